"""docs/jax.md's example: a CUDA kernel as a graphd program, called from
inside jax.jit, in a lax.scan and under vmap.

    nvcc -cubin -arch=sm_90 -o scale.cubin docs/examples/scale.cu
    GRAPHD_SOCKET=/run/graphd/graphd.sock python3 docs/examples/jax_scale.py scale.cubin
"""
import sys

import jax
import jax.numpy as jnp

import graphd
import graphd.jax
from graphd import Slot, f32, u32

cubin = open(sys.argv[1], "rb").read()
mod = graphd.module_id("cubin", cubin)


def build(x, *, mode):
    """The program for operands of x's shape and dtype (jax.ShapeDtypeStruct):
    y = 2 * x over every element. Called once per shape."""
    nbytes = x.size * x.dtype.itemsize
    p = graphd.Program(mode)
    xs, ys = p.add_slot("input", nbytes), p.add_slot("output", nbytes)
    p.launch(mod, "scale", grid=(x.size + 255) // 256, block=256,
             args=[Slot(xs), Slot(ys), f32(2.0), u32(x.size)])
    return graphd.jax.Spec(p, results=[x], operand_slots=[xs], result_slots=[ys],
                           modules=[("cubin", cubin)])


scale = graphd.jax.program_callable(build, vmap_method="broadcast_all")
x = jax.random.normal(jax.random.key(0), (1 << 16,), jnp.float32)

# Inside jit: captured once by the daemon, then replayed on XLA's buffers.
y = jax.jit(scale)(x)
assert bool((y == 2 * x).all())


# In a scan: 100 steps, each a replay on whatever buffers XLA picks,
# against the same scan in plain JAX.
def run(double):
    def step(c, _):
        return double(c) * 0.5 + 1.0, None
    return jax.jit(lambda x: jax.lax.scan(step, x, None, length=100)[0])


assert bool((run(scale)(x) == run(lambda c: 2 * c)(x)).all())

# Under vmap: broadcast_all builds one program for the whole batch.
batch = jnp.stack([x, -x, x + 1.0])
assert bool((jax.jit(jax.vmap(scale))(batch) == 2 * batch).all())
print("jax_scale: ok")
