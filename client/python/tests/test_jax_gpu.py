"""graphd.jax on the GPU (the JAX scenarios): the doubling kernel under
jit(shard_map) over every local device in both modes, with exactly one
capture per device per program; vmap, pmap, fori_loop; an RL-style
lax.scan of 1000 steps on XLA temporaries checked against pure JAX; and a
daemon killed with SIGKILL mid-loop, which must surface as a Python
exception within 1 s, after which the next call works again; and a Triton
kernel (compiled here by Triton, with its hidden trailing parameters)
called through graphd.jax.

Run by tests/run_jax_gpu.sh (ctest label gpu) in a python that has jax
with CUDA. Without a GPU it skips; with GRAPHD_REQUIRE_GPU=1 a skip is a
failure."""

import faulthandler
import os
import tempfile
import threading
import time
import unittest

from _gpu_common import Daemon, GpuTestCase, unavailable

# libgraphd traces its stream releases and failures on stderr.
os.environ.setdefault("GRAPHD_CLIENT_DEBUG", "1")
# The handler counts its calls (read by the scan test); set before the first.
os.environ["GRAPHD_XLA_STATS"] = "1"
N = 1 << 16  # floats per device


def _gpu_or_skip():
    why = None
    try:
        import jax
        if not jax.devices("gpu"):
            why = "jax sees no GPU"
    except Exception as e:  # noqa: BLE001: any failure to find a GPU
        why = f"no jax with CUDA here ({e})"
    if why:
        unavailable(why)


