"""graphd.warp's gradients on the GPU, against Warp's own: every shape of
use of jax_kernel(..., enable_backward=True) in Warp's JAX tests
(warp/tests/interop/test_jax.py) runs through graphd.warp.jax_kernel and
through Warp's jax_kernel in the same process, and the outputs and
gradients are compared bit for bit:

- jax.grad of a jitted loss with a static scalar, jit(grad), and grad with
  no jit at all (scale_sum_square);
- two outputs, both cotangents used, under jit(grad) (two_outputs);
- 2-D arrays, vec2 and mat22 arrays;
- pmap(grad) over every local GPU;
- block_dim None, 64 and 128 (the result depends on the block size);
- explicit launch_dims narrower than the arrays, two wrappers of other
  launch_dims side by side, and launch_dims under vmap.

Each program of graphd's is captured once by the daemon and replayed: a
jit(grad) called twice replays the adjoint program's one capture twice.

Run by tests/run_warp_gpu.sh test_warp_grad_gpu (ctest label gpu) in a
python with jax for CUDA and Warp, against a daemon it starts
($GRAPHD_BIN). Without a GPU, jax or Warp it skips; with
GRAPHD_REQUIRE_GPU=1 each of those is a failure."""

import os
import tempfile
import unittest
from functools import partial

from _gpu_common import Daemon, GpuTestCase, require_built, unavailable

try:
    import numpy as np
    import warp as wp
    WARP_ERROR = None
except Exception as e:  # noqa: BLE001: any failure to import Warp
    WARP_ERROR = e

if WARP_ERROR is None:
    from _warp_grad_kernels import (extra_axis, outer_2d, scale_mat, scale_sum_square, scale_vec,
                                    times_block, two_outputs)

    @wp.kernel
    def inc_2d(x: wp.array2d(dtype=float), y: wp.array2d(dtype=float)):
        i, j = wp.tid()
        y[i, j] = x[i, j] + 1.0

    @wp.kernel
    def triple(a: wp.array(dtype=float), b: wp.array(dtype=float)):
        tid = wp.tid()
        b[tid] = 3.0 * a[tid]


def _check_environment():
    try:
        import jax
        if not jax.devices("gpu"):
            unavailable("jax sees no GPU")
    except (ImportError, RuntimeError) as e:
        unavailable(f"no jax with CUDA here ({e})")
    if WARP_ERROR is not None:
        unavailable(f"Warp is not importable ({WARP_ERROR}); put warp-lang on PYTHONPATH "
                    "(or in $GRAPHD_WARP_PATH for tests/run_warp_gpu.sh)")
    import graphd.warp as gw
    try:
        gw.warp_modules()
    except gw.Refused as e:
        unavailable(f"graphd.warp refuses this Warp: {e}")
    require_built("GRAPHD_BIN", "GRAPHD_LIB", "GRAPHD_XLA_LIB")


