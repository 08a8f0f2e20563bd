"""graphd.warp on the GPU, against Warp's own JAX interop:

(a) a particle step (gravity and a floor bounce) under jax.jit + lax.scan
    for 1000 steps through graphd.warp.jax_callable in staged and
    staged_ex modes, bit for bit equal to warp.jax_callable's (its default
    graph mode), with one capture per program that all 1000 replays use;
(b) the same under vmap (broadcast_all and sequential), equal to Warp's
    vmap and to each environment run alone;
(c) a step whose substeps are a wp.capture_while loop over a count that
    is data (one program for every count), equal to the same substeps
    unrolled in a Warp function run by Warp's jax_callable;
(d) `graphctl evict --all` in the middle of a scan (from a host callback
    at step 500): exactly one re-capture, the replays of the evicted and
    the new capture add up, and the result is the one without eviction;
(e) graphd.warp.array_callable outside JAX, on Warp arrays that change every
    step (ping-pong), staged and direct, equal to the same launches in
    Warp;
(f) a second process running the same function shares its capture: one
    capture, both processes' pids on it;
(g) wp.launch_tiled through graphd.warp matches Warp (block size kept);
(h) jit(shard_map) over every local GPU: one capture of the program on
    each device, each replayed once a step, the particles equal to Warp's
    step of all of them on one device (written for N devices);
(i) Warp's own vmap lookup case: an unbatched table, batched indices,
    launch_dims / output_dims for one element through functools.partial,
    batched on either axis, broadcast_all and sequential, jax_kernel and
    jax_callable: every batch equal to Warp's and to JAX's lookup;
(j) one graphd.warp callable called on the GPU and on JAX's CPU device:
    the GPU call is graphd's (a capture), the CPU call Warp's own (no new
    program), both equal to the lookup (skipped where Warp has no CPU
    compiler);
(k) a function that reads and writes a Warp array made on the GPU before
    the calls (from Warp's memory pool, bound through the handler's
    copies, and from cuMemAlloc, bound as it is), staged and direct: the
    outputs of 20 jitted calls and the array afterwards bit for bit
    equal to Warp's jax_callable on an array of the same contents;
(l) under graphd.warp.install(), a function whose kernel queries a Warp
    BVH by its id (an address in this process's CUDA context, which
    graphd refuses) runs as Warp's own call: no graphd program, the
    fallback logged once, and its outputs over 10 jitted calls (also
    under vmap) bit for bit equal to Warp's jax_callable;
(m) MJX's render test in small under install(): a refit (boxes written
    into arrays made before the calls, then Bvh.refit on the GPU) and a
    query by the BVH's id, each a jax_callable with vmap_method None
    under custom_vmap, called in a vmap and in a vmap of vmaps: both run
    as Warp's own calls (native, param_type) and every hit is Warp's, bit
    for bit (graphd had made the refit a program that never refit the
    tree).
Mode "direct" and "auto" run in (a) too (auto goes direct there: its
buffers outweigh its one kernel node).

Warp's result is first checked to be deterministic (two runs, bit for
bit); the comparisons are then bit for bit. Were Warp's own runs to differ,
the comparisons fall back to a tolerance and say so in a FIGURE line.

Run by tests/run_warp_gpu.sh (ctest label gpu) in a python that has jax
with CUDA and Warp (warp-lang 1.19) on PYTHONPATH, against a daemon it
starts ($GRAPHD_BIN, graphctl from $GRAPHCTL_BIN). Without a GPU, jax or
Warp it skips; with GRAPHD_REQUIRE_GPU=1 each of those is a failure."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

from _gpu_common import Daemon, GpuTestCase, require_built, unavailable

STEPS = 1000
DT = 0.005

try:
    import numpy as np
    import warp as wp
    WARP_ERROR = None
except Exception as e:  # noqa: BLE001: any failure to import Warp
    WARP_ERROR = e

if WARP_ERROR is None:
    # The kernels live in this module, with the functions that launch them:
    # Warp's jax_callable loads the module of the function it calls.

    @wp.kernel
    def integrate(pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3), dt: float,
                  pos_out: wp.array(dtype=wp.vec3), vel_out: wp.array(dtype=wp.vec3)):
        i = wp.tid()
        v = vel[i] + wp.vec3(0.0, -9.81, 0.0) * dt
        p = pos[i] + v * dt
        if p[1] < 0.0:
            p = wp.vec3(p[0], -0.8 * p[1], p[2])
            v = wp.vec3(v[0], -0.8 * v[1], v[2])
        pos_out[i] = p
        vel_out[i] = v

    @wp.kernel
    def integrate_in_place(pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3), dt: float):
        i = wp.tid()
        v = vel[i] + wp.vec3(0.0, -9.81, 0.0) * dt
        p = pos[i] + v * dt
        if p[1] < 0.0:
            p = wp.vec3(p[0], -0.8 * p[1], p[2])
            v = wp.vec3(v[0], -0.8 * v[1], v[2])
        pos[i] = p
        vel[i] = v

    @wp.kernel
    def count_down(c: wp.array(dtype=wp.int32)):
        c[0] = c[0] - 1

    def particles(pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3), dt: float,
                  pos_out: wp.array(dtype=wp.vec3), vel_out: wp.array(dtype=wp.vec3)):
        wp.launch(integrate, dim=pos.shape[0], inputs=[pos, vel, dt], outputs=[pos_out, vel_out])

    def substeps_loop(pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3), nsub: wp.array(dtype=wp.int32),
                      dt: float, pos_out: wp.array(dtype=wp.vec3), vel_out: wp.array(dtype=wp.vec3)):
        """nsub[0] substeps, counted down on the device by a capture_while loop."""
        counter = wp.empty(1, dtype=wp.int32)
        wp.copy(counter, nsub)
        wp.copy(pos_out, pos)
        wp.copy(vel_out, vel)

        def body():
            wp.launch(integrate_in_place, dim=pos.shape[0], inputs=[pos_out, vel_out, dt])
            wp.launch(count_down, dim=1, inputs=[counter])
        wp.capture_while(counter, body)

    def substeps_unrolled(pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3), k: int, dt: float,
                          pos_out: wp.array(dtype=wp.vec3), vel_out: wp.array(dtype=wp.vec3)):
        """The same k substeps, unrolled on the host (k is static)."""
        wp.copy(pos_out, pos)
        wp.copy(vel_out, vel)
        for _ in range(k):
            wp.launch(integrate_in_place, dim=pos.shape[0], inputs=[pos_out, vel_out, dt])

    @wp.kernel
    def lookup(table: wp.array(dtype=float), indices: wp.array(dtype=int), output: wp.array(dtype=float)):
        i = wp.tid()
        output[i] = table[indices[i]]

    def lookup_fn(table: wp.array(dtype=float), indices: wp.array(dtype=int), output: wp.array(dtype=float)):
        wp.launch(lookup, dim=indices.shape, inputs=[table, indices, output])

    @wp.kernel
    def accumulate(x: wp.array(dtype=float), acc: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        a = acc[i] + x[i]
        acc[i] = a
        y[i] = 2.0 * a

    # Device memory a library made before the calls (as MJX's render
    # context holds its buffers), which the function closes over.
    OUTSIDE = {}

    def with_outside(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(accumulate, dim=x.shape[0], inputs=[x, OUTSIDE["acc"]], outputs=[y])

    @wp.kernel
    def boxes_near(bvh: wp.uint64, x: wp.array(dtype=float), y: wp.array(dtype=float)):
        """y[i]: how many of the BVH's boxes are within 0.5 of (x[i], 0, 0)."""
        i = wp.tid()
        p = wp.vec3(x[i], 0.0, 0.0)
        query = wp.bvh_query_aabb(bvh, p - wp.vec3(0.5), p + wp.vec3(0.5))
        hit = int(0)
        n = int(0)
        while wp.bvh_query_next(query, hit):
            n += 1
        y[i] = float(n) + x[i]

    # A BVH a library built before the calls (as MJX's render context).
    BVH = {}

    def with_bvh(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        wp.launch(boxes_near, dim=x.shape[0], inputs=[BVH["bvh"].id, x], outputs=[y])

    # (m): MJX's refit_bvh and render in small. A scene made before the
    # calls (as MJX's render context): a BVH on the GPU over one box per
    # world and index, and its bounds arrays.
    SCENE = {}

    @wp.kernel
    def scene_boxes(pos: wp.array2d(dtype=float), lowers: wp.array(dtype=wp.vec3),
                    uppers: wp.array(dtype=wp.vec3), token: wp.array(dtype=int)):
        w, j = wp.tid()
        c = wp.vec3(pos[w, j], 10.0 * float(w), 0.0)
        k = w * pos.shape[1] + j
        lowers[k] = c - wp.vec3(0.25)
        uppers[k] = c + wp.vec3(0.25)
        if j == 0:
            token[w] = w

    def refit_scene(pos: wp.array2d(dtype=float), token: wp.array(dtype=int)):
        token.zero_()
        wp.launch(scene_boxes, dim=pos.shape, inputs=[pos, SCENE["lowers"], SCENE["uppers"], token])
        SCENE["bvh"].refit()

    @wp.kernel
    def scene_hits(bvh: wp.uint64, x: wp.array2d(dtype=float), token: wp.array(dtype=int),
                   y: wp.array2d(dtype=float)):
        """y[w, i]: the sum of 1 + index over the boxes within 0.5 of
        (x[w, i], 10 w, 0) (world w's boxes only, by their height)."""
        w, i = wp.tid()
        p = wp.vec3(x[w, i], 10.0 * float(w), 0.0)
        query = wp.bvh_query_aabb(bvh, p - wp.vec3(0.5), p + wp.vec3(0.5))
        hit = int(0)
        n = int(0)
        while wp.bvh_query_next(query, hit):
            n += 1 + hit
        y[w, i] = float(n + token[w] - w)

    def render_scene(x: wp.array2d(dtype=float), token: wp.array(dtype=int), y: wp.array2d(dtype=float)):
        wp.launch(scene_hits, dim=x.shape, inputs=[SCENE["bvh"].id, x, token], outputs=[y])

    from _warp_tiles import TILE, row_sums


def _check_environment():
    """jax with a GPU, Warp that graphd.warp supports, and the paths the
    test needs; a skip, or under GRAPHD_REQUIRE_GPU=1 a failure."""
    try:
        import jax
        if not jax.devices("gpu"):
            unavailable("jax sees no GPU")
    except (ImportError, RuntimeError) as e:
        unavailable(f"no jax with CUDA here ({e})")
    if WARP_ERROR is not None:
        unavailable(f"Warp is not importable ({WARP_ERROR}); put warp-lang 1.19 on PYTHONPATH "
                     "(or in $GRAPHD_WARP_PATH for tests/run_warp_gpu.sh)")
    import graphd.warp as gw
    try:
        gw.warp_modules()  # the version and layout checks
    except gw.Refused as e:
        unavailable(f"graphd.warp refuses this Warp: {e}")
    require_built("GRAPHD_BIN", "GRAPHD_LIB", "GRAPHD_XLA_LIB")


def _graphctl():
    p = os.environ.get("GRAPHCTL_BIN") or os.path.join(os.path.dirname(os.environ["GRAPHD_BIN"]), "graphctl")
    if not os.path.exists(p):
        raise AssertionError(f"no graphctl at {p}: set $GRAPHCTL_BIN")
    return p


class WarpGpuTest(GpuTestCase):
    @classmethod
    def setUpClass(cls):
        _check_environment()
        import jax
        import jax.numpy as jnp
        import graphd
        import graphd.warp as gw
        cls.jax, cls.jnp, cls.graphd, cls.gw = jax, jnp, graphd, gw
        cls.dir = tempfile.mkdtemp(prefix="graphd-warp-")
        cls.daemon = Daemon(os.path.join(cls.dir, "graphd.sock"), os.path.join(cls.dir, "graphd.log"))
        os.environ["GRAPHD_SOCKET"] = cls.daemon.sock
        cls.daemon.start()
        try:
            # Warp's own jax_callable, even if graphd.warp.install() made
            # warp.jax_callable graphd's.
            if gw.installed():
                gw.uninstall()
            cls.warp_jax_callable = staticmethod(wp.jax_callable)
            cls.warp_jax_kernel = staticmethod(wp.jax_kernel)
            wp.init()
            print(f"FIGURE Warp {wp.__version__}, jax {jax.__version__}, device "
                  f"{jax.devices('gpu')[0].device_kind}, graphd.warp compiles for sm_{gw.resolve_arch()}")
        except BaseException:
            cls.daemon.stop()  # tearDownClass does not run after a failed setUpClass
            raise

    def setUp(self):
        super().setUp()
        # jax_callable gives the same object for the same arguments, as
        # Warp's does; each test here takes its callables fresh, so that
        # `programs` holds what that test built.
        self.gw._registry.clear()

    # --- helpers -----------------------------------------------------------------

    def state(self, n, batch=None, seed=0):
        """Particles between 0 and 2 m high with random velocities."""
        rng = np.random.default_rng(seed)
        shape = (n, 3) if batch is None else (batch, n, 3)
        pos = rng.uniform(0.0, 2.0, size=shape).astype(np.float32)
        vel = rng.normal(0.0, 1.0, size=shape).astype(np.float32)
        return self.jnp.asarray(pos), self.jnp.asarray(vel)

    def scan(self, call, pos, vel, steps=STEPS, extra=()):
        """steps of call(pos, vel, *extra) -> (pos, vel) under jit +
        lax.scan, blocked on; returns numpy arrays. Arrays a step needs
        besides the carry come in `extra`, as arguments of the jitted
        function: an array the function closes over becomes a constant in
        XLA's own module memory, which no other process can map."""
        jax = self.jax

        def run(p, v, *e):
            def step(c, _):
                return tuple(call(*c, *e)), None
            return jax.lax.scan(step, (p, v), None, length=steps)[0]
        out = jax.jit(run)(pos, vel, *extra)
        out = jax.block_until_ready(out)
        return np.asarray(out[0]), np.asarray(out[1])

    def same(self, got, want, what, deterministic=True):
        """Bit for bit, or to a tolerance when Warp's own result is not
        deterministic (said in a FIGURE line)."""
        for g, w, name in zip(got, want, ("positions", "velocities")):
            if deterministic:
                self.assertTrue(np.array_equal(g, w), f"{what}: {name} differ, max |diff| "
                                f"{np.max(np.abs(g - w)) if g.shape == w.shape else 'shape'}")
            else:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{what}: {name}")
        print(f"FIGURE {what}: {'bit for bit equal' if deterministic else 'equal within rtol/atol 1e-5 (Warp not deterministic)'}")

    def warp_reference(self, call, *state, steps=STEPS, what="Warp"):
        """Warp's result, run twice: (result, deterministic)."""
        a = self.scan(call, *state, steps=steps)
        b = self.scan(call, *state, steps=steps)
        det = all(np.array_equal(x, y) for x, y in zip(a, b))
        if not det:
            print(f"FIGURE {what}: two runs of Warp's own jax_callable differ; comparing to a tolerance")
        return a, det

    def captures_of(self, pid_hex):
        with self.graphd.Client.connect(self.daemon.sock) as c:
            return [x for x in c.list_captures() if x["program"] == pid_hex]

    def counters(self):
        """Sum over the daemon's devices of the capture counters."""
        with self.graphd.Client.connect(self.daemon.sock) as c:
            devs = c.status()["devices"]
        return {k: sum(d["counters"][k] for d in devs) for k in ("captures_built", "recaptures", "evictions")}

    # --- (a) ---------------------------------------------------------------------

    def test_a_particles_scan_matches_warp(self):
        n = 4096 + 1  # not a multiple of the block: the last block is partial
        pos, vel = self.state(n)
        results = {}
        # graphd.warp first: its recording must not overlap Warp work.
        for mode in ("staged", "staged_ex", "direct", "auto"):
            f = self.gw.jax_callable(particles, num_outputs=2, mode=mode)
            t = time.monotonic()
            results[mode] = self.scan(lambda p, v, f=f: f(p, v, DT), pos, vel)
            took = time.monotonic() - t
            (b,) = f.programs.values()
            caps = self.captures_of(b.id_hex)
            self.assertEqual(len(caps), 1, caps)
            self.assertEqual(caps[0]["replays"], STEPS, caps)
            self.assertEqual(caps[0]["mode"], "direct" if mode == "auto" else mode)
            print(f"FIGURE particles scan, graphd.warp {mode}: {took * 1e6 / STEPS:.1f} us/step (jit included)")
        warp_f = self.warp_jax_callable(particles, num_outputs=2)
        want, det = self.warp_reference(lambda p, v: warp_f(p, v, DT), pos, vel, what="particles")
        # The particles moved and some bounced.
        self.assertFalse(np.array_equal(want[0], np.asarray(pos)))
        for mode, got in results.items():
            self.same(got, want, f"particles scan of {STEPS} steps, graphd.warp {mode} vs Warp's jax_callable", det)

    # --- (b) ---------------------------------------------------------------------

    def test_b_vmap(self):
        jax = self.jax
        n, batch = 1024, 4
        pos, vel = self.state(n, batch=batch, seed=1)
        got = {}
        for method in ("broadcast_all", "sequential"):
            f = self.gw.jax_callable(particles, num_outputs=2, vmap_method=method, mode="staged")
            got[method] = self.scan(jax.vmap(lambda p, v, f=f: f(p, v, DT)), pos, vel)
        # Each environment alone, through the unbatched program.
        one = self.gw.jax_callable(particles, num_outputs=2, mode="staged")
        alone = [self.scan(lambda p, v: one(p, v, DT), pos[k], vel[k]) for k in range(batch)]
        warp_f = self.warp_jax_callable(particles, num_outputs=2)
        want, det = self.warp_reference(jax.vmap(lambda p, v: warp_f(p, v, DT)), pos, vel, what="vmap")
        for method, g in got.items():
            self.same(g, want, f"vmap ({batch} environments), graphd.warp {method} vs Warp's vmap", det)
        stacked = (np.stack([a[0] for a in alone]), np.stack([a[1] for a in alone]))
        self.same(got["broadcast_all"], stacked, "vmap broadcast_all vs each environment alone")

    # --- (c) ---------------------------------------------------------------------

    def test_c_capture_while_matches_the_unrolled_substeps(self):
        jnp = self.jnp
        n, steps = 2048, 200
        pos, vel = self.state(n, seed=2)
        loops = {mode: self.gw.jax_callable(substeps_loop, num_outputs=2, mode=mode)
                 for mode in ("staged", "staged_ex")}
        got = {}
        for k in (3, 5, 0):
            nsub = jnp.asarray([k], dtype=jnp.int32)
            for mode, f in loops.items():
                got[k, mode] = self.scan(lambda p, v, ns, f=f: f(p, v, ns, DT / 4), pos, vel,
                                         steps=steps, extra=(nsub,))
        for mode, f in loops.items():
            # One program for every count: the loop runs on the device.
            (b,) = f.programs.values()
            self.assertEqual([(c.kind, c.body) for c in b.conds], [("while", 2)])
            caps = self.captures_of(b.id_hex)
            self.assertEqual(len(caps), 1, caps)
            self.assertEqual(caps[0]["replays"], 3 * steps, caps)
        unrolled = self.warp_jax_callable(substeps_unrolled, num_outputs=2)
        for k in (3, 5, 0):
            want, det = self.warp_reference(lambda p, v, k=k: unrolled(p, v, k, DT / 4), pos, vel, steps=steps,
                                            what=f"{k} substeps")
            for mode in loops:
                self.same(got[k, mode], want, f"{k} substeps a step for {steps} steps, graphd.warp capture_while "
                          f"{mode} vs the substeps unrolled in Warp", det)
        self.assertFalse(np.array_equal(got[3, "staged"][0], got[5, "staged"][0]))
        self.assertTrue(np.array_equal(got[0, "staged"][0], np.asarray(pos)))

    # --- (d) ---------------------------------------------------------------------

    def test_d_evict_all_in_the_middle_of_a_scan(self):
        jax, jnp = self.jax, self.jnp
        from jax.experimental import io_callback
        n = 4096 + 3  # this test's own program
        pos, vel = self.state(n, seed=3)
        f = self.gw.jax_callable(particles, num_outputs=2, mode="staged")
        evict_at = [-1]
        done = {}
        ctl = _graphctl()

        def at_step(i):
            # On the host, in stream order: every replay before this step
            # has finished, none after it has started.
            if int(i) == evict_at[0]:
                try:
                    r = subprocess.run([ctl, "--socket", self.daemon.sock, "evict", "--all", "--json"],
                                       capture_output=True, text=True, timeout=60)
                    done["rc"], done["out"], done["err"] = r.returncode, r.stdout, r.stderr
                except Exception as e:  # noqa: BLE001: reported after the scan
                    done["error"] = repr(e)
            return np.int32(0)

        def step(c, i):
            p, v = c
            zero = io_callback(at_step, jax.ShapeDtypeStruct((), jnp.int32), i, ordered=True)
            # The step's replay waits for the callback: its input depends
            # on the callback's result (a zero).
            p, v = f(p + zero.astype(p.dtype), v, DT)
            return (p, v), None

        run = jax.jit(lambda p, v: jax.lax.scan(step, (p, v), jnp.arange(STEPS))[0])
        want = [np.asarray(x) for x in jax.block_until_ready(run(pos, vel))]  # captures; no eviction
        (b,) = f.programs.values()
        before = self.counters()
        evict_at[0] = STEPS // 2
        t = time.monotonic()
        got = [np.asarray(x) for x in jax.block_until_ready(run(pos, vel))]
        took = time.monotonic() - t
        after = self.counters()
        self.assertNotIn("error", done, done.get("error"))
        self.assertIn("rc", done, "the host callback never ran graphctl")
        self.assertEqual(done["rc"], 0, f"graphctl evict --all failed: {done.get('err')}")
        evicted = [c for c in json.loads(done["out"])["evicted"] if c["program"] == b.id_hex]
        self.assertEqual(len(evicted), 1, done["out"])
        now = self.captures_of(b.id_hex)
        self.assertEqual(len(now), 1, now)
        print(f"FIGURE evict --all at step {STEPS // 2}: the evicted capture had {evicted[0]['replays']} replays, "
              f"the new one has {now[0]['replays']}; counters before {before}, after {after}; the scan took "
              f"{took * 1e3:.0f} ms")
        # Exactly one capture built again, by the replay after the eviction.
        self.assertEqual(after["recaptures"] - before["recaptures"], 1)
        self.assertEqual(after["captures_built"] - before["captures_built"], 1)
        self.assertGreaterEqual(after["evictions"] - before["evictions"], 1)
        # Every replay of both scans went to one of the two captures; the
        # second scan's first half to the old one.
        self.assertEqual(evicted[0]["replays"] + now[0]["replays"], 2 * STEPS)
        self.assertEqual(now[0]["replays"], STEPS - STEPS // 2)
        self.same(got, want, "scan with evict --all in the middle vs the same scan without")

    # --- (e) ---------------------------------------------------------------------

    def test_e_callable_on_warp_arrays(self):
        n = 2048 + 5
        p0, v0 = (np.asarray(a) for a in self.state(n, seed=4))
        steps = 200
        # Warp alone: the same launches, ping-ponging between two pairs.
        a = [wp.array(p0, dtype=wp.vec3), wp.array(v0, dtype=wp.vec3)]
        b = [wp.zeros(n, dtype=wp.vec3), wp.zeros(n, dtype=wp.vec3)]
        for _ in range(steps):
            wp.launch(integrate, dim=n, inputs=[a[0], a[1], DT], outputs=[b[0], b[1]])
            a, b = b, a
        want = (a[0].numpy(), a[1].numpy())
        for mode in ("staged", "direct"):
            f = self.gw.array_callable(particles, inputs=["pos", "vel"], outputs=["pos_out", "vel_out"], mode=mode)
            # Warp allocates from CUDA's stream-ordered pool by default,
            # which cannot be shared with another process: these come from
            # cuMemAlloc (docs/warp.md, "graphd.warp.array_callable").
            with wp.ScopedMempool(wp.get_device(), False):
                a = [wp.array(p0, dtype=wp.vec3), wp.array(v0, dtype=wp.vec3)]
                b = [wp.zeros(n, dtype=wp.vec3), wp.zeros(n, dtype=wp.vec3)]
            try:
                for _ in range(steps):
                    f(a[0], a[1], DT, b[0], b[1])
                    a, b = b, a
                got = (a[0].numpy(), a[1].numpy())  # Warp's stream: after the replays
            finally:
                f.close()
            self.same(got, want, f"graphd.warp.array_callable {mode}, {steps} steps on ping-ponging Warp arrays vs Warp")

    # --- (f) ---------------------------------------------------------------------

    def test_f_a_second_process_shares_the_capture(self):
        n = 4096 + 7  # this test's own program
        pos, vel = self.state(n, seed=5)
        f = self.gw.jax_callable(particles, num_outputs=2, mode="staged")
        mine = self.scan(lambda p, v: f(p, v, DT), pos, vel, steps=100)
        (b,) = f.programs.values()
        child = (
            "import numpy as np, jax, jax.numpy as jnp, graphd.warp as gw, test_warp_gpu as t\n"
            f"rng = np.random.default_rng(5); n = {n}\n"
            "pos = jnp.asarray(rng.uniform(0.0, 2.0, size=(n, 3)).astype(np.float32))\n"
            "vel = jnp.asarray(rng.normal(0.0, 1.0, size=(n, 3)).astype(np.float32))\n"
            "f = gw.jax_callable(t.particles, num_outputs=2, mode='staged')\n"
            "def step(c, _): return tuple(f(*c, t.DT)), None\n"
            "out = jax.jit(lambda p, v: jax.lax.scan(step, (p, v), None, length=100)[0])(pos, vel)\n"
            "out = [np.asarray(x) for x in jax.block_until_ready(out)]\n"
            "(b,) = f.programs.values()\n"
            "import sys; np.save(sys.argv[1], np.stack(out)); print(b.id_hex)\n")
        out_path = os.path.join(self.dir, "second.npy")
        here = os.path.dirname(os.path.abspath(__file__))  # the child imports this module
        r = subprocess.run([sys.executable, "-c", child, out_path], capture_output=True, text=True, timeout=240,
                           cwd=here)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stdout.strip().splitlines()[-1], b.id_hex, "the same function, another program id")
        caps = self.captures_of(b.id_hex)
        self.assertEqual(len(caps), 1, caps)
        self.assertEqual(caps[0]["replays"], 200, caps)
        self.assertIn(os.getpid(), caps[0]["pids"])
        self.assertEqual(len(caps[0]["pids"]), 2, caps)
        theirs = np.load(out_path)
        self.same((theirs[0], theirs[1]), mine, "a second process's scan of the shared capture vs this process's")
        print(f"FIGURE two processes, one capture of program {b.id_hex[:16]}: {caps[0]['replays']} replays, "
              f"pids {caps[0]['pids']}")


    # --- (g) ---------------------------------------------------------------------

    def test_g_launch_tiled_matches_warp(self):
        rows = 300
        a = self.jnp.asarray(np.random.default_rng(7).normal(size=(rows, TILE)).astype(np.float32))
        dims = {"out": (rows,)}
        want = np.asarray(self.jax.jit(self.warp_jax_callable(row_sums, num_outputs=1, output_dims=dims))(a)[0])
        np.testing.assert_allclose(want, np.asarray(a).sum(axis=1), rtol=1e-5, atol=1e-5)
        for mode in ("staged", "direct"):
            f = self.gw.jax_callable(row_sums, num_outputs=1, output_dims=dims, mode=mode)
            got = np.asarray(self.jax.jit(f)(a)[0])
            self.assertTrue(np.array_equal(got, want),
                            f"tiled row sums, graphd.warp {mode} vs Warp: max |diff| {np.max(np.abs(got - want))}")
            (b,) = f.programs.values()
            (l,) = b.launches
            self.assertEqual((l.block_dim, tuple(b.program._steps[l.step].block)), (TILE, (TILE, 1, 1)))
        print(f"FIGURE wp.launch_tiled ({rows} blocks of {TILE} threads, tile_load/tile_sum/tile_store): "
              "graphd.warp staged and direct bit for bit equal to Warp's jax_callable")

    # --- (h) ---------------------------------------------------------------------

    def test_h_every_device_under_shard_map_has_its_own_capture(self):
        """The particle step under jit(shard_map) over every local GPU: one
        program, one capture of it on each device, each replayed once a
        step; every shard's particles equal to Warp's step of all of them
        on one device (each particle's arithmetic is its own)."""
        jax = self.jax
        from jax.sharding import NamedSharding, PartitionSpec as P
        ndev = len(jax.local_devices())
        mesh = jax.make_mesh((ndev,), ("d",))
        steps, n = 200, 2048 + 3
        pos, vel = self.state(n * ndev, seed=5)
        warp_f = self.warp_jax_callable(particles, num_outputs=2)
        want, det = self.warp_reference(lambda p, v: warp_f(p, v, DT), pos, vel, steps=steps,
                                        what="particles of every shard")
        sharded = NamedSharding(mesh, P("d"))
        for mode in ("staged", "direct"):
            f = self.gw.jax_callable(particles, num_outputs=2, mode=mode)

            # Each device scans its own shard; the operands are placed on
            # the mesh already (JAX refuses a shard_map of one-device
            # operands under jit).
            def shard_scan(p, v, f=f):
                def step(c, _):
                    return tuple(f(*c, DT)), None
                return jax.lax.scan(step, (p, v), None, length=steps)[0]
            run = jax.jit(jax.shard_map(shard_scan, mesh=mesh, in_specs=(P("d"), P("d")),
                                        out_specs=(P("d"), P("d"))))
            out = jax.block_until_ready(run(jax.device_put(pos, sharded), jax.device_put(vel, sharded)))
            got = (np.asarray(out[0]), np.asarray(out[1]))
            (b,) = f.programs.values()
            caps = self.captures_of(b.id_hex)
            self.assertEqual(sorted(c["device"] for c in caps), list(range(ndev)), caps)
            for c in caps:
                self.assertEqual(c["replays"], steps, c)
            self.same(got, want, f"shard_map over {ndev} device(s), graphd.warp {mode}: one capture a "
                      f"device, {steps} replays each, vs Warp's step of all particles", det)

    # --- (i) ---------------------------------------------------------------------

    def test_i_vmap_lookup_matches_warp(self):
        import functools
        jax, jnp = self.jax, self.jnp
        table = jnp.arange(100, dtype=jnp.float32)
        idx = jax.random.randint(jax.random.key(42), (3, 5), 0, 100, dtype=jnp.int32)
        for method in ("broadcast_all", "sequential"):
            makers = {"jax_kernel": (lambda m, **kw: m(lookup, vmap_method=method, **kw), "launch_dims"),
                      "jax_callable": (lambda m, **kw: m(lookup_fn, vmap_method=method, **kw), "output_dims")}
            for what, (make, option) in makers.items():
                warp_make = self.warp_jax_kernel if what == "jax_kernel" else self.warp_jax_callable
                ours_make = self.gw.jax_kernel if what == "jax_kernel" else self.gw.jax_callable
                ours, theirs = make(ours_make, mode="staged"), make(warp_make)
                for axis in (0, 1):
                    n = idx.shape[1 - axis]
                    want = np.asarray(jax.jit(jax.vmap(lambda t, i: t[i], in_axes=(None, axis)))(table, idx))
                    run = lambda f: np.asarray(jax.jit(jax.vmap(functools.partial(f, **{option: n}),
                                                                in_axes=(None, axis)))(table, idx)[0])
                    warp_out, got = run(theirs), run(ours)
                    self.assertTrue(np.array_equal(warp_out, want), f"Warp's own {what} {method} axis {axis}")
                    self.assertEqual(got.shape, want.shape)
                    self.assertTrue(np.array_equal(got, warp_out),
                                    f"{what} {method} axis {axis}: graphd {got.tolist()} vs Warp {warp_out.tolist()}")
        print("FIGURE Warp's vmap lookup (jax_kernel and jax_callable, broadcast_all and sequential, batch on "
              "axis 0 and 1): graphd.warp bit for bit equal to Warp")

    # --- (j) ---------------------------------------------------------------------

    def test_j_a_cpu_call_is_warps_own(self):
        jax, jnp = self.jax, self.jnp
        if not wp.is_cpu_available():
            self.skipTest("this Warp has no CPU compiler")
        cpu = jax.devices("cpu")[0]
        table = np.arange(100, dtype=np.float32)
        idx = np.random.default_rng(3).integers(0, 100, size=64).astype(np.int32)
        want = table[idx]
        f = self.gw.jax_kernel(lookup, mode="staged")
        run = jax.jit(lambda t, i: f(t, i)[0])
        gpu_out = np.asarray(run(jnp.asarray(table), jnp.asarray(idx)))
        (b,) = f.programs.values()
        self.assertEqual(len(self.captures_of(b.id_hex)), 1)
        cpu_out = run(jax.device_put(table, cpu), jax.device_put(idx, cpu))
        self.assertEqual(cpu_out.devices(), {cpu})
        self.assertEqual(len(f.programs), 1, "the CPU call built a graphd program")
        self.assertTrue(np.array_equal(gpu_out, want))
        self.assertTrue(np.array_equal(np.asarray(cpu_out), want))
        print("FIGURE one graphd.warp jax_kernel: the GPU call replayed by graphd, the CPU call Warp's own, "
              "both equal to the lookup")

    # --- (k) ---------------------------------------------------------------------

    def test_k_a_warp_array_made_outside_the_function(self):
        jax, jnp = self.jax, self.jnp
        n, calls = 4096 + 3, 20
        x = jnp.asarray(np.random.default_rng(5).normal(size=n).astype(np.float32))
        start = np.linspace(-1.0, 1.0, n, dtype=np.float32)

        def run(f, pool):
            with wp.ScopedMempool("cuda:0", pool):
                OUTSIDE["acc"] = wp.array(start, dtype=float, device="cuda:0")
            call = jax.jit(lambda v: f(v)[0])
            ys = [np.asarray(call(x)) for _ in range(calls)]
            return ys, OUTSIDE["acc"].numpy()

        warp_ys, warp_acc = run(self.warp_jax_callable(with_outside, num_outputs=1), True)
        # Warp's own: each call added x to the array (float32 sums in order).
        want = start.copy()
        for _ in range(calls):
            want = want + np.asarray(x)
        self.assertTrue(np.array_equal(warp_acc, want), "Warp's own run is not the sum")
        for pool in (True, False):
            for mode in ("staged", "direct"):
                self.gw._registry.clear()
                f = self.gw.jax_callable(with_outside, num_outputs=1, mode=mode)
                ys, acc = run(f, pool)
                (b,) = f.programs.values()
                self.assertEqual([(x.address, x.nbytes) for x in b.fixed], [(OUTSIDE["acc"].ptr, 4 * n)])
                self.assertEqual(len(self.captures_of(b.id_hex)), 1)
                what = f"{'pool' if pool else 'cuMemAlloc'} memory, {mode}"
                self.assertTrue(all(np.array_equal(g, w) for g, w in zip(ys, warp_ys)), f"{what}: outputs differ")
                self.assertTrue(np.array_equal(acc, warp_acc), f"{what}: the array made outside differs")
        print(f"FIGURE a Warp array made outside the function ({calls} calls, pool and cuMemAlloc memory, "
              "staged and direct): graphd.warp bit for bit equal to Warp's jax_callable")

    # --- (l) ---------------------------------------------------------------------

    def test_l_install_runs_what_graphd_refuses_as_warps_own(self):
        import logging
        jax, jnp, gw = self.jax, self.jnp, self.gw
        rng = np.random.default_rng(7)
        lo = rng.uniform(-4.0, 4.0, size=(64, 3)).astype(np.float32)
        lo[:, 1:] = -0.25
        BVH["bvh"] = wp.Bvh(wp.array(lo, dtype=wp.vec3, device="cuda:0"),
                            wp.array(lo + 0.5, dtype=wp.vec3, device="cuda:0"))
        xs = [jnp.asarray(rng.uniform(-4.0, 4.0, size=1000).astype(np.float32)) for _ in range(10)]
        batch = jnp.stack(xs[:4])
        warp_f = self.warp_jax_callable(with_bvh, num_outputs=1)
        want = [np.asarray(jax.jit(lambda x: warp_f(x)[0])(x)) for x in xs]
        want_b = np.asarray(jax.jit(jax.vmap(lambda x: warp_f(x)[0]))(batch))
        self.assertTrue(any(np.any(w != np.asarray(x)) for w, x in zip(want, xs)), "no box was near")
        try:
            gw.install()
            f = wp.jax_callable(with_bvh, num_outputs=1)
            self.assertIsInstance(f, gw.JaxCallable)
            with self.assertLogs("graphd.warp", logging.INFO) as logs:
                call = jax.jit(lambda x: f(x)[0])
                got = [np.asarray(call(x)) for x in xs]
                got_b = np.asarray(jax.jit(jax.vmap(lambda x: f(x)[0]))(batch))
        finally:
            gw.uninstall()
        self.assertEqual(f.programs, {}, "graphd built a program for a function it refuses")
        # One signature (the vmapped call is the same one, batched by Warp):
        # one fallback, logged once.
        self.assertEqual([r.reason for r in f.fallbacks.values()], ["param_type"])
        self.assertEqual(len(logs.records), 1, logs.output)
        self.assertTrue(all(np.array_equal(g, w) for g, w in zip(got, want)), "outputs differ from Warp's")
        self.assertTrue(np.array_equal(got_b, want_b), "vmapped outputs differ from Warp's")
        print("FIGURE a function with a BVH id under install(): Warp's own call, bit for bit equal to Warp's "
              f"jax_callable over {len(xs)} calls and a vmap of {batch.shape[0]}")

    # --- (m) ---------------------------------------------------------------------

    def test_m_install_refit_and_query_under_nested_vmap(self):
        jax, jnp, gw = self.jax, self.jnp, self.gw
        nworld, nbox, nq = 16, 32, 256
        rng = np.random.default_rng(11)
        pos = jnp.asarray(rng.uniform(-4.0, 4.0, size=(nworld, nbox)).astype(np.float32))
        x = jnp.asarray(rng.uniform(-4.0, 4.0, size=(nworld, nq)).astype(np.float32))
        far = np.full((nworld * nbox, 3), 1000.0, dtype=np.float32)
        SCENE["lowers"] = wp.array(far, dtype=wp.vec3, device="cuda:0")
        SCENE["uppers"] = wp.array(far + 1.0, dtype=wp.vec3, device="cuda:0")
        SCENE["bvh"] = wp.Bvh(SCENE["lowers"], SCENE["uppers"])

        def reset():
            """The boxes and the tree far away, as built."""
            SCENE["lowers"].assign(far)
            SCENE["uppers"].assign(far + 1.0)
            SCENE["bvh"].refit()
            wp.synchronize()

        def mjx_style(f, nout_dims):
            """f as MJX calls its FFI functions: vmap_method None under
            custom_vmap, whose rule folds a nested vmap's batch dimensions
            into the first and calls f once on all worlds."""
            @jax.custom_batching.custom_vmap
            def call(*args):
                args = [a.reshape((1,) * (n - a.ndim) + a.shape) for a, n in zip(args, (2, 1))]
                return f(*args, output_dims=nout_dims(args[0].shape[0]))[0]

            @call.def_vmap
            def rule(axis_size, in_batched, *args):
                out = call(*[a.reshape(-1, *a.shape[2:]) if a.ndim == n + 1 else a
                             for a, n in zip(args, (2, 1))])
                return (out if out.shape[0] == axis_size else out.reshape(axis_size, -1, *out.shape[1:])), True
            return call

        def run(make):
            """MJX's render test: a vmap (refit, then query), then the same
            in a vmap of vmaps (2 x 8 worlds), without a reset between."""
            refit = mjx_style(make(refit_scene), lambda n: {"token": (n,)})
            query = mjx_style(make(render_scene), lambda n: {"y": (n, nq)})

            def inner(p, xs):
                token = jax.vmap(refit)(p)
                return jax.vmap(query)(xs, token)
            reset()
            single = np.asarray(inner(pos, x))
            nested = np.asarray(jax.vmap(inner)(pos.reshape(2, 8, nbox), x.reshape(2, 8, nq))).reshape(nworld, nq)
            return single, nested

        def warp_own(fn):
            return self.warp_jax_callable(fn, num_outputs=1, vmap_method=None, has_side_effect=True)

        want_single, want_nested = run(warp_own)
        self.assertTrue(np.array_equal(want_single, want_nested), "Warp's own nested vmap differs from its vmap")
        self.assertGreater(np.count_nonzero(want_single), nworld, "no box was hit (the refit did nothing?)")
        made = {}
        try:
            gw.install()

            def graphd_own(fn):
                made[fn.__name__] = wp.jax_callable(fn, num_outputs=1, vmap_method=None, has_side_effect=True)
                self.assertIsInstance(made[fn.__name__], gw.JaxCallable)
                return made[fn.__name__]
            got_single, got_nested = run(graphd_own)
        finally:
            gw.uninstall()
        # The refit runs Bvh.refit on the GPU (native), the query passes
        # the BVH's id (param_type): both Warp's own, no graphd program.
        self.assertEqual({n: sorted({r.reason for r in f.fallbacks.values()}) for n, f in made.items()},
                         {"refit_scene": ["native"], "render_scene": ["param_type"]})
        self.assertEqual({n: f.programs for n, f in made.items()}, {"refit_scene": {}, "render_scene": {}})
        self.assertTrue(np.array_equal(got_single, want_single), "vmap: the hits differ from Warp's")
        self.assertTrue(np.array_equal(got_nested, want_nested), "nested vmap: the hits differ from Warp's")
        print(f"FIGURE MJX's refit and query under install(), a vmap of {nworld} and a vmap of vmaps (2 x 8): "
              "Warp's own calls, bit for bit equal to Warp's jax_callable")


if __name__ == "__main__":
    unittest.main()
