"""The time per step of a MuJoCo MJX scene (impl="warp") in a jax.jit +
lax.scan loop, through Warp's own warp.jax_callable in each graph mode MJX
can be given (NONE, JAX, WARP, which is MJX's default on a GPU,
WARP_STAGED, WARP_STAGED_EX) and through graphd.warp after
graphd.warp.install() (staged, direct, auto), with the step's buffers at
repeating addresses and at changing ones.

The scene (--scene) is one of three, or all three in turn (--scene all),
each run as below with its own figures and table:

  humanoid  the humanoid mujoco-mjx ships for its tests
            (mujoco/mjx/test_data/humanoid/humanoid.xml), 128 worlds;
  pendula   mujoco-mjx's pendula test model (mujoco/mjx/test_data/
            pendula.xml: free, ball, slide and hinge joints, chains,
            limits, no contacts), 16 worlds: a short step;
  contacts  a scene of this bench's own: spheres, boxes and a capsule
            falling on a plane and on each other beside an actuated
            four-joint arm, 64 worlds: a short step with contacts.

--worlds copies (the scene's number by default), each from its own
perturbed start (hinge and slide joints, velocities, controls), stepped by
jax.vmap(mjx.step); MJX runs a whole
step as one warp.jax_callable (mujoco/mjx/warp/ffi.py calls
`wp.jax_callable` when a step is traced), so install() puts the whole step
on graphd. MuJoCo Warp's overflow warnings (printf calls in its kernels)
are turned off.

Two patterns of buffer addresses, each timed as --steps steps:

  repeat  one jitted scan of --steps steps from the same start, run
          --repeats times: inside the scan the step works on the loop's
          carried buffers, the same at every step, and the runs alternate
          between two sets of output buffers;
  change  the same steps as a chain of jitted scans of --chunk steps, each
          starting from the previous one's result, with every result kept
          alive until the path is done: each scan's buffers are new
          allocations, so the step sees new addresses every --chunk
          steps. (This includes one jit dispatch per chunk, the same for
          every path.)

Warp's WARP mode keys its captured graphs on the addresses (at most 32
kept), its staged modes copy through buffers of their own; graphd binds
the addresses at every replay. For each path and pattern the median
repeat divided by the step count is the figure. Every result is compared
with Warp's WARP mode on the repeat pattern (MJX's default), which is run
twice to see whether it is deterministic: then the comparison is bit for
bit; otherwise the difference is reported beside Warp's own run-to-run
difference (MuJoCo Warp's contact and constraint lists are filled through
atomic counters, and a falling humanoid amplifies rounding).

Beside each wall time per step is the GPU time per step: how long the
step keeps the GPU busy, from the start of its first copy or launch on the
stream to the end of its last. For graphd.warp it is the daemon's own
figure: its device workers time the replays they sample (one in 16 at
random by default; scripts/warp-gpu.sh starts the daemon with
--gpu-time-sample 1, which times every one) and Status reports
the sum and the count, read before and after the timed repeats; the figure is the
mean over the sampled replays. For Warp it is timed here, in --repeats
more repeats after the timed ones (so that the wall times carry no cost of
it): every CUDA graph Warp launches (through its
runtime.core.wp_cuda_graph_launch, which both wp.capture_launch and
jax_callable's replays of a known graph call) gets a timing event recorded
on its stream before and after it, for the first 256 launches of each
repeat; the figure is the mean over the timed launches, so it includes
the time from the start event to the graph's first node. WARP_STAGED
copies inside its graph, WARP_STAGED_EX outside it, where its figure
leaves them out; NONE and JAX launch no Warp graph and have none. Each
figure is also given as a ratio to Warp's WARP mode (MJX's default graph)
in the same pattern, for graphd.warp in the RESULT line too. A daemon or
libgraphd that does not report GPU time, or that sampled no replay, gives
"n/a".

Beside them, for graphd.warp, the host cost of a call: the bench sets
GRAPHD_XLA_STATS=1 for its process and reads graphd.jax.xla_stats()
before and after the timed repeats, giving per call the bindings it made,
the host time in graphd's XLA handler and libgraphd, and of it the wait
for room in the submission ring (the GPU behind) and the rest, the
handler's and libgraphd's own work (with libgraphd's part, and the part
on copies of buffers graphd cannot map); it is held against a target of
5 us plus 0.1 us a binding. From Status, the same way, the daemon's worker
time per replay (its checks, binding resolution and queueing), and of it
the time in the driver's graph launches, which block while the device's
queue is full: the rest is the worker's own work.

All paths run in one process, graphd.warp's first: its recording (at
trace time) must not overlap Warp work. Before each path MJX's registry
of callables is emptied, and afterwards the bench checks that MJX made a
new callable of the intended kind and mode.

Needs a GPU, a running graphd (--socket, else $GRAPHD_SOCKET), libgraphd
and libgraphd_xla ($GRAPHD_LIB, $GRAPHD_XLA_LIB), graphd's Python package,
warp-lang 1.18, mujoco 3.17 and mujoco-mjx 3.17 on PYTHONPATH, and jax
with CUDA. Prints lines starting FIGURE, a table (wall and GPU time per
step, the GPU time as a ratio to Warp's WARP), and a RESULT line of
key=value pairs (the format scripts/bench-report.py reads; a GPU time that
is not available has no key). Exit status:
0; 1 when a graphd.warp path failed or differs from a deterministic Warp
result; 2 for bad arguments or a missing prerequisite. A Warp path that
fails is reported and does not change the status (--strict makes it
count).

--build-only builds the graphd.warp programs of the step on the CPU (no
GPU, no daemon) for --arch and prints them; --cpu runs Warp's NONE and JAX
modes on JAX's CPU backend (a check of the bench itself)."""

