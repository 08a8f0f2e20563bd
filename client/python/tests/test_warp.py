"""graphd.warp without a GPU: Warp functions become graphd programs whose
launches match the parameter lists of the CUDA entries Warp generates (the
`.entry` `.param` list of the PTX from Warp's NVRTC), with stable ids, and
every refusal names its reason. The JAX part lowers for CUDA on the CPU
jaxlib. Skipped when warp (warp-lang) cannot be imported; CTest's
test_python_warp runs it with the warp-lang that scripts/py-deps.sh
installs under build/pywarp."""

import ctypes
import os
import re
import struct
import subprocess
import sys
import tempfile
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
from graphd.errors import GraphdError

ARCH = 90

if HAVE_WARP:
    import graphd.warp as gw
    from graphd.warp import _captures as gw_captures  # where a dropped program is evicted
    from graphd.warp._core import FuncSpec, Function

    @wp.struct
    class Body:
        mass: float
        pos: wp.array(dtype=wp.vec3)
        vel: wp.array(dtype=wp.vec3)
        tag: wp.int32

    @wp.kernel
    def scale(x: wp.array(dtype=float), y: wp.array(dtype=float), a: float):
        i = wp.tid()
        y[i] = a * x[i]

    @wp.kernel
    def integrate(b: Body, dt: float, g: wp.vec3, out: wp.array(dtype=wp.vec3)):
        i = wp.tid()
        v = b.vel[i] + g * dt
        out[i] = b.pos[i] + v * dt

    @wp.kernel
    def grid_add(a: wp.array2d(dtype=wp.vec3), acc: wp.array2d(dtype=wp.vec3), s: wp.float64, n: wp.int64,
                 flag: wp.bool, m: wp.mat22):
        i, j = wp.tid()
        acc[i, j] = acc[i, j] + a[i, j] * wp.float32(s)

    @wp.kernel
    def count(x: wp.array(dtype=float), total: wp.array(dtype=wp.int32)):
        i = wp.tid()
        if x[i] > 0.0:
            wp.atomic_add(total, 0, 1)

    @wp.kernel
    def many(a0: wp.array(dtype=float), a1: wp.array(dtype=float), a2: wp.array(dtype=float),
             a3: wp.array(dtype=float), a4: wp.array(dtype=float), a5: wp.array(dtype=float),
             a6: wp.array(dtype=float), a7: wp.array(dtype=float)):
        i = wp.tid()
        a7[i] = a0[i] + a1[i] + a2[i] + a3[i] + a4[i] + a5[i] + a6[i]

    @wp.kernel
    def cond_step(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        i = wp.tid()
        x[i] = x[i] * 0.5

    def physics(x: wp.array(dtype=float), pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3),
                grid: wp.array2d(dtype=wp.vec3), dt: float,
                acc: wp.array2d(dtype=wp.vec3), y: wp.array(dtype=float), newpos: wp.array(dtype=wp.vec3),
                hits: wp.array(dtype=wp.int32)):
        """Several kernels, a struct, vectors, 2-D arrays, an in-out
        argument (acc), a static scalar (dt), temp arrays, memsets, a
        fill and a copy."""
        n = x.shape[0]
        tmp = wp.zeros(n, dtype=float)                       # temp + memset
        wp.launch(scale, dim=n, inputs=[x, tmp, 2.0])
        wp.copy(y, tmp)                                      # copy
        b = Body()
        b.mass = 1.5
        b.pos = pos
        b.vel = vel
        b.tag = 7
        wp.launch(integrate, dim=pos.shape[0], inputs=[b, dt, wp.vec3(0.0, -9.8, 0.0)], outputs=[newpos])
        wp.launch(grid_add, dim=grid.shape, inputs=[grid, acc, wp.float64(0.5), wp.int64(3), True,
                                                    wp.mat22(1.0, 2.0, 3.0, 4.0)])
        hits.fill_(0)                                        # memset through memtile
        wp.launch(count, dim=n, inputs=[x[1:], hits], block_dim=128)   # a view, another block size

    SHAPES = {0: (1000,), 1: (64,), 2: (64,), 3: (8, 16), 5: (8, 16), 6: (1000,), 7: (64,), 8: (1,)}


def physics_spec():
    return FuncSpec.of_function(physics, 4, in_out_argnames=["acc"])


# --- the PTX parameter list -----------------------------------------------------

_PTX_SCALAR = {"8": 1, "16": 2, "32": 4, "64": 8}


def ptx_params(ptx, entry):
    """[(align, size)] of the .entry's parameters, from Warp's PTX."""
    text = ptx.decode("utf-8", "replace") if isinstance(ptx, bytes) else ptx
    m = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", text, re.S)
    assert m, f"no .entry {entry} in the PTX"
    out = []
    for line in m.group(1).split(","):
        line = line.strip()
        if not line:
            continue
        a = re.match(r"\.param\s+\.align\s+(\d+)\s+\.b8\s+\w+\[(\d+)\]", line)
        if a:
            out.append((int(a.group(1)), int(a.group(2))))
            continue
        s = re.match(r"\.param\s+\.[bsuf](8|16|32|64)\s+\w+", line)
        assert s, f"unparsed parameter {line!r}"
        n = _PTX_SCALAR[s.group(1)]
        out.append((n, n))
    return out


def natural_offsets(params):
    off, out = 0, []
    for align, size in params:
        off = (off + align - 1) // align * align
        out.append((off, size))
        off += size
    return out


class NativeStandIns:
    """Within the block, Warp's native wp_bvh_refit_device and
    wp_mesh_refit_device (work on a CUDA device) are functions that note
    each call in `ran` as (what, id)."""

    NAMES = {"wp_bvh_refit_device": "bvh", "wp_mesh_refit_device": "mesh"}

    def __enter__(self):
        self.core = wp._src.context.runtime.core
        self.saved = {n: getattr(self.core, n) for n in self.NAMES}
        self.ran = []
        for n, what in self.NAMES.items():
            setattr(self.core, n, lambda i, what=what: self.ran.append((what, i)) or True)
        return self

    def __exit__(self, *exc):
        for n, v in self.saved.items():
            setattr(self.core, n, v)


@unittest.skipUnless(HAVE_WARP, WHY)
class ProgramFromWarpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fn = Function(physics, physics_spec())
        cls.built = cls.fn.build(SHAPES, {4: 0.01}, ARCH, "staged")

    def test_slots(self):
        b = self.built
        roles = [(s.role, s.nbytes, s.staged) for s in b.slots]
        self.assertEqual(roles[:8], [
            ("input", 4000, True), ("input", 64 * 12, True), ("input", 64 * 12, True), ("input", 8 * 16 * 12, True),
            ("inout", 8 * 16 * 12, True), ("output", 4000, True), ("output", 64 * 12, True), ("output", 4, True)])
        # One temp slot: the array wp.zeros made inside the function.
        self.assertEqual([(s.role, s.nbytes) for s in b.slots[8:]], [("temp", 4000)])
        self.assertEqual(b.arg_slots, {0: 0, 1: 1, 2: 2, 3: 3, 5: 4, 6: 5, 7: 6, 8: 7})

    def test_steps_in_order(self):
        kinds = [s.kind for s in self.built.program._steps]
        ST = gprog
        self.assertEqual(kinds, [ST.STEP_MEMSET, ST.STEP_LAUNCH, ST.STEP_COPY, ST.STEP_LAUNCH, ST.STEP_LAUNCH,
                                 ST.STEP_MEMSET, ST.STEP_LAUNCH])
        st = self.built.program._steps
        self.assertEqual((st[0].slot, st[0].offset, st[0].nbytes, st[0].element_size, st[0].value), (8, 0, 4000, 4, 0))
        self.assertEqual((st[2].dst_slot, st[2].src_slot, st[2].nbytes), (5, 8, 4000))
        self.assertEqual((st[5].slot, st[5].nbytes, st[5].element_size, st[5].value), (7, 4, 4, 0))

    def test_params_match_the_ptx_entries(self):
        for l in self.built.launches:
            ptx = gw.compile_module(l.kernel.module, l.block_dim, ARCH, ptx=True).data
            want = natural_offsets(ptx_params(ptx, l.entry))
            got = [(off, size) for _, off, size, _, _ in l.params]
            self.assertEqual(got, want, l.entry)
            aligns = [a for a, _ in ptx_params(ptx, l.entry)]
            self.assertEqual([p[3] for p in l.params], aligns, l.entry)
            # The program encodes exactly these parameters.
            step = self.built.program._steps[l.step]
            self.assertEqual(sorted(step.params), got)
            self.assertEqual(len(step.data), got[-1][0] + got[-1][1])

    def test_patches_hit_the_data_pointers(self):
        by_entry = {l.kernel.key: l for l in self.built.launches}
        arr = wp._src.types.array_t
        # scale(x, tmp, a): x is slot 0, tmp the temp slot 8.
        l = by_entry[scale.key]
        self.assertEqual([(p[0], p[4]) for p in l.params],
                         [("dim", []), ("x", [(arr.data.offset, 0, 0)]), ("y", [(arr.data.offset, 8, 0)]), ("a", [])])
        # integrate(Body{mass, pos, vel, tag}, dt, g, out): the struct's
        # array fields are at 8 and 64 (after the 4-byte float, 8-aligned).
        l = by_entry[integrate.key]
        body = l.params[1]
        self.assertEqual(body[2], 8 + 56 + 56 + 8)
        self.assertEqual(body[4], [(8, 1, 0), (64, 2, 0)])
        self.assertEqual(l.params[4][4], [(0, 6, 0)])
        # count(x[1:], hits): the view points 4 bytes into x.
        l = by_entry[count.key]
        self.assertEqual(l.params[1][4], [(0, 0, 4)])
        self.assertEqual(l.block_dim, 128)
        self.assertEqual(l.grid, (8, 1, 1))  # 999 threads in blocks of 128
        # The program's patches are those, at the parameter's offset.
        for l in self.built.launches:
            step = self.built.program._steps[l.step]
            want = sorted((off + o, s, so) for _, off, _, _, pl in l.params for o, s, so in pl)
            self.assertEqual(sorted(step.patches), want)
            for off, _, _ in step.patches:
                self.assertEqual(bytes(step.data[off:off + 8]), bytes(8))

    def test_scalars_stay_as_bytes(self):
        l = {l.kernel.key: l for l in self.built.launches}[grid_add.key]
        step = self.built.program._steps[l.step]
        _, off, size, _, _ = l.params[3]  # s: float64 0.5
        self.assertEqual(bytes(step.data[off:off + 8]), bytes(ctypes.c_double(0.5)))
        _, off, _, _, _ = l.params[4]  # n: int64 3
        self.assertEqual(int.from_bytes(step.data[off:off + 8], "little"), 3)
        # The launch bounds: shape (8, 16), size 128.
        self.assertEqual(int.from_bytes(step.data[8:16], "little"), 128)
        self.assertEqual(step.data[0:8], (8).to_bytes(4, "little") + (16).to_bytes(4, "little"))

    def test_entry_names_and_modules(self):
        for l in self.built.launches:
            self.assertRegex(l.entry, r"^\w+_[0-9a-f]{8}_cuda_kernel_forward$")
            self.assertIn(l.entry.encode(), l.module.data)  # the CUBIN holds the entry
            self.assertEqual(l.module.kind, "cubin")
        # Two block sizes: two variants of the test module.
        self.assertEqual(sorted({m.block_dim for m in self.built.modules}), [128, 256])
        self.assertEqual([m.id for m in self.built.modules], self.built.program.modules())

    def test_id_is_stable(self):
        again = Function(physics, physics_spec()).build(SHAPES, {4: 0.01}, ARCH, "staged")
        self.assertEqual(again.id, self.built.id)
        self.assertEqual(again.encoding, self.built.encoding)
        other = self.fn.build(SHAPES, {4: 0.02}, ARCH, "staged")  # another static value
        self.assertNotEqual(other.id, self.built.id)
        ex = self.fn.build(SHAPES, {4: 0.01}, ARCH, "staged_ex")
        self.assertNotEqual(ex.id, self.built.id)
        bigger = dict(SHAPES)
        bigger.update({0: (2000,), 6: (2000,)})
        self.assertNotEqual(self.fn.build(bigger, {4: 0.01}, ARCH, "staged").id, self.built.id)

    def test_id_is_stable_across_processes(self):
        code = ("import sys; sys.path.insert(0, %r); import test_warp as t; "
                "from graphd.warp._core import Function; "
                "print(Function(t.physics, t.physics_spec()).build(t.SHAPES, {4: 0.01}, 90, 'staged').id_hex)"
                % os.path.dirname(os.path.abspath(__file__)))
        # A fresh kernel cache: the other process compiles the modules itself
        # (NVRTC gives the same CUBIN, so the same module and program ids).
        with tempfile.TemporaryDirectory() as cache:
            env = dict(os.environ, WARP_CACHE_PATH=cache)
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(r.stdout.strip().splitlines()[-1], self.built.id_hex)

    def test_staging_follows_stage_argnames(self):
        spec = FuncSpec.of_function(physics, 4, in_out_argnames=["acc"], stage_in_argnames=["x"],
                                    stage_out_argnames=["y"])
        b = Function(physics, spec).build(SHAPES, {4: 0.01}, ARCH, "staged")
        self.assertEqual([s.staged for s in b.slots], [True, False, False, False, False, True, False, False, False])

    def test_grid(self):
        self.assertEqual(gw.grid_for(1000, 256, True, 0), (4, 1, 1))
        self.assertEqual(gw.grid_for(1000, 256, True, 2), (2, 1, 1))
        self.assertEqual(gw.grid_for(1, 256, True, 0), (1, 1, 1))
        # A lean (no grid-stride) kernel spreads its blocks over y and z.
        self.assertEqual(gw.grid_for(1 << 30, 256, False, 0), (65536, 64, 1))


