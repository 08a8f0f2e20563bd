#!/usr/bin/env bash
# Runs bench/replay_bench (the request path's figures) on the lent GPU machine from the
# repository root, over a build made here (same absolute path) and bundled
# with scripts/gpu-bundle.sh:
#  1. without MPS, with a short chain (each dependent hand-off costs about
#     300 us there: GPU time-slicing between the two processes);
#  2. under MPS (-M), with the full chain of 1000.
# After each replay_bench, bench/jax_scan_bench.py (a lax.scan step
# through graphd against the same step in pure XLA) runs in $GRAPHD_JAX_PYTHON
# (default /opt/torch/.venv/bin/python3) against a fresh daemon, and under
# MPS bench/scaling_bench (GRAPHD_BENCH_CLIENTS client processes per device,
# default 8, sync then async) against another, and bench/large_bench
# (GRAPHD_BENCH_LARGE=0 leaves it out) against a third. Last, scripts/bench-report.py
# prints the targets table and writes OUT_DIR/bench.json, bench.md and
# bench.png (the plot where matplotlib is importable).
# Each run gets a fresh daemon on its own socket, so its first replays are
# captures. Every process is bounded by timeout. The bench's output is shown
# and kept in OUT_DIR/bench-nomps.log and bench-mps.log (bench-jax-*.log,
# scaling-mps.log), the daemons' logs beside them (graphd-*.log). Exit status 1 when a run failed.
# GRAPHD_BENCH_RUNS picks the runs ("nomps mps" by default).
# Each daemon runs at nice -5, as the systemd unit starts graphd
# (GRAPHD_BENCH_NICE sets another; raising the priority needs root).
# Usage: scripts/bench-gpu.sh BUILD_DIR OUT_DIR [extra replay_bench flags]
set -uo pipefail
build=$(realpath "$1"); out=${2:-/tmp}; shift 2 || shift $#
mkdir -p "$out"
export LD_LIBRARY_PATH="$build/rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:/usr/local/nvidia/bin"
bench="$build/bench/replay_bench"
src=$(cd "$(dirname "$0")/.." && pwd)
py=${GRAPHD_JAX_PYTHON:-/opt/torch/.venv/bin/python3}
sock=/tmp/graphd-bench-$$.sock
rc=0

# shellcheck source=scripts/gpu-daemon.sh
. "$src/scripts/gpu-daemon.sh"

# run_bench NAME CHAIN [flags]: one bench run against a fresh daemon, then
# (unless GRAPHD_BENCH_JAX=0) bench/jax_scan_bench.py against another.
run_bench() {
  local name=$1 chain=$2 r
  shift 2
  start_daemon "$out/graphd-$name.log" || { rc=1; return; }
  timeout 300 "$bench" --socket "$sock" --chain "$chain" "$@" 2>&1 | tee "$out/bench-$name.log"
  r=${PIPESTATUS[0]}
  echo "replay_bench ($name) exit status $r"
  [[ $r == 0 ]] || rc=1
  stop_daemon
  [[ ${GRAPHD_BENCH_JAX:-1} == 1 ]] || return 0
  start_daemon "$out/graphd-jax-$name.log" || { rc=1; return; }
  GRAPHD_LIB="$build/libgraphd.so" GRAPHD_XLA_LIB="$build/libgraphd_xla.so" \
    GRAPHD_CUDA_KERNELS="$build/tests/kernels" PYTHONPATH="$src/client/python" \
    XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONDONTWRITEBYTECODE=1 \
    timeout 300 "$py" "$src/bench/jax_scan_bench.py" --socket "$sock" 2>&1 | tee "$out/bench-jax-$name.log"
  r=${PIPESTATUS[0]}
  echo "jax_scan_bench ($name) exit status $r"
  [[ $r == 0 ]] || rc=1
  stop_daemon
}

# run_scaling NAME: scaling_bench sync, then async, each against a fresh daemon.
run_scaling() {
  local name=$1 r mode
  : >"$out/scaling-$name.log"
  for mode in "" --async; do
    start_daemon "$out/graphd-scaling$mode-$name.log" || { rc=1; return; }
    timeout 120 "$build/bench/scaling_bench" --socket "$sock" --seconds 2 \
      --clients-per-device "${GRAPHD_BENCH_CLIENTS:-8}" $mode 2>&1 | tee -a "$out/scaling-$name.log"
    r=${PIPESTATUS[0]}
    echo "scaling_bench $mode ($name) exit status $r"
    [[ $r == 0 ]] || rc=1
    stop_daemon
  done
}

# run_large NAME: large_bench (a program of real size, sync and async)
# against a fresh daemon.
run_large() {
  local name=$1 r
  start_daemon "$out/graphd-large-$name.log" --gpu-time-sample 1 || { rc=1; return; }
  timeout 300 "$build/bench/large_bench" --socket "$sock" --kernels "$build/tests/kernels" \
    2>&1 | tee "$out/large-$name.log"
  r=${PIPESTATUS[0]}
  echo "large_bench ($name) exit status $r"
  [[ $r == 0 ]] || rc=1
  stop_daemon
}

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$out/machine.txt"
[[ -x $bench ]] || { echo "no $bench: build with GRAPHD_BUILD_BENCH=ON"; exit 1; }

runs=" ${GRAPHD_BENCH_RUNS:-nomps mps} "
if [[ $runs == *" nomps "* ]]; then
echo "== 1. replay_bench without MPS (chain of 300)"
run_bench nomps 300 "$@"
fi

if [[ $runs == *" mps "* ]]; then
echo "== 2. replay_bench under MPS (-M), chain of 1000"
if start_mps; then
  run_bench mps 1000 "$@"
  [[ ${GRAPHD_BENCH_SCALING:-1} == 1 ]] && run_scaling mps
  [[ ${GRAPHD_BENCH_LARGE:-1} == 1 ]] && run_large mps
  stop_mps
else
  rc=1
fi
fi

echo "== report"
"$py" -c "import matplotlib" 2>/dev/null || py=python3
"$py" "$src/scripts/bench-report.py" "$out" || rc=1
exit $rc