import argparse
import os
import statistics
import sys
import time
import traceback

import scan_common
from scan_common import mode_list

GRAPHD_MODES = ("staged", "staged_ex", "direct", "auto")
# WARP first: it is the reference; JAX last: Warp meets MuJoCo Warp's while
# loop inside XLA's own graph there, the likeliest to fail.
WARP_MODES = ("WARP", "WARP_STAGED", "WARP_STAGED_EX", "NONE", "JAX")
VARIANTS = ("repeat", "change")
CONTACTS_XML = """
<mujoco model="contacts">
  <option timestep="0.004"/>
  <worldbody>
    <geom name="floor" type="plane" size="2 2 0.1"/>
    <body pos="0.45 0 0.3"><freejoint/><geom type="sphere" size="0.08" mass="0.5"/></body>
    <body pos="0.55 0.2 0.5"><freejoint/><geom type="sphere" size="0.06" mass="0.3"/></body>
    <body pos="0.5 -0.3 0.2"><freejoint/><geom type="box" size="0.07 0.07 0.07" mass="0.6"/></body>
    <body pos="0.3 0.35 0.4"><freejoint/><geom type="box" size="0.05 0.1 0.04" mass="0.4"/></body>
    <body pos="0.6 -0.1 0.7"><freejoint/><geom type="capsule" size="0.04 0.1" mass="0.3"/></body>
    <body name="arm" pos="0 0 0.1">
      <joint name="yaw" axis="0 0 1"/>
      <joint name="shoulder" axis="0 1 0" range="-1.5 1.5"/>
      <geom type="capsule" fromto="0 0 0 0.3 0 0.15" size="0.03"/>
      <body pos="0.3 0 0.15">
        <joint name="elbow" axis="0 1 0" range="-2 2"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 -0.15" size="0.025"/>
        <body pos="0.3 0 -0.15">
          <joint name="wrist" axis="1 0 0"/>
          <geom type="box" size="0.04 0.04 0.02"/>
        </body>
      </body>
    </body>
  </worldbody>
  <actuator>
    <motor joint="yaw" gear="5" ctrlrange="-1 1"/>
    <motor joint="shoulder" gear="10" ctrlrange="-1 1"/>
    <motor joint="elbow" gear="8" ctrlrange="-1 1"/>
    <motor joint="wrist" gear="2" ctrlrange="-1 1"/>
  </actuator>
</mujoco>
"""

# name: (file under mujoco/mjx or None for an XML string here, XML, worlds,
# contacts a world for naconmax, constraint rows a world for njmax)
SCENES = {
    "humanoid": (("test_data", "humanoid", "humanoid.xml"), None, 128, 16, 128),
    "pendula": (("test_data", "pendula.xml"), None, 16, 1, 64),
    "contacts": (None, CONTACTS_XML, 64, 48, 384),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("GRAPHD_SOCKET"), help="graphd's socket")
    ap.add_argument("--scene", default="humanoid", choices=(*SCENES, "all"),
                    help="the model stepped (humanoid), or all three in turn")
    ap.add_argument("--worlds", type=int, default=None,
                    help="copies stepped together (the scene's own: humanoid 128, pendula 16, contacts 64)")
    ap.add_argument("--steps", type=int, default=200, help="steps timed per repeat (200)")
    ap.add_argument("--chunk", type=int, default=20, help="steps per scan in the change pattern (20)")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per path and pattern; the median counts (5)")
    ap.add_argument("--modes", default="staged,direct,auto", help="graphd.warp modes, or 'none'")
    ap.add_argument("--warp-modes", default=",".join(WARP_MODES),
                    help="Warp's jax_callable graph modes (WARP is MJX's default), or 'none'")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="address patterns: repeat, change")
    ap.add_argument("--strict", action="store_true", help="a failed Warp path fails the bench too")
    ap.add_argument("--unrolled", action="store_true",
                    help="MuJoCo Warp's solver loop unrolled (graph_conditional off): no conditional node in "
                         "either graph, so a profiler that cannot see into conditional graphs (ncu) sees "
                         "every kernel")
    ap.add_argument("--build-only", action="store_true",
                    help="build the graphd.warp programs of the step on the CPU and print them; no GPU, no daemon")
    ap.add_argument("--arch", default="90", help="the architecture for --build-only (90)")
    ap.add_argument("--cpu", action="store_true",
                    help="a check of the bench itself on JAX's CPU backend: Warp's NONE and JAX modes only")
    a = ap.parse_args(argv)
    if min(a.worlds or 1, a.steps, a.chunk, a.repeats) < 1:
        ap.error("--worlds, --steps, --chunk and --repeats must be positive")
    if a.steps % a.chunk:
        ap.error("--steps must be a multiple of --chunk")
    a.modes = mode_list(ap, "--modes", a.modes, GRAPHD_MODES)
    a.warp_modes = mode_list(ap, "--warp-modes", a.warp_modes, WARP_MODES, upper=True)
    a.variants = mode_list(ap, "--variants", a.variants, VARIANTS, none=False)
    if a.cpu and (a.modes or [m for m in a.warp_modes if m not in ("NONE", "JAX")]):
        ap.error("--cpu runs Warp's NONE and JAX modes only: add --modes none --warp-modes NONE,JAX")
    if not a.build_only and a.modes and not a.socket:
        ap.error("no daemon: pass --socket or set GRAPHD_SOCKET (or --modes none)")
    return a