def _thread_states():
    """Every thread's name, state, wait channel and kernel stack (the
    kernel stack needs root), for a hang that Python's stacks cannot
    explain: a thread in the GPU driver shows it there."""
    out = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        d = f"/proc/self/task/{tid}"
        row = [tid]
        for name in ("comm", "wchan"):
            try:
                with open(f"{d}/{name}") as f:
                    row.append(f.read().strip())
            except OSError:
                row.append("?")
        try:
            with open(f"{d}/stat") as f:
                row.append("state " + f.read().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass
        try:
            with open(f"{d}/stack") as f:
                row.append("| " + " < ".join(x.split()[1] for x in f.read().splitlines()[:6]))
        except (OSError, IndexError):
            pass
        out.append(" ".join(row))
    return "\n".join(out)


def _compile_triton_axpy(n):
    """Compiles out = a * x + y with Triton (through one torch launch) and
    returns the CompiledKernel."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def axpy_kernel(x_ptr, y_ptr, out_ptr, a, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m)
        y = tl.load(y_ptr + offs, mask=m)
        tl.store(out_ptr + offs, a * x + y, mask=m)

    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.ones(n, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    k = axpy_kernel[(triton.cdiv(n, 1024),)](x, y, out, 2.0, n, BLOCK=1024)
    torch.cuda.synchronize()
    assert torch.equal(out, 2 * x + y), "Triton's own launch is wrong"
    return k


class JaxGpuTest(GpuTestCase):
    HANG_S = 150

    @classmethod
    def setUpClass(cls):
        _gpu_or_skip()
        import jax
        import jax.numpy as jnp
        import numpy as np
        import graphd
        import graphd.jax as gj
        cls.jax, cls.jnp, cls.np, cls.graphd, cls.gj = jax, jnp, np, graphd, gj
        cls.dir = tempfile.mkdtemp(prefix="graphd-jax-")
        cls.daemon = Daemon(os.path.join(cls.dir, "graphd.sock"), log_level="warn")
        os.environ["GRAPHD_SOCKET"] = cls.daemon.sock
        # A daemon killed while none of our replays is in flight (between two
        # jitted calls) has cut nothing off, and libgraphd waits for the next
        # one up to this bound (30 s by default) before the call fails: the
        # kill test below would wait that long once in a while. Read when the
        # handler connects, so set before any call.
        os.environ["GRAPHD_RECONNECT_MS"] = "300"
        cls.daemon.start()
        with open(os.path.join(os.environ["GRAPHD_CUDA_KERNELS"], "test_kernels.cubin"), "rb") as f:
            cls.cubin = f.read()
        cls.mod = graphd.module_id("cubin", cls.cubin)

    def build_double(self, x, *, mode):
        """y = 2 x with the CUDA C `scale` kernel, for this shape."""
        from graphd import Slot, f32, u32
        n = x.size
        nb = n * x.dtype.itemsize
        p = self.graphd.Program(mode)
        a = p.add_slot("input", nb)
        b = p.add_slot("output", nb)
        p.launch(self.mod, "scale", grid=(n + 255) // 256, block=256,
                 args=[Slot(a), Slot(b), f32(2.0), u32(n)])
        return self.gj.Spec(p, results=[x], operand_slots=[a], result_slots=[b],
                            modules=[("cubin", self.cubin)])

    def ctl(self):
        return self.graphd.Client.connect(self.daemon.sock)

    def captures_of(self, pid_hex):
        with self.ctl() as c:
            return [x for x in c.list_captures() if x["program"] == pid_hex]

    def test_double_under_jit_shard_map_one_capture_per_device_both_modes(self):
        jax, jnp, np = self.jax, self.jnp, self.np
        from jax.sharding import PartitionSpec as P
        ndev = len(jax.local_devices())
        mesh = jax.make_mesh((ndev,), ("d",))
        for mode in ("staged", "staged_ex"):
            with self.subTest(mode=mode):
                f = self.gj.program_callable(self.build_double, mode=mode)
                g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
                # A size no other test uses, so the counts below are this test's.
                m = N + 1024
                # Placed on the mesh already: a jit(shard_map) whose operand
                # is on one device is refused by JAX (in_specs mismatch).
                x = jax.device_put(jnp.arange(ndev * m, dtype=jnp.float32),
                                   jax.sharding.NamedSharding(mesh, P("d")))
                calls = 0
                for k in range(2 + 100):  # twice, then many times
                    y = g(x + k)
                    calls += 1
                    if k < 2 or k % 25 == 0:
                        np.testing.assert_array_equal(np.asarray(y), 2 * (np.arange(ndev * m) + k))
                y.block_until_ready()
                (b,) = f.programs.values()
                caps = self.captures_of(b.id_hex)
                self.assertEqual(sorted(c["device"] for c in caps), list(range(ndev)), caps)
                for c in caps:
                    self.assertEqual(c["replays"], calls, c)

    def test_vmap_pmap_and_fori_loop(self):
        jax, jnp, np = self.jax, self.jnp, self.np
        x = jnp.arange(N, dtype=jnp.float32)
        for method in ("sequential", "broadcast_all"):
            f = self.gj.program_callable(self.build_double, vmap_method=method)
            xs = jnp.stack([x, x + 1, x + 2])
            ys = jax.jit(jax.vmap(f))(xs)
            np.testing.assert_array_equal(np.asarray(ys), 2 * np.asarray(xs), err_msg=method)
        f = self.gj.program_callable(self.build_double)
        ndev = len(jax.local_devices())
        xp = jnp.stack([x + i for i in range(ndev)])
        np.testing.assert_array_equal(np.asarray(jax.pmap(f)(xp)), 2 * np.asarray(xp))
        out = jax.jit(lambda v: jax.lax.fori_loop(0, 10, lambda i, c: f(c) * 0.5 + 1.0, v))(x)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x) + 10)

    def test_constants_of_the_jitted_function_go_through_copies(self):
        # An array the jitted function closes over is a constant in XLA's
        # module memory, which the daemon cannot map; the handler binds a
        # copy of it instead (copied on the stream before each replay).
        jax, jnp, np = self.jax, self.jnp, self.np
        f = self.gj.program_callable(self.build_double)
        const = jnp.arange(N + 3, dtype=jnp.float32) * 0.5
        g = jax.jit(lambda k: f(const) + k)
        for k in range(20):
            np.testing.assert_array_equal(np.asarray(g(float(k))), 2 * np.asarray(const) + k)
        # The copy is checked on the executable's first call only (the
        # handler's state from XLA's instantiate stage): none of the calls
        # after it asks the driver anything about it.
        before = self.gj.xla_stats()
        for k in range(20):
            np.testing.assert_array_equal(np.asarray(g(float(k))), 2 * np.asarray(const) + k)
        d = {k: v - before[k] for k, v in self.gj.xla_stats().items()}
        self.assertEqual(d["calls"], 20, d)
        self.assertEqual(d["id_queries"], 0, d)
        self.assertEqual(d["stateless"], 0, d)
        self.assertGreater(self.gj.xla_stats()["executables"], 0)
        # A folded constant that changes from one program to the next.
        h = jax.jit(lambda: jax.lax.scan(lambda c, _: (f(c), None), const, None, length=5)[0])
        np.testing.assert_array_equal(np.asarray(h()), 32 * np.asarray(const))
        # Executables made and freed one after another, each closing over a
        # constant of the same size with other contents: XLA may load one's
        # constant where a freed one's was, and each must still see its own.
        for j in range(12):
            c = jnp.full((N + 3,), float(j), dtype=jnp.float32)
            gj_ = jax.jit(lambda k, c=c: f(c) + k)
            for k in range(2):
                np.testing.assert_array_equal(np.asarray(gj_(float(k))),
                                              np.full(N + 3, 2.0 * j + k, dtype=np.float32))
            del gj_, c
            jax.clear_caches()
        print("FIGURE a closed-over constant bound through a copy: 40 calls, no driver query after "
              "the first; a scan of 5; 12 executables made and freed in turn, exact")

    def test_rl_style_scan_of_1000_steps_matches_pure_jax(self):
        for sync in (False, True):
            with self.subTest(sync=sync):
                self.rl_scan(sync)
        self.assertIsNone(self.gj.collect())  # nothing failed, nothing left

    def rl_scan(self, sync):
        jax, jnp, np = self.jax, self.jnp, self.np
        f = self.gj.program_callable(self.build_double, sync=sync)

        def step_graphd(s, _):
            obs = jnp.sin(s) + 1.0           # an XLA temporary as the input
            act = f(obs)                      # graphd's output, also a temporary
            return s * 0.99 + act * 1e-3, act[0]

        def step_ref(s, _):
            obs = jnp.sin(s) + 1.0
            # The barrier keeps XLA from fusing the doubling into the update
            # (graphd's output is opaque to it), so both round alike.
            act = jax.lax.optimization_barrier(obs * 2.0)
            return s * 0.99 + act * 1e-3, act[0]

        s0 = jnp.linspace(0.0, 1.0, N, dtype=jnp.float32)
        before = self.gj.xla_stats()
        got = jax.jit(lambda s: jax.lax.scan(step_graphd, s, None, length=1000))(s0)
        jax.block_until_ready(got)
        after = self.gj.xla_stats()
        want = jax.jit(lambda s: jax.lax.scan(step_ref, s, None, length=1000))(s0)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
        # The handler counted every call of the scan, its two bindings, and
        # where its host time went.
        self.assertIsNotNone(before)
        d = {k: after[k] - before[k] for k in after}
        self.assertEqual(d["calls"], 1000, d)
        self.assertEqual(d["sync_calls"], 1000 if sync else 0, d)
        self.assertEqual(d["buffers"], 2000, d)
        self.assertGreater(d["replay_ns"], 0, d)
        self.assertGreaterEqual(d["handler_ns"], d["replay_ns"], d)
        self.assertGreaterEqual(d["replay_ns"], d["wait_ns"], d)
        self.assertGreaterEqual(d["handler_ns"], d["replay_ns"] + d["bounce_ns"], d)
        print(f"test_jax_gpu: sync={sync}: a call {d['handler_ns'] / 1e3 / 1000:.2f} us in the handler, "
              f"{(d['handler_ns'] - d['wait_ns']) / 1e3 / 1000:.2f} us of it its own work", flush=True)

    def test_rl_style_scan_sharded_across_devices(self):
        jax, jnp, np = self.jax, self.jnp, self.np
        from jax.sharding import PartitionSpec as P
        ndev = len(jax.local_devices())
        mesh = jax.make_mesh((ndev,), ("d",))
        f = self.gj.program_callable(self.build_double)

        def run(double):
            def step(s, _):
                obs = jnp.sin(s) + 1.0
                return s * 0.99 + double(obs) * 1e-3, None
            body = lambda s: jax.lax.scan(step, s, None, length=300)[0]
            return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P("d")))

        m = N + 2048  # this test's own program size
        s0 = jax.device_put(jnp.linspace(0.0, 1.0, ndev * m, dtype=jnp.float32),
                            jax.sharding.NamedSharding(mesh, P("d")))
        got = run(f)(s0)
        want = run(lambda o: jax.lax.optimization_barrier(o * 2.0))(s0)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        (b,) = f.programs.values()
        caps = self.captures_of(b.id_hex)
        self.assertEqual(sorted(c["device"] for c in caps), list(range(ndev)), caps)
        for c in caps:
            self.assertEqual(c["replays"], 300, c)

    def test_triton_kernel_with_hidden_parameters(self):
        jax, jnp, np = self.jax, self.jnp, self.np
        from graphd import Slot, f32, u32
        from graphd.triton import Kernel
        k = Kernel(_compile_triton_axpy(N))
        hidden = k.hidden(5)
        print(f"FIGURE triton kernel {k.name}: {k.params} parameters, {hidden} hidden, block {k.block}")
        self.assertGreaterEqual(hidden, 1, "Triton 3.x appends scratch pointers")

        def build(x, y, *, mode):
            n, nb = x.size, x.size * 4
            p = self.graphd.Program(mode)
            xs, ys, os_ = p.add_slot("input", nb), p.add_slot("input", nb), p.add_slot("output", nb)
            k.launch(p, (n + 1023) // 1024, [Slot(xs), Slot(ys), Slot(os_), f32(2.0), u32(n)])
            return self.gj.Spec(p, results=[x], operand_slots=[xs, ys], result_slots=[os_],
                                modules=[k.module])

        f = jax.jit(self.gj.program_callable(build))
        x = jnp.arange(N, dtype=jnp.float32)
        for y0 in (1.0, -3.0):
            y = jnp.full((N,), y0, dtype=jnp.float32)
            np.testing.assert_array_equal(np.asarray(f(x, y)), 2 * np.asarray(x) + y0)

    def test_daemon_killed_mid_loop_raises_within_a_second_then_recovers(self):
        jax, jnp, np = self.jax, self.jnp, self.np
        f = self.gj.program_callable(self.build_double)
        loop = jax.jit(lambda v: jax.lax.fori_loop(0, 200, lambda i, c: f(c) * 0.5, v))
        x = jnp.arange(N, dtype=jnp.float32)
        np.testing.assert_array_equal(np.asarray(loop(x)), np.asarray(x))
        result = {}

        def run():
            try:
                while "killed" not in result or time.monotonic() < result["killed"] + 5:
                    loop(x).block_until_ready()
                result["error"] = "no exception within 5 s of the kill"
            except Exception as e:  # noqa: BLE001: any XLA error type
                result["raised"] = time.monotonic()
                result["error"] = str(e)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.5)
        result["killed"] = time.monotonic()
        self.daemon.kill()
        t.join(20)
        if t.is_alive():
            # Hung: say where, then leave (the process cannot go on).
            print("HANG: the loop is still running 20 s after the daemon died", flush=True)
            print(_thread_states(), flush=True)
            faulthandler.dump_traceback(all_threads=True)
            os._exit(3)
        self.assertIn("raised", result, result.get("error"))
        took = result["raised"] - result["killed"]
        print(f"FIGURE daemon SIGKILL to Python exception: {took * 1e3:.1f} ms")
        self.assertLess(took, 1.0)
        self.assertIn("graphd", result["error"])
        self.daemon.start()
        # The handler connects again and re-registers from the client-side
        # registry on its own.
        np.testing.assert_array_equal(np.asarray(loop(x)), np.asarray(x))


if __name__ == "__main__":
    unittest.main()
