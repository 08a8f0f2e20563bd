#!/usr/bin/env bash
# Checks that every tracked C source and header is formatted as .clang-format
# says (clang-format from Debian). Prints the files that are not, with the
# fix, and exits 1; exits 0 when all are. Run from anywhere in the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "check-format: clang-format is not installed"; exit 1; }
bad=()
while IFS= read -r f; do
  clang-format --style=file --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done < <(git ls-files '*.c' '*.h')
if ((${#bad[@]})); then
  echo "check-format: not formatted (fix: clang-format -i FILE):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "check-format: $(git ls-files '*.c' '*.h' | wc -l) files formatted"