def need(what, hint):
    return scan_common.need("mjx_scan_bench", what, hint)


def prerequisites():
    need("warp", "put warp-lang 1.18 on PYTHONPATH")
    need("mujoco", "put mujoco 3.17 on PYTHONPATH")
    need("mujoco.mjx", "put mujoco-mjx 3.17 on PYTHONPATH")
    import mujoco.mjx.warp as mjxw
    if not mjxw.WARP_INSTALLED or mjxw.mujoco_warp is None:
        print("mjx_scan_bench: mujoco.mjx has no Warp implementation here", file=sys.stderr)
        sys.exit(2)


class Sim:
    """A scene, its batched start, and MJX's step."""

    def __init__(self, scene, worlds, seed=0, unrolled=False):
        import jax
        import jax.numpy as jnp
        import mujoco
        import mujoco.mjx as mjx
        import numpy as np
        self.jax, self.mjx = jax, mjx
        self.unrolled = unrolled
        rel, xml, _, contacts, rows = SCENES[scene]
        self.scene = scene
        if rel is None:
            self.path = f"{scene} (this bench's own)"
            m = self.m = mujoco.MjModel.from_xml_string(xml)
        else:
            path = os.path.join(os.path.dirname(mjx.__file__), *rel)
            if not os.path.exists(path):
                print(f"mjx_scan_bench: no {path} in this mujoco-mjx", file=sys.stderr)
                sys.exit(2)
            self.path = os.path.relpath(path, os.path.dirname(os.path.dirname(path)))
            m = self.m = mujoco.MjModel.from_xml_path(path)
        rng = np.random.default_rng(seed)
        qpos = np.tile(m.qpos0.astype(np.float32), (worlds, 1))
        # Hinge and slide joints only: free and ball joints hold quaternions.
        adr = [int(m.jnt_qposadr[j]) for j in range(m.njnt)
               if m.jnt_type[j] in (mujoco.mjtJoint.mjJNT_HINGE, mujoco.mjtJoint.mjJNT_SLIDE)]
        qpos[:, adr] += rng.uniform(-0.1, 0.1, size=(worlds, len(adr))).astype(np.float32)
        qvel = rng.uniform(-0.1, 0.1, size=(worlds, m.nv)).astype(np.float32)
        ctrl = rng.uniform(-0.2, 0.2, size=(worlds, m.nu)).astype(np.float32)
        # naconmax counts contacts over all worlds; njmax constraint rows
        # per world.
        d = mjx.make_data(m, impl="warp", naconmax=max(contacts, 1) * worlds, njmax=rows)
        d0 = jax.vmap(lambda q, v, c: d.replace(qpos=q, qvel=v, ctrl=c))(
            jnp.asarray(qpos), jnp.asarray(qvel), jnp.asarray(ctrl))
        # Committed to the device like a scan's result, so that jit sees one
        # signature for both.
        self.d0 = jax.device_put(d0, jax.devices()[0])
        self.vstep = jax.vmap(mjx.step, in_axes=(None, 0))

    def model(self, graph_mode=None):
        """mjx.Model with impl="warp" (graph_mode None: MJX's default),
        MuJoCo Warp's overflow warnings off."""
        mx = self.mjx.put_model(self.m, impl="warp", graph_mode=graph_mode)
        impl = mx.opt._impl.replace(warn_overflow=0)
        if self.unrolled:
            impl = impl.replace(graph_conditional=False)
        return mx.replace(opt=mx.opt.replace(_impl=impl))

    def scan(self, length):
        """jit of (mx, d) -> d after `length` steps. The model is an
        argument: arrays a jitted function closes over become constants in
        XLA's module memory, which the daemon cannot map."""
        jax, vstep = self.jax, self.vstep

        def run(mx, d):
            return jax.lax.scan(lambda d, _: (vstep(mx, d), None), d, None, length=length)[0]
        return jax.jit(run)