# --- loops and branches (wp.capture_while, wp.capture_if) -------------------------

if HAVE_WARP:
    @wp.kernel
    def count_down(c: wp.array(dtype=wp.int32)):
        c[0] = c[0] - 1

    @wp.kernel
    def scale_in_place(x: wp.array(dtype=float), a: float):
        i = wp.tid()
        x[i] = x[i] * a

    @wp.kernel
    def above(x: wp.array(dtype=float), tol: float, flag: wp.array(dtype=wp.int32)):
        if x[0] > tol:
            flag[0] = 1
        else:
            flag[0] = 0

    def w_loop(counter: wp.array(dtype=wp.int32), x: wp.array(dtype=float)):
        """x halved `counter` times: a counter loop."""
        def body():
            wp.launch(count_down, dim=1, inputs=[counter])
            wp.launch(scale_in_place, dim=x.shape[0], inputs=[x, 0.5])
        wp.capture_while(counter, body)

    def w_loop_flag(x: wp.array(dtype=float), tol: float, y: wp.array(dtype=float)):
        """x halved until x[0] <= tol, into y: a loop over a flag the
        function allocates, with the factor passed to the body as a
        keyword (capture_while forwards it)."""
        flag = wp.zeros(1, dtype=wp.int32)
        t = wp.empty_like(x)
        wp.copy(t, x)
        wp.launch(above, dim=1, inputs=[t, tol, flag])

        def body(a):
            wp.launch(scale_in_place, dim=t.shape[0], inputs=[t, a])
            wp.launch(above, dim=1, inputs=[t, tol, flag])
        wp.capture_while(flag, body, a=0.5)
        wp.copy(y, t)

    def w_branch(flag: wp.array(dtype=wp.int32), x: wp.array(dtype=float), y: wp.array(dtype=float)):
        """An if/else on flag[0], an else-only branch on flag[1], and a
        branch with nothing on either side."""
        n = x.shape[0]
        wp.capture_if(flag, on_true=lambda: wp.launch(scale, dim=n, inputs=[x, y, 2.0]),
                      on_false=lambda: wp.launch(scale, dim=n, inputs=[x, y, -1.0]))
        wp.capture_if(flag[1:], on_false=lambda: wp.launch(scale_in_place, dim=n, inputs=[y, 3.0]))
        wp.capture_if(flag, on_true=lambda: None)
        wp.capture_if(flag)

    def w_nested(counter: wp.array(dtype=wp.int32), flag: wp.array(dtype=wp.int32), x: wp.array(dtype=float)):
        """A loop holding a branch whose then-side holds a loop."""
        n = x.shape[0]

        def inner():
            wp.launch(count_down, dim=1, inputs=[counter[1:]])
            wp.launch(scale_in_place, dim=n, inputs=[x, 0.5])

        def then():
            wp.launch(scale_in_place, dim=n, inputs=[x, 2.0])
            counter[1:].fill_(3)
            wp.capture_while(counter[1:], inner)

        def body():
            wp.launch(count_down, dim=1, inputs=[counter])
            wp.capture_if(flag, then, lambda: wp.launch(scale_in_place, dim=n, inputs=[x, 3.0]))
        wp.capture_while(counter, body)

    DEPTH = [8]

    def w_deep(counter: wp.array(dtype=wp.int32)):
        def nest(d):
            if d == 0:
                wp.launch(count_down, dim=1, inputs=[counter])
            else:
                wp.capture_while(counter, lambda: nest(d - 1))
        nest(DEPTH[0])


@unittest.skipUnless(HAVE_WARP, WHY)
class ConditionalTest(unittest.TestCase):
    def build(self, f, shapes, nout, statics=None, **kw):
        spec = FuncSpec.of_function(f, nout, **kw)
        return Function(f, spec).build(shapes, statics or {}, ARCH, "staged")

    def steps(self, b):
        """(kind, cond slot, offset, body, else) of each step; launches and
        memsets as their kind and the launch's kernel or memset's slot."""
        out = []
        by_step = {l.step: l for l in b.launches}
        for i, st in enumerate(b.program._steps):
            if st.kind == gprog.STEP_WHILE:
                out.append(("while", st.slot, st.offset, st.body))
            elif st.kind == gprog.STEP_IF:
                out.append(("if", st.slot, st.offset, st.body, st.orelse))
            elif st.kind == gprog.STEP_LAUNCH:
                out.append(("launch", by_step[i].kernel.key))
            elif st.kind == gprog.STEP_MEMSET:
                out.append(("memset", st.slot, st.offset, st.nbytes, st.value))
            else:
                out.append(("copy", st.dst_slot, st.src_slot))
        return out

    def check_launches(self, b):
        """Every launch, inside loops and branches too, against its PTX
        entry, with its patches on the data pointers."""
        self.assertEqual(len(b.launches), sum(1 for st in b.program._steps if st.kind == gprog.STEP_LAUNCH))
        for l in b.launches:
            ptx = gw.compile_module(l.kernel.module, l.block_dim, ARCH, ptx=True).data
            want = ptx_params(ptx, l.entry)
            self.assertEqual([(off, size) for _, off, size, _, _ in l.params], natural_offsets(want), l.entry)
            self.assertEqual([p[3] for p in l.params], [a for a, _ in want], l.entry)
            step = b.program._steps[l.step]
            self.assertEqual(step.kind, gprog.STEP_LAUNCH)
            self.assertEqual(sorted(step.patches),
                             sorted((off + o, s, so) for _, off, _, _, pl in l.params for o, s, so in pl))

    def test_counter_loop(self):
        b = self.build(w_loop, {0: (1,), 1: (100,)}, 2, in_out_argnames=["counter", "x"])
        self.assertEqual(self.steps(b), [("while", 0, 0, 2), ("launch", count_down.key),
                                         ("launch", scale_in_place.key)])
        self.assertEqual([(c.step, c.kind, c.slot, c.offset, c.body, c.orelse) for c in b.conds],
                         [(0, "while", 0, 0, 2, 0)])
        self.assertEqual(b.nsteps, 3)
        self.check_launches(b)
        arr = wp._src.types.array_t
        self.assertEqual([p[4] for p in b.launches[0].params], [[], [(arr.data.offset, 0, 0)]])
        self.assertEqual([p[4] for p in b.launches[1].params], [[], [(arr.data.offset, 1, 0)], []])
        # The encoding holds the loop as docs/protocol.md says: kind 4, slot,
        # offset, body.
        self.assertIn(struct.pack("<IIQI", gprog.STEP_WHILE, 0, 0, 2), b.encoding)
        self.assertIn("step 0: while slot 0 offset 0 (body 2)", b.describe())

    def test_loop_over_an_allocated_flag(self):
        b = self.build(w_loop_flag, {0: (64,), 2: (64,)}, 1, statics={1: 0.01})
        # Slots: x, y, then the temp flag and t in allocation order.
        self.assertEqual([(s.role, s.nbytes) for s in b.slots],
                         [("input", 256), ("output", 256), ("temp", 4), ("temp", 256)])
        self.assertEqual(self.steps(b), [
            ("memset", 2, 0, 4, 0), ("copy", 3, 0), ("launch", above.key),
            ("while", 2, 0, 2), ("launch", scale_in_place.key), ("launch", above.key),
            ("copy", 1, 3)])
        self.check_launches(b)
        d = b.describe()
        self.assertIn("step 0: memset slot 2 offset 0 4 bytes of 0x0 (4-byte elements)", d)
        self.assertIn("step 1: copy 256 bytes from slot 0 offset 0 to slot 3 offset 0", d)
        self.assertIn("step 3: while slot 2 offset 0 (body 2)", d)
        # The keyword reached the body: a = 0.5 in the loop's launch.
        l = [l for l in b.launches if l.kernel.key == scale_in_place.key][0]
        _, off, _, _, _ = l.params[2]
        self.assertEqual(bytes(b.program._steps[l.step].data[off:off + 4]), struct.pack("<f", 0.5))

    def test_branches(self):
        b = self.build(w_branch, {0: (2,), 1: (50,), 2: (50,)}, 1)
        self.assertEqual(self.steps(b), [
            ("if", 0, 0, 1, 1), ("launch", scale.key), ("launch", scale.key),
            ("if", 0, 4, 0, 1), ("launch", scale_in_place.key)])
        self.check_launches(b)
        # The then-side scales by 2, the else-side by -1.
        a = [bytes(b.program._steps[l.step].data[l.params[3][1]:l.params[3][1] + 4]) for l in b.launches[:2]]
        self.assertEqual(a, [struct.pack("<f", 2.0), struct.pack("<f", -1.0)])
        self.assertIn(struct.pack("<IIQII", gprog.STEP_IF, 0, 4, 0, 1), b.encoding)

    def test_nested(self):
        b = self.build(w_nested, {0: (2,), 1: (1,), 2: (32,)}, 2, in_out_argnames=["counter", "x"])
        self.assertEqual(self.steps(b), [
            ("while", 0, 0, 8),
            ("launch", count_down.key),
            ("if", 1, 0, 5, 1),
            ("launch", scale_in_place.key),
            ("memset", 0, 4, 4, 3),
            ("while", 0, 4, 2),
            ("launch", count_down.key),
            ("launch", scale_in_place.key),
            ("launch", scale_in_place.key)])
        self.check_launches(b)
        # The inner count_down works on counter[1]: 4 bytes into slot 0.
        self.assertEqual(b.launches[2].params[1][4], [(0, 0, 4)])
        self.assertEqual([(c.kind, c.body, c.orelse) for c in b.conds], [("while", 8, 0), ("if", 5, 1),
                                                                        ("while", 2, 0)])

    def test_ids_are_stable_and_follow_the_structure(self):
        shapes = {0: (2,), 1: (1,), 2: (32,)}
        a = self.build(w_nested, shapes, 2, in_out_argnames=["counter", "x"])
        again = self.build(w_nested, shapes, 2, in_out_argnames=["counter", "x"])
        self.assertEqual(a.id, again.id)
        loop = self.build(w_loop, {0: (2,), 1: (32,)}, 2, in_out_argnames=["counter", "x"])
        self.assertNotEqual(loop.id, a.id)

    def test_nesting_limit(self):
        b = self.build(w_deep, {0: (1,)}, 1, in_out_argnames=["counter"])
        self.assertEqual(self.steps(b), [("while", 0, 0, 8 - d) for d in range(8)] + [("launch", count_down.key)])
        DEPTH[0] = 9
        try:
            with self.assertRaises(gw.Refused) as cm:
                self.build(w_deep, {0: (1,)}, 1, in_out_argnames=["counter"])
        finally:
            DEPTH[0] = 8
        self.assertEqual(cm.exception.reason, "limits")
        self.assertEqual(cm.exception.code, "RESOURCE_EXHAUSTED")
        self.assertIn("nest more than 8 deep", str(cm.exception))


