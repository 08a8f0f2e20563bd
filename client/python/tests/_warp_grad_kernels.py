"""The Warp kernels that the gradient tests launch (test_warp_grad on the
CPU, test_warp_grad_gpu on a GPU), each with an adjoint. Imports Warp:
import it only where Warp is importable."""

import warp as wp


@wp.kernel
def scale_sum_square(a: wp.array(dtype=float), b: wp.array(dtype=float), s: float, c: wp.array(dtype=float)):
    tid = wp.tid()
    c[tid] = (a[tid] * s + b[tid]) ** 2.0


@wp.kernel
def two_outputs(a: wp.array(dtype=float), b: wp.array(dtype=float), s: float, c: wp.array(dtype=float),
                d: wp.array(dtype=float)):
    tid = wp.tid()
    c[tid] = a[tid] ** 2.0
    d[tid] = a[tid] * b[tid] * s


@wp.kernel
def scale_vec(a: wp.array(dtype=wp.vec2), s: float, out: wp.array(dtype=wp.vec2)):
    tid = wp.tid()
    out[tid] = a[tid] * s


@wp.kernel
def scale_mat(a: wp.array(dtype=wp.mat22), s: float, out: wp.array(dtype=wp.mat22)):
    tid = wp.tid()
    out[tid] = a[tid] * s


@wp.kernel(module="unique")
def times_block(a: wp.array(dtype=float), b: wp.array(dtype=float)):
    tid = wp.tid()
    b[tid] = a[tid] * float(wp.block_dim())


@wp.kernel
def extra_axis(a: wp.array4d(dtype=float), b: wp.array4d(dtype=float)):
    """A 3-D launch over 4-D arrays: the outer axis is looped over."""
    i, j, k = wp.tid()
    for m in range(a.shape[0]):
        b[m, i, j, k] = a[m, i, j, k] * 2.0


@wp.kernel
def outer_2d(a: wp.array3d(dtype=float), b: wp.array3d(dtype=float)):
    i, j = wp.tid()
    for m in range(a.shape[0]):
        b[m, i, j] = a[m, i, j] * 2.0
