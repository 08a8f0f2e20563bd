#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang (ASan+UBSan, coverage) in
# build-fuzz/ and runs each for a bounded time over its seed corpus in
# tests/fuzz/corpus/NAME. New inputs the fuzzer finds go to a scratch
# directory, never into the repository; a crash leaves its input in
# build-fuzz/artifacts/ and fails the run. Add every such input to the
# corpus once it is fixed.
# Usage: scripts/fuzz.sh [SECONDS_EACH]   (default 30; $GRAPHD_FUZZ_SECONDS)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${GRAPHD_FUZZ_SECONDS:-30}}
command -v clang >/dev/null || { echo "fuzz.sh: clang is not installed (Debian: clang libclang-rt-dev)" >&2; exit 2; }
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHD_FUZZ=ON \
  -DGRAPHD_SANITIZE=address,undefined -DGRAPHD_BUILD_TESTS=OFF -DGRAPHD_BUILD_BENCH=OFF \
  -DGRAPHD_CONDITION_KERNEL=OFF >/dev/null
cmake --build build-fuzz --target fuzz_frame fuzz_program
mkdir -p build-fuzz/artifacts
rc=0
for h in frame program; do
  work=$(mktemp -d /tmp/graphd-fuzz-$h-XXXXXX)
  echo "== fuzz_$h for ${secs}s"
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    build-fuzz/fuzz_$h -max_total_time="$secs" -print_final_stats=1 \
      -artifact_prefix=build-fuzz/artifacts/$h- "$work" tests/fuzz/corpus/$h \
      >build-fuzz/fuzz_$h.log 2>&1; then
    rc=1
    grep -E "ERROR|SUMMARY|artifact" build-fuzz/fuzz_$h.log || tail -20 build-fuzz/fuzz_$h.log
  fi
  grep -E "^stat::(number_of_executed_units|new_units_added)" build-fuzz/fuzz_$h.log || true
  rm -rf "$work"
done
exit $rc
