"""MuJoCo MJX with impl="warp" through graphd, against Warp's own JAX interop.

MJX's Warp implementation (mujoco-mjx 3.17, which carries its own copy of
MuJoCo Warp and pins warp-lang 1.18.0) runs a whole physics step as one
`warp.jax_callable`: mujoco/mjx/warp/ffi.py does `import warp as wp` and
calls `wp.jax_callable(...)` when a step is first traced, so
graphd.warp.install() makes that call graphd's. MJX also keeps the
callables it made in a registry of its own for the life of the process;
each way of running therefore gets a process of its own here, which makes
the install-before-import question moot as well.

The model is the humanoid that mujoco-mjx ships for its own tests
(mujoco/mjx/test_data/humanoid/humanoid.xml: 16 bodies on a free joint
and 21 hinges with limits, 21 motors, a floor plane and four foot-floor
contact pairs). WORLDS copies of it, each started from its own perturbed
pose, velocity and control, are stepped STEPS times by
jax.vmap(mjx.step) in a jax.lax.scan under jax.jit, with each step's qpos
and qvel kept:

(a) by Warp's own jax_callable (MJX's default graph mode on a GPU, WARP:
    Warp captures a CUDA graph per set of buffer addresses), RUNS times
    from the same start, and once more as scans of CHUNK steps, keeping
    the whole state at the start of each chunk;
(b) by graphd.warp after graphd.warp.install() (mode "auto", which MJX's
    WARP graph mode maps to), RUNS times, then one step from each state
    that (a) kept. The step's program must have been captured by the
    daemon exactly once and replayed once per step, and the daemon must
    build and re-capture nothing during the scans after the first.

Comparison. When Warp's own runs (the RUNS scans and the chunked one)
agree bit for bit, graphd's must too: every step's qpos and qvel of every
world in each scan, and the single steps against the steps that followed
those states in Warp's chunked run. If Warp's runs differ (MuJoCo Warp
hands out constraint rows through atomic counters and sums some of the
solver's terms with atomic adds, so the rounding can change from run to
run, and a falling humanoid amplifies it step by step), comparing whole
trajectories says nothing; then the single steps are compared instead,
each from the same state, so that nothing is amplified: qpos to rtol and
atol 1e-5, qvel (which takes dt times the accelerations, whose
constraint forces are summed with atomics and then solved through the
mass matrix) to rtol 1e-4 and atol 1e-3; and graphd's scans must stay
finite. FIGURE lines say which comparison was made and what the
differences were, Warp's own among them.

Run by tests/run_warp_gpu.sh test_mjx_gpu (ctest label gpu) in a python that has jax
with CUDA, with warp-lang 1.18, mujoco 3.17 and mujoco-mjx 3.17 on
PYTHONPATH, against a daemon it starts ($GRAPHD_BIN). Without a GPU, jax,
Warp or MJX it skips; with GRAPHD_REQUIRE_GPU=1 each of those is a
failure. The processes that step the model are this file run as a script:
`test_mjx_gpu.py --worker warp|graphd OUT_DIR`."""

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

from _gpu_common import Daemon, GpuTestCase, require_built, unavailable

WORKER_S = 360  # one stepping process, compiling included
STEPS = 500
WORLDS = 32
RUNS = 3  # scans from the same start in each process: the first compiles and captures
CHUNK = 50  # Warp's chunked run keeps the state every CHUNK steps: STEPS // CHUNK single steps
MODEL = ("test_data", "humanoid", "humanoid.xml")  # under mujoco/mjx


# --- the stepping process --------------------------------------------------------


def load_model():
    """The humanoid that mujoco-mjx ships (see the module docstring)."""
    import mujoco
    import mujoco.mjx as mjx
    path = os.path.join(os.path.dirname(mjx.__file__), *MODEL)
    if not os.path.exists(path):
        raise AssertionError(f"no {path}: this mujoco-mjx does not ship the humanoid test model")
    return mujoco.MjModel.from_xml_path(path), path


