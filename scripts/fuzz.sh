#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang (ASan+UBSan, coverage) in
# build-fuzz/ and runs each for a bounded time over its seed corpus in
# tests/fuzz/corpus/NAME:
#   frame    bytes on a session socket: framing and Request decoding
#   program  the program decoder and validator
#   request  every request through a daemon in the process (two host
#            devices, up to three client connections)
#   region   memfd seal and size checks, the host backend's region and
#            flag page mappings, the region table, the Replay binding checks
#   ring     a session's submission ring read by the worker on a host
#            device while a second thread rewrites its entries
# New inputs the fuzzer finds go to a scratch directory, never into the
# repository; a crash leaves its input in build-fuzz/artifacts/ and fails
# the run. Add every such input to the corpus once it is fixed.
# Usage: scripts/fuzz.sh [SECONDS_EACH [HARNESS...]]   (default 30, all;
#          $GRAPHD_FUZZ_SECONDS; $GRAPHD_FUZZ_KEEP=DIR keeps what each run
#          found in DIR/NAME, for a longer campaign: docs/fuzzing.md)
#        scripts/fuzz.sh --seeds   (writes the request, region and ring
#          seeds again from tests/fuzz/gen_seeds.c)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  -h|--help) echo "usage: scripts/fuzz.sh [SECONDS_EACH [HARNESS...]] | --seeds"; exit 0 ;;
esac
command -v clang >/dev/null || { echo "fuzz.sh: clang is not installed (Debian: clang libclang-rt-dev)" >&2; exit 2; }
CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHD_FUZZ=ON \
  -DGRAPHD_SANITIZE=address,undefined -DGRAPHD_BUILD_TESTS=OFF -DGRAPHD_BUILD_BENCH=OFF \
  -DGRAPHD_CONDITION_KERNEL=OFF >/dev/null
all="frame program request region ring"
if [ "${1:-}" = --seeds ]; then
  cmake --build build-fuzz --target fuzz_seeds
  build-fuzz/fuzz_seeds tests/fuzz/corpus
  echo "fuzz.sh: seeds written to tests/fuzz/corpus/request, region and ring"
  exit 0
fi
secs=${1:-${GRAPHD_FUZZ_SECONDS:-30}}
shift || true
harnesses=${*:-$all}
cmake --build build-fuzz --target $(for h in $harnesses; do printf 'fuzz_%s ' "$h"; done)
mkdir -p build-fuzz/artifacts
rc=0
for h in $harnesses; do
  if [ -n "${GRAPHD_FUZZ_KEEP:-}" ]; then
    work=$GRAPHD_FUZZ_KEEP/$h
    mkdir -p "$work"
  else
    work=$(mktemp -d /tmp/graphd-fuzz-$h-XXXXXX)
  fi
  echo "== fuzz_$h for ${secs}s"
  # -timeout: one input may take at most 25 s (fuzz_request gives a
  # request 20 s to be answered and aborts, naming it, past that).
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    build-fuzz/fuzz_$h -max_total_time="$secs" -timeout=25 -print_final_stats=1 \
      -artifact_prefix=build-fuzz/artifacts/$h- "$work" tests/fuzz/corpus/$h \
      >build-fuzz/fuzz_$h.log 2>&1; then
    rc=1
    grep -E "ERROR|SUMMARY|artifact" build-fuzz/fuzz_$h.log || tail -20 build-fuzz/fuzz_$h.log
  fi
  grep -E "^stat::(number_of_executed_units|new_units_added)" build-fuzz/fuzz_$h.log || true
  [ -n "${GRAPHD_FUZZ_KEEP:-}" ] || rm -rf "$work"
done
exit $rc
