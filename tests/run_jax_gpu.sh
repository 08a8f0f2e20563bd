#!/bin/sh
# ctest's test_jax_gpu: client/python/tests/test_jax_gpu.py in a python that
# has jax with CUDA ($GRAPHD_JAX_PYTHON, else the GPU machine's
# /opt/torch/.venv/bin/python3, else python3). Exits 77 (skip) without a
# GPU, unless GRAPHD_REQUIRE_GPU=1, where a missing GPU or jax fails.
py=${GRAPHD_JAX_PYTHON:-}
[ -z "$py" ] && [ -x /opt/torch/.venv/bin/python3 ] && py=/opt/torch/.venv/bin/python3
[ -z "$py" ] && py=python3
if [ ! -e /dev/nvidia0 ] && [ "${GRAPHD_REQUIRE_GPU:-0}" != 1 ]; then
  echo "no GPU: skipping"
  exit 77
fi
cd "$(dirname "$0")/../client/python/tests" || exit 1
exec "$py" -m unittest test_jax_gpu -v