def put_model(m, graph_mode=None):
    """mjx.put_model with impl="warp", with MuJoCo Warp's overflow warnings
    off: they are printf calls in the kernels, and with the humanoid's
    single solver iteration every world would print one at every step."""
    import mujoco.mjx as mjx
    mx = mjx.put_model(m, impl="warp", graph_mode=graph_mode)
    return mx.replace(opt=mx.opt.replace(_impl=mx.opt._impl.replace(warn_overflow=0)))


def start_state(m, worlds, seed=0):
    """Per world: qpos0 with the hinge angles moved by up to 0.1 rad (the
    free joint's position and quaternion as they are), velocities up to
    0.1, controls up to 0.2; the same numbers in every process."""
    import numpy as np
    rng = np.random.default_rng(seed)
    qpos = np.tile(m.qpos0.astype(np.float32), (worlds, 1))
    qpos[:, 7:] += rng.uniform(-0.1, 0.1, size=(worlds, m.nq - 7)).astype(np.float32)
    qvel = rng.uniform(-0.1, 0.1, size=(worlds, m.nv)).astype(np.float32)
    ctrl = rng.uniform(-0.2, 0.2, size=(worlds, m.nu)).astype(np.float32)
    return qpos, qvel, ctrl


def batched_data(m, worlds, seed=0):
    """MJX Data for `worlds` worlds, batched along the first axis, from
    start_state."""
    import jax
    import jax.numpy as jnp
    import mujoco.mjx as mjx
    # naconmax counts contacts over all worlds: four capsule-plane pairs
    # give at most 8 a world; njmax counts constraint rows per world.
    d = mjx.make_data(m, impl="warp", naconmax=16 * worlds, njmax=128)
    qpos, qvel, ctrl = start_state(m, worlds, seed)
    one = jax.vmap(lambda q, v, c: d.replace(qpos=q, qvel=v, ctrl=c))
    # Committed to the device like a scan's result: jit sees one signature.
    return jax.device_put(one(jnp.asarray(qpos), jnp.asarray(qvel), jnp.asarray(ctrl)), jax.devices()[0])


def one_step():
    """A jitted function (mx, d) -> d one step later, every world. The
    model goes in as an argument: arrays a jitted function closes over
    become constants in XLA's own module memory, which the daemon cannot
    map."""
    import jax
    import mujoco.mjx as mjx
    return jax.jit(jax.vmap(mjx.step, in_axes=(None, 0)))


def rollout(steps):
    """A jitted function (mx, d) -> (final d, (qpos, qvel) of every step)."""
    import jax
    import mujoco.mjx as mjx
    vstep = jax.vmap(mjx.step, in_axes=(None, 0))

    def run(mx, d):
        def body(d, _):
            d = vstep(mx, d)
            return d, (d.qpos, d.qvel)
        return jax.lax.scan(body, d, None, length=steps)
    return jax.jit(run)


def _program_info(b):
    return {"id": b.id_hex, "slots": len(b.slots), "launches": len(b.launches), "conds": len(b.conds),
            "steps": b.nsteps, "bytes": sum(s.nbytes for s in b.slots),
            "roles": {r: sum(1 for s in b.slots if s.role == r) for r in ("input", "inout", "output", "scratch", "temp")}}


def _daemon_view(sock, ids):
    """(captures of these programs, the capture counters summed over the
    devices). The daemon folds in what the ring replays counted within
    milliseconds of its worker going idle: this reads until two reads
    0.1 s apart agree (2 s at most)."""
    import graphd
    last = None
    for _ in range(20):
        with graphd.Client.connect(sock) as c:
            caps = [x for x in c.list_captures() if x["program"] in ids]
            devs = c.status()["devices"]
        counters = {k: sum(d["counters"][k] for d in devs) for k in ("captures_built", "recaptures", "evictions")}
        now = (sorted((x["program"], x["replays"]) for x in caps), counters)
        if now == last:
            break
        last = now
        time.sleep(0.1)
    return caps, counters


