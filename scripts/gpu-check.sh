#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root, over a build made
# here (same absolute path) and bundled with scripts/gpu-bundle.sh:
#  1. the GPU tests without MPS (GRAPHD_REQUIRE_GPU=1: a skip fails);
#  2. the unit tests there too;
#  3. the GPU tests under MPS (-M);
#  4. the GPU tests again with the daemon under compute-sanitizer memcheck
#     (API errors are not reported: the negative tests cause them on purpose,
#     and cuFuncGetParamInfo ends its list with one; memory errors and device
#     leaks are).
# Lines starting FIGURE are the measurements the tests print. The gpu label
# includes test_warp_gpu, which needs Warp on PYTHONPATH (or in
# $GRAPHD_WARP_PATH); without it that test fails here.
# Usage: scripts/gpu-check.sh BUILD_DIR OUT_DIR [STEPS]
#   STEPS: which of the steps to run, e.g. "1 3" (default "1 2 3 4").
set -uo pipefail
build=$(realpath "$1"); out=${2:-/tmp}; steps=" ${3:-1 2 3 4} "
want() { [[ $steps == *" $1 "* ]]; }
export LD_LIBRARY_PATH="$build/rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PATH:/usr/local/nvidia/bin" GRAPHD_REQUIRE_GPU=1
rc=0
pick='FIGURE|Test +#| \.\.\. |Ran [0-9]+ tests|: (OK|FAILED)|(FAIL|ERROR): |tests passed|tests failed|Assertion|device [0-9]:|refusal|JIT error|cudaMallocAsync'
nvidia-smi --query-gpu=index,name,uuid,memory.total,driver_version --format=csv,noheader
if want 1; then
echo "== 1. ctest -L gpu, no MPS"
(cd "$build" && GRAPHD_EXPECT_MPS=0 timeout 1500 ctest -L gpu --output-on-failure -V 2>&1) \
  | tee "$out/gpu-nomps.log" | grep -E "$pick"
grep -q "100% tests passed" "$out/gpu-nomps.log" || rc=1
fi
if want 2; then
echo "== 2. ctest -L unit"
(cd "$build" && timeout 300 ctest -L unit -j8 --output-on-failure 2>&1) | tee "$out/unit.log" \
  | grep -E "tests passed|tests failed|\*\*\*Failed"
grep -q "100% tests passed" "$out/unit.log" || rc=1
fi
if want 3; then
echo "== 3. ctest -L gpu under MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d -M && sleep 1
(cd "$build" && GRAPHD_EXPECT_MPS=1 timeout 1500 ctest -L gpu --output-on-failure -V 2>&1) \
  | tee "$out/gpu-mps.log" | grep -E "$pick"
grep -q "100% tests passed" "$out/gpu-mps.log" || rc=1
echo quit | nvidia-cuda-mps-control; sleep 1
unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if want 4; then
echo "== 4. GPU tests with the daemon under compute-sanitizer memcheck"
for t in "$build"/tests/test_gpu_*; do
  GRAPHD_TEST_KEEP=1 GRAPHD_TEST_WRAPPER="compute-sanitizer --tool memcheck --leak-check full --report-api-errors no --error-exitcode 9" \
    timeout 500 "$t" > "$out/memcheck-$(basename "$t").log" 2>&1
  r=$?; echo "$(basename "$t") under memcheck: exit $r"; [[ $r == 0 ]] || rc=1
done
grep -h "ERROR SUMMARY" /tmp/graphd-test-*/graphd.log | sort | uniq -c
fi
exit $rc
