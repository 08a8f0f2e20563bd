#!/usr/bin/env bash
# The test suite: checks the C formatting (.clang-format) and that every
# include points down the tree's layers (scripts/check-layers.py), builds graphd
# with warnings as errors and runs every
# ctest (GPU tests skip with 77 where there is no GPU; on a GPU machine set
# GRAPHD_REQUIRE_GPU=1 to make a skip a failure), builds the Python wheel
# in a fresh virtual environment and runs the Python tests against it
# (scripts/wheel-test.sh), then builds again under ASan+UBSan and runs the
# unit tests there, then under ThreadSanitizer (any race fails the test
# whose process, client or graphd, saw it), then builds the Debian package,
# installs, runs and purges it (scripts/deb-test.sh), and last runs each
# libFuzzer harness for a bounded time (scripts/fuzz.sh: five harnesses,
# 30 s each).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
scripts/check-format.sh
scripts/check-layers.py

# jaxlib's XLA FFI header, for the JAX handler and its tests (downloaded
# once; without it the handler and test_xla are left out, with a message).
scripts/fetch-xla-headers.sh build/xla-include ||
  echo "warning: no XLA FFI headers; the JAX handler is not built or tested"
for b in build-asan build-tsan; do
  mkdir -p $b && cp -r build/xla-include $b/ 2>/dev/null || true
done

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHD_WERROR=ON
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs"

# The Python wheel as a user gets it (pip install ./client/python), built in
# a fresh virtual environment, and the Python tests against it.
scripts/wheel-test.sh build

cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DGRAPHD_SANITIZE=address,undefined -DGRAPHD_WERROR=ON
cmake --build build-asan -j "$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit --output-on-failure -j "$jobs"

# No suppressions: every report is a race in graphd, libgraphd or a test.
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DGRAPHD_SANITIZE=thread -DGRAPHD_WERROR=ON -DGRAPHD_BUILD_BENCH=OFF
cmake --build build-tsan -j "$jobs"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan -L unit --output-on-failure -j "$jobs"

# The Debian package: built, lintian-clean, installed, run, purged.
scripts/deb-test.sh build-deb build/wheel

scripts/fuzz.sh "${GRAPHD_FUZZ_SECONDS:-30}"
