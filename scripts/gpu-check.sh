#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root, over a build made
# here (same absolute path) and bundled with scripts/gpu-bundle.sh:
# the whole ctest suite without MPS, then the GPU tests under MPS (-M).
# Usage: scripts/gpu-check.sh BUILD_DIR OUT_DIR
set -uo pipefail
build=$(realpath "$1"); out=${2:-/tmp}
export LD_LIBRARY_PATH="$build/rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:/usr/local/nvidia/bin"
export GRAPHD_REQUIRE_GPU=1 CK_VERBOSITY=verbose
rc=0
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv
echo "== ldd graphd | grep libcuda (expect nothing)"; ldd "$build/graphd" | grep libcuda
echo "== ctest, no MPS"
(cd "$build" && GRAPHD_EXPECT_MPS=0 timeout 400 ctest --output-on-failure -V 2>&1) \
  | tee "$out/ctest-nomps.log" | grep -E "^[0-9]+/|tests passed|PASS|FAIL|Passed|Failed|device [0-9]:" || true
grep -q "100% tests passed" "$out/ctest-nomps.log" || rc=1
echo "== graphd status, no MPS"
sock=/tmp/graphd-gpucheck.sock
timeout 30 "$build/graphd" --backend cuda --socket $sock 2>"$out/graphd-nomps.log" &
for i in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
timeout 10 "$build/graphctl" --socket $sock status; timeout 10 "$build/graphctl" --socket $sock status --json > "$out/status-nomps.json"
kill -TERM %1; wait %1; echo "graphd exit $?"; grep -E "WARN|ERROR" "$out/graphd-nomps.log"
echo "== MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d -M && sleep 1
(cd "$build" && GRAPHD_EXPECT_MPS=1 timeout 300 ctest -L gpu --output-on-failure -V 2>&1) \
  | tee "$out/ctest-mps.log" | grep -E "^[0-9]+/|tests passed|Passed|Failed|device [0-9]:" || true
grep -q "100% tests passed" "$out/ctest-mps.log" || rc=1
timeout 30 "$build/graphd" --backend cuda --socket $sock 2>"$out/graphd-mps.log" &
for i in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
timeout 10 "$build/graphctl" --socket $sock status
kill -TERM %1; wait %1; echo "graphd exit $?"
echo quit | nvidia-cuda-mps-control; sleep 1
exit $rc