def worker(how, out_dir, steps=STEPS, worlds=WORLDS, runs=RUNS, chunk=CHUNK):
    """Steps the humanoid `runs` times from the same start, with Warp's
    jax_callable (how="warp") or graphd.warp's (how="graphd"). Warp's
    process also steps it in scans of `chunk` steps and writes the state at
    the start of each to OUT_DIR/states.npz; graphd's then takes one step
    from each of those. Writes OUT_DIR/{how}.npz (qpos and qvel: of every
    step of every scan, of the chunked run, of the single steps) and
    OUT_DIR/{how}.json (times, the model, and for graphd its programs and
    the daemon's view of them)."""
    import numpy as np
    if how == "graphd":
        import graphd.warp as gw
        gw.install()  # before MJX is imported, although it looks wp.jax_callable up at each new trace
    elif how != "warp":
        raise SystemExit(f"--worker: {how!r} is not warp or graphd")
    import jax
    import jax.numpy as jnp
    import warp as wp
    from mujoco.mjx.warp import ffi as mjx_ffi
    if how == "warp" and not wp.jax_callable.__module__.startswith("warp"):
        raise SystemExit(f"warp.jax_callable is {wp.jax_callable.__module__}'s, not Warp's")
    registry = mjx_ffi._JAX_CALLABLE_VARIADIC_TUPLE_REGISTRY

    def program_ids():
        return {b.id_hex for c in registry.values() for b in getattr(c, "programs", {}).values()}

    info = {"how": how, "warp": wp.__version__, "jax": jax.__version__, "steps": steps, "worlds": worlds,
            "runs": runs, "chunk": chunk, "device": jax.devices()[0].device_kind}
    m, info["model"] = load_model()
    info.update(nq=m.nq, nv=m.nv, nbody=m.nbody, ngeom=m.ngeom, nu=m.nu, timestep=float(m.opt.timestep))
    mx = put_model(m)
    gm = mx.opt._impl.graph_mode
    info["graph_mode"] = getattr(gm, "name", str(gm))
    d0 = batched_data(m, worlds)
    leaves0, treedef = jax.tree.flatten(d0)
    sock = os.environ.get("GRAPHD_SOCKET")
    out = {}

    # The scans from the same start.
    f = rollout(steps)
    times, qpos, qvel = [], [], []
    before = None
    for r in range(runs):
        if r == 1 and how == "graphd":
            before = _daemon_view(sock, program_ids())[1]
        t = time.perf_counter()
        _, (qp, qv) = jax.block_until_ready(f(mx, d0))
        times.append(time.perf_counter() - t)
        qpos.append(np.asarray(qp))
        qvel.append(np.asarray(qv))
    out["qpos"], out["qvel"] = np.stack(qpos), np.stack(qvel)
    info["first_s"] = times[0]
    info["us_per_step"] = float(np.median(times[1:])) / steps * 1e6 if runs > 1 else times[0] / steps * 1e6
    if how == "graphd":
        import graphd.jax as gj
        gj.collect()  # replays submitted without waiting: their errors raise here
        after = _daemon_view(sock, program_ids())[1]
        info["counters_timed"] = {k: after[k] - before[k] for k in after} if before else None

    if how == "warp":
        # The chunked run, keeping the state at the start of each chunk.
        g = rollout(chunk)
        d, states, cq, cv = d0, {}, [], []
        for k in range(steps // chunk):
            for i, x in enumerate(jax.tree.leaves(d)):
                states[f"s{k}_{i}"] = np.asarray(x)
            d, (qp, qv) = jax.block_until_ready(g(mx, d))
            cq.append(np.asarray(qp))
            cv.append(np.asarray(qv))
        out["chunked_qpos"], out["chunked_qvel"] = np.concatenate(cq), np.concatenate(cv)
        np.savez(os.path.join(out_dir, "states.npz"), **states)
    # One step from each of those states (Warp's own too: its spread).
    path = os.path.join(out_dir, "states.npz")
    step = one_step()
    oq, ov = [], []
    with np.load(path) as states:
        for k in range(steps // chunk):
            leaves = [jnp.asarray(states[f"s{k}_{i}"]) for i in range(len(leaves0))]
            d = jax.block_until_ready(step(mx, jax.tree.unflatten(treedef, leaves)))
            oq.append(np.asarray(d.qpos))
            ov.append(np.asarray(d.qvel))
    out["one_qpos"], out["one_qvel"] = np.stack(oq), np.stack(ov)

    # Every callable MJX made: Warp's or graphd.warp's, by what install() did.
    made = list(registry.values())
    info["callables"] = [f"{type(c).__module__}.{type(c).__name__}" for c in made]
    if how == "graphd":
        gj.collect()
        info["programs"] = [_program_info(b) for c in made for b in getattr(c, "programs", {}).values()]
        caps, _ = _daemon_view(sock, {p["id"] for p in info["programs"]})
        info["captures"] = [{k: c[k] for k in ("program", "device", "mode", "replays", "nodes", "pids")}
                            for c in caps]
    np.savez(os.path.join(out_dir, f"{how}.npz"), **out)
    with open(os.path.join(out_dir, f"{how}.json"), "w") as fh:
        json.dump(info, fh, indent=1, default=str)
    print(json.dumps({k: info[k] for k in ("how", "us_per_step", "first_s", "graph_mode")}))


# --- the test ----------------------------------------------------------------------


def _check_environment():
    """jax with a GPU, Warp that graphd.warp supports, mujoco and MJX with
    its Warp implementation, and the daemon's binary; a skip, or under
    GRAPHD_REQUIRE_GPU=1 a failure."""
    try:
        import jax
        if not jax.devices("gpu"):
            unavailable("jax sees no GPU")
    except (ImportError, RuntimeError) as e:
        unavailable(f"no jax with CUDA here ({e})")
    try:
        import numpy  # noqa: F401
        import warp  # noqa: F401
    except Exception as e:  # noqa: BLE001: any failure to import Warp
        unavailable(f"Warp is not importable ({e}); put warp-lang 1.18 on PYTHONPATH "
                     "(or in $GRAPHD_WARP_PATH for tests/run_warp_gpu.sh)")
    try:
        import mujoco  # noqa: F401
        import mujoco.mjx.warp as mjxw
    except Exception as e:  # noqa: BLE001: any failure to import MuJoCo
        unavailable(f"mujoco or mujoco.mjx is not importable ({e}); put mujoco 3.17 and mujoco-mjx 3.17 "
                     "on PYTHONPATH")
    if not mjxw.WARP_INSTALLED or mjxw.mujoco_warp is None:
        unavailable("mujoco.mjx has no Warp implementation here (it failed to import warp or its MuJoCo Warp)")
    import graphd.warp as gw
    try:
        gw.warp_modules()  # the version and layout checks
    except gw.Refused as e:
        unavailable(f"graphd.warp refuses this Warp: {e}")
    require_built("GRAPHD_BIN", "GRAPHD_LIB", "GRAPHD_XLA_LIB")


class MjxGpuTest(GpuTestCase):
    HANG_S = 800  # the whole test: three processes that compile and step the model

    @classmethod
    def setUpClass(cls):
        _check_environment()
        import numpy as np
        cls.np = np
        cls.dir = tempfile.mkdtemp(prefix="graphd-mjx-")
        cls.daemon = Daemon(os.path.join(cls.dir, "graphd.sock"), os.path.join(cls.dir, "graphd.log"))
        os.environ["GRAPHD_SOCKET"] = cls.daemon.sock
        cls.daemon.start()

    def step_in_process(self, how):
        """Runs this file as `--worker how`; returns (npz arrays, info)."""
        env = dict(os.environ)
        env.pop("GRAPHD_WARP_INSTALL", None)  # Warp's own must stay Warp's
        t = time.monotonic()
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", how, self.dir],
                           capture_output=True, text=True, timeout=WORKER_S, env=env)
        took = time.monotonic() - t
        self.assertEqual(r.returncode, 0, f"the {how} process failed (exit {r.returncode}):\n"
                         f"{r.stdout[-2000:]}\n{r.stderr[-6000:]}")
        with open(os.path.join(self.dir, f"{how}.json")) as fh:
            info = json.load(fh)
        arrays = self.np.load(os.path.join(self.dir, f"{how}.npz"))
        print(f"FIGURE MJX humanoid, {how}: process took {took:.1f} s, first scan (compile, "
              f"{'record, capture' if how == 'graphd' else 'capture'}) {info['first_s']:.1f} s")
        return arrays, info

    def test_mjx_humanoid_through_graphd_matches_warp(self):
        np = self.np
        w, warp_info = self.step_in_process("warp")
        g, gd_info = self.step_in_process("graphd")
        nsingle = STEPS // CHUNK
        print(f"FIGURE MJX {warp_info['model']}: nq {warp_info['nq']}, nv {warp_info['nv']}, nbody "
              f"{warp_info['nbody']}, ngeom {warp_info['ngeom']}, nu {warp_info['nu']}; {WORLDS} worlds, "
              f"{STEPS} steps of {warp_info['timestep']} s a scan, {RUNS} scans a process, then {nsingle} single "
              f"steps; Warp {warp_info['warp']}, jax {warp_info['jax']}, {warp_info['device']}; MJX graph_mode "
              f"{warp_info['graph_mode']}")

        # Which jax_callable MJX got in each process.
        self.assertTrue(warp_info["callables"], "MJX made no jax_callable")
        self.assertTrue(all(c.startswith("warp.") for c in warp_info["callables"]), warp_info["callables"])
        self.assertTrue(all(c.startswith("graphd.warp") for c in gd_info["callables"]), gd_info["callables"])

        # graphd served the steps: one capture of the batched step's
        # program (MJX also traces the step for a single world, which
        # builds a program that never runs), one replay per step, nothing
        # built while the later scans ran.
        programs = gd_info["programs"]
        self.assertTrue(programs, "graphd.warp built no program")
        for p in programs:
            print(f"FIGURE MJX step program {p['id'][:16]}: {p['launches']} launches recorded, {p['steps']} "
                  f"steps, {p['conds']} while/if, {p['slots']} slots {p['roles']}, {p['bytes']} bytes bound")
        caps = gd_info["captures"]
        self.assertEqual(len(caps), 1, f"expected one capture of the step program, got {caps}")
        cap = caps[0]
        # XLA may evaluate the step twice in a scan body that both carries
        # and emits its result (the callable is not side-effecting, so it
        # may be recomputed rather than kept): whole replays per step.
        per_step, rest = divmod(cap["replays"] - nsingle, STEPS * RUNS)
        self.assertTrue(rest == 0 and per_step in (1, 2), cap)
        print(f"FIGURE MJX through graphd: {per_step} replay(s) per scan step (XLA's choice)")
        timed = gd_info["counters_timed"]
        self.assertEqual((timed["captures_built"], timed["recaptures"]), (0, 0), timed)
        print(f"FIGURE MJX through graphd: capture of {cap['program'][:16]} mode {cap['mode']}, {cap['nodes']} "
              f"nodes, {cap['replays']} replays ({STEPS} x {RUNS} scans + {nsingle} single steps); during "
              f"scans 2 to {RUNS}: {timed}")

        # The humanoids moved; graphd's stayed finite.
        wq, wv, gq, gv = w["qpos"], w["qvel"], g["qpos"], g["qvel"]  # (runs, steps, worlds, nq or nv)
        self.assertEqual(gq.shape, wq.shape)
        self.assertTrue(np.all(np.isfinite(gq)) and np.all(np.isfinite(gv)), "graphd's scan is not finite")
        self.assertGreater(float(np.max(np.abs(gq[0, -1] - gq[0, 0]))), 0.01,
                           "graphd's humanoids did not move")

        def most(a, b):
            return float(np.max(np.abs(a - b)))

        if float(np.max(np.abs(wq[0, -1] - wq[0, 0]))) == 0.0:
            # Seen on the H200 with JAX 0.11.2: in this scan XLA gives some
            # in-out results buffers of their own instead of the operands'
            # (graphd's handler copies the operand into the result's buffer
            # and binds that), while Warp's jax_callable writes its in-out
            # arrays into the operands, so the results it returns are the
            # stale buffers and its humanoids never advance. There is no
            # trajectory to compare with: graphd's first scan step must then
            # match Warp's own single step from the start (outside a scan,
            # where XLA aliases them), and its single steps Warp's.
            d0_q, d0_v = w["one_qpos"][0], w["one_qvel"][0]  # Warp's step from the first kept state: d0
            np.testing.assert_allclose(gq[0, 0], d0_q, rtol=1e-5, atol=1e-5,
                                       err_msg="graphd's first scan step against Warp's single step from d0")
            np.testing.assert_allclose(gv[0, 0], d0_v, rtol=1e-4, atol=1e-3,
                                       err_msg="graphd's first scan step against Warp's single step from d0")
            np.testing.assert_allclose(g["one_qpos"], w["one_qpos"], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(g["one_qvel"], w["one_qvel"], rtol=1e-4, atol=1e-3)
            print(f"FIGURE MJX humanoid: Warp's own scan did not advance (its qpos at step {STEPS} is its "
                  "qpos at step 1: XLA did not alias its in-out results, which Warp writes into the operands); "
                  f"graphd's moved by up to {most(gq[0, -1], gq[0, 0]):.3g} in qpos, and its first scan step and "
                  f"its single steps match Warp's single steps (max |diff| qpos "
                  f"{max(most(gq[0, 0], d0_q), most(g['one_qpos'], w['one_qpos'])):.3g})")
            return

        # Warp's single steps against the steps that followed the same
        # states in its chunked run: Warp's own one-step spread.
        nxt = np.arange(nsingle) * CHUNK  # index of the step after each kept state
        want_q, want_v = w["chunked_qpos"][nxt], w["chunked_qvel"][nxt]
        warp_one = max(most(w["one_qpos"], want_q), most(w["one_qvel"], want_v))
        same = [np.array_equal(wq[r], wq[0]) and np.array_equal(wv[r], wv[0]) for r in range(1, RUNS)]
        same.append(np.array_equal(w["chunked_qpos"], wq[0]) and np.array_equal(w["chunked_qvel"], wv[0]))
        same.append(warp_one == 0.0)
        if all(same):
            for r in range(RUNS):
                self.assertTrue(np.array_equal(gq[r], wq[0]) and np.array_equal(gv[r], wv[0]),
                                f"graphd's scan {r} differs from Warp's deterministic result: max |diff| qpos "
                                f"{most(gq[r], wq[0]):.3g}, qvel {most(gv[r], wv[0]):.3g}")
            self.assertTrue(np.array_equal(g["one_qpos"], want_q) and np.array_equal(g["one_qvel"], want_v),
                            f"graphd's single steps differ from Warp's: max |diff| qpos "
                            f"{most(g['one_qpos'], want_q):.3g}, qvel {most(g['one_qvel'], want_v):.3g}")
            print(f"FIGURE MJX humanoid, {STEPS} steps x {WORLDS} worlds: graphd.warp bit for bit equal to Warp's "
                  f"jax_callable (qpos and qvel of every step of {RUNS} scans, and {nsingle} single steps; Warp's "
                  "own runs were deterministic)")
        else:
            spread = max(max(most(wq[r], wq[0]), most(wv[r], wv[0])) for r in range(1, RUNS))
            onset = min((int(np.argmax(np.any(wq[r] != wq[0], axis=(1, 2)))) for r in range(1, RUNS)
                         if not np.array_equal(wq[r], wq[0])), default=None)
            np.testing.assert_allclose(g["one_qpos"], want_q, rtol=1e-5, atol=1e-5,
                                       err_msg="qpos one step after the same states")
            np.testing.assert_allclose(g["one_qvel"], want_v, rtol=1e-4, atol=1e-3,
                                       err_msg="qvel one step after the same states")
            print(f"FIGURE MJX humanoid: Warp's own runs differ (scans: max |diff| {spread:.3g}, qpos first differs "
                  f"at step {onset}; one step from the same state: {warp_one:.3g}); graphd.warp's single steps "
                  f"from Warp's states within qpos 1e-5, qvel 1e-4 + 1e-3 (max |diff| qpos "
                  f"{most(g['one_qpos'], want_q):.3g}, qvel {most(g['one_qvel'], want_v):.3g}); its scans differ "
                  f"from Warp's first by up to {max(most(gq[0], wq[0]), most(gv[0], wv[0])):.3g}")
        print(f"FIGURE MJX humanoid scan, per step ({WORLDS} worlds): Warp's jax_callable "
              f"{warp_info['us_per_step']:.1f} us, graphd.warp {gd_info['us_per_step']:.1f} us "
              f"(median of {RUNS - 1} scans of {STEPS} steps, the per-step qpos and qvel output included)")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
    else:
        unittest.main()
