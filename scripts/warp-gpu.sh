#!/usr/bin/env bash
# graphd.warp on the lent GPU machine, from the repository root, over a
# build made here (same absolute path) and bundled with
# scripts/gpu-bundle.sh, with Warp (warp-lang 1.19) on the PYTHONPATH this
# script is given (or in $GRAPHD_WARP_PATH, a directory holding warp/):
#  1. without MPS: ctest's test_warp_gpu (GRAPHD_REQUIRE_GPU=1: a missing
#     GPU, jax or Warp fails), which starts its own daemon; then
#     bench/warp_scan_bench.py against a fresh daemon;
#  2. the same under MPS (nvidia-cuda-mps-control -d -M).
# With the step "mjx" (GRAPHD_WARP_STEPS="test bench mjx", or "mjx" alone;
# "mjx-test" or "mjx-bench" for one of the two), each run also runs ctest's
# test_mjx_gpu (MuJoCo MJX with impl="warp"
# through graphd.warp.install() against Warp's own jax_callable) and
# bench/mjx_scan_bench.py against a fresh daemon, with $GRAPHD_MJX_BENCH_FLAGS
# (for example "--worlds 256 --steps 400"); these need warp-lang 1.18,
# mujoco 3.17 and mujoco-mjx 3.17 on the PYTHONPATH.
# The Python is $GRAPHD_JAX_PYTHON (default /opt/torch/.venv/bin/python3).
# Every process is bounded by timeout. Output is shown and kept in OUT_DIR:
# warp-test-{nomps,mps}.log, warp-bench-{nomps,mps}.log and the bench
# daemons' logs graphd-warp-bench-*.log (with mjx: mjx-test-*.log,
# mjx-bench-*.log, graphd-mjx-bench-*.log). Lines starting FIGURE are the
# measurements. Exit status 1 when a step failed, 2 for a missing
# prerequisite.
# With the step "suites" (GRAPHD_WARP_STEPS="suites"), each run runs the
# peers' own test suites as their users run them, twice: with Warp alone,
# and with graphd.warp.install() in every process (a sitecustomize that
# imports graphd with GRAPHD_WARP_INSTALL=1) against a fresh daemon: Warp's
# `python -m unittest -v warp.tests.interop.test_jax` (in the pack that
# warp-for-device.sh makes) and, where MuJoCo is on the PYTHONPATH, MJX's
# mujoco/mjx/warp/*_test.py, each file in one process ($GRAPHD_SUITES picks
# them: "warp mjx" by default). $GRAPHD_SUITE_FILTER
# narrows the MJX files (a regular expression), $GRAPHD_SUITE_HOWS the ways
# ("alone graphd" by default); $GRAPHD_SUITE_WARP_ARGS
# replaces the Warp test's name (for example one test case). Logs:
# suite-{alone,graphd}-{warp,mjx-NAME}-RUN.log; a line starting SUITE per
# log gives its counts.
# With the step "procs", each run runs bench/procs_bench.py against a fresh
# daemon: N processes (1 2 4 8 16) stepping the MJX scenes and the JAX small
# step at once, through graphd and without it; $GRAPHD_PROCS_FLAGS go to it
# (for example "--procs 4 --seconds 5"), $GRAPHD_PROCS_LIMIT bounds it
# (590 s by default), and the compiled scans are kept in
# $JAX_COMPILATION_CACHE_DIR (default OUT_DIR/jax-cache). The daemon runs
# with $GRAPHD_PROCS_DAEMON_FLAGS (none by default; for example
# "--ready-hold-rings 65536" to leave every ready wait on the GPU, or
# "--ready-hold-max-us 1000000" to hold every program's replays).
# Log: procs-RUN.log.
# GRAPHD_WARP_RUNS picks the runs ("nomps mps" by default);
# GRAPHD_WARP_STEPS the steps ("test bench" by default); extra arguments go
# to the bench (for example --steps 1000 --repeats 7 --n 65536).
# The daemons run at nice -5, as the systemd unit starts graphd
# (GRAPHD_BENCH_NICE).
# Usage: scripts/warp-gpu.sh BUILD_DIR OUT_DIR [bench flags]
set -uo pipefail
[[ $# -ge 2 ]] || { echo "usage: scripts/warp-gpu.sh BUILD_DIR OUT_DIR [bench flags]"; exit 2; }
build=$(realpath "$1"); out=$2; shift 2
mkdir -p "$out"; out=$(realpath "$out")
src=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH="$build/rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:/usr/local/nvidia/bin"
py=${GRAPHD_JAX_PYTHON:-/opt/torch/.venv/bin/python3}
export GRAPHD_JAX_PYTHON=$py
export PYTHONPATH="$src/client/python${GRAPHD_WARP_PATH:+:$GRAPHD_WARP_PATH}${PYTHONPATH:+:$PYTHONPATH}"
export GRAPHD_LIB="$build/libgraphd.so" GRAPHD_XLA_LIB="$build/libgraphd_xla.so"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONDONTWRITEBYTECODE=1
export WARP_CACHE_PATH=${WARP_CACHE_PATH:-$out/warp-cache}
sock=/tmp/graphd-warp-bench-$$.sock
rc=0

for f in "$build/graphd" "$build/graphctl" "$GRAPHD_LIB" "$GRAPHD_XLA_LIB"; do
  [[ -e $f ]] || { echo "missing $f: build with the XLA handler (scripts/fetch-xla-headers.sh) and bundle"; exit 2; }
done
[[ -x $py ]] || command -v "$py" >/dev/null || { echo "no python at $py: set GRAPHD_JAX_PYTHON"; exit 2; }
if ! timeout 120 "$py" -c 'import jax, warp, graphd.warp as gw; gw.warp_modules(); print("python", __import__("sys").version.split()[0], "jax", jax.__version__, "warp", warp.__version__, "from", warp.__file__)'; then
  echo "jax, Warp or graphd.warp is not usable in $py with PYTHONPATH=$PYTHONPATH"
  echo "(put warp-lang 1.19 on PYTHONPATH, or set GRAPHD_WARP_PATH)"
  exit 2
fi
steps=" ${GRAPHD_WARP_STEPS:-test bench} "
if [[ $steps == *" mjx"* ]] && ! timeout 120 "$py" -c 'import mujoco, mujoco.mjx.warp as w, warp; assert w.WARP_INSTALLED and w.mujoco_warp is not None, "no MuJoCo Warp"; print("mujoco", mujoco.__version__, "warp", warp.__version__, "from", mujoco.__file__)'; then
  echo "mujoco, mujoco.mjx or its Warp implementation is not usable in $py with PYTHONPATH=$PYTHONPATH"
  echo "(put warp-lang 1.18, mujoco 3.17 and mujoco-mjx 3.17 on PYTHONPATH)"
  exit 2
fi
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version,compute_mode --format=csv,noheader

daemon_limit=1200
# shellcheck source=scripts/gpu-daemon.sh
. "$src/scripts/gpu-daemon.sh"
trap 'stop_daemon' EXIT

# gpu_test TEST LOG, within run NAME: ctest's TEST with
# GRAPHD_REQUIRE_GPU=1, its output kept in LOG, its figures and results
# shown.
gpu_test() {
  local t=$1 log=$2
  echo "== $t ($name)"
  (cd "$build" && GRAPHD_REQUIRE_GPU=1 timeout 960 ctest -R "^$t\$" -V 2>&1) \
    | tee "$log" | grep -E 'FIGURE| \.\.\. |Ran [0-9]+ tests|^[0-9]+: (OK|FAILED)|(FAIL|ERROR): |Error|tests passed|tests failed'
  grep -q "100% tests passed" "$log" || { echo "$t ($name) failed"; rc=1; }
}

# bench BENCH SECONDS [flags], within run NAME: bench/BENCH.py (warp_ or
# mjx_scan_bench) bounded by SECONDS against a fresh daemon; the bench's
# output kept in warp-bench-NAME.log or mjx-bench-NAME.log, the daemon's in
# graphd-warp-bench-NAME.log or graphd-mjx-bench-NAME.log. Returns 1 when
# the daemon did not start.
bench() {
  local b=$1 limit=$2 r
  shift 2
  local short=${b%_scan_bench}
  short=${short%_bench}
  echo "== $b ($name)"
  # Every replay timed on the GPU: the bench sets the daemon's mean GPU
  # time beside Warp's, which times every launch.
  # shellcheck disable=SC2086 # the flags are words
  start_daemon "$out/graphd-$short-bench-$name.log" ${daemon_flags---gpu-time-sample 1} || { rc=1; return 1; }
  timeout "$limit" "$py" "$src/bench/$b.py" --socket "$sock" "$@" 2>&1 | tee "$out/$short-bench-$name.log"
  r=${PIPESTATUS[0]}
  echo "$b ($name) exit status $r"
  [[ $r == 0 ]] || rc=1
  stop_daemon
}

# suite LOG CMD...: runs CMD (bounded), keeps its output in LOG and prints
# one SUITE line with unittest's counts.
suite() {
  local log=$1
  shift
  timeout 900 "$@" >"$log" 2>&1
  local r=$? ran fails
  ran=$(grep -Eo '^Ran [0-9]+ tests?' "$log" | tail -1 | grep -Eo '[0-9]+')
  fails=$(grep -Eo '^FAILED \(.*\)' "$log" | tail -1)
  echo "SUITE $(basename "$log" .log): exit $r, ran ${ran:-?}, ${fails:-OK} ($(grep -Ec '\.\.\. ok$' "$log") ok lines)"
  grep -E '\.\.\. (FAIL|ERROR)$|^(FAIL|ERROR): ' "$log" | sort -u | head -60
}

# suites NAME: the peers' own suites with Warp alone, then under graphd.
suites() {
  local name=$1 site="$out/site-graphd" how
  mkdir -p "$site"
  printf 'import os\nos.environ.setdefault("GRAPHD_WARP_INSTALL", "1")\nimport graphd  # noqa: F401 (installs graphd.warp)\n' >"$site/sitecustomize.py"
  local mjx_dir
  mjx_dir=$("$py" -c 'import mujoco.mjx.warp as w, os; print(os.path.dirname(w.__file__))' 2>/dev/null)
  for how in ${GRAPHD_SUITE_HOWS:-alone graphd}; do
    local pp=$PYTHONPATH
    if [[ $how == graphd ]]; then
      start_daemon "$out/graphd-suites-$name.log" || { rc=1; return; }
      pp="$site:$PYTHONPATH"
    fi
    if [[ " ${GRAPHD_SUITES:-warp mjx} " == *" warp "* ]]; then
      echo "== Warp's JAX tests, $how ($name)"
      # shellcheck disable=SC2086 # the names are words
      (cd /tmp && PYTHONPATH=$pp GRAPHD_SOCKET=$sock suite "$out/suite-$how-warp-$name.log" \
        "$py" -m unittest -v ${GRAPHD_SUITE_WARP_ARGS:-warp.tests.interop.test_jax})
    fi
    if [[ -n $mjx_dir && " ${GRAPHD_SUITES:-warp mjx} " == *" mjx "* ]]; then
      for f in "$mjx_dir"/*_test.py; do
        local t
        t=$(basename "$f" _test.py)
        [[ $t =~ ${GRAPHD_SUITE_FILTER:-.} ]] || continue
        echo "== MJX $t, $how ($name)"
        (cd /tmp && PYTHONPATH=$pp GRAPHD_SOCKET=$sock suite "$out/suite-$how-mjx-$t-$name.log" "$py" "$f")
      done
    fi
    [[ $how == graphd ]] && stop_daemon
  done
}

# run NAME [bench flags]: the GPU test, then the bench; with mjx, then the
# MJX test and the MJX bench; with suites, the peers' own suites.
run() {
  local name=$1
  shift
  if [[ $steps == *" suites "* ]]; then
    suites "$name"
  fi
  if [[ $steps == *" procs "* ]]; then
    # shellcheck disable=SC2086 # the flags are words
    # The daemon's default sampling of GPU time: throughput is measured.
    daemon_flags="${GRAPHD_PROCS_DAEMON_FLAGS:-}" GRAPHD_CUDA_KERNELS="$build/tests/kernels" \
      JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$out/jax-cache}" \
      bench procs_bench "${GRAPHD_PROCS_LIMIT:-590}" ${GRAPHD_PROCS_FLAGS:-} || return
    mv "$out/procs-bench-$name.log" "$out/procs-$name.log"
  fi
  if [[ $steps == *" test "* ]]; then
    gpu_test test_warp_gpu "$out/warp-test-$name.log"
  fi
  if [[ $steps == *" bench "* ]]; then
    bench warp_scan_bench 1200 "$@" || return
  fi
  if [[ $steps == *" mjx "* || $steps == *" mjx-test "* ]]; then
    gpu_test test_mjx_gpu "$out/mjx-test-$name.log"
  fi
  if [[ $steps == *" mjx "* || $steps == *" mjx-bench "* ]]; then
    # shellcheck disable=SC2086 # the flags are words
    bench mjx_scan_bench 600 ${GRAPHD_MJX_BENCH_FLAGS:-} || return
  fi
}

runs=" ${GRAPHD_WARP_RUNS:-nomps mps} "
if [[ $runs == *" nomps "* ]]; then
  echo "== 1. without MPS"
  run nomps "$@"
fi
if [[ $runs == *" mps "* ]]; then
  echo "== 2. under MPS (-M)"
  if start_mps; then
    run mps "$@"
    stop_mps
  else
    rc=1
  fi
fi
exit $rc
