#!/usr/bin/env bash
# Copies the shared libraries that the GPU test machine lacks (libuv,
# protobuf-c, json-c, inih, libmicrohttpd, check's subunit) next to a build, so that the
# build directory can run there with LD_LIBRARY_PATH=BUILD/rtlibs.
# Usage: scripts/gpu-bundle.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: gpu-bundle.sh BUILD_DIR}
out="$build/rtlibs"
mkdir -p "$out"
for bin in "$build/graphd" "$build/graphctl" "$build/libgraphd.so" "$build"/tests/test_*; do
  [[ -x "$bin" || -f "$bin" ]] || continue
  ldd "$bin" | awk '/=> \// {print $3}'
done | sort -u | grep -E 'lib(uv|protobuf-c|json-c|inih|microhttpd|subunit|check)\.so' | while read -r lib; do
  cp -L "$lib" "$out/"
done
ls "$out"