def mjx_registry():
    from mujoco.mjx.warp import ffi as mjx_ffi
    return mjx_ffi._JAX_CALLABLE_VARIADIC_TUPLE_REGISTRY


def build_only(a):
    """The step's graphd programs, lowered for CUDA on JAX's CPU backend."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    prerequisites()
    import warp as wp
    import graphd.warp as gw
    arch = gw.resolve_arch(a.arch)
    os.environ["GRAPHD_WARP_ARCH"] = str(arch)
    gw.install()
    sim = Sim(a.scene, a.worlds, unrolled=a.unrolled)
    status = 0
    for mode in a.modes or ("auto",):
        mjx_registry().clear()
        set_graphd_mode(gw, mode)
        try:
            mx = sim.model(wp.JaxCallableGraphMode.WARP)  # as on a GPU, where WARP is MJX's default
            sim.scan(1).trace(mx, sim.d0).lower(lowering_platforms=("cuda",))
        except gw.Refused as e:
            print(f"FIGURE MJX {a.scene} step, graphd.warp {mode}, sm_{arch}: refused ({e.reason}): {e}")
            status = 1
            continue
        for c in mjx_registry().values():
            for b in c.programs.values():
                lines = b.describe().splitlines()
                print(f"FIGURE MJX {a.scene} step, graphd.warp {mode} ({c.mode}), sm_{arch}: {lines[0]}; "
                      f"{len(b.launches)} launches, {len(b.conds)} while/if")
    gw.uninstall()
    return status


def set_graphd_mode(gw, mode):
    """install() gives MJX graphd.warp's jax_callable with mode "auto";
    another mode is the same function with that mode fixed."""
    import warp as wp
    gw.install()
    if mode != "auto":
        def jax_callable(*args, **kw):
            kw.setdefault("mode", mode)
            return gw.jax_callable(*args, **kw)
        wp.jax_callable = jax_callable


class Path:
    def __init__(self, name, kind, mode):
        self.name, self.kind, self.mode = name, kind, mode
        self.us = {}
        self.gpu = {}  # pattern: GpuTime
        self.host = {}  # pattern: HostCost (graphd only)
        self.final = {}
        self.notes = {}
        self.extra = {}
        self.error = None
        self.scan = None


class GpuTime:
    """A path's GPU time per step in one pattern: us, the mean over `timed`
    of `total` replays (graphd) or graph launches (Warp) in `steps` steps;
    us None when not available, `why` saying why."""

    def __init__(self, us=None, timed=0, total=None, steps=0, how="", why=""):
        self.us, self.timed, self.total, self.steps, self.how, self.why = us, timed, total, steps, how, why

    def text(self):
        if self.us is None:
            return f"GPU time n/a ({self.why})"
        total = "?" if self.total is None else self.total
        each = f"; {self.total / self.steps:g} a step" if self.total is not None and self.steps else ""
        return f"GPU {self.us:.2f} us/step (mean of {self.timed} of {total} {self.how}{each})"


def daemon_gpu(before, after, steps):
    """GpuTime of a graphd path from Status read before and after: the
    workers' GPU time over the replays they sampled meanwhile."""
    d = {k: None if before.get(k) is None or after.get(k) is None else after[k] - before[k]
         for k in ("replays", "gpu_ns", "gpu_replays")}
    if d["gpu_ns"] is None or d["gpu_replays"] is None:
        return GpuTime(why="the daemon's Status has no GPU time: an older daemon or libgraphd")
    if d["gpu_replays"] <= 0:
        return GpuTime(total=d["replays"], steps=steps, why="the daemon sampled no replay")
    if d["gpu_ns"] < 0 or (d["replays"] is not None and d["gpu_replays"] > d["replays"]):
        return GpuTime(why=f"implausible: {d['gpu_replays']} replays sampled of {d['replays']}, {d['gpu_ns']} ns")
    return GpuTime(d["gpu_ns"] / d["gpu_replays"] / 1e3, d["gpu_replays"], d["replays"], steps,
                   "replays, those the daemon sampled")