# --- tile kernels (wp.launch_tiled) -----------------------------------------------

if HAVE_WARP:
    from _warp_tiles import TILE, row_sums as w_row_sums


@unittest.skipUnless(HAVE_WARP, WHY)
class TiledTest(unittest.TestCase):
    def test_launch_tiled_keeps_its_block_size(self):
        # Recording runs on Warp's CPU device, where launch_tiled would
        # resolve the block size to 1; the program launches as a GPU would.
        was = getattr(wp.config, "enable_cpu_blocks", False)
        fn = Function(w_row_sums, FuncSpec.of_function(w_row_sums, 1))
        b = fn.build({0: (32, TILE), 1: (32,)}, {}, ARCH, "staged")
        self.assertEqual(getattr(wp.config, "enable_cpu_blocks", False), was)
        (l,) = b.launches
        self.assertEqual(l.block_dim, TILE)
        step = b.program._steps[l.step]
        self.assertEqual(tuple(step.block), (TILE, 1, 1))
        self.assertEqual(tuple(step.grid), (32, 1, 1))  # a block per row
        # The module is compiled for that block size, and the launch's
        # parameters are its entry's.
        ptx = gw.compile_module(l.kernel.module, TILE, ARCH, ptx=True).data
        self.assertEqual([(off, size) for _, off, size, _, _ in l.params],
                         natural_offsets(ptx_params(ptx, l.entry)))


# --- refusals --------------------------------------------------------------------

