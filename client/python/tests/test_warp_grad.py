"""graphd.warp's gradients without a GPU: jax_kernel(..., enable_backward=True)
lowers to two graphd programs, the kernel's forward launch and its adjoint
launch, and the adjoint program is what Warp's own backward runs: the input
gradients zeroed, then the kernel's backward entry over the primal inputs,
the primal outputs, the output cotangents and the input gradients, with
the forward's launch dimensions and block size and the static scalars
passed by value. jax.grad, jit(grad) and vmap lower to graphd calls of the
right shapes. The kernels are the shapes Warp's own JAX tests
differentiate. Skipped without warp or jax; CTest's test_python_warp runs
it beside test_warp."""

import ctypes
import os
import unittest

try:
    import numpy as np
    import warp as wp
    HAVE_WARP = True
    WHY = ""
except ImportError as e:
    HAVE_WARP = False
    WHY = f"warp is not importable ({e}); install warp-lang for these tests (docs/warp.md)"

try:
    import jax
    import jax.numpy as jnp
    HAVE_JAX = True
except ImportError:
    HAVE_JAX = False

import _env
from graphd import program as gprog

if HAVE_WARP:
    import graphd.warp as gw
    from _warp_grad_kernels import (extra_axis, outer_2d, scale_mat, scale_sum_square, scale_vec,
                                    times_block, two_outputs)
    from test_warp import custom_calls, natural_offsets, ptx_params

    @wp.kernel(module="det_fallback")
    def det_square(a: wp.array(dtype=float), s: float, c: wp.array(dtype=float)):
        tid = wp.tid()
        c[tid] = (a[tid] * s) ** 2.0

    @wp.kernel(enable_backward=False)
    def no_adjoint(a: wp.array(dtype=float), b: wp.array(dtype=float)):
        tid = wp.tid()
        b[tid] = a[tid]

ARCH = 90


