#!/usr/bin/env bash
# The whole test suite, on a fresh Debian 12 machine as on CI (.ci/run runs
# only this). First it installs what it needs: the Debian packages of
# `scripts/deps.sh test` (with sudo when not root) and the pinned Python
# packages of scripts/py-deps.sh (jax, warp-lang, MuJoCo and MJX) under
# build/. Then, each a phase with a banner and its time:
#   format   the C formatting (.clang-format) and that every include points
#            down the tree's layers and the daemon's (scripts/check-layers.py,
#            first checked against planted offences with --self-test)
#   build    graphd with warnings as errors, with the XLA handler (jaxlib's
#            header, downloaded once; without it the handler and its tests
#            are left out, with a message)
#   ctest    every test (GPU tests skip with 77 where there is no GPU; on a
#            GPU machine set GRAPHD_REQUIRE_GPU=1 to make a skip a failure;
#            a Python test whose package is missing fails, saying which)
#   wheel    the Python wheel, daemon and graphctl inside, built as
#            `pip wheel ./client/python` builds it, made a manylinux wheel
#            by auditwheel, installed into a fresh virtual environment with
#            no compiler, its `graphd --backend host` answering its
#            `graphctl status`, and the Python tests against it
#            (scripts/wheel-test.sh)
#   asan     the unit tests under ASan+UBSan
#   tsan     the unit tests under ThreadSanitizer (any race fails the test
#            whose process, client or graphd, saw it)
#   deb      the Debian package built, lintian-clean, installed, run and
#            purged (scripts/deb-test.sh)
#   fuzz     each libFuzzer harness for a bounded time (scripts/fuzz.sh:
#            five harnesses, $GRAPHD_FUZZ_SECONDS each, default 30)
# A phase that fails does not stop the others, except those that need it
# (ctest and wheel need build). Last comes a summary of every phase, and the
# exit status is 1 when one failed.
# Usage: scripts/test.sh
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  "") ;;
  -h|--help) echo "usage: scripts/test.sh   (the whole suite; no arguments)"; exit 0 ;;
  *) echo "usage: scripts/test.sh   (the whole suite; no arguments)" >&2; exit 2 ;;
esac
jobs=$(nproc)
# A Python test whose pip package is missing fails here, rather than skip.
export GRAPHD_TEST_REQUIRE_PY=1

p_deps() { scripts/deps.sh test; }
p_pydeps() { scripts/py-deps.sh build; }
p_format() {
  scripts/check-format.sh
  scripts/check-layers.py --self-test
  scripts/check-layers.py
}
p_build() {
  # jaxlib's XLA FFI header, for the JAX handler and its tests.
  scripts/fetch-xla-headers.sh build/xla-include ||
    echo "warning: no XLA FFI headers; the JAX handler is not built or tested"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGRAPHD_WERROR=ON
  cmake --build build -j "$jobs"
}
p_ctest() { ctest --test-dir build --output-on-failure -j "$jobs"; }
p_wheel() { scripts/wheel-test.sh build; }
p_asan() {
  mkdir -p build-asan && cp -r build/xla-include build-asan/ 2>/dev/null || true
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DGRAPHD_SANITIZE=address,undefined -DGRAPHD_WERROR=ON
  cmake --build build-asan -j "$jobs"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j "$jobs"
}
p_tsan() {
  # No suppressions: every report is a race in graphd, libgraphd or a test.
  mkdir -p build-tsan && cp -r build/xla-include build-tsan/ 2>/dev/null || true
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
    -DGRAPHD_SANITIZE=thread -DGRAPHD_WERROR=ON -DGRAPHD_BUILD_BENCH=OFF
  cmake --build build-tsan -j "$jobs"
  # die_after_fork=0: tests fork children that connect as other users, and a
  # child's libgraphd starts a watcher thread of its own (fork safety: it
  # never uses the parent's); TSan otherwise stops any process that starts
  # a thread after a fork of a multi-threaded one. Races still halt.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:die_after_fork=0 \
    ctest --test-dir build-tsan -L unit --output-on-failure -j "$jobs"
}
p_deb() { scripts/deb-test.sh build-deb build/wheel; }
p_fuzz() { scripts/fuzz.sh "${GRAPHD_FUZZ_SECONDS:-30}"; }

# name|needs|what
PHASES=(
  "deps||the Debian packages (scripts/deps.sh test)"
  "pydeps||the Python packages under build/ (scripts/py-deps.sh)"
  "format||C formatting and include layers"
  "build||graphd in build/ with -Werror"
  "ctest|build|every test in build/"
  "wheel|build|the manylinux wheel in a fresh venv: its graphd and graphctl, the Python tests"
  "asan||the unit tests under ASan+UBSan (build-asan/)"
  "tsan||the unit tests under ThreadSanitizer (build-tsan/)"
  "deb||the Debian package (build-deb/)"
  "fuzz||the libFuzzer harnesses (build-fuzz/)"
)
declare -A result took
order=()
hms() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }
t0=$SECONDS
n=0
for p in "${PHASES[@]}"; do
  IFS='|' read -r name needs what <<<"$p"
  n=$((n + 1))
  order+=("$name")
  for d in $needs; do
    if [[ ${result[$d]} != passed ]]; then
      result[$name]=skipped took[$name]=0
      echo; echo "=== [$n/${#PHASES[@]}] $name: skipped ($d ${result[$d]})"
      continue 2
    fi
  done
  echo; echo "=== [$n/${#PHASES[@]}] $name: $what"
  start=$SECONDS
  (set -e; "p_$name")
  rc=$?
  took[$name]=$((SECONDS - start))
  if [[ $rc -eq 0 ]]; then result[$name]=passed; else result[$name]=failed; fi
  echo "=== $name: ${result[$name]} in $(hms "${took[$name]}")"
  if [[ $name == deps && $rc -ne 0 ]]; then
    echo "=== the Debian packages could not be installed: stopping (the other phases need them)"
    break
  fi
done

echo; echo "=== summary ($(hms $((SECONDS - t0))) in all)"
passed=0 failed=0 skipped=0
for name in "${order[@]}"; do
  printf '  %-7s %-8s %s\n' "$name" "${result[$name]}" "$(hms "${took[$name]}")"
  case ${result[$name]} in
    passed) passed=$((passed + 1)) ;;
    failed) failed=$((failed + 1)) ;;
    skipped) skipped=$((skipped + 1)) ;;
  esac
done
echo "phases: $passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 && $skipped -eq 0 && ${#order[@]} -eq ${#PHASES[@]} ]]
