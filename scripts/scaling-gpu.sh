#!/usr/bin/env bash
# bench/scaling_bench (one process driving every GPU
# against one process per GPU) on the lent GPU machine, under MPS (-M),
# against a fresh daemon. Runs from the repository root over a build bundled
# with scripts/gpu-bundle.sh; every process is bounded by timeout.
# graphd runs at nice -5 as its systemd unit starts it (GRAPHD_BENCH_NICE).
# Usage: scripts/scaling-gpu.sh BUILD_DIR OUT_DIR [scaling_bench flags]
set -uo pipefail
build=$(realpath "$1"); out=${2:-/tmp}; shift 2 || shift $#
export LD_LIBRARY_PATH="$build/rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p "$out" $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
sock=/tmp/graphd-scaling-$$.sock
timeout 30 nvidia-cuda-mps-control -d -M || { echo "MPS did not start"; exit 1; }
sleep 1
daemon_limit=300
# shellcheck source=scripts/gpu-daemon.sh
. "$(dirname "$0")/gpu-daemon.sh"
start_daemon "$out/graphd-scaling.log" || { echo quit | timeout 30 nvidia-cuda-mps-control; exit 1; }
timeout 120 "$build/bench/scaling_bench" --socket "$sock" "$@"
rc=$?
echo "scaling_bench exit status $rc"
stop_daemon
echo quit | timeout 30 nvidia-cuda-mps-control
exit $rc
