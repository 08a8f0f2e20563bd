"""docs/cupy.md's example: a cupy.RawKernel (compiled by NVRTC) as a
graphd program, replayed on CuPy arrays on CuPy's current stream.

    GRAPHD_SOCKET=/run/graphd/graphd.sock python3 docs/examples/cupy_saxpy.py
"""
import cupy

import graphd
import graphd.cupy
from graphd import Program, Slot, f32, u32

source = r"""
extern "C" __global__ void saxpy(const float *x, float *y, float a, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}
"""
kernel = cupy.RawKernel(source, "saxpy")
n = 1 << 20
x = cupy.random.standard_normal(n, dtype=cupy.float32)
y = cupy.random.standard_normal(n, dtype=cupy.float32)

# CuPy's own launch, for comparison.
want = y.copy()
kernel((n // 256,), (256,), (x, want, cupy.float32(2.0), cupy.uint32(n)))

# The same kernel as a graphd program: y is read and written (inout).
k = graphd.cupy.Kernel(kernel)  # NVRTC -> CUBIN for this GPU
p = Program("staged")
xs = graphd.arrays.slot_like(p, "input", x)
ys = graphd.arrays.slot_like(p, "inout", y)
k.launch(p, n // 256, 256, [Slot(xs), Slot(ys), f32(2.0), u32(n)])

with graphd.cupy.connect() as c:  # a session on the current GPU
    c.register_module(*k.module)
    c.replay_arrays(p, x, y)
    assert bool((y == want).all())  # bit for bit

    # On a stream of its own: the replay follows CuPy's current stream.
    with cupy.cuda.Stream(non_blocking=True):
        y2 = cupy.zeros(n, dtype=cupy.float32)
        c.replay_arrays(p, x, y2)
        assert bool((y2 == 2 * x).all())
print("cupy_saxpy: ok")