if HAVE_WARP:
    GLOBAL = None
    GLOBAL_FLAG = None
    CALLS = [0]

    def f_numpy(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        if x.numpy()[0] > 0:
            wp.launch(scale, dim=x.shape[0], inputs=[x, y, 1.0])

    def f_sync(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(scale, dim=x.shape[0], inputs=[x, y, 1.0])
        wp.synchronize()

    def f_pause(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.capture_pause()

    def f_while_graph(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        wp.capture_while(flag, wp.Graph(wp.get_device("cpu")))

    def f_while_empty(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        wp.capture_while(flag, lambda: None)

    def f_while_type(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        wp.capture_while(x, lambda: wp.launch(cond_step, dim=x.shape[0], inputs=[x, flag]))

    def f_if_global(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        wp.capture_if(GLOBAL_FLAG, on_true=lambda: wp.launch(cond_step, dim=x.shape[0], inputs=[x, flag]))

    EARLY_WHILE, EARLY_IF = wp.capture_while, wp.capture_if

    def f_while_early(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        EARLY_WHILE(flag, lambda: wp.launch(cond_step, dim=x.shape[0], inputs=[x, flag]))

    def f_if_early(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        EARLY_IF(flag, on_true=lambda: wp.launch(cond_step, dim=x.shape[0], inputs=[x, flag]))

    def f_body_counter(x: wp.array(dtype=float), flag: wp.array(dtype=wp.int32)):
        def body():
            CALLS[0] += 1
            for _ in range(CALLS[0]):
                wp.launch(cond_step, dim=x.shape[0], inputs=[x, flag])
        wp.capture_while(flag, body)

    def f_capture(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.capture_begin()

    def f_counter(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        CALLS[0] += 1
        for _ in range(CALLS[0]):
            wp.launch(scale, dim=x.shape[0], inputs=[x, y, 1.0])

    def f_global(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(scale, dim=x.shape[0], inputs=[GLOBAL, y, 1.0])

    @wp.kernel
    def by_id(obj: wp.uint64, seed: wp.uint64, y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = float(seed % wp.uint64(7))

    @wp.kernel
    def by_texture(texs: wp.array(dtype=wp.Texture2D), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = 1.0

    def f_zero_global(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        GLOBAL.zero_()
        wp.launch(scale, dim=x.shape[0], inputs=[GLOBAL, y, 1.0])

    CACHE = {}

    def f_cached(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        if "t" not in CACHE:
            CACHE["t"] = wp.empty(x.shape[0], dtype=float)
        wp.launch(scale, dim=x.shape[0], inputs=[x, CACHE["t"], 1.0])

    def f_hostdata(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        t = wp.array(np.ones(x.shape[0], dtype=np.float32), dtype=float, copy=True)
        wp.launch(scale, dim=x.shape[0], inputs=[t, y, 1.0])

    def f_scan(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.utils.array_scan(x, y)

    # A BVH and a mesh on a CUDA device, as far as Warp's refit code asks
    # (no GPU here): their refit calls Warp's native wp_bvh_refit_device /
    # wp_mesh_refit_device, which the tests stand in for.
    class OnCuda:
        id = 0x7000
        device = type("CudaDevice", (), {"is_cpu": False, "is_cuda": True})()

        @property
        def runtime(self):
            return wp._src.context.runtime

    CUDA_BVH = OnCuda()

    def f_refit_bvh(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(scale, dim=x.shape[0], inputs=[x, y, 2.0])
        wp.Bvh.refit(CUDA_BVH)

    def f_refit_mesh(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(scale, dim=x.shape[0], inputs=[x, y, 2.0])
        wp.Mesh.refit(CUDA_BVH)

    def f_fill_vec(x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3)):
        y.fill_(wp.vec3(1.0, 2.0, 3.0))

    def f_nothing(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        pass

    def f_ptr_as_int(x: wp.array(dtype=float), y: wp.array(dtype=wp.uint64)):
        wp.launch(store_u64, dim=1, inputs=[wp.uint64(x.ptr), y])

    @wp.kernel
    def store_u64(v: wp.uint64, y: wp.array(dtype=wp.uint64)):
        y[0] = v

    def f_many(a0: wp.array(dtype=float), out: wp.array(dtype=float)):
        n = a0.shape[0]
        t = [wp.empty(n, dtype=float) for _ in range(7)]
        for _ in range(10):
            wp.launch(many, dim=n, inputs=[a0] + t[:6], outputs=[out])

    def f_260_arrays(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        # As many arrays as a MuJoCo Warp humanoid step uses (260).
        n = x.shape[0]
        prev = x
        for _ in range(260):
            t = wp.empty(n, dtype=float)
            wp.launch(scale, dim=n, inputs=[prev, t, 1.0])
            prev = t
        wp.copy(y, prev)

    def f_cmd_ok(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        cmd = wp.launch(scale, dim=x.shape[0], inputs=[x, y, 3.0], record_cmd=True)
        cmd.launch()
        cmd.launch()

    def f_cmd_set(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        cmd = wp.launch(scale, dim=x.shape[0], inputs=[x, y, 3.0], record_cmd=True)
        cmd.set_param_by_name("a", 4.0)

    EARLY_LAUNCH = wp.launch

    def f_early(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        EARLY_LAUNCH(scale, dim=x.shape[0], inputs=[x, y, 1.0])


@unittest.skipUnless(HAVE_WARP, WHY)
class RefusalTest(unittest.TestCase):
    def build(self, f, shapes=None, statics=None, nout=1, **kw):
        spec = FuncSpec.of_function(f, nout, **kw)
        shapes = shapes or {i: (16,) for i, a in enumerate(spec.args) if a.is_array}
        return Function(f, spec).build(shapes, statics or {}, ARCH, "staged")

    def refused(self, reason, f, *args, pattern=None, **kw):
        with self.assertRaises(gw.Refused) as cm:
            f(*args, **kw)
        self.assertEqual(cm.exception.reason, reason, str(cm.exception))
        self.assertIn(reason, gw.REASONS)
        if pattern:
            self.assertRegex(str(cm.exception), pattern)
        return cm.exception

    def test_host_reads_and_sync(self):
        self.refused("host_sync", self.build, f_numpy, pattern="numpy")
        self.refused("host_sync", self.build, f_sync, pattern="wp.synchronize")

    def test_host_callback(self):
        self.refused("host_callback", self.build, f_pause, pattern="capture_pause")

    def test_conditional_nodes(self):
        global GLOBAL_FLAG
        self.refused("conditional", self.build, f_while_graph, pattern="wp.Graph as while_body")
        self.refused("conditional", self.build, f_while_empty, pattern="never end")
        self.refused("conditional", self.build, f_while_early, pattern="reference taken before recording")
        self.refused("conditional", self.build, f_if_early, pattern="reference taken before recording")
        with self.assertRaisesRegex(TypeError, "Condition must be a Warp array of int32"):
            self.build(f_while_type)
        GLOBAL_FLAG = wp.zeros(1, dtype=wp.int32, device="cpu")
        self.refused("unknown_pointer", self.build, f_if_global, pattern="condition of wp.capture_if")
        self.refused("value_dependent", self.build, f_body_counter)

    def test_nested_capture(self):
        self.refused("nested_capture", self.build, f_capture)

    def test_value_dependent(self):
        self.refused("value_dependent", self.build, f_counter, pattern="step 1|steps")

    def test_unknown_memory(self):
        global GLOBAL
        GLOBAL = wp.zeros(16, dtype=float, device="cpu")
        # A Warp array made outside the function that a launch passes is a
        # fixed slot (WarpCallableTest); set or copied inside the function
        # it has no array to say so, and is refused.
        self.assertEqual([s.role for s in self.build(f_global).slots], ["input", "output", "fixed"])
        self.refused("unknown_pointer", self.build, f_zero_global, pattern="neither an argument")
        # An array cached across calls is not the second run's allocation,
        # nor memory made outside the recording.
        self.refused("unknown_pointer", self.build, f_cached)

    def test_process_handles(self):
        # A Warp BVH's id (a wp.uint64 argument) and an array of textures
        # are an address and handles in this process's CUDA context (MJX's
        # render passes both): refused, not baked into a program that the
        # daemon runs in its own context. A plain uint64 is a value.
        lo = wp.zeros(4, dtype=wp.vec3, device="cpu")
        hi = wp.array(np.ones((4, 3), dtype=np.float32), dtype=wp.vec3, device="cpu")
        bvh = wp.Bvh(lo, hi)
        textures = wp.array([wp.Texture2D(np.zeros((2, 2, 4), dtype=np.float32), device="cpu")],
                            dtype=wp.Texture2D, device="cpu")

        def f_bvh(x: wp.array(dtype=float), y: wp.array(dtype=float)):
            wp.launch(by_id, dim=x.shape[0], inputs=[bvh.id, wp.uint64(12345), y])

        def f_seed(x: wp.array(dtype=float), y: wp.array(dtype=float)):
            wp.launch(by_id, dim=x.shape[0], inputs=[wp.uint64(0), wp.uint64(bvh.id + 8), y])

        def f_textures(x: wp.array(dtype=float), y: wp.array(dtype=float)):
            wp.launch(by_texture, dim=x.shape[0], inputs=[textures, y])

        self.refused("param_type", self.build, f_bvh, pattern="parameter 'obj' is the id of a Warp Bvh")
        self.refused("param_type", self.build, f_textures, pattern="array of Warp textures")
        self.assertEqual(self.build(f_seed).nsteps, 1)

    def test_host_data(self):
        self.refused("host_data", self.build, f_hostdata)

    def test_native_host_work(self):
        self.refused("native", self.build, f_scan, pattern="wp_array_scan")

    def test_native_work_on_a_cuda_device(self):
        # Bvh.refit and Mesh.refit on a CUDA device call Warp's native
        # functions, which run on the GPU at once: recorded, they had run
        # once while the function was recorded, on the bounds of that
        # moment, and never when the program replays (MJX's refit_bvh: the
        # program wrote the boxes, the BVH kept the tree of the recording).
        # Refused, and not run. Failed before: built, the refit run twice.
        with NativeStandIns() as native:
            self.refused("native", self.build, f_refit_bvh, pattern=r"wp_bvh_refit_device \(Bvh\.refit\).*"
                         "GPU at once")
            self.refused("native", self.build, f_refit_mesh, pattern=r"wp_mesh_refit_device \(Mesh\.refit\)")
            # The program's own launch alone still builds.
            self.assertEqual(self.build(scale_fn).nsteps, 1)
            # Outside a recording the refit is Warp's again, and runs.
            wp.Bvh.refit(CUDA_BVH)
        self.assertEqual(native.ran, [("bvh", CUDA_BVH.id)])

    def test_fill_value(self):
        self.refused("fill_value", self.build, f_fill_vec, pattern="12-byte value")

    def test_nothing_to_do(self):
        self.refused("empty", self.build, f_nothing)

    def test_address_as_integer(self):
        self.refused("param_type", self.build, f_ptr_as_int, pattern="address")

    def test_launch_commands(self):
        b = self.build(f_cmd_ok)
        self.assertEqual(b.nsteps, 2)
        self.refused("launch_command", self.build, f_cmd_set)
        self.refused("unrecorded_launch", self.build, f_early)

    def test_limits(self):
        # 7 arrays a launch x 10 launches fit; more patches than the daemon
        # takes in one launch do not.
        b = self.build(f_many)
        self.assertEqual(b.nsteps, 10)
        saved = gprog.MAX_PATCHES
        gprog.MAX_PATCHES = 4
        try:
            e = self.refused("limits", self.build, f_many, shapes={0: (32,), 1: (32,)}, pattern="limit of 4")
            self.assertEqual(e.code, "RESOURCE_EXHAUSTED")
        finally:
            gprog.MAX_PATCHES = saved
        # 2 arguments and 260 temp arrays (a MuJoCo Warp humanoid's) fit the
        # daemon's slots, and are refused under a cap below 262.
        self.assertEqual(self.build(f_260_arrays).nsteps, 261)
        saved = gprog.MAX_SLOTS
        gprog.MAX_SLOTS = 256
        try:
            self.refused("limits", self.build, f_260_arrays, pattern="262 slots.*limit of 256")
        finally:
            gprog.MAX_SLOTS = saved
        saved = gprog.MAX_STEPS
        gprog.MAX_STEPS = 5
        try:
            self.refused("limits", self.build, f_many, shapes={0: (48,), 1: (48,)}, pattern="limit of 5")
        finally:
            gprog.MAX_STEPS = saved

    def test_signature(self):
        self.refused("signature", gw.jax_callable, scale_fn, vmap_method="expand_dims")

    def test_kernel_features(self):
        opts = scale.module.options
        saved = opts["deterministic"]
        opts["deterministic"] = wp.DeterministicMode.RUN_TO_RUN
        try:
            self.refused("kernel", self.build, scale_fn, pattern="deterministic")
        finally:
            opts["deterministic"] = saved
        self.assertEqual(self.build(scale_fn).nsteps, 1)

    def test_cpu_device(self):
        self.refused("cpu_device", gw.resolve_arch, "cpu")
        self.refused("cpu_device", gw.resolve_arch, wp.get_device("cpu"))
        f = gw.array_callable(scale_fn)
        x = wp.zeros(16, dtype=float, device="cpu")
        self.refused("cpu_device", f, x, x)

    def test_warp_version(self):
        from graphd.warp import _support
        _support.check_version(wp.__version__)
        for v in ("1.17.3", "1.20.0", "2.0.0", "0.15.1", "nonsense"):
            self.refused("warp_version", _support.check_version, v, pattern=r"1\.18\.0")
        for v in ("1.18.0", "1.18.2", "1.19.0", "1.19.5"):
            _support.check_version(v)
        # A layout change is refused too.
        from warp._src import codegen, context, types
        saved = types.array_t

        class Other(ctypes.Structure):
            _fields_ = [("data", ctypes.c_uint64), ("shape", ctypes.c_int32 * 4)]
        types.array_t = Other
        try:
            self.refused("warp_version", _support.check_layouts, wp, context, types, codegen, pattern="array_t")
        finally:
            types.array_t = saved

    def test_mode(self):
        self.assertEqual(gw.resolve_mode("direct"), "direct")
        self.assertEqual(gw.resolve_mode("auto"), "auto")
        self.assertEqual(gw.resolve_mode("auto", wp.JaxCallableGraphMode.WARP_STAGED_EX), "staged_ex")
        self.assertEqual(gw.resolve_mode("staged_ex"), "staged_ex")
        with self.assertRaises(GraphdError):
            gw.resolve_mode("bogus")

    def test_arch(self):
        self.assertEqual(gw.resolve_arch(90), 90)
        self.assertEqual(gw.resolve_arch("sm_90"), 90)
        self.assertEqual(gw.resolve_arch("9.0"), 90)
        self.refused("arch", gw.compile_module, scale.module, 256, 12)

    def test_recording_leaves_warp_as_it_was(self):
        launch, sync, cwhile = wp.launch, wp.synchronize, wp.capture_while
        apic = wp._src.context._get_apic_capture_for_device
        with self.assertRaises(gw.Refused):
            self.build(f_numpy)
        with self.assertRaises(gw.Refused):
            self.build(f_while_empty)
        self.assertIs(wp.launch, launch)
        self.assertIs(wp.synchronize, sync)
        self.assertIs(wp.capture_while, cwhile)
        self.assertIs(wp._src.context.capture_while, cwhile)
        self.assertIs(wp._src.context._get_apic_capture_for_device, apic)
        x = wp.zeros(4, dtype=float, device="cpu")
        self.assertEqual(x.numpy().tolist(), [0.0] * 4)

    def test_the_function_sees_the_cuda_device(self):
        # A library keys its state by the current device (MJX's render
        # context by wp.get_device().ordinal): while recorded, the function
        # sees the CUDA device the call is for, as under Warp, not Warp's CPU
        # device (ordinal -1, where MJX's lookup raised KeyError).
        seen.clear()
        f = gw.array_callable(by_device, inputs=["x"], outputs=["y"])
        x = wp.zeros(64, dtype=float, device="cpu")
        b = f.build(x, x, arch=90)
        self.assertEqual(seen, [(0, True, False, "cuda:0", 90)] * 2)  # two recordings
        # Arrays it makes on that device are temp slots of the program.
        self.assertEqual([s.role for s in b.slots], ["input", "output", "temp"])
        seen.clear()
        Function(by_device, f._spec).build({0: (64,), 1: (64,)}, {}, 90, "staged", ordinal=1)
        self.assertEqual([s[0] for s in seen], [1, 1])
        # Warp's own tests are user code too (their module is warp.tests.*).
        ns = {"__name__": "warp.tests.interop.fake"}
        exec("import warp as wp\ndef f(x: wp.array(dtype=float), y: wp.array(dtype=float)):\n"
             "    seen.append(wp.get_device().ordinal)\n    wp.copy(y, x)\n", ns)
        ns["seen"] = seen
        seen.clear()
        gw.array_callable(ns["f"], inputs=["x"], outputs=["y"]).build(x, x, arch=90)
        self.assertEqual(seen, [0, 0])
        self.assertEqual(wp.get_device().ordinal, -1)  # Warp's own again
        self.assertTrue(wp.get_device().is_cpu)


if HAVE_WARP:
    def scale_fn(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(scale, dim=x.shape[0], inputs=[x, y, 2.0])

    @wp.kernel
    def add_table(x: wp.array(dtype=float), table: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = x[i] + table[i]
        table[i] = table[i] + 1.0

    # Memory a library made before the calls (MJX's render context): a
    # table the functions below close over. Host memory a GPU can read
    # stands for device memory here (pinned, as Warp marks such an array).
    TABLE_MEMORY = np.arange(64, dtype=np.float32)
    TABLE = wp.array(ptr=TABLE_MEMORY.ctypes.data, dtype=float, shape=(64,), device="cpu", pinned=True)
    BODY = Body()
    BODY.pos = wp.zeros(16, dtype=wp.vec3, device="cpu", pinned=False)
    BODY.vel = wp.zeros(16, dtype=wp.vec3, device="cpu")

    def with_table(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(add_table, dim=16, inputs=[x, TABLE, y])
        wp.launch(add_table, dim=8, inputs=[x, TABLE[8:], y])  # a view: the same slot, 32 bytes in

    def with_table_zeroed(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        # Two views that overlap, the later one lower: one slot from the
        # lower's start; then a memset inside the first view only (on the
        # CPU Warp's device memset is recorded).
        wp.launch(add_table, dim=8, inputs=[x, TABLE[8:], y])
        wp.launch(add_table, dim=8, inputs=[x, TABLE[:16], y])
        TABLE[32:].zero_()

    def with_body(out: wp.array(dtype=wp.vec3)):
        wp.launch(integrate, dim=16, inputs=[BODY, 0.1, wp.vec3(0.0, -9.8, 0.0), out])

    seen = []
    per_device = {(4, 0): 2.0, (4, 1): 3.0}

    def by_device(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        d = wp.get_device()
        seen.append((d.ordinal, d.is_cuda, d.is_cpu, str(d), d.arch))
        tmp = wp.zeros(x.shape[0], dtype=float, device=d)
        with wp.ScopedDevice(d):
            wp.launch(scale, dim=x.shape[0], inputs=[x, tmp, per_device[(4, d.ordinal)]])
        wp.copy(y, tmp)


@unittest.skipUnless(HAVE_WARP, WHY)
class WarpCallableTest(unittest.TestCase):
    def test_the_old_spelling_callable_is_array_callable_and_shadows_nothing(self):
        # graphd.warp.callable still works, from the module and by import,
        # but is no global of graphd.warp: the builtin stays the builtin
        # there, and `from graphd.warp import *` does not bind it.
        from graphd.warp import callable as old
        self.assertIs(old, gw.array_callable)
        self.assertIs(gw.callable, gw.array_callable)
        self.assertNotIn("callable", vars(gw))
        self.assertNotIn("callable", gw.__all__)
        with self.assertRaises(AttributeError):
            gw.no_such_name  # noqa: B018

    def test_arrays_made_outside_are_fixed_slots(self):
        # A Warp array the function closes over (made before the calls) is
        # a slot of its own, read and written, bound at every call to the
        # array's address; a view of it shares that slot; the program keeps
        # the array alive. Refused before: unknown_pointer.
        x = wp.zeros(16, dtype=float, device="cpu")
        b = gw.array_callable(with_table, inputs=["x"], outputs=["y"]).build(x, x, arch=90)
        self.assertEqual([(s.role, s.nbytes) for s in b.slots], [("input", 64), ("output", 64), ("fixed", 256)])
        self.assertEqual(b.program._slots[2], (gprog.ROLES["inout"], gprog.SLOT_STAGED, 256))
        ((slot, address, nbytes, arrays),) = [(f.slot, f.address, f.nbytes, f.arrays) for f in b.fixed]
        self.assertEqual((slot, address, nbytes), (2, TABLE.ptr, 256))
        self.assertIs(arrays[0], TABLE)
        # Parameter 2 of each launch is the table: patched to slot 2, at
        # 0 and at 8 floats in.
        self.assertEqual([l.params[2][4] for l in b.launches], [[(0, 2, 0)], [(0, 2, 32)]])
        # Each offset is into the one slot, from the table's start.
        z = gw.array_callable(with_table_zeroed, inputs=["x"], outputs=["y"]).build(x, x, arch=90)
        self.assertEqual([(f.address, f.nbytes) for f in z.fixed], [(TABLE.ptr, 256)])
        self.assertEqual([l.params[2][4] for l in z.launches], [[(0, 2, 32)], [(0, 2, 0)]])
        st = z.program._steps[2]
        self.assertEqual((st.kind, st.slot, st.offset, st.nbytes), (gprog.STEP_MEMSET, 2, 128, 128))
        # A struct's arrays made outside: one slot each (pos, vel).
        out = wp.zeros(16, dtype=wp.vec3, device="cpu")
        c = gw.array_callable(with_body).build(out, arch=90)
        self.assertEqual([(f.address, f.nbytes) for f in c.fixed], sorted([(BODY.pos.ptr, 192), (BODY.vel.ptr, 192)]))
        self.assertEqual([s.role for s in c.slots], ["inout", "fixed", "fixed"])

    def test_build_from_shapes(self):
        f = gw.array_callable(scale_fn, inputs=["x"], outputs=["y"])
        x = wp.zeros(300, dtype=float, device="cpu")
        b = f.build(x, x, arch=90)
        self.assertEqual([(s.role, s.nbytes) for s in b.slots], [("input", 1200), ("output", 1200)])
        self.assertEqual(b.launches[0].grid, (2, 1, 1))
        g = gw.array_callable(scale_fn)
        self.assertEqual([s.role for s in g.build(x, x, arch=90).slots], ["inout", "inout"])
        with self.assertRaises(ValueError):
            gw.array_callable(scale_fn, inputs=["nope"]).build(x, x, arch=90)


# --- JAX ----------------------------------------------------------------------------

if HAVE_WARP:
    def jstep(x: wp.array(dtype=float), v: wp.array2d(dtype=wp.vec3), a: float, o: wp.array2d(dtype=wp.vec3),
              y: wp.array(dtype=float)):
        tmp = wp.zeros(x.shape[0], dtype=float)
        wp.launch(scale, dim=x.shape[0], inputs=[x, tmp, a])
        wp.copy(y, tmp)
        wp.launch(grid_add, dim=v.shape, inputs=[v, o, wp.float64(1.0), wp.int64(0), False, wp.mat22()])

    @wp.kernel
    def add_count(x: wp.array(dtype=float), e: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = x[i] + float(e.shape[0])

    def with_empty(x: wp.array(dtype=float), e: wp.array(dtype=float), f: wp.array(dtype=float),
                   y: wp.array(dtype=float)):
        """e and f may be empty (MJX passes fields a model does not use so)."""
        wp.launch(add_count, dim=x.shape[0], inputs=[x, e], outputs=[y])
        wp.launch(add_count, dim=x.shape[0], inputs=[y, f], outputs=[y])

    @wp.kernel
    def lookup(table: wp.array(dtype=float), indices: wp.array(dtype=int), output: wp.array(dtype=float)):
        i = wp.tid()
        output[i] = table[indices[i]]

    @wp.kernel
    def twice(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = 2.0 * x[i]

    @wp.kernel
    def half_scale(x: wp.array(dtype=wp.bfloat16), y: wp.array(dtype=wp.bfloat16)):
        i = wp.tid()
        y[i] = x[i] * wp.bfloat16(2.0)


if HAVE_WARP:
    # MJX's refit_bvh, in small: a kernel writes each world's boxes into a
    # render-context array made before the calls, then the context's BVH
    # (on the GPU) is refit to them.
    @wp.kernel
    def world_boxes(pos: wp.array2d(dtype=float), lower: wp.array(dtype=float), token: wp.array(dtype=int)):
        w, i = wp.tid()
        lower[w * pos.shape[1] + i] = pos[w, i] - 0.5
        token[w] = w

    BOXES_MEMORY = np.zeros(64, dtype=np.float32)
    BOXES = wp.array(ptr=BOXES_MEMORY.ctypes.data, dtype=float, shape=(64,), device="cpu", pinned=True)

    def refit_shim(nworld: int, pos: wp.array2d(dtype=float), rc_id: int, token: wp.array(dtype=int)):
        token.zero_()
        wp.launch(world_boxes, dim=pos.shape, inputs=[pos, BOXES, token])
        wp.Bvh.refit(CUDA_BVH)


def mjx_style_refit(f, nworld):
    """f (a jax_callable of refit_shim) as MJX calls its FFI functions:
    vmap_method None under jax.custom_batching.custom_vmap, whose rule
    folds a nested vmap's batch dimensions into the first (MJX's
    marshal_custom_vmap) and calls the function once on all worlds."""
    @jax.custom_batching.custom_vmap
    def refit(pos):
        return f(nworld, pos if pos.ndim == 2 else pos[None], 11)[0]

    @refit.def_vmap
    def rule(axis_size, in_batched, pos):
        out = refit(pos.reshape(-1, pos.shape[-1]))
        return (out if out.shape[0] == axis_size else out.reshape(axis_size, -1)), True

    return refit


def program_of(f, call):
    """The program of a custom call, among those a callable built (the
    same jax_callable arguments give the same callable, with what other
    tests built)."""
    return next(b for b in f.programs.values() if b.id_hex == call[0])


def custom_calls(text):
    out = []
    for line in text.splitlines():
        if "custom_call @graphd_replay" in line:
            m = re.search(r'program = "([0-9a-f]{64})", slots = dense<\[?([-0-9, ]*)\]?>', line)
            out.append((m.group(1), [int(s) for s in m.group(2).split(",")]))
    return out


@unittest.skipUnless(HAVE_WARP and HAVE_JAX, WHY or "jax is not importable")
class JaxTest(unittest.TestCase):
    def setUp(self):
        if _env.INSTALLED:
            _env.path(self, "GRAPHD_LIB")
            _env.path(self, "GRAPHD_XLA_LIB")
        elif not os.environ.get("GRAPHD_XLA_LIB") or not os.environ.get("GRAPHD_LIB"):
            raise unittest.SkipTest("$GRAPHD_LIB or $GRAPHD_XLA_LIB is not set (libgraphd_xla not built)")

    def lower(self, f, *args):
        return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()

    def test_callable_lowers_to_a_graphd_replay(self):
        f = gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"], output_dims={"y": 100}, device=90)
        x = jnp.zeros(100, jnp.float32)
        v = jnp.zeros((4, 5, 3), jnp.float32)
        c = custom_calls(self.lower(lambda x, v, o: f(x, v, 2.0, o), x, v, v))
        self.assertEqual(len(c), 1)
        b = program_of(f, c[0])
        self.assertEqual(c[0], (b.id_hex, [0, 1, 2, 2, 3]))
        self.assertEqual([s.role for s in b.slots], ["input", "input", "inout", "output", "temp"])
        out = jax.eval_shape(lambda x, v, o: f(x, v, 2.0, o), x, v, v)
        self.assertEqual([(o.shape, o.dtype) for o in out], [((4, 5, 3), jnp.float32), ((100,), jnp.float32)])
        # A static value is part of the signature.
        c3 = custom_calls(self.lower(lambda x, v, o: f(x, v, 3.0, o), x, v, v))
        self.assertNotEqual(c3[0][0], c[0][0])
        self.assertIsNot(program_of(f, c3[0]), b)

    def test_shard_map_scan_carries_the_results(self):
        # The results carry a scan inside shard_map: they vary over the mesh
        # axis as the sharded operands do; v, replicated, is cast to vary.
        from jax.sharding import NamedSharding, PartitionSpec as P
        f = gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"], output_dims={"y": 100}, device=90)
        ndev = len(jax.local_devices())
        mesh = jax.make_mesh((ndev,), ("d",))

        def per_shard(x, v, o):
            def step(c, _):
                o2, y = f(c[0], v, 2.0, c[1])
                return (y, o2), None
            return jax.lax.scan(step, (x, o), None, length=3)[0]

        g = jax.shard_map(per_shard, mesh=mesh, in_specs=(P("d"), P(), P("d")), out_specs=(P("d"), P("d")))
        put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))
        x = put(jnp.zeros(100 * ndev, jnp.float32), P("d"))
        v = put(jnp.zeros((4, 5, 3), jnp.float32), P())
        o = put(jnp.zeros((4 * ndev, 5, 3), jnp.float32), P("d"))
        c = custom_calls(self.lower(g, x, v, o))
        self.assertEqual(len(c), 1)
        b = program_of(f, c[0])
        self.assertEqual(c[0], (b.id_hex, [0, 1, 2, 2, 3]))

    def test_vmap_folds_the_batch_like_warp(self):
        f = gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"], output_dims={"y": 100}, device=90)
        xs, vs = jnp.zeros((3, 100), jnp.float32), jnp.zeros((3, 4, 5, 3), jnp.float32)
        g = jax.vmap(lambda x, v, o: f(x, v, 2.0, o))
        c = custom_calls(self.lower(g, xs, vs, vs))
        self.assertEqual(len(c), 1)
        b = [b for b in f.programs.values() if b.id_hex == c[0][0]][0]
        self.assertEqual([s.nbytes for s in b.slots], [1200, 720, 720, 1200, 1200])
        out = jax.eval_shape(g, xs, vs, vs)
        self.assertEqual([o.shape for o in out], [(3, 4, 5, 3), (3, 100)])

    def test_vmap_launch_dims_cover_the_batch(self):
        # Warp's lookup case: an unbatched table, batched indices and
        # launch_dims for one element, given through functools.partial.
        # Warp rolls the batch into the first launch dim; a launch over one
        # element's dims left every batch but the first unwritten.
        import functools
        k = gw.jax_kernel(lookup, device=90)
        table, idx = jnp.arange(100, dtype=jnp.float32), jnp.zeros((3, 5), jnp.int32)
        for axis, n in ((0, 5), (1, 3)):
            g = jax.vmap(functools.partial(k, launch_dims=n), in_axes=(None, axis))
            (c,) = custom_calls(self.lower(g, table, idx))
            b = [b for b in k.programs.values() if b.id_hex == c[0]][0]
            self.assertEqual(c[1], [0, 1, 2])
            # The table is broadcast to the batch (3 or 5 copies), as Warp gets it.
            self.assertEqual([(s.role, s.nbytes) for s in b.slots],
                             [("input", 400 * 15 // n), ("input", 60), ("output", 60)])
            self.assertEqual(b.launches[0].dim, (15,))
            self.assertEqual(jax.eval_shape(g, table, idx)[0].shape, (3, 5) if axis == 0 else (5, 3))
        # sequential replays the one-element program once per element.
        k = gw.jax_kernel(lookup, device=90, vmap_method="sequential")
        (c,) = custom_calls(self.lower(jax.vmap(functools.partial(k, launch_dims=5), in_axes=(None, 0)), table, idx))
        b = [b for b in k.programs.values() if b.id_hex == c[0]][0]
        self.assertEqual([s.nbytes for s in b.slots], [400, 20, 20])
        self.assertEqual(b.launches[0].dim, (5,))

    def test_bfloat16(self):
        # Warp takes JAX's bfloat16 for a wp.bfloat16 array (and makes its
        # outputs so); graphd.warp had asked for uint16, the numpy type Warp
        # stores bfloat16 as.
        k = gw.jax_kernel(half_scale, device=90)
        x = jnp.ones(300, jnp.bfloat16)
        (c,) = custom_calls(self.lower(k, x))
        b = program_of(k, c)
        self.assertEqual(c, (b.id_hex, [0, 1]))
        self.assertEqual([s.nbytes for s in b.slots], [600, 600])
        (out,) = jax.eval_shape(k, x)
        self.assertEqual((out.shape, out.dtype), ((300,), jnp.bfloat16))
        with self.assertRaisesRegex(TypeError, "expected bfloat16, got uint16"):
            k(jnp.ones(300, jnp.uint16))

    def test_same_arguments_same_callable(self):
        # Warp caches its callables (MJX relies on it across retraces, Warp's
        # tests check it with assertIs); graphd.warp made a new one per call.
        opts = dict(num_outputs=2, output_dims={"y": 100}, device=90)
        f = gw.jax_callable(jstep, in_out_argnames=["o"], **opts)
        self.assertIs(gw.jax_callable(jstep, in_out_argnames=["o"], **opts), f)
        self.assertIsNot(gw.jax_callable(jstep, in_out_argnames=["o"], mode="direct", **opts), f)
        # graph_cache_max is no part of the key: it updates the callable.
        self.assertEqual(f.graph_cache_max, 32)
        self.assertIs(gw.jax_callable(jstep, in_out_argnames=["o"], graph_cache_max=None, **opts), f)
        self.assertIsNone(f.graph_cache_max)
        # An empty selection is the absent one; an integer graph_mode is the enum.
        g = gw.jax_callable(scale_fn, num_outputs=1, device=90)
        self.assertIs(gw.jax_callable(scale_fn, num_outputs=1, in_out_argnames=[], stage_in_argnames=[],
                                      device=90), g)
        self.assertIs(g.graph_mode, wp.JaxCallableGraphMode.JAX)
        h = gw.jax_callable(scale_fn, num_outputs=1, graph_mode=4, device=90)
        self.assertIs(h.graph_mode, wp.JaxCallableGraphMode.WARP_STAGED_EX)
        # Warp's attributes of the object.
        s = gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"], stage_in_argnames=["x"], device=90)
        self.assertEqual((s.stage_in_argnames, s.stage_out_argnames), ({"x"}, None))
        self.assertEqual((s.func, s.num_outputs, s.num_inputs, s.num_in_out), (jstep, 2, 4, 1))
        self.assertEqual(h.mode, "staged_ex")
        with self.assertRaises(ValueError):
            gw.jax_callable(scale_fn, graph_mode=9, device=90)
        k = gw.jax_kernel(count, device=90, output_dims=1, block_dim=np.int64(64))
        self.assertIs(gw.jax_kernel(count, device=90, output_dims=1, block_dim=64), k)
        self.assertIsNot(gw.jax_kernel(count, device=90, output_dims=1), k)
        self.assertEqual(k.block_dim, 64)
        # block_dim with Warp's checks and errors.
        for bad in (True, 1.5):
            with self.assertRaisesRegex(TypeError, "block_dim must be an integer or None"):
                gw.jax_kernel(count, block_dim=bad)
        with self.assertRaisesRegex(ValueError, "block_dim must be positive"):
            gw.jax_kernel(count, block_dim=0)

    def test_graph_cache_max_bounds_the_captures(self):
        # Each shape is a program; past graph_cache_max the oldest is
        # dropped and its captures evicted from the daemon, as Warp drops
        # its oldest graph. clear() (Warp's clear_jax_callable_graph_cache)
        # evicts them all.
        evicted = []
        orig = gw_captures.evict_captures
        gw_captures.evict_captures = lambda ids, socket=None: evicted.extend(ids)
        try:
            f = gw.jax_callable(scale_fn, num_outputs=1, device=90, graph_cache_max=2, mode="direct")
            ids = []
            for n in (10, 11, 12, 13):
                (c,) = custom_calls(self.lower(f, jnp.zeros(n, jnp.float32)))
                ids.append(c[0])
                self.assertEqual(f.graph_cache_size, min(len(ids), 2))
            self.assertEqual(list(f.captures), ids[2:])
            self.assertEqual(evicted, ids[:2])
            # A program traced again (another function calling the callable) is
            # in use again: kept, the oldest other dropped.
            custom_calls(self.lower(lambda x: f(x), jnp.zeros(10, jnp.float32)))
            self.assertEqual(list(f.captures), [ids[3], ids[0]])
            self.assertEqual(evicted, ids[:3])
            f.graph_cache_max = 1
            self.assertEqual((list(f.captures), evicted), ([ids[0]], ids[:4]))
            wp.clear_jax_callable_graph_cache(f)
            self.assertEqual((f.graph_cache_size, evicted), (0, ids + [ids[0]]))
        finally:
            gw_captures.evict_captures = orig

    def test_replays_after_clearing_count_again(self):
        # A compiled call replays without passing through Python; after
        # clear_jax_callable_graph_cache the daemon captures a program again
        # at its next replay, which the handler's replay numbers show
        # (faked here: no GPU). The callable counts it again, in the order
        # they ran, graph_cache_max still bounding it, as Warp counts each
        # graph it captures again. Replays before the clearing do not count.
        from graphd import jax as gj
        evicted, replays = [], {}
        orig_evict, orig_last = gw_captures.evict_captures, gj.last_replays
        gw_captures.evict_captures = lambda ids, socket=None: evicted.extend(ids)
        gj.last_replays = lambda ids: [replays.get(i, 0) for i in ids]
        try:
            f = gw.jax_callable(scale_fn, num_outputs=1, device=90, graph_cache_max=2, mode="direct",
                                vmap_method="sequential")
            a, b, c = [custom_calls(self.lower(f, jnp.zeros(n, jnp.float32)))[0][0] for n in (40, 41, 42)]
            self.assertEqual((list(f.captures), evicted), ([b, c], [a]))
            replays[a] = 1  # before the clearing: replayed, captured again
            self.assertEqual((f.graph_cache_size, list(f.captures)), (2, [c, a]))
            wp.clear_jax_callable_graph_cache(f)
            self.assertEqual(f.graph_cache_size, 0)
            replays[a] = 5
            self.assertEqual((f.graph_cache_size, list(f.captures)), (1, [a]))
            replays.update({c: 6, b: 7})
            self.assertEqual((f.graph_cache_size, list(f.captures)), (2, [c, b]))
            self.assertEqual(evicted[-1], a)
        finally:
            gw_captures.evict_captures, gj.last_replays = orig_evict, orig_last

    def test_graph_cache_counts_gpu_lowerings_only(self):
        # A call lowered for the CPU is Warp's own: its program, traced in
        # the CUDA branch all the same, is not one the callable keeps (it
        # had counted, so a fresh shape on the GPU then made 2, not 1).
        # Lowered for CUDA, each new shape is one.
        f = gw.jax_callable(scale_fn, num_outputs=1, device=90, mode="staged_ex", has_side_effect=True)
        for n in (20, 21):
            jax.jit(f).trace(jnp.zeros(n, jnp.float32)).lower(lowering_platforms=("cpu",))
        self.assertEqual(f.graph_cache_size, 0)
        for i, n in enumerate((22, 23)):
            (c,) = custom_calls(self.lower(f, jnp.zeros(n, jnp.float32)))
            self.assertEqual(f.graph_cache_size, i + 1)
            self.assertEqual(list(f.captures)[-1], c[0])

    def test_graph_cache_counts_the_program_a_call_replays(self):
        # Under vmap (broadcast_all) the call replays the batched program:
        # that one is kept (and watched for replays), not the unbatched one
        # the trace also builds.
        f = gw.jax_callable(scale_fn, num_outputs=1, device=90, mode="direct", has_side_effect=True)
        text = jax.jit(jax.vmap(lambda x: f(x)[0])).trace(jnp.zeros((4, 24), jnp.float32)).lower(
            lowering_platforms=("cuda",)).as_text()
        (c,) = custom_calls(text)
        self.assertEqual(list(f.captures), [c[0]])
        self.assertEqual(len(f.programs), 2)  # the unbatched one, traced, and the batched one

    def test_cuda_call_needs_warps_cuda_support(self):
        # A Warp built without CUDA cannot build CUDA modules: a call
        # lowered for a GPU is refused with Warp's own message, and so is
        # graphd.warp.array_callable; the CPU call (Warp's own) still lowers.
        from unittest import mock
        f = gw.jax_callable(scale_fn, num_outputs=1, device=90, mode="staged_ex")
        k = gw.jax_kernel(count, device=90, output_dims=1, mode="staged_ex")
        x = jnp.zeros(9, jnp.float32)
        with mock.patch.object(wp._src.context.runtime, "is_cuda_enabled", False):
            for c in (f, k):
                with self.assertRaisesRegex(GraphdError, "does not include CUDA support"):
                    self.lower(lambda v, c=c: c(v)[0], x)
                jax.jit(lambda v, c=c: c(v)[0]).trace(x).lower(lowering_platforms=("cpu",))
            w = gw.array_callable(scale_fn, inputs=["x"], outputs=["y"], device=90)
            a = wp.zeros(9, dtype=float, device="cpu")
            with self.assertRaisesRegex(GraphdError, "does not include CUDA support"):
                w(a, a)
        self.assertEqual(len(custom_calls(self.lower(lambda v: f(v)[0], x))), 1)

    def test_array_made_outside_is_bound_at_its_address(self):
        # The call carries the fixed slot, the table's address and size as
        # the attribute `fixed`; operands and results name their own slots.
        f = gw.jax_callable(with_table, num_outputs=1, device=90)
        text = self.lower(f, jnp.zeros(16, jnp.float32))
        (c,) = custom_calls(text)
        self.assertEqual(c[1], [0, 1])
        (fixed,) = re.findall(r"fixed = dense<\[([-0-9, ]*)\]>", text)
        self.assertEqual([int(v) for v in fixed.split(",")], [2, TABLE.ptr, 256])
        self.assertEqual(program_of(f, c).fixed[0].arrays[0].ptr, TABLE.ptr)
        # Pageable host memory is refused where the call is lowered for a
        # GPU (a kernel there cannot read it); for the CPU it lowers.
        g = gw.jax_callable(with_body, num_outputs=1, output_dims={"out": 16}, device=90)
        with self.assertRaisesRegex(gw.Refused, "on the CPU and not pinned") as cm:
            self.lower(lambda: g())
        self.assertEqual(cm.exception.reason, "cpu_device")
        jax.jit(lambda: g()).trace().lower(lowering_platforms=("cpu",))

    def test_cpu_lowers_to_warps_own_call(self):
        # One call, lowered per platform: Warp's own FFI call for a CPU
        # device, graphd's replay for CUDA (a CPU call had lowered to
        # graphd's custom call, which has no CPU handler).
        f = gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"], output_dims={"y": 100}, device=90)
        x, v = jnp.zeros(100, jnp.float32), jnp.zeros((4, 5, 3), jnp.float32)
        g = lambda x, v, o: f(x, v, 2.0, o)
        k = gw.jax_kernel(count, device=90, output_dims=1)
        texts = {(what, platform): jax.jit(fn).trace(*a).lower(lowering_platforms=(platform,)).as_text()
                 for what, fn, a in (("callable", g, (x, v, v)), ("kernel", k, (x,))) for platform in ("cpu", "cuda")}
        for (what, platform), text in texts.items():
            self.assertEqual(len(custom_calls(text)), int(platform == "cuda"), (what, platform))
        for what, c in (("callable", f), ("kernel", k)):
            name = c.warp_callable().name
            for platform in ("cpu", "cuda"):
                self.assertEqual(texts[what, platform].count(f"custom_call @{name}("), int(platform == "cpu"),
                                 (what, platform))
        # Run on the CPU: Warp's result.
        if wp.is_cpu_available():
            (out,) = jax.jit(gw.jax_kernel(twice, device=90))(jnp.arange(8, dtype=jnp.float32))
            np.testing.assert_array_equal(np.asarray(out), 2.0 * np.arange(8, dtype=np.float32))

    def test_loop_lowers_to_a_graphd_replay(self):
        f = gw.jax_callable(w_loop, num_outputs=2, in_out_argnames=["counter", "x"], device=90)
        c = custom_calls(self.lower(f, jnp.zeros(1, jnp.int32), jnp.zeros(100, jnp.float32)))
        self.assertEqual(len(c), 1)
        b = program_of(f, c[0])
        self.assertEqual(c[0], (b.id_hex, [0, 1, 0, 1]))
        self.assertEqual([(x.kind, x.slot, x.body) for x in b.conds], [("while", 0, 2)])

    def test_empty_arrays_bind_nothing(self):
        f = gw.jax_callable(with_empty, num_outputs=2, in_out_argnames=["f"], device=90)
        x, none = jnp.zeros(100, jnp.float32), jnp.zeros(0, jnp.float32)
        c = custom_calls(self.lower(f, x, none, none))
        b = program_of(f, c[0])
        # Operands x, e, f; results f (in-out) and y: the empty ones are -1.
        self.assertEqual(c[0], (b.id_hex, [0, -1, -1, -1, 1]))
        self.assertEqual(b.arg_slots, {0: 0, 1: None, 2: None, 3: 1})
        self.assertEqual([(s.role, s.nbytes) for s in b.slots], [("input", 400), ("output", 400)])
        # The empty arrays' data pointers stay null in the parameters: no patch
        # there, only x's and y's.
        for l in b.launches:
            (x_p, e_p, y_p) = [p for p in l.params if p[0] in ("x", "e", "y")]
            self.assertEqual(e_p[4], [])
            self.assertEqual((len(x_p[4]), len(y_p[4])), (1, 1))
        out = jax.eval_shape(f, x, none, none)
        self.assertEqual([o.shape for o in out], [(0,), (100,)])
        # Not empty, the same arguments are slots again (another program).
        c2 = custom_calls(self.lower(f, x, x, x))
        self.assertEqual(c2[0][1], [0, 1, 2, 2, 3])

    def test_kernel(self):
        k = gw.jax_kernel(count, device=90, output_dims=1)
        x = jnp.zeros(500, jnp.float32)
        c = custom_calls(self.lower(k, x))
        b = program_of(k, c[0])
        self.assertEqual(c[0], (b.id_hex, [0, 1]))
        self.assertEqual(b.launches[0].grid, (2, 1, 1))

    def test_warp_argument_checks(self):
        f = gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"], device=90)
        v = jnp.zeros((4, 5, 3), jnp.float32)
        with self.assertRaisesRegex(TypeError, "Invalid data type"):
            f(jnp.zeros(10, jnp.int32), v, 1.0, v)
        with self.assertRaisesRegex(TypeError, "Invalid inner dimensions"):
            f(jnp.zeros(10, jnp.float32), jnp.zeros((4, 5, 2), jnp.float32), 1.0, v)
        with self.assertRaisesRegex(ValueError, "Expected 4 inputs"):
            f(jnp.zeros(10, jnp.float32))
        with self.assertRaises(ValueError):
            gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["y"])

    def test_no_gpu_means_refused(self):
        f = gw.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"])
        v = jnp.zeros((4, 5, 3), jnp.float32)
        with self.assertRaises(gw.Refused) as cm:
            jax.eval_shape(lambda x, v, o: f(x, v, 2.0, o), jnp.zeros(10, jnp.float32), v, v)
        self.assertEqual(cm.exception.reason, "cpu_device")

    def test_install(self):
        import warp
        orig = warp.jax_callable
        try:
            gw.install()
            # graphd.warp's, with fallback="warp" (what graphd cannot serve
            # runs as Warp's own).
            self.assertIs(warp.jax_callable.__wrapped__, gw.jax_callable)
            self.assertIs(warp.jax_kernel.__wrapped__, gw.jax_kernel)
            self.assertTrue(gw.installed())
            f = warp.jax_callable(jstep, num_outputs=2, in_out_argnames=["o"], graph_mode=warp.JaxCallableGraphMode.WARP_STAGED_EX,
                                  device=90)
            self.assertIsInstance(f, gw.JaxCallable)
            self.assertEqual(f.mode, "staged_ex")
            # Warp's clear_jax_callable_graph_cache() (every callable) reaches
            # graphd.warp's callables too; Warp's own only knew its own.
            self.assertIs(warp.clear_jax_callable_graph_cache, gw.clear_jax_callable_graph_cache)
            g = gw.jax_callable(scale_fn, num_outputs=1, device=90, mode="staged")
            (c,) = custom_calls(self.lower(g, jnp.zeros(7, jnp.float32)))
            self.assertEqual(list(g.captures), [c[0]])
            evicted, evict = [], gw_captures.evict_captures
            gw_captures.evict_captures = lambda ids, socket=None: evicted.extend(ids)
            try:
                warp.clear_jax_callable_graph_cache()
            finally:
                gw_captures.evict_captures = evict
            self.assertEqual(g.graph_cache_size, 0)
            self.assertIn(c[0], evicted)
        finally:
            gw.uninstall()
        self.assertIs(warp.jax_callable, orig)
        self.assertFalse(gw.installed())

    def handle_function(self):
        """A function graphd refuses (a launch passes a Warp BVH's id, an
        address in this process's CUDA context) and Warp runs: y = 4."""
        lo = wp.zeros(4, dtype=wp.vec3, device="cpu")
        hi = wp.array(np.ones((4, 3), dtype=np.float32), dtype=wp.vec3, device="cpu")
        bvh = wp.Bvh(lo, hi)

        def f_handle(x: wp.array(dtype=float), y: wp.array(dtype=float)):
            wp.launch(by_id, dim=x.shape[0], inputs=[bvh.id, wp.uint64(12345), y])

        f_handle.bvh = bvh  # alive as long as the function
        return f_handle

    def test_install_falls_back_to_warps_own_call(self):
        import logging
        import warp
        f_handle = self.handle_function()
        x = jnp.zeros(16, jnp.float32)
        # Called directly, without the keyword: refused, by name.
        with self.assertRaises(gw.Refused) as cm:
            self.lower(gw.jax_callable(f_handle, device=90), x)
        self.assertEqual(cm.exception.reason, "param_type")
        before = len(gw.fallbacks())
        try:
            gw.install()
            f = warp.jax_callable(f_handle, device=90)
            self.assertEqual(f.fallback, "warp")
            with self.assertLogs("graphd.warp", logging.INFO) as logs:
                text = self.lower(f, x)
            # Warp's own FFI call in the CUDA lowering, not graphd's replay.
            self.assertEqual(custom_calls(text), [])
            self.assertEqual(text.count(f"custom_call @{f.warp_callable().name}("), 1)
            self.assertEqual(len(logs.records), 1)
            self.assertRegex(logs.output[0], "INFO:graphd.warp:.*f_handle runs as Warp's own jax_callable "
                             r"\(param_type\).*id of a Warp Bvh")
            # Once per function and signature: later traces log nothing more.
            with self.assertNoLogs("graphd.warp", logging.INFO):
                text2 = self.lower(lambda x: f(x), x)
                self.assertEqual(custom_calls(text2), [])
            self.assertEqual(len(f.fallbacks), 1)
            new = gw.fallbacks()[before:]
            self.assertEqual([(r.name, r.reason) for r in new], [(f.__name__, "param_type")])
            self.assertTrue(new[0].name.endswith("f_handle"), new[0].name)
            # On the CPU the outputs are Warp's.
            if wp.is_cpu_available():
                (y,) = jax.jit(f)(x)
                np.testing.assert_array_equal(np.asarray(y), np.full(16, 4.0, np.float32))
                # vmap on the fallback path: Warp's own batching.
                (yb,) = jax.jit(jax.vmap(f))(jnp.zeros((3, 16), jnp.float32))
                np.testing.assert_array_equal(np.asarray(yb), np.full((3, 16), 4.0, np.float32))
            # The user's errors are still Warp's errors, not a fallback.
            with self.assertRaisesRegex(TypeError, "Invalid data type"):
                f(jnp.zeros(16, jnp.int32))
        finally:
            gw.uninstall()
        # Uninstalled, the same function without the keyword is refused again.
        with self.assertRaises(gw.Refused):
            self.lower(gw.jax_callable(f_handle, device=90), x)
        # The keyword alone falls back too; a bad one is refused.
        g = gw.jax_callable(f_handle, device=90, fallback="warp")
        self.assertEqual(custom_calls(self.lower(g, x)), [])
        with self.assertRaisesRegex(GraphdError, "fallback 'jax'"):
            gw.jax_callable(f_handle, device=90, fallback="jax")

    def test_install_runs_a_gpu_refit_as_warps_own_under_nested_vmap(self):
        # MJX's refit_bvh under install(), as its render test calls it (a
        # vmap, and a vmap of a vmap): graphd had made it a program that
        # wrote the boxes and never refit the BVH. The refit ran on the GPU
        # at once while the function was recorded, once a recording, on the
        # boxes of that moment; the nested vmap, recorded again for its
        # inner shape, left another tree than the single vmap did, and MJX's
        # render (Warp's own, it passes the BVH's id) drew other pixels.
        # Now it is refused where it is recorded and runs as Warp's own
        # call, refit included, at every call. Failed before: a graphd
        # replay, the refit run 6 times while lowering.
        import logging
        import warp
        nworld = 8
        pos = jnp.arange(nworld * 8, dtype=jnp.float32).reshape(nworld, 8)
        before = len(gw.fallbacks())
        with NativeStandIns() as native:
            try:
                gw.install()
                f = warp.jax_callable(refit_shim, num_outputs=1, output_dims={"token": (nworld,)},
                                      vmap_method=None, has_side_effect=True, device=90)
                self.assertIsInstance(f, gw.JaxCallable)
                single, nested = jax.vmap(mjx_style_refit(f, nworld)), jax.vmap(jax.vmap(mjx_style_refit(f, nworld)))
                with self.assertLogs("graphd.warp", logging.INFO) as logs:
                    texts = [self.lower(single, pos), self.lower(nested, pos.reshape(2, 4, 8))]
                for text in texts:
                    self.assertEqual(custom_calls(text), [])
                    self.assertEqual(text.count(f"custom_call @{f.warp_callable().name}("), 1)
                self.assertEqual(native.ran, [], "the refit ran while the call was lowered")
                self.assertEqual(f.programs, {})
                self.assertEqual([r.reason for r in f.fallbacks.values()], ["native"])
                self.assertEqual([(r.name, r.reason) for r in gw.fallbacks()[before:]], [(f.__name__, "native")])
                self.assertEqual(len(logs.records), 1, logs.output)
                self.assertRegex(logs.output[0], r"refit_shim runs as Warp's own jax_callable \(native\).*"
                                 r"wp_bvh_refit_device \(Bvh\.refit\)")
                if not wp.is_cpu_available():
                    return
                # On the CPU, Warp's own call: the refit runs once a call, and
                # the nested vmap gives the single vmap's worlds in order.
                got = {}
                for what, g, p in (("single", single, pos), ("nested", nested, pos.reshape(2, 4, 8))):
                    BOXES_MEMORY[:] = 0.0
                    native.ran.clear()
                    token = np.asarray(jax.block_until_ready(jax.jit(g)(p))).reshape(-1)
                    got[what] = (token, BOXES_MEMORY.copy())
                    self.assertEqual(native.ran, [("bvh", CUDA_BVH.id)], what)
            finally:
                gw.uninstall()
            # Warp's own jax_callable, nested the same way: bit for bit.
            w = warp.jax_callable(refit_shim, num_outputs=1, output_dims={"token": (nworld,)}, vmap_method=None,
                                  has_side_effect=True)
            self.assertNotIsInstance(w, gw.JaxCallable)
            BOXES_MEMORY[:] = 0.0
            token = np.asarray(jax.block_until_ready(jax.jit(jax.vmap(jax.vmap(mjx_style_refit(w, nworld))))(
                pos.reshape(2, 4, 8)))).reshape(-1)
            want = (token, BOXES_MEMORY.copy())
        np.testing.assert_array_equal(want[0], np.arange(nworld))
        np.testing.assert_array_equal(want[1], np.asarray(pos).reshape(-1) - 0.5)
        for what in ("single", "nested"):
            for g, w_ in zip(got[what], want):
                self.assertTrue(np.array_equal(g, w_), what)

    def test_install_from_the_environment(self):
        code = "import graphd, warp, graphd.warp as gw; print(warp.jax_callable.__wrapped__ is gw.jax_callable)"
        env = dict(os.environ, GRAPHD_WARP_INSTALL="1")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(r.stdout.strip().splitlines()[-1], "True")

    def test_install_from_the_environment_waits_for_warp_and_prints_nothing(self):
        """As a sitecustomize puts it in every Python process: a process
        that never imports Warp does not import it, and one that does gets
        graphd.warp's functions from its first import, with Warp not
        started (it prints its banner on stdout when it starts)."""
        env = dict(os.environ, GRAPHD_WARP_INSTALL="1")
        quiet = "import sys, graphd; print('warp' in sys.modules)"
        r = subprocess.run([sys.executable, "-c", quiet], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(r.stdout, "False\n")
        late = ("import graphd, warp, graphd.warp as gw; from warp._src.jax import ffi; "
                "from warp._src import context; "
                "print(gw.installed(), ffi.jax_kernel.__wrapped__ is gw.jax_kernel, context.runtime is None)")
        r = subprocess.run([sys.executable, "-c", late], capture_output=True, text=True, env=env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(r.stdout, "True True True\n")


if __name__ == "__main__":
    unittest.main()
