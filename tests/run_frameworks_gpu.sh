#!/bin/sh
# ctest's test_frameworks_gpu: client/python/tests/test_frameworks_gpu.py
# (PyTorch and CuPy through Client.replay, and the examples of
# docs/pytorch.md and docs/cupy.md) in a python that has torch and cupy
# ($GRAPHD_TORCH_PYTHON, else the GPU machine's /opt/torch/.venv/bin/python3,
# else python3). Exits 77 (skip) without a GPU, unless GRAPHD_REQUIRE_GPU=1,
# where a missing GPU, torch or cupy fails.
py=${GRAPHD_TORCH_PYTHON:-}
[ -z "$py" ] && [ -x /opt/torch/.venv/bin/python3 ] && py=/opt/torch/.venv/bin/python3
[ -z "$py" ] && py=python3
if [ ! -e /dev/nvidia0 ] && [ "${GRAPHD_REQUIRE_GPU:-0}" != 1 ]; then
  echo "no GPU: skipping"
  exit 77
fi
cd "$(dirname "$0")/../client/python/tests" || exit 1
exec timeout -k 10 "${GRAPHD_FRAMEWORKS_GPU_TIMEOUT:-540}" "$py" -m unittest test_frameworks_gpu -v