@unittest.skipUnless(HAVE_WARP and HAVE_JAX, WHY or "jax is not importable")
class AdjointProgramTest(unittest.TestCase):
    def setUp(self):
        if _env.INSTALLED:
            _env.path(self, "GRAPHD_LIB")
            _env.path(self, "GRAPHD_XLA_LIB")
        elif not os.environ.get("GRAPHD_XLA_LIB") or not os.environ.get("GRAPHD_LIB"):
            raise unittest.SkipTest("$GRAPHD_LIB or $GRAPHD_XLA_LIB is not set (libgraphd_xla not built)")

    def lower(self, f, *args, static=()):
        return jax.jit(f, static_argnums=static).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    def only(self, callable_):
        (b,) = callable_.programs.values()
        return b

    def launch(self, built):
        (l,) = built.launches
        return l, built.program._steps[l.step]

    def check_ptx(self, l):
        """The launch's parameters are the backward entry's, as Warp's PTX lists them."""
        ptx = gw.compile_module(l.kernel.module, l.block_dim, ARCH, ptx=True).data
        want = natural_offsets(ptx_params(ptx, l.entry))
        self.assertEqual([(off, size) for _, off, size, _, _ in l.params], want, l.entry)

    def bounds(self, step, ndim):
        """(shape, size) of the ndim-dimensional launch bounds that start
        the parameters (the size after the shape, 8-aligned)."""
        shape = [int.from_bytes(step.data[4 * i:4 * i + 4], "little") for i in range(ndim)]
        at = 8 if ndim <= 2 else 16
        return shape, int.from_bytes(step.data[at:at + 8], "little")

    def test_jit_of_grad_is_the_forward_then_the_adjoint_program(self):
        k = gw.jax_kernel(scale_sum_square, num_outputs=1, enable_backward=True, device=ARCH)
        self.assertIsInstance(k, gw._grad.DifferentiableKernel)

        def loss(a, b, s):
            return jnp.sum(k(a, b, s)[0])

        n = 1000
        a = jnp.zeros(n, jnp.float32)
        calls = custom_calls(self.lower(jax.grad(loss, argnums=(0, 1)), a, a, 2.0, static=(2,)))
        fwd, bwd = self.only(k.forward), self.only(k.backward)
        # The forward: a, b in, c out. The adjoint: a, b, c and c's
        # cotangent in, the gradients of a and b out.
        self.assertEqual(calls, [(fwd.id_hex, [0, 1, 2]), (bwd.id_hex, [0, 1, 2, 3, 4, 5])])
        self.assertEqual([(s.role, s.name, s.nbytes) for s in bwd.slots],
                         [("input", "a", 4 * n), ("input", "b", 4 * n), ("input", "c", 4 * n),
                          ("input", "adj_c", 4 * n), ("output", "adj_a", 4 * n), ("output", "adj_b", 4 * n)])
        # Warp's backward zeroes the input gradients, then launches the adjoint.
        st = bwd.program._steps
        self.assertEqual([s.kind for s in st], [gprog.STEP_MEMSET, gprog.STEP_MEMSET, gprog.STEP_LAUNCH])
        self.assertEqual([(s.slot, s.offset, s.nbytes, s.value) for s in st[:2]], [(4, 0, 4 * n, 0), (5, 0, 4 * n, 0)])
        l, step = self.launch(bwd)
        self.assertRegex(l.entry, r"^scale_sum_square_[0-9a-f]{8}_cuda_kernel_backward$")
        self.assertIn(l.entry.encode(), l.module.data)
        (fl,) = fwd.launches
        self.assertEqual(fl.entry, l.entry.replace("_backward", "_forward"))
        self.assertIs(fl.module, l.module)  # one module holds both entries
        self.check_ptx(l)
        data = 0  # the array descriptor's data pointer: the patched field
        self.assertEqual([(p[0], p[4]) for p in l.params],
                         [("dim", []), ("a", [(data, 0, 0)]), ("b", [(data, 1, 0)]), ("s", []), ("c", [(data, 2, 0)]),
                          ("adj_a", [(data, 4, 0)]), ("adj_b", [(data, 5, 0)]), ("adj_s", []),
                          ("adj_c", [(data, 3, 0)])])
        # The static scalar is passed by value to both the primal and the
        # adjoint parameter, as Warp passes it.
        for name in ("s", "adj_s"):
            _, off, size, _, _ = [p for p in l.params if p[0] == name][0]
            self.assertEqual(bytes(step.data[off:off + size]), bytes(ctypes.c_float(2.0)))
        self.assertEqual(self.bounds(step, 1), ([n], n))
        self.assertEqual((l.grid, l.block_dim), ((4, 1, 1), 256))
        # Another static value: other programs, forward and adjoint.
        again = custom_calls(self.lower(jax.grad(loss, argnums=(0, 1)), a, a, 3.0, static=(2,)))
        self.assertEqual(len(k.forward.programs) + len(k.backward.programs), 4)
        self.assertNotEqual(again[0][0], fwd.id_hex)
        self.assertNotEqual(again[1][0], bwd.id_hex)
        # jax.grad alone (no jit around it) traces the same two calls.
        da, db = jax.eval_shape(jax.grad(lambda a, b: loss(a, b, 2.0), argnums=(0, 1)), a, a)
        self.assertEqual([(x.shape, x.dtype) for x in (da, db)], [((n,), jnp.float32)] * 2)

    def test_two_outputs_have_two_cotangents(self):
        k = gw.jax_kernel(two_outputs, num_outputs=2, enable_backward=True, device=ARCH)

        def loss(a, b):
            c, d = k(a, b, 2.0)
            return jnp.sum(c + d)

        a = jnp.zeros(64, jnp.float32)
        calls = custom_calls(self.lower(jax.grad(loss, argnums=(0, 1)), a, a))
        bwd = self.only(k.backward)
        self.assertEqual(calls[1], (bwd.id_hex, list(range(8))))
        self.assertEqual([(s.role, s.name) for s in bwd.slots],
                         [("input", "a"), ("input", "b"), ("input", "c"), ("input", "d"), ("input", "adj_c"),
                          ("input", "adj_d"), ("output", "adj_a"), ("output", "adj_b")])
        l, _ = self.launch(bwd)
        self.check_ptx(l)
        self.assertEqual([(p[0], p[4]) for p in l.params][6:],
                         [("adj_a", [(0, 6, 0)]), ("adj_b", [(0, 7, 0)]), ("adj_s", []), ("adj_c", [(0, 4, 0)]),
                          ("adj_d", [(0, 5, 0)])])

    def test_vector_and_matrix_arrays(self):
        for kernel, inner in ((scale_vec, (2,)), (scale_mat, (2, 2))):
            with self.subTest(kernel=kernel.key):
                k = gw.jax_kernel(kernel, num_outputs=1, enable_backward=True, device=ARCH)
                a = jnp.zeros((6,) + inner, jnp.float32)
                g = jax.grad(lambda a: jnp.sum(k(a, 3.0)[0]))
                calls = custom_calls(self.lower(g, a))
                bwd = self.only(k.backward)
                self.assertEqual(calls[1][0], bwd.id_hex)
                nbytes = 4 * int(np.prod((6,) + inner))
                self.assertEqual([(s.name, s.nbytes) for s in bwd.slots],
                                 [("a", nbytes), ("out", nbytes), ("adj_out", nbytes), ("adj_a", nbytes)])
                self.assertEqual(jax.eval_shape(g, a).shape, (6,) + inner)
                l, step = self.launch(bwd)
                self.check_ptx(l)
                self.assertEqual(self.bounds(step, 1), ([6], 6))

    def test_launch_dims_are_the_adjoints_too(self):
        n = 8
        k = gw.jax_kernel(extra_axis, num_outputs=1, launch_dims=(n, n, n), enable_backward=True, device=ARCH)
        a = jnp.zeros((4, n, n, n), jnp.float32)
        # The output has the input's shape, not the launch's.
        self.assertEqual(jax.eval_shape(lambda a: k(a)[0], a).shape, (4, n, n, n))
        g = jax.grad(lambda a: jnp.sum(k(a)[0]))
        self.assertEqual(jax.eval_shape(g, a).shape, (4, n, n, n))
        custom_calls(self.lower(g, a))
        for built in (self.only(k.forward), self.only(k.backward)):
            _, step = self.launch(built)
            self.assertEqual(self.bounds(step, 3), ([n, n, n], n ** 3))
        self.assertEqual([(s.name, s.nbytes) for s in self.only(k.backward).slots],
                         [("a", 4 * 4 * n ** 3), ("b", 4 * 4 * n ** 3), ("adj_b", 4 * 4 * n ** 3),
                          ("adj_a", 4 * 4 * n ** 3)])
        # Other launch dims: another wrapper with programs of its own.
        small = gw.jax_kernel(extra_axis, num_outputs=1, launch_dims=(4, 4, 4), enable_backward=True, device=ARCH)
        self.assertIsNot(small.backward, k.backward)
        custom_calls(self.lower(jax.grad(lambda a: jnp.sum(small(a)[0])), jnp.zeros((2, 4, 4, 4), jnp.float32)))
        _, step = self.launch(self.only(small.backward))
        self.assertEqual(self.bounds(step, 3), ([4, 4, 4], 64))

    def test_vmap_folds_the_batch_into_both_programs(self):
        outer, inner, n = 3, 4, 8
        k = gw.jax_kernel(outer_2d, num_outputs=1, launch_dims=(n, n), enable_backward=True, device=ARCH)
        batched = jax.vmap(k)
        a = jnp.zeros((outer, inner, n, n), jnp.float32)
        self.assertEqual(jax.eval_shape(lambda a: batched(a)[0], a).shape, (outer, inner, n, n))
        g = jax.grad(lambda a: jnp.sum(batched(a)[0]))
        self.assertEqual(jax.eval_shape(g, a).shape, (outer, inner, n, n))
        calls = custom_calls(self.lower(g, a))
        # (Tracing the vmapped function also builds the unbatched programs.)
        fwd, bwd = [{b.id_hex: b for b in c.programs.values()}[i] for c, (i, _) in zip((k.forward, k.backward), calls)]
        self.assertEqual(len(calls), 2)
        # One program for the whole batch, as Warp folds it: the batch axis
        # into the first, the launch over (n, n).
        whole = 4 * outer * inner * n * n
        self.assertEqual([s.nbytes for s in fwd.slots], [whole] * 2)
        self.assertEqual([s.nbytes for s in bwd.slots], [whole] * 4)
        for built in (fwd, bwd):
            _, step = self.launch(built)
            self.assertEqual(self.bounds(step, 2), ([n, n], n * n))

    def test_block_dim_is_the_adjoints_too(self):
        for block_dim, grid in ((None, 1), (64, 4), (np.int64(128), 2)):
            with self.subTest(block_dim=block_dim):
                k = gw.jax_kernel(times_block, num_outputs=1, block_dim=block_dim, enable_backward=True, device=ARCH)
                self.assertEqual(k.block_dim, None if block_dim is None else int(block_dim))
                custom_calls(self.lower(jax.grad(lambda a: jnp.sum(k(a)[0])), jnp.zeros(256, jnp.float32)))
                want = 256 if block_dim is None else int(block_dim)
                for built in (self.only(k.forward), self.only(k.backward)):
                    l, _ = self.launch(built)
                    self.assertEqual((l.block_dim, l.grid, l.module.block_dim), (want, (grid, 1, 1), want))

    def test_warp_refusals_and_cache(self):
        with self.assertRaises(NotImplementedError):
            gw.jax_kernel(scale_sum_square, output_dims={"c": (8,)}, enable_backward=True, device=ARCH)
        with self.assertRaises(NotImplementedError):
            gw.jax_kernel(two_outputs, num_outputs=2, in_out_argnames=["c"], enable_backward=True, device=ARCH)
        k = gw.jax_kernel(scale_sum_square, launch_dims=(8,), enable_backward=True, device=ARCH)
        a = jnp.zeros(8, jnp.float32)
        with self.assertRaisesRegex(TypeError, "launch_dims cannot be overridden per-call"):
            k(a, a, 1.0, launch_dims=(8,))
        with self.assertRaisesRegex(TypeError, "output_dims is not supported"):
            k(a, a, 1.0, output_dims={"c": (8,)})
        with self.assertRaisesRegex(TypeError, "vmap_method cannot be overridden per-call"):
            k(a, a, 1.0, vmap_method="sequential")
        # The same arguments share one differentiable function, as in Warp.
        again = gw.jax_kernel(scale_sum_square, launch_dims=(8,), enable_backward=True, device=ARCH)
        self.assertIs(again.forward, k.forward)
        self.assertIs(again.backward, k.backward)

    def test_kernel_without_an_adjoint_is_refused(self):
        k = gw.jax_kernel(no_adjoint, num_outputs=1, enable_backward=True, device=ARCH)
        with self.assertRaisesRegex(gw.Refused, "no_adjoint is compiled without its adjoint"):
            self.lower(jax.grad(lambda a: jnp.sum(k(a)[0])), jnp.zeros(8, jnp.float32))

    def test_install(self):
        import warp
        try:
            gw.install()
            k = warp.jax_kernel(scale_sum_square, enable_backward=True, device=ARCH)
            self.assertIsInstance(k, gw._grad.DifferentiableKernel)
        finally:
            gw.uninstall()

    def test_install_falls_back_for_both_launches(self):
        # A kernel in Warp's deterministic mode (hidden buffers graphd does
        # not allocate) is refused; under install() the forward and the
        # adjoint launch each run as Warp's own call, and the gradient is
        # Warp's.
        import logging
        import warp
        a = jnp.arange(16, dtype=jnp.float32) * 0.25
        opts = det_square.module.options
        saved = opts["deterministic"]
        opts["deterministic"] = wp.DeterministicMode.RUN_TO_RUN
        try:
            def loss(k):
                return lambda a: jnp.sum(k(a, 2.0)[0])

            with self.assertRaises(gw.Refused) as cm:
                self.lower(jax.grad(loss(gw.jax_kernel(det_square, enable_backward=True, device=ARCH))), a)
            self.assertEqual(cm.exception.reason, "kernel")
            try:
                gw.install()
                k = warp.jax_kernel(det_square, enable_backward=True, device=ARCH)
                with self.assertLogs("graphd.warp", logging.INFO) as logs:
                    text = self.lower(jax.grad(loss(k)), a)
                self.assertEqual(custom_calls(text), [])
                self.assertEqual(len(logs.records), 2)
                reasons = [[r.reason for r in c.fallbacks.values()] for c in (k.forward, k.backward)]
                self.assertEqual(reasons, [["kernel"], ["kernel"]])
                for c in (k.forward, k.backward):
                    self.assertEqual(text.count(f"custom_call @{c.warp_callable().name}("), 1)
                if wp.is_cpu_available():
                    got = jax.jit(jax.grad(loss(k)))(a)
                    np.testing.assert_array_equal(np.asarray(got), 8.0 * np.asarray(a))
            finally:
                gw.uninstall()
        finally:
            opts["deterministic"] = saved