class HostCost:
    """A graphd path's host cost per call in one pattern, from the
    handler's counts (graphd.jax.xla_stats()) and the daemon's Status read
    before and after the timed repeats: bindings a call; us in the handler
    and libgraphd, of it waiting for ring room, in libgraphd's own work and
    on the copies of buffers graphd cannot map; and the worker's us a
    replay, of it in the driver's graph launches. None where not
    available."""

    def __init__(self, xla_before, xla_after, status_before, status_after):
        self.calls = self.bindings = self.handler_us = self.wait_us = None
        self.lib_us = self.copies_us = self.worker_us = self.launch_us = None
        if xla_before is not None and xla_after is not None:
            d = {k: xla_after[k] - xla_before[k] for k in xla_after}
            if d["calls"] > 0:
                per = 1e-3 / d["calls"]
                self.calls = d["calls"]
                self.bindings = d["buffers"] / d["calls"]
                self.handler_us = d["handler_ns"] * per
                self.wait_us = d["wait_ns"] * per
                self.lib_us = (d["replay_ns"] - d["wait_ns"]) * per
                self.copies_us = d["bounce_ns"] * per

        def delta(k):
            v = [x.get(k) for x in (status_before, status_after)]
            return None if None in v else v[1] - v[0]
        n = delta("replays")
        if n and delta("worker_ns") is not None:
            self.worker_us = delta("worker_ns") / n / 1e3
            if delta("launch_ns") is not None:
                self.launch_us = delta("launch_ns") / n / 1e3

    @property
    def own_us(self):
        return None if self.handler_us is None else self.handler_us - self.wait_us

    @property
    def worker_own_us(self):
        return None if self.worker_us is None or self.launch_us is None else self.worker_us - self.launch_us

    @property
    def target_us(self):
        return None if self.bindings is None else 5.0 + 0.1 * self.bindings

    def text(self):
        if self.calls is None:
            worker = "" if self.worker_us is None else f"; the worker {self.worker_us:.2f} us a replay"
            return "host cost n/a (the handler did not count: GRAPHD_XLA_STATS was not set in time)" + worker
        met = "met" if self.own_us <= self.target_us else "missed"
        worker = "n/a" if self.worker_us is None else f"{self.worker_us:.2f} us"
        if self.launch_us is not None:
            worker += f" ({self.launch_us:.2f} of it in graph launches, {self.worker_own_us:.2f} its own work)"
        return (f"a call binds {self.bindings:.0f} buffers: {self.handler_us:.2f} us in the handler and "
                f"libgraphd, {self.wait_us:.2f} of it waiting for ring room, {self.own_us:.2f} its own work "
                f"(target {self.target_us:.1f}: {met}; libgraphd {self.lib_us:.2f}, "
                f"{self.copies_us:.2f} on copies of unmappable buffers); "
                f"the worker {worker} a replay ({self.calls} calls)")


def gpu_us(path, variant):
    """A path's GPU time per step in a pattern as text: us, or n/a."""
    g = path.gpu.get(variant)
    return "n/a" if g is None or g.us is None else f"{g.us:.2f}"


class LaunchTimer:
    """While entered, times on the GPU the CUDA graphs Warp launches:
    runtime.core.wp_cuda_graph_launch, which wp.capture_launch and
    jax_callable's replays of a known graph (looked up at every call) both
    call, is replaced by a wrapper that records a timing event on the
    launch's stream before and after each of the first POOL launches since
    the last collect(). collect(), once that work is done, adds up their
    elapsed times and frees the events for the next launches. The events
    are made as they are first needed, on `device` (a CUDA ordinal)."""

    POOL = 256

    def __init__(self, wp, device):
        self.wp, self.device = wp, device
        self.core = wp._src.context.runtime.core
        self.pairs = []  # (start, end) events, reused after each collect()
        self.used = 0  # pairs recorded since the last collect()
        self.launches = 0
        self.timed = 0
        self.ms = 0.0
        self.error = None
        self.orig = None

    def __enter__(self):
        self.orig = self.core.wp_cuda_graph_launch
        self.core.wp_cuda_graph_launch = self.launch
        return self

    def __exit__(self, *exc):
        self.core.wp_cuda_graph_launch = self.orig

    def take(self):
        if self.error is not None or self.used >= self.POOL:
            return None
        if self.used == len(self.pairs):
            try:
                dev = self.wp.get_cuda_device(self.device)
                self.pairs.append((self.wp.Event(dev, enable_timing=True), self.wp.Event(dev, enable_timing=True)))
            except Exception as e:  # noqa: BLE001: the launches go on, untimed
                self.error = f"{type(e).__name__}: {e}"
                return None
        self.used += 1
        return self.pairs[self.used - 1]

    def launch(self, graph_exec, stream):
        # What Stream.record_event does, on the raw stream the launch is given.
        pair = self.take()
        if pair:
            self.core.wp_cuda_event_record(pair[0].cuda_event, stream, True)
        ok = self.orig(graph_exec, stream)
        if pair:
            self.core.wp_cuda_event_record(pair[1].cuda_event, stream, True)
        self.launches += 1
        return ok

    def collect(self):
        for start, end in self.pairs[:self.used]:
            self.ms += self.wp.get_event_elapsed_time(start, end)
        self.timed += self.used
        self.used = 0

    def figure(self, steps, repeats):
        if self.error is not None:
            return GpuTime(total=self.launches, steps=steps, why=f"no timing events: {self.error}")
        if not self.timed:
            return GpuTime(total=self.launches, steps=steps, why="no Warp graph launched")
        how = (f"graph launches, timed with events in {repeats} more repeats"
               + (f", the first {self.POOL} of each" if self.timed < self.launches else ""))
        return GpuTime(self.ms / self.timed * 1e3, self.timed, self.launches, steps, how)


