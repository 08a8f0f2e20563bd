#!/usr/bin/env bash
# An eviction transcript on the lent GPU machine: a JAX process makes two
# captures with large staging buffers (one per mode) and exits; then, on an
# otherwise quiet GPU, graphctl shows them (list, stats, status with the
# device's free memory), evicts one by program hash and the rest with --all,
# and status shows the free memory after each step. Runs from the repository
# root over a build bundled with scripts/gpu-bundle.sh. Every process is
# bounded by timeout. Exit status 1 when a step failed.
# Usage: scripts/evict-gpu.sh BUILD_DIR [FLOATS_PER_BUFFER]
set -uo pipefail
build=$(realpath "$1"); n=${2:-67108864}
src=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH="$build/rtlibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=${GRAPHD_JAX_PYTHON:-/opt/torch/.venv/bin/python3}
sock=/tmp/graphd-evict-$$.sock
ctl() { echo "\$ graphctl $*"; timeout 30 "$build/graphctl" --socket "$sock" "$@"; }
# The device's free memory (cuMemGetInfo, from the daemon) in bytes.
free_mem() {
  local f
  f=$(timeout 30 "$build/graphctl" --socket "$sock" status --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["devices"][0]["free_memory"])') || return 1
  echo "device 0 free memory $1: $f bytes"
}
rc=0

daemon_limit=300
# shellcheck source=scripts/gpu-daemon.sh
. "$src/scripts/gpu-daemon.sh"
start_daemon /tmp/graphd-evict.log || exit 1

GRAPHD_LIB="$build/libgraphd.so" GRAPHD_XLA_LIB="$build/libgraphd_xla.so" \
  GRAPHD_CUDA_KERNELS="$build/tests/kernels" PYTHONPATH="$src/client/python" \
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONDONTWRITEBYTECODE=1 GRAPHD_SOCKET="$sock" \
  timeout 120 "$py" - "$n" <<'PY' || rc=1
import os, sys
import jax, jax.numpy as jnp, numpy as np
import graphd, graphd.jax as gj
from graphd import Slot, f32, u32
n = int(sys.argv[1])
cubin = open(os.path.join(os.environ["GRAPHD_CUDA_KERNELS"], "test_kernels.cubin"), "rb").read()
mod = graphd.module_id("cubin", cubin)

def build(x, *, mode):
    p = graphd.Program(mode)
    a, b = p.add_slot("input", x.size * 4), p.add_slot("output", x.size * 4)
    p.launch(mod, "scale", grid=(x.size + 255) // 256, block=256,
             args=[Slot(a), Slot(b), f32(2.0), u32(x.size)])
    return gj.Spec(p, results=[x], operand_slots=[a], result_slots=[b], modules=[("cubin", cubin)])

for mode, size in (("staged", n), ("staged_ex", n // 4)):
    f = jax.jit(gj.program_callable(build, mode=mode))
    x = jnp.arange(size, dtype=jnp.float32)
    for _ in range(5):
        y = f(x)
    assert np.array_equal(np.asarray(y), 2 * np.arange(size, dtype=np.float32)), mode
    print(f"{mode}: 5 calls on {size} floats, output correct")
PY
ctl list || rc=1
ctl stats || rc=1
ctl status || rc=1
free_mem "with the captures" || rc=1
ctl evict --all --dry-run || rc=1
prog=$(timeout 30 "$build/graphctl" --socket "$sock" list --json |
  python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["program"])' 2>/dev/null)
if [[ -n $prog ]]; then ctl evict --program "$prog" || rc=1; free_mem "after evicting one" || rc=1; else echo "no program hash in list --json"; rc=1; fi
ctl evict --all || rc=1
free_mem "after evicting all" || rc=1
ctl status || rc=1
ctl list || rc=1
ctl stats --prometheus | grep -E '^graphd_(captures|staging|evictions|recaptures|replays)' || rc=1
stop_daemon
grep -iE "evict|error" /tmp/graphd-evict.log | tail -5
exit $rc
