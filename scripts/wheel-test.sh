#!/usr/bin/env bash
# Builds the Python package's wheel the way a user's `pip install
# ./client/python` does (scikit-build-core running this repository's CMake
# build with GRAPHD_CLIENT_ONLY), in a fresh virtual environment; installs
# it there; and runs the Python tests against the installed package with
# GRAPHD_TEST_INSTALLED=1: no $GRAPHD_LIB, no $GRAPHD_XLA_LIB, no source tree
# on the path. The daemon and the host kernels the tests start come from
# BUILD_DIR (a normal build); jax and warp-lang from BUILD_DIR/pyjax and
# BUILD_DIR/pywarp when .ci/run put them there (else those tests skip).
# The wheel is left in OUT_DIR (default BUILD_DIR/wheel).
# Usage: scripts/wheel-test.sh BUILD_DIR [OUT_DIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:?usage: scripts/wheel-test.sh BUILD_DIR [OUT_DIR]}")
out=$(realpath -m "${2:-$build/wheel}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py=$work/venv/bin/python
rm -rf "$out" && mkdir -p "$out"
# The XLA FFI headers the normal build fetched, so the wheel build need not
# download jaxlib again (without them it fetches them itself).
[[ -f $build/xla-include/xla/ffi/api/c_api.h ]] && export GRAPHD_XLA_INCLUDE=$build/xla-include
(cd "$work" && "$py" -m pip wheel --quiet --no-deps -w "$out" "$src/client/python")
whl=$(ls "$out"/graphd-*.whl)
echo "built $(basename "$whl"):"
"$py" -m zipfile -l "$whl" | grep -E '\.so' || true
"$py" -m pip install --quiet --no-deps "$whl"
deps=""
for d in pyjax pywarp; do [[ -d $build/$d ]] && deps+="${deps:+:}$build/$d"; done
cd "$work"
env -u GRAPHD_LIB -u GRAPHD_XLA_LIB PYTHONPATH="$deps" PYTHONDONTWRITEBYTECODE=1 \
  GRAPHD_TEST_INSTALLED=1 GRAPHD_TEST_STRICT=1 \
  GRAPHD_BIN="$build/graphd" GRAPHD_HOST_KERNELS="$build/tests/kernels/host_kernels.so" \
  GRAPHD_ABI_SIZES="$build/tests/abi_sizes" \
  "$py" -m unittest discover -s "$src/client/python/tests" -t "$src/client/python/tests" -v
