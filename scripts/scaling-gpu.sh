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
mkdir -p "$out"
sock=/tmp/graphd-scaling-$$.sock
daemon_limit=300
# shellcheck source=scripts/gpu-daemon.sh
. "$(dirname "$0")/gpu-daemon.sh"
start_mps || exit 1
start_daemon "$out/graphd-scaling.log" || { stop_mps; exit 1; }
timeout 120 "$build/bench/scaling_bench" --socket "$sock" "$@"
rc=$?
echo "scaling_bench exit status $rc"
stop_daemon
stop_mps
exit $rc