@unittest.skipUnless(HAVE_WARP and HAVE_JAX, WHY or "jax is not importable")
class SameAsWarpOnTheCpuTest(unittest.TestCase):
    """The differentiable wrapper graphd.warp builds around its two
    callables, driven by Warp's own jax_callable on JAX's CPU (Warp's CPU
    backend runs the forward and the adjoint launch): its outputs and
    gradients are Warp's jax_kernel(..., enable_backward=True)'s, bit for
    bit. What the GPU adds (graphd's programs) is test_warp_grad_gpu's."""

    @classmethod
    def setUpClass(cls):
        if not wp.is_cpu_available():
            raise unittest.SkipTest("Warp's CPU backend (LLVM) is not available")
        if gw.installed():
            raise AssertionError("graphd.warp is installed: Warp's jax_callable is needed here")
        from warp._src.jax.ffi import jax_callable
        cls.warp_jax_callable = staticmethod(jax_callable)

    def ours(self, kernel, *args, enable_backward, **kwargs):
        """graphd.warp's differentiable wrapper around Warp's own jax_callable."""
        self.assertTrue(enable_backward)
        return gw._grad.differentiable_kernel(self.warp_jax_callable, kernel, *args, **kwargs)

    def same(self, make, run):
        ours = jax.tree.leaves(run(make(self.ours)))
        want = jax.tree.leaves(run(make(wp.jax_kernel)))
        self.assertEqual(len(ours), len(want))
        for g, w in zip(ours, want):
            g, w = np.asarray(g), np.asarray(w)
            self.assertEqual((g.shape, g.dtype), (w.shape, w.dtype))
            self.assertTrue(np.array_equal(g.view(np.uint8), w.view(np.uint8)), f"{g} != {w}")

    def test_gradients_are_warps(self):
        a = jnp.arange(64, dtype=jnp.float32) * 0.25 - 3.0
        b = jnp.linspace(-1.0, 2.0, 64, dtype=jnp.float32)

        def loss(f, s):
            return lambda a, b: sum(jnp.sum(o ** 2) for o in f(a, b, s))

        self.same(lambda jk: jk(scale_sum_square, 1, enable_backward=True),
                  lambda f: jax.jit(jax.grad(loss(f, 2.0), argnums=(0, 1)))(a, b))
        self.same(lambda jk: jk(two_outputs, 2, enable_backward=True),
                  lambda f: (f(a, b, 3.0), jax.grad(loss(f, 3.0), argnums=(0, 1))(a, b)))
        for kernel, shape in ((scale_vec, (6, 2)), (scale_mat, (3, 2, 2))):
            x = jnp.arange(int(np.prod(shape)), dtype=jnp.float32).reshape(shape) * 0.5
            self.same(lambda jk, k=kernel: jk(k, 1, enable_backward=True),
                      lambda f, x=x: jax.grad(lambda x: jnp.sum(f(x, 1.5)[0] ** 2))(x))

    def test_launch_dims_and_vmap_are_warps(self):
        x = jnp.arange(2 * 4 * 4 * 4, dtype=jnp.float32).reshape((2, 4, 4, 4)) * 0.125
        self.same(lambda jk: jk(extra_axis, 1, launch_dims=(4, 4, 4), enable_backward=True),
                  lambda f: (f(x)[0], jax.grad(lambda x: jnp.sum(f(x)[0] ** 2))(x)))
        y = jnp.arange(3 * 4 * 8 * 8, dtype=jnp.float32).reshape((3, 4, 8, 8)) * 0.125
        self.same(lambda jk: jk(outer_2d, 1, launch_dims=(8, 8), enable_backward=True),
                  lambda f: (jax.vmap(f)(y)[0], jax.grad(lambda y: jnp.sum(jax.vmap(f)(y)[0] ** 2))(y)))


if __name__ == "__main__":
    unittest.main()
