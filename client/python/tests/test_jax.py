"""graphd.jax on CPU: the lowering of graphd.jax.program_callable (the handler is a
CUDA target, so nothing is run here; the GPU suite runs it). Skipped when
jax cannot be imported, or when libgraphd_xla was not built
($GRAPHD_XLA_LIB unset)."""

import os
import re
import subprocess
import sys
import unittest

try:
    import jax
    import jax.numpy as jnp
    import numpy as np
    HAVE_JAX = True
except ImportError as e:  # noqa: F841
    HAVE_JAX = False
    WHY = f"jax is not importable ({e}); install it for these tests (docs/jax.md)"

import graphd
from graphd import Slot, u32
from graphd.errors import GraphdError

import _env
from _env import path

MOD = b"\x7fELF not a real cubin: lowering never loads it"


def lower(f, *args):
    """The StableHLO text of jit(f) lowered for CUDA (the CPU jaxlib can
    lower for CUDA; it cannot run it)."""
    return jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def calls(text):
    """(program hex, slots list) of each custom_call to graphd_replay."""
    out = []
    for line in text.splitlines():
        if "custom_call @graphd_replay" in line:
            m = re.search(r'program = "([0-9a-f]{64})", slots = dense<\[?([-0-9, ]*)\]?> : tensor<(\d+)xi64>',
                          line)
            assert m, line
            slots = [int(s) for s in m.group(2).split(",")]
            n = int(m.group(3))
            out.append((m.group(1), slots * n if len(slots) == 1 else slots))  # a splat: dense<0>
    return out


