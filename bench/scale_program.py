"""The JAX benches' graphd step: the test kernels' `scale` (y = 2 x) as a
graphd program built for whatever array JAX traces, for
graphd.jax.program_callable. The CUBIN comes from $GRAPHD_CUDA_KERNELS."""

import os


def doubler(mode, sync):
    """program_callable of y = 2 x through graphd, in `mode`, sync or async."""
    import graphd
    import graphd.jax as gj
    from graphd import Slot, f32, u32
    with open(os.path.join(os.environ["GRAPHD_CUDA_KERNELS"], "test_kernels.cubin"), "rb") as f:
        cubin = f.read()
    mod = graphd.module_id("cubin", cubin)

    def build(x, *, mode):
        n, nb = x.size, x.size * 4
        p = graphd.Program(mode)
        xs, ys = p.add_slot("input", nb), p.add_slot("output", nb)
        p.launch(mod, "scale", grid=(n + 255) // 256, block=256,
                 args=[Slot(xs), Slot(ys), f32(2.0), u32(n)])
        return gj.Spec(p, results=[x], operand_slots=[xs], result_slots=[ys],
                       modules=[("cubin", cubin)])
    return gj.program_callable(build, mode=mode, sync=sync)
