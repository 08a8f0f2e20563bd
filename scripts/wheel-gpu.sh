#!/usr/bin/env bash
# On a GPU machine: installs the Python package's wheel (built and repaired
# by scripts/wheel-test.sh) into a Python's environment the way a user does,
# `pip install --no-deps graphd-*.whl`, starts the wheel's own daemon as a
# user would, `graphd --backend cuda` on a socket of its own, checks that
# `graphctl status` sees the GPU, then runs the examples of docs/jax.md,
# docs/pytorch.md and docs/cupy.md as written, from an empty directory and
# with no PYTHONPATH, GRAPHD_LIB, GRAPHD_XLA_LIB or LD_LIBRARY_PATH: the
# package must find its own libraries. The package is uninstalled again at
# the end.
# Usage: scripts/wheel-gpu.sh WHEEL [PYTHON]
#   PYTHON: one with jax (CUDA), torch and cupy; default the GPU machine's
#   /opt/torch/.venv/bin/python3, else python3.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
whl=$(realpath "${1:?usage: scripts/wheel-gpu.sh WHEEL [PYTHON]}")
py=${2:-}
[[ -z $py && -x /opt/torch/.venv/bin/python3 ]] && py=/opt/torch/.venv/bin/python3
py=${py:-python3}
work=$(mktemp -d)
daemon=""
cleanup() {
  [[ -n $daemon ]] && kill "$daemon" 2>/dev/null && wait "$daemon" || true
  "$py" -m pip uninstall --quiet -y graphd >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "\$ $py -m pip install --no-deps $(basename "$whl")"
# A system Python that refuses installs (PEP 668) is told this one is meant.
"$py" -m pip install --no-deps --force-reinstall "$whl" ||
  "$py" -m pip install --no-deps --force-reinstall --break-system-packages "$whl"

cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
nvcc -cubin -arch="sm_$cap" -o "$work/scale.cubin" "$src/docs/examples/scale.cu"

# The console scripts pip put beside the Python.
bin=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
clean=(env -u PYTHONPATH -u GRAPHD_LIB -u GRAPHD_XLA_LIB -u LD_LIBRARY_PATH
  GRAPHD_SOCKET="$work/s" PYTHONDONTWRITEBYTECODE=1)
user() { (cd "$work" && "${clean[@]}" "$@"); }
echo "\$ graphd --backend cuda --socket \$SOCK"
# exec: $! is the daemon's pid (the console script execs the binary too).
(cd "$work" && exec "${clean[@]}" "$bin/graphd" --backend cuda --socket "$work/s" --log-level warn) &
daemon=$!
for _ in $(seq 400); do [[ -S $work/s ]] && break; sleep 0.025; done
[[ -S $work/s ]] || { echo "graphd did not create its socket"; exit 1; }
echo "\$ graphctl status"
user "$bin/graphctl" status | tee "$work/status"
grep -q "backend cuda" "$work/status" || { echo "FAILED: graphctl status shows no CUDA device"; exit 1; }

user "$py" -c 'import graphd, graphd._lib as l; print("graphd from", graphd.__file__); print("libgraphd", l.lib()._name)'
rc=0
for ex in "jax_scale.py scale.cubin" "torch_scale.py scale.cubin" "cupy_saxpy.py"; do
  set -- $ex
  cp "$src/docs/examples/$1" "$work/"
  echo "\$ GRAPHD_SOCKET=\$SOCK python3 $*"
  user "$py" "$@" || { echo "FAILED: $1"; rc=1; }
done
exit $rc