@unittest.skipUnless(HAVE_JAX, WHY if not HAVE_JAX else "")
class TestJaxLowering(unittest.TestCase):
    def setUp(self):
        path(self, "GRAPHD_LIB")
        if _env.INSTALLED:
            path(self, "GRAPHD_XLA_LIB")  # the wheel must carry it
        elif not os.environ.get("GRAPHD_XLA_LIB"):
            raise unittest.SkipTest("$GRAPHD_XLA_LIB is not set (libgraphd_xla not built)")
        import graphd.jax as gj
        self.gj = gj
        self.built = []

    def build(self, x, *, mode):
        """scale(x) -> y, one program per shape."""
        gj = self.gj
        nb = x.size * x.dtype.itemsize
        p = graphd.Program(mode)
        a = p.add_slot("input", nb)
        b = p.add_slot("output", nb)
        p.launch(graphd.module_id("cubin", MOD), "scale", grid=max(1, x.size // 256), block=256,
                 args=[Slot(a), Slot(b), u32(x.size)])
        self.built.append((tuple(x.shape), p))
        return gj.Spec(p, results=[x], operand_slots=[a], result_slots=[b], modules=[("cubin", MOD)])

    def expected_id(self, shape, mode="staged"):
        x = jax.ShapeDtypeStruct(shape, np.float32)
        spec = self.build(x, mode=mode)
        return spec.program.finish()[1].hex()

    def test_the_old_spelling_callable_is_program_callable_and_shadows_nothing(self):
        # graphd.jax.callable still works, from the module and by import,
        # but is no global of graphd.jax: the builtin stays the builtin
        # there, and `from graphd.jax import *` does not bind it.
        from graphd.jax import callable as old
        self.assertIs(old, self.gj.program_callable)
        self.assertIs(self.gj.callable, self.gj.program_callable)
        self.assertNotIn("callable", vars(self.gj))
        self.assertNotIn("callable", self.gj.__all__)
        with self.assertRaises(AttributeError):
            self.gj.no_such_name  # noqa: B018

    def test_custom_call_has_program_and_slots(self):
        f = self.gj.program_callable(self.build)
        x = jnp.zeros((512,), jnp.float32)
        c = calls(lower(f, x))
        self.assertEqual(len(c), 1)
        self.assertEqual(c[0][0], self.expected_id((512,)))
        self.assertEqual(c[0][1], [0, 1])
        # The handler's program is in the client-side registry: adding it
        # again is accepted.
        from graphd import _lib
        (key, b), = f.programs.items()
        self.assertEqual(b.id_hex, c[0][0])
        _lib.registry_add_program(b.id, b.encoding)

    def test_calls_are_async_unless_sync_is_asked_for(self):
        x = jnp.ones(256, jnp.float32)
        text = lower(self.gj.program_callable(self.build), x)
        self.assertEqual(len(calls(text)), 1)
        self.assertNotIn("sync", text)
        text = lower(self.gj.program_callable(self.build, sync=True), x)
        self.assertEqual(len(calls(text)), 1)
        self.assertRegex(text, r"custom_call @graphd_replay.*sync = true")
        # With nothing replayed in this process, nothing is left to report.
        self.assertIsNone(self.gj.collect())

    def test_each_shape_is_its_own_program_and_cached(self):
        f = self.gj.program_callable(self.build)
        a = calls(lower(f, jnp.zeros((512,), jnp.float32)))[0][0]
        b = calls(lower(f, jnp.zeros((1024,), jnp.float32)))[0][0]
        a2 = calls(lower(f, jnp.ones((512,), jnp.float32)))[0][0]
        self.assertNotEqual(a, b)
        self.assertEqual(a, a2)
        self.assertEqual(len(f.programs), 2)
        self.assertEqual(len(self.built), 2)  # build ran once per shape
        self.assertEqual(b, self.expected_id((1024,)))

    def test_mode_is_per_callable(self):
        f = self.gj.program_callable(self.build, mode="staged_ex")
        pid = calls(lower(f, jnp.zeros((512,), jnp.float32)))[0][0]
        self.assertEqual(pid, self.expected_id((512,), "staged_ex"))
        self.assertNotEqual(pid, self.expected_id((512,), "staged"))
        g = self.gj.program_callable(lambda x, mode: self.build(x, mode="staged"), mode="staged_ex")
        with self.assertRaisesRegex(GraphdError, "mode is staged_ex"):
            lower(g, jnp.zeros((512,), jnp.float32))

    def test_vmap_broadcast_all_builds_the_batched_program(self):
        f = self.gj.program_callable(self.build, vmap_method="broadcast_all")
        xs = jnp.zeros((3, 512), jnp.float32)
        c = calls(lower(jax.vmap(f), xs))
        self.assertEqual(len(c), 1)
        self.assertEqual(c[0][0], self.expected_id((3, 512)))
        c4 = calls(lower(jax.vmap(f), jnp.zeros((4, 512), jnp.float32)))
        self.assertEqual(c4[0][0], self.expected_id((4, 512)))
        self.assertNotEqual(c[0][0], c4[0][0])
        # Outside jit too (traced by vmap only): the same program.
        self.assertEqual(jax.eval_shape(jax.vmap(f), xs).shape, (3, 512))

    def test_vmap_sequential_loops_over_the_unbatched_program(self):
        f = self.gj.program_callable(self.build, vmap_method="sequential")
        text = lower(jax.vmap(f), jnp.zeros((3, 512), jnp.float32))
        c = calls(text)
        self.assertEqual(len(c), 1)
        self.assertEqual(c[0][0], self.expected_id((512,)))
        self.assertIn("stablehlo.while", text)

    def test_vmap_without_a_method_raises(self):
        f = self.gj.program_callable(self.build)
        with self.assertRaises(Exception):
            lower(jax.vmap(f), jnp.zeros((3, 512), jnp.float32))

    def test_inout_slot_aliases_the_result(self):
        gj = self.gj

        def build(x, *, mode):
            nb = x.size * x.dtype.itemsize
            p = graphd.Program(mode)
            s = p.add_slot("inout", nb)
            p.launch(graphd.module_id("cubin", MOD), "inc", grid=1, block=256, args=[Slot(s), u32(x.size)])
            return gj.Spec(p, results=[x], operand_slots=[s], result_slots=[s], modules=[("cubin", MOD)])

        f = gj.program_callable(build)
        text = lower(f, jnp.zeros((256,), jnp.float32))
        self.assertEqual(calls(text)[0][1], [0, 0])
        self.assertIn("output_operand_aliases", text)

    def test_empty_operands_and_results_bind_no_slot(self):
        gj = self.gj

        def build(x, e, *, mode):
            nb = x.size * x.dtype.itemsize
            p = graphd.Program(mode)
            s = p.add_slot("inout", nb)
            p.launch(graphd.module_id("cubin", MOD), "inc", grid=1, block=256, args=[Slot(s), u32(x.size)])
            # e is empty: no slot, as an operand and as a result.
            return gj.Spec(p, results=[x, e], operand_slots=[s, None], result_slots=[s, None],
                           modules=[("cubin", MOD)])

        f = gj.program_callable(build)
        text = lower(f, jnp.zeros((256,), jnp.float32), jnp.zeros((0,), jnp.float32))
        self.assertEqual(calls(text)[0][1], [0, -1, 0, -1])
        self.assertEqual(gj.Spec(None, results=[], operand_slots=[0, None, 1], result_slots=[]).aliases(), {})
        spec = gj.Spec(None, results=[jnp.zeros(1), jnp.zeros(0)], operand_slots=[None, 3],
                       result_slots=[3, None])
        self.assertEqual(spec.aliases(), {1: 0})  # the empty ones are not paired
        with self.assertRaises(graphd.GraphdError):
            gj.Spec(None, results=[], operand_slots=[2, 2], result_slots=[])

    def test_inside_scan(self):
        f = self.gj.program_callable(self.build)

        def loop(x):
            return jax.lax.scan(lambda c, _: (f(c), None), x, None, length=5)[0]

        c = calls(lower(loop, jnp.zeros((512,), jnp.float32)))
        self.assertEqual(len(c), 1)
        self.assertEqual(c[0][0], self.expected_id((512,)))

    def test_inside_shard_map_the_result_carries_a_scan(self):
        # Under shard_map an operand varies over the mesh axis; the result
        # must too, or it cannot replace the scan's carry (JAX refuses the
        # scan: the carry's types differ).
        from jax.sharding import NamedSharding, PartitionSpec as P
        f = self.gj.program_callable(self.build)
        ndev = len(jax.local_devices())
        mesh = jax.make_mesh((ndev,), ("d",))

        def per_shard(x):
            return jax.lax.scan(lambda c, _: (f(c), None), x, None, length=5)[0]

        g = jax.shard_map(per_shard, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
        x = jax.device_put(jnp.zeros((512 * ndev,), jnp.float32), NamedSharding(mesh, P("d")))
        c = calls(lower(g, x))
        self.assertEqual(len(c), 1)
        self.assertEqual(c[0][0], self.expected_id((512,)))

    def test_registry_refuses_a_bogus_program(self):
        from graphd import _lib
        p = graphd.Program("staged")
        a = p.add_slot("input", 1024)
        p.launch(graphd.module_id("cubin", b"never added to the registry"), "k", grid=1, block=1,
                 args=[Slot(a)])
        enc, pid = p.finish()
        with self.assertRaises(GraphdError):  # its module is not in the registry
            _lib.registry_add_program(pid, enc)
        _lib.registry_add_module("cubin", MOD)
        q = graphd.Program("staged")
        q.add_slot("input", 64)
        q.launch(graphd.module_id("cubin", MOD), "k", grid=1, block=1, args=[Slot(0)])
        enc, pid = q.finish()
        with self.assertRaises(GraphdError):  # the id does not match the bytes
            _lib.registry_add_program(bytes(32), enc)
        _lib.registry_add_program(pid, enc)
        _lib.registry_add_program(pid, enc)  # again: accepted

    def test_xla_stats_only_when_the_process_counts(self):
        # The handler reads GRAPHD_XLA_STATS once a process: each case gets
        # a process of its own.
        code = "import graphd.jax as gj; s = gj.xla_stats(); print(s and sorted(s.items()))"
        for value, want in (("1", "[('bounce_copies', 0), ('bounce_ns', 0), ('bounced', 0), ('buffers', 0), "
                                  "('calls', 0), ('executables', 0), ('handler_ns', 0), ('id_queries', 0), "
                                  "('replay_ns', 0), ('stateless', 0), ('sync_calls', 0), ('unaliased', 0), "
                                  "('wait_ns', 0)]"),
                            (None, "None"), ("0", "None")):
            env = dict(os.environ)
            env.pop("GRAPHD_XLA_STATS", None)
            if value is not None:
                env["GRAPHD_XLA_STATS"] = value
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                 timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.strip(), want)

    def test_handler_shares_the_process_libgraphd(self):
        self.gj.xla_lib()
        with open("/proc/self/maps") as m:
            libs = {line.split()[-1] for line in m if "libgraphd.so" in line}
        self.assertEqual(len(libs), 1, libs)


if __name__ == "__main__":
    unittest.main()
