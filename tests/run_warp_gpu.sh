#!/bin/sh
# ctest's test_warp_gpu and test_mjx_gpu: client/python/tests/MODULE.py
# (run_warp_gpu.sh [MODULE], test_warp_gpu by default) in a python that has
# jax with CUDA ($GRAPHD_JAX_PYTHON, else the GPU machine's
# /opt/torch/.venv/bin/python3, else python3) and Warp (for test_mjx_gpu
# warp-lang 1.18, mujoco 3.17 and mujoco-mjx 3.17): on the PYTHONPATH the
# run is given, or in $GRAPHD_WARP_PATH (a directory holding warp/).
# graphd's package ($GRAPHD_PYTHON_DIR, which ctest sets) goes first.
# Exits 77 (skip) without a GPU, unless GRAPHD_REQUIRE_GPU=1, where a
# missing GPU, jax or Warp fails. Bounded by $GRAPHD_WARP_GPU_TIMEOUT
# seconds (840).
py=${GRAPHD_JAX_PYTHON:-}
[ -z "$py" ] && [ -x /opt/torch/.venv/bin/python3 ] && py=/opt/torch/.venv/bin/python3
[ -z "$py" ] && py=python3
if [ ! -e /dev/nvidia0 ] && [ "${GRAPHD_REQUIRE_GPU:-0}" != 1 ]; then
  echo "no GPU: skipping"
  exit 77
fi
here=$(cd "$(dirname "$0")" && pwd)
pkg=${GRAPHD_PYTHON_DIR:-$here/../client/python}
PYTHONPATH="$pkg${GRAPHD_WARP_PATH:+:$GRAPHD_WARP_PATH}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
cd "$here/../client/python/tests" || exit 1
exec timeout -k 10 "${GRAPHD_WARP_GPU_TIMEOUT:-840}" "$py" -m unittest "${1:-test_warp_gpu}" -v
