#!/usr/bin/env bash
# Copies the shared libraries that the GPU test machine lacks (libuv,
# protobuf-c, json-c, inih, libmicrohttpd, check's subunit) next to a build, so that the
# build directory can run there with LD_LIBRARY_PATH=BUILD/rtlibs.
# With --pack FILE it also writes FILE, an xz tarball of the build tree as
# that machine runs it (no object files, static libraries or the Python
# packages py-deps.sh put there), its paths relative to the build's parent:
# some 4 MB where the tree is 45 MB, so that a device call can carry it
# beside other large parts. There, from the same parent directory (the
# build's absolute path must be the same): tar xJf FILE.
# Usage: scripts/gpu-bundle.sh BUILD_DIR [--pack FILE]
set -euo pipefail
build=${1:?usage: gpu-bundle.sh BUILD_DIR [--pack FILE]}
pack=
if [[ ${2:-} == --pack ]]; then
  pack=${3:?--pack needs a file}
elif [[ $# -gt 1 ]]; then
  echo "usage: gpu-bundle.sh BUILD_DIR [--pack FILE]" >&2
  exit 2
fi
out="$build/rtlibs"
mkdir -p "$out"
for bin in "$build/graphd" "$build/graphctl" "$build/libgraphd.so" "$build"/tests/test_*; do
  [[ -x "$bin" || -f "$bin" ]] || continue
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -E 'lib(uv|protobuf-c|json-c|inih|microhttpd|subunit|check)\.so' | while read -r lib; do
  cp -L "$lib" "$out/"
done
ls "$out"
if [[ -n $pack ]]; then
  parent=$(dirname "$(realpath "$build")")
  name=$(basename "$(realpath "$build")")
  pack=$(realpath -m "$pack")
  tar -C "$parent" -cf - --exclude='*.o' --exclude='*.a' --exclude="$name/CMakeFiles" \
    --exclude="$name/py*" "$name" | xz -T0 -6 >"$pack"
  echo "packed $name into $pack ($(du -h "$pack" | cut -f1))"
fi
