#!/bin/sh
# The Debian packages that README.md ("Building by hand") and
# docs/operator.md ("Requirements") tell a builder to install include every
# package of `scripts/deps.sh build`, the set the demo installs.
# Usage: test_docs_deps.sh SOURCE_DIR
src=$1
pkgs=$(bash "$src/scripts/deps.sh" --print build) || exit 1
readme=$(sed -n '/^## Building by hand/,/^```sh/p' "$src/README.md")
operator=$(sed -n '/^## Requirements/,/^## Install/p' "$src/docs/operator.md")
rc=0
for p in $pkgs; do
  printf '%s\n' "$readme" | grep -qw -- "$p" ||
    { echo "README.md, Building by hand: $p is missing"; rc=1; }
  printf '%s\n' "$operator" | grep -qw -- "$p" ||
    { echo "docs/operator.md, Requirements: $p is missing"; rc=1; }
done
[ $rc -eq 0 ] && echo "README.md and docs/operator.md list every package of scripts/deps.sh build"
exit $rc