class WarpGradGpuTest(GpuTestCase):
    @classmethod
    def setUpClass(cls):
        _check_environment()
        import jax
        import jax.numpy as jnp
        import graphd
        import graphd.warp as gw
        cls.jax, cls.jnp, cls.graphd, cls.gw = jax, jnp, graphd, gw
        cls.dir = tempfile.mkdtemp(prefix="graphd-warp-grad-")
        cls.daemon = Daemon(os.path.join(cls.dir, "graphd.sock"), os.path.join(cls.dir, "graphd.log"))
        os.environ["GRAPHD_SOCKET"] = cls.daemon.sock
        cls.daemon.start()
        try:
            # Warp's own jax_kernel, whose differentiable path calls Warp's
            # own jax_callable: neither may be graphd's here.
            if gw.installed():
                gw.uninstall()
            cls.warp_jax_kernel = staticmethod(wp.jax_kernel)
            wp.init()
            print(f"FIGURE Warp {wp.__version__}, jax {jax.__version__}, {jax.local_device_count()} device(s) "
                  f"{jax.devices('gpu')[0].device_kind}")
        except BaseException:
            cls.daemon.stop()
            raise

    def both(self, what, make, run):
        """run(make(jax_kernel)) with graphd.warp's jax_kernel, then with
        Warp's, each blocked on (a graphd recording must not overlap Warp
        work); every array of the results equal bit for bit. Returns
        graphd's wrapper and results."""
        jax = self.jax
        ours = make(self.gw.jax_kernel)
        got = jax.tree.leaves(jax.block_until_ready(run(ours)))
        want = jax.tree.leaves(jax.block_until_ready(run(make(self.warp_jax_kernel))))
        self.assertEqual(len(got), len(want), what)
        for i, (g, w) in enumerate(zip(got, want)):
            g, w = np.asarray(g), np.asarray(w)
            self.assertEqual((g.shape, g.dtype), (w.shape, w.dtype), f"{what}: result {i}")
            self.assertTrue(np.array_equal(g.view(np.uint8), w.view(np.uint8)),
                            f"{what}: result {i} differs, max |diff| {np.max(np.abs(g - w))}")
        print(f"FIGURE {what}: {len(got)} arrays bit for bit equal to Warp's")
        return ours, got

    def captures_of(self, pid_hex):
        with self.graphd.Client.connect(self.daemon.sock) as c:
            return [x for x in c.list_captures() if x["program"] == pid_hex]

    def inputs(self, n=1024):
        jnp = self.jnp
        return jnp.arange(n, dtype=jnp.float32) * 0.25 - 7.0, jnp.linspace(-1.0, 2.0, n, dtype=jnp.float32)

    def test_a_grad_jit_of_grad_and_no_jit(self):
        jax, jnp = self.jax, self.jnp
        a, b = self.inputs()

        def make(jk):
            return jk(scale_sum_square, num_outputs=1, enable_backward=True)

        def loss_of(f):
            return lambda a, b, s: jnp.sum(f(a, b, s)[0])

        self.both("grad of a jitted loss (static s)", make,
                  lambda f: jax.grad(partial(jax.jit, static_argnames=["s"])(loss_of(f)), argnums=(0, 1))(a, b, 2.0))
        self.both("jit(grad) with static s", make,
                  lambda f: jax.jit(jax.grad(loss_of(f), argnums=(0, 1)), static_argnames=("s",))(a, b, 2.0))
        ours, _ = self.both("grad with no jit", make, lambda f: jax.grad(loss_of(f), argnums=(0, 1))(a, b, 1.5))
        self.both("the forward alone", make, lambda f: f(a, b, 2.0))
        # The adjoint is a graphd program like any other: one capture,
        # replayed at each call.
        before = {x.id_hex for x in ours.backward.programs.values()}
        g = jax.jit(jax.grad(loss_of(ours), argnums=(0, 1)), static_argnames=("s",))
        for _ in range(2):
            jax.block_until_ready(g(a, b, 0.5))
        (new,) = {x.id_hex for x in ours.backward.programs.values()} - before  # s = 0.5: another program
        caps = self.captures_of(new)
        self.assertEqual([c["replays"] for c in caps], [2], caps)

    def test_b_two_outputs(self):
        jax, jnp = self.jax, self.jnp
        a, b = self.inputs()

        def make(jk):
            return jk(two_outputs, num_outputs=2, enable_backward=True)

        def run(f):
            @jax.jit
            def grads(a, b):
                def loss(a, b):
                    c, d = f(a, b, 2.0)
                    return jnp.sum(c + d)
                return jax.grad(loss, argnums=(0, 1))(a, b)
            return grads(a, b)

        self.both("two outputs, jit(grad)", make, run)
        self.both("two outputs, only the first used", make,
                  lambda f: jax.grad(lambda a, b: jnp.sum(f(a, b, 3.0)[0]), argnums=(0, 1))(a, b))

    def test_c_2d_vec2_mat22(self):
        jax, jnp = self.jax, self.jnp
        x = jnp.arange(8 * 6, dtype=jnp.float32).reshape((8, 6)) * 0.5
        self.both("2-D arrays", lambda jk: jk(inc_2d, num_outputs=1, enable_backward=True),
                  lambda f: jax.grad(jax.jit(lambda a: jnp.sum(f(a)[0] ** 2)))(x))
        v = jnp.arange(64, dtype=jnp.float32).reshape((32, 2)) * 0.1
        m = jnp.arange(48, dtype=jnp.float32).reshape((12, 2, 2)) * 0.1
        for what, kernel, arr, s in (("vec2 arrays", scale_vec, v, 3.0), ("mat22 arrays", scale_mat, m, 2.5)):
            self.both(what, lambda jk, k=kernel: jk(k, num_outputs=1, enable_backward=True),
                      lambda f, arr=arr, s=s: jax.grad(
                          partial(jax.jit, static_argnames=("s",))(lambda a, s: jnp.sum(f(a, s)[0] ** 2)))(arr, s))

    def test_d_pmap(self):
        jax, jnp = self.jax, self.jnp
        ndev = jax.local_device_count()
        x = jnp.arange(ndev * 256, dtype=jnp.float32).reshape((ndev, 256)) * 0.5
        self.both(f"pmap(grad) over {ndev} device(s)", lambda jk: jk(triple, num_outputs=1, enable_backward=True),
                  lambda f: jax.pmap(jax.grad(lambda x: jnp.sum(f(x)[0] ** 2)))(x))

    def test_e_block_dim(self):
        jax, jnp = self.jax, self.jnp
        x = jnp.arange(256, dtype=jnp.float32)
        for block_dim in (None, 64, 128):
            ours, (out, grad) = self.both(
                f"block_dim {block_dim}",
                lambda jk, bd=block_dim: jk(times_block, num_outputs=1, block_dim=bd, enable_backward=True),
                lambda f: (f(x)[0], jax.grad(lambda a: jnp.sum(f(a)[0]))(x)))
            scale = 256.0 if block_dim is None else float(block_dim)
            self.assertTrue(np.array_equal(np.asarray(grad), np.full(256, scale, np.float32)), block_dim)
            self.assertEqual(ours.block_dim, block_dim)

    def test_f_launch_dims(self):
        jax, jnp = self.jax, self.jnp

        def run(f, shape):
            a = jnp.arange(int(np.prod(shape)), dtype=jnp.float32).reshape(shape) * 0.125
            return f(a)[0], jax.grad(lambda a: jnp.sum(f(a)[0] ** 2))(a)

        for dims, shape in (((8, 8, 8), (4, 8, 8, 8)), ((4, 4, 4), (2, 4, 4, 4))):
            self.both(f"launch_dims {dims} over {shape}",
                      lambda jk, d=dims: jk(extra_axis, num_outputs=1, launch_dims=d, enable_backward=True),
                      lambda f, s=shape: run(f, s))
        # Two wrappers of other launch dims, used side by side.
        self.both("two wrappers of other launch_dims",
                  lambda jk: (jk(extra_axis, num_outputs=1, launch_dims=(4, 4, 4), enable_backward=True),
                              jk(extra_axis, num_outputs=1, launch_dims=(8, 8, 8), enable_backward=True)),
                  lambda fs: (run(fs[0], (2, 4, 4, 4)), run(fs[1], (2, 8, 8, 8))))

    def test_g_launch_dims_under_vmap(self):
        jax, jnp = self.jax, self.jnp
        a = jnp.arange(3 * 4 * 8 * 8, dtype=jnp.float32).reshape((3, 4, 8, 8)) * 0.125

        def run(f):
            batched = jax.vmap(f)
            return batched(a)[0], jax.grad(lambda x: jnp.sum(batched(x)[0] ** 2))(a)

        self.both("launch_dims (8, 8) under vmap",
                  lambda jk: jk(outer_2d, num_outputs=1, launch_dims=(8, 8), enable_backward=True), run)


if __name__ == "__main__":
    unittest.main()
