#!/usr/bin/env bash
# Builds the Python package's wheel the way a user's `pip install
# ./client/python` does (scikit-build-core running this repository's CMake
# build with GRAPHD_CLIENT_ONLY), in a fresh virtual environment; installs
# it there; and runs the Python tests against the installed package with
# GRAPHD_TEST_INSTALLED=1: no $GRAPHD_LIB, no $GRAPHD_XLA_LIB, no source tree
# on the path. The daemon and the host kernels the tests start come from
# BUILD_DIR (a normal build); jax (with numpy) and warp-lang from
# BUILD_DIR/pyjax and BUILD_DIR/pywarp (scripts/py-deps.sh). Without them
# their tests skip, after a message that says how to get them; with
# GRAPHD_TEST_REQUIRE_PY=1 (scripts/test.sh) that fails instead.
# The wheel is left in OUT_DIR (default BUILD_DIR/wheel).
# Usage: scripts/wheel-test.sh BUILD_DIR [OUT_DIR]
set -euo pipefail
usage="usage: scripts/wheel-test.sh BUILD_DIR [OUT_DIR]"
[[ "${1:-}" == -h || "${1:-}" == --help ]] && { echo "$usage"; exit 0; }
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:?$usage}")
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
deps=$build/pyjax:$build/pywarp
if ! PYTHONPATH=$deps "$src/scripts/py-deps.sh" --need "$py" "$build" jax warp; then
  [[ ${GRAPHD_TEST_REQUIRE_PY:-0} == 1 ]] && { echo "GRAPHD_TEST_REQUIRE_PY=1: failing"; exit 1; }
  echo "wheel-test: the tests that need them skip"
fi
cd "$work"
env -u GRAPHD_LIB -u GRAPHD_XLA_LIB PYTHONPATH="$deps" PYTHONDONTWRITEBYTECODE=1 \
  GRAPHD_TEST_INSTALLED=1 GRAPHD_TEST_STRICT=1 \
  GRAPHD_BIN="$build/graphd" GRAPHD_HOST_KERNELS="$build/tests/kernels/host_kernels.so" \
  GRAPHD_ABI_SIZES="$build/tests/abi_sizes" \
  "$py" -m unittest discover -s "$src/client/python/tests" -t "$src/client/python/tests" -v