def run(a):
    if a.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    jax = need("jax", "install jax with CUDA")
    import numpy as np
    try:
        gpus = jax.devices("cpu" if a.cpu else "gpu")
    except RuntimeError as e:
        print(f"mjx_scan_bench: jax sees no GPU ({e})", file=sys.stderr)
        return 2
    prerequisites()
    import warp as wp
    if a.socket:
        os.environ["GRAPHD_SOCKET"] = a.socket
    # The handler's counts of its calls (read around the timed repeats);
    # it reads this at the process's first call.
    os.environ.setdefault("GRAPHD_XLA_STATS", "1")
    gw = None
    if a.modes:
        import graphd
        import graphd.warp as gw
        import graphd.jax as gj
    if gw is not None and gw.installed():
        gw.uninstall()
    wp.init()
    sim = Sim(a.scene, a.worlds, unrolled=a.unrolled)

    def counters():
        """The capture counters and the workers' replays and GPU time (None
        where Status has no such field) summed over the daemon's devices,
        read until two reads 0.1 s apart agree: the daemon folds in what its
        rings replayed, and the GPU time of the replays it sampled, within
        milliseconds of going idle."""
        last = None
        for _ in range(20):
            with graphd.Client.connect(a.socket) as c:
                devs = c.status()["devices"]
            now = {k: sum(d["counters"][k] for d in devs) for k in ("captures_built", "recaptures")}
            works = [d.get("work") or {} for d in devs]
            for k, field in (("replays", "replays"), ("gpu_ns", "gpu_ns"), ("gpu_replays", "gpu_replays"),
                             ("worker_ns", "replay_ns"), ("launch_ns", "launch_ns")):
                now[k] = sum(w[field] for w in works) if all(field in w for w in works) else None
            if now == last:
                break
            last = now
            time.sleep(0.1)
        return now

    class Timed:
        """Around a path's timed repeats in pattern `variant`: for graphd,
        what the daemon built meanwhile (which must be nothing) and the GPU
        time of the replays it sampled."""

        def __init__(self, path, variant):
            self.path, self.variant = path, variant

        def __enter__(self):
            if self.path.kind == "graphd":
                gj.collect()
                self.before = counters()
                self.xla_before = gj.xla_stats()

        def __exit__(self, *exc):
            if self.path.kind == "graphd" and exc[0] is None:
                gj.collect()
                xla_after = gj.xla_stats()
                after = counters()
                self.path.host[self.variant] = HostCost(self.xla_before, xla_after, self.before, after)
                for k in ("captures_built", "recaptures"):
                    self.path.extra[k] = self.path.extra.get(k, 0) + after[k] - self.before[k]
                self.path.gpu[self.variant] = daemon_gpu(self.before, after, a.steps * a.repeats)

    def repeats(path, variant, once, last=None):
        """once() -> (seconds, result) --repeats times, each while the last
        result (at first `last`) is alive: the times and final_of the last
        result. For a Warp path, then --repeats more the same way with its
        graph launches timed on the GPU (apart, so that the times carry no
        cost of it; the wrapper is taken off when they end or fail, and a
        failure there leaves the times standing)."""
        times = []
        with Timed(path, variant):
            for _ in range(a.repeats):
                t, last = once()
                times.append(t)
        final = final_of(last)
        if path.kind == "warp":
            try:
                with LaunchTimer(wp, gpus[0].id) as timer:
                    for _ in range(a.repeats):
                        _, last = once()
                        timer.collect()
                path.gpu[variant] = timer.figure(a.steps * a.repeats, a.repeats)
            except Exception as e:  # noqa: BLE001: reported; the wall times stand
                print(f"mjx_scan_bench: {path.name}, {variant} addresses: the GPU-timed repeats failed:",
                      file=sys.stderr)
                traceback.print_exc()
                path.gpu[variant] = GpuTime(why=f"its GPU-timed repeats failed: {type(e).__name__}")
        return times, final

    def final_of(d):
        return np.asarray(d.qpos), np.asarray(d.qvel)

    def time_repeat(path, mx):
        f = sim.scan(a.steps)
        out = jax.block_until_ready(f(mx, sim.d0))  # compile, record, capture

        def once():
            t = time.perf_counter()
            out = jax.block_until_ready(f(mx, sim.d0))
            return time.perf_counter() - t, out
        times, final = repeats(path, "repeat", once, out)
        path.scan = f
        return statistics.median(times), final

    def time_change(path, mx):
        g = sim.scan(a.chunk)
        # Compile, record, capture; and a scan from a scan's result.
        keep = [g(mx, sim.d0)]
        keep.append(jax.block_until_ready(g(mx, keep[0])))

        def once():
            d = sim.d0
            t = time.perf_counter()
            for _ in range(a.steps // a.chunk):
                d = g(mx, d)
                keep.append(d)  # alive to the end of the path: the next scan's buffers are new
            jax.block_until_ready(d)
            return time.perf_counter() - t, d
        times, result = repeats(path, "change", once)
        keep.clear()
        return statistics.median(times), result

    def measure(path, mx):
        for v in a.variants:
            med, path.final[v] = (time_repeat if v == "repeat" else time_change)(path, mx)
            path.us[v] = med / a.steps * 1e6
        made = list(mjx_registry().values())
        if not made:
            raise RuntimeError("MJX made no new jax_callable for this path (its trace was reused?): run the "
                               "paths one at a time (--modes / --warp-modes)")
        if path.kind == "graphd":
            wrong = [c for c in made if not isinstance(c, gw.JaxCallable)
                     or c.mode != gw.resolve_mode(path.mode, c.graph_mode)]
            if wrong:
                raise RuntimeError(f"MJX's callables are not graphd.warp's in mode {path.mode}: {wrong}")
            path.extra["programs"] = [b for c in made for b in c.programs.values()]
        else:
            wrong = [c for c in made if type(c).__module__.split(".")[0] != "warp"
                     or int(c.graph_mode) != int(wp.JaxCallableGraphMode[path.mode])]
            if wrong:
                raise RuntimeError(f"MJX's callables are not Warp's in graph mode {path.mode}: {wrong}")
            path.extra["graphs"] = sum(getattr(c, "graph_cache_size", 0) for c in made)

    paths = []
    for mode in a.modes:
        paths.append(Path(f"graphd.warp {mode}", "graphd", mode))
    for m in a.warp_modes:
        paths.append(Path(f"Warp jax_callable {m}" + (" (MJX default)" if m == "WARP" else ""), "warp", m))

    for path in paths:
        mjx_registry().clear()
        # JAX's own caches would hand the next path the last one's trace,
        # and MJX would make no new jax_callable for it.
        jax.clear_caches()
        try:
            if path.kind == "graphd":
                set_graphd_mode(gw, path.mode)
                mx = sim.model()
            else:
                # Warp's own functions back (also over a fixed-mode
                # wrapper of set_graphd_mode, which installed() does not
                # count as graphd.warp's).
                if gw is not None:
                    gw.uninstall()
                mx = sim.model(wp.JaxCallableGraphMode[path.mode])
            measure(path, mx)
            print(f"mjx_scan_bench: {path.name} measured: " + ", ".join(
                f"{v} addresses {us:.2f} us/step (GPU {gpu_us(path, v)})" for v, us in path.us.items()), flush=True)
        except Exception as e:  # noqa: BLE001: reported, the other paths still run
            path.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"mjx_scan_bench: {path.name} failed:", file=sys.stderr)
            traceback.print_exc()
    if gw is not None and gw.installed():
        gw.uninstall()

    # The reference: Warp's WARP mode (MJX's default; without it the first
    # Warp mode measured), repeat pattern, run once more to see whether it
    # is deterministic.
    ref, spread, deterministic = None, 0.0, True
    measured = [p for p in paths if p.kind == "warp" and "repeat" in p.final]
    default = next((p for p in measured if p.mode == "WARP"), measured[0] if measured else None)
    if default is not None:
        ref = default.final["repeat"]  # the same jitted scan again: the same Warp callable
        ref_name = f"Warp's {default.mode}"
        try:
            again = final_of(jax.block_until_ready(
                default.scan(sim.model(wp.JaxCallableGraphMode[default.mode]), sim.d0)))
            spread = max(float(np.max(np.abs(x - y))) for x, y in zip(ref, again))
            deterministic = spread == 0.0
            default.notes["repeat"] = "reference" + ("" if deterministic else f" (two runs differ by {spread:.3g})")
        except Exception:  # noqa: BLE001: the comparisons stay bit for bit
            print(f"mjx_scan_bench: {ref_name} did not run again:", file=sys.stderr)
            traceback.print_exc()
            default.notes["repeat"] = "reference (not run again: compared bit for bit)"
    status = 0
    for path in paths:
        if path.error:
            if path.kind == "graphd" or a.strict:
                status = 1
            continue
        for v, res in path.final.items():
            if ref is None or (path is default and v == "repeat"):
                continue
            if all(np.array_equal(x, y) for x, y in zip(res, ref)):
                path.notes[v] = f"bit for bit equal to {ref_name}"
                continue
            diff = max(float(np.max(np.abs(x - y))) for x, y in zip(res, ref))
            if deterministic:
                path.notes[v] = f"DIFFERENT from {ref_name} (max |diff| {diff:.3g})"
                if path.kind == "graphd" or a.strict:
                    status = 1
            else:
                path.notes[v] = f"max |diff| {diff:.3g} from {ref_name} (its own two runs: {spread:.3g})"

    device = gpus[0].device_kind
    m = sim.m
    # The humanoid's keys as they always were; the other scenes' named.
    pre = "mjx" if a.scene == "humanoid" else f"mjx_{a.scene}"
    what = f"mjx {a.scene} scan"
    print(f"step: MJX {a.scene} ({sim.path}, nq {m.nq}, "
          f"nv {m.nv}), {a.worlds} worlds, jax.vmap(mjx.step) in lax.scan; {a.steps} steps a repeat (change: "
          f"scans of {a.chunk}), median of {a.repeats}; Warp {wp.__version__}, jax {jax.__version__}, {device}")
    results = [f"{pre}_worlds={a.worlds}", f"{pre}_steps={a.steps}", f"{pre}_chunk={a.chunk}"]
    warp_ref = next((p for p in paths if p.kind == "warp" and p.mode == "WARP" and not p.error), None)

    def gpu_ratio(p, v):
        """p's GPU time per step over Warp's WARP's, in pattern v, or None."""
        g, r = p.gpu.get(v), warp_ref.gpu.get(v) if warp_ref is not None else None
        if p is warp_ref or g is None or g.us is None or r is None or r.us is None or r.us <= 0:
            return None
        return g.us / r.us

    for p in paths:
        if p.error:
            print(f"FIGURE {what}, {p.name}: failed ({p.error})")
            continue
        key = f"{pre}_{p.kind}_{p.mode}"
        for v in a.variants:
            if v not in p.us:
                continue
            extra = ""
            if p.kind == "graphd":
                extra = (f"; daemon while timed: {p.extra['captures_built']} captures built, "
                         f"{p.extra['recaptures']} re-captures")
            elif p.mode in ("WARP",):
                extra = f"; Warp holds {p.extra['graphs']} graphs after the path"
            g = p.gpu.get(v) or GpuTime(why="not measured")
            ratio = gpu_ratio(p, v)
            gpu = g.text() + (f", {ratio:.3f}x Warp's WARP" if ratio is not None else "")
            print(f"FIGURE {what}, {p.name}, {v} addresses: {p.us[v]:.2f} us/step "
                  f"({p.us[v] / a.worlds * 1e3:.1f} ns per world-step); {gpu}; {p.notes.get(v, '')}{extra}")
            results.append(f"{key}_{v}_us={p.us[v]:.2f}")
            if g.us is not None:
                results.append(f"{key}_{v}_gpu_us={g.us:.2f}")
            if p.kind == "graphd" and ratio is not None:
                results.append(f"{key}_{v}_gpu_ratio={ratio:.3f}")
            h = p.host.get(v)
            if h is not None:
                print(f"FIGURE {what}, {p.name}, {v} addresses, host a call: {h.text()}")
                if h.calls is not None:
                    results += [f"{key}_{v}_bindings={h.bindings:.1f}", f"{key}_{v}_host_us={h.own_us:.2f}",
                                f"{key}_{v}_host_wait_us={h.wait_us:.2f}", f"{key}_{v}_host_lib_us={h.lib_us:.2f}",
                                f"{key}_{v}_host_copies_us={h.copies_us:.2f}"]
                if h.worker_us is not None:
                    results.append(f"{key}_{v}_worker_us={h.worker_us:.2f}")
                if h.worker_own_us is not None:
                    results.append(f"{key}_{v}_worker_own_us={h.worker_own_us:.2f}")
        if p.kind == "graphd":
            results += [f"{key}_captures={p.extra['captures_built']}", f"{key}_recaptures={p.extra['recaptures']}"]
            for b in p.extra["programs"]:
                print(f"FIGURE mjx {a.scene} step program {b.id_hex[:16]} ({p.mode}): {len(b.launches)} launches, "
                      f"{len(b.conds)} while/if, {len(b.slots)} slots, {sum(s.nbytes for s in b.slots)} bytes")
        elif p.mode == "WARP":
            results.append(f"{key}_graphs={p.extra['graphs']}")
    width = max([len(p.name) for p in paths] + [10])
    print(f"{'path':<{width}}  {'pattern':<7}  {'us/step':>9}  {'GPU us/step':>11}  {'GPU/WARP':>8}  result")
    for p in paths:
        for v in a.variants:
            us = f"{p.us[v]:9.2f}" if v in p.us else f"{'-':>9}"
            gpu = gpu_us(p, v) if v in p.us else "-"
            ratio = gpu_ratio(p, v)
            ratio = f"{ratio:.3f}x" if ratio is not None else "-"
            note = p.notes.get(v, "") if not p.error else f"FAILED {p.error}"
            print(f"{p.name:<{width}}  {v:<7}  {us}  {gpu:>11}  {ratio:>8}  {note}")
    print("RESULT " + " ".join(results))
    if a.modes and a.socket:
        scan_common.print_captures("mjx_scan_bench", a.socket)
    return status


def main(argv=None):
    a = parse_args(argv)
    status = 0
    for scene in SCENES if a.scene == "all" else (a.scene,):
        one = argparse.Namespace(**vars(a))
        one.scene = scene
        one.worlds = a.worlds or SCENES[scene][2]
        if a.scene == "all":
            print(f"== mjx_scan_bench: {scene}", flush=True)
        status = max(status, build_only(one) if a.build_only else run(one))
    return status


if __name__ == "__main__":
    sys.exit(main())
