"""The time per step of a Warp step in a jax.jit + lax.scan loop, through
graphd.warp (staged, staged_ex, direct), through Warp's own warp.jax_callable (its
graph modes: JAX, the default, WARP, WARP_STAGED, WARP_STAGED_EX) and as the
same step in pure JAX.

The step moves n particles one time step under gravity with a floor
bounce (one Warp kernel, positions and velocities in, new ones out). In the
scan the step's inputs are the loop's carries after an XLA multiply (the
velocity damping), so each call gets buffers XLA assigned inside the loop:
graphd binds them at every replay, Warp's WARP mode keys its graphs on
them. Each path's scan is jitted once and run once (compile, capture);
each repeat then times a whole scan of --steps steps to
block_until_ready; the median repeat divided by the step count is the
figure. Every path's final state is compared with Warp's default mode,
which is itself run twice to see whether it is deterministic: then the
comparison is bit for bit, otherwise to a tolerance (the table says which).

Needs a GPU, a running graphd (--socket, else $GRAPHD_SOCKET), libgraphd
and libgraphd_xla ($GRAPHD_LIB, $GRAPHD_XLA_LIB), graphd's Python package
and Warp (warp-lang 1.19) on PYTHONPATH, and jax with CUDA. Prints lines
starting FIGURE and a table. Exit status: 0; 1 when a graphd.warp path
failed or differs from Warp's result; 2 for bad arguments or a missing
prerequisite. A Warp path that fails is reported and does not change the
status (--strict makes it count).

--build-only builds the graphd.warp programs on the CPU (no GPU, no
daemon) for --arch and prints them; --cpu runs Warp's JAX mode and the
pure JAX step on JAX's CPU backend (a check of the bench itself)."""

import argparse
import os
import statistics
import sys
import time
import traceback

import scan_common
from scan_common import mode_list

GRAVITY = -9.81
BOUNCE = 0.8
DAMPING = 0.999
WARP_MODES = ("JAX", "WARP", "WARP_STAGED", "WARP_STAGED_EX")
GRAPHD_MODES = ("staged", "staged_ex", "direct")

_kernels = {}


def warp_step():
    """The Warp function (defined once, after Warp is imported): positions
    and velocities in, new ones out."""
    if "particles" in _kernels:
        return _kernels["particles"]
    import warp as wp

    @wp.kernel
    def bench_integrate(pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3), dt: float,
                        pos_out: wp.array(dtype=wp.vec3), vel_out: wp.array(dtype=wp.vec3)):
        i = wp.tid()
        v = vel[i] + wp.vec3(0.0, GRAVITY, 0.0) * dt
        p = pos[i] + v * dt
        if p[1] < 0.0:
            p = wp.vec3(p[0], -BOUNCE * p[1], p[2])
            v = wp.vec3(v[0], -BOUNCE * v[1], v[2])
        pos_out[i] = p
        vel_out[i] = v

    def particles(pos: wp.array(dtype=wp.vec3), vel: wp.array(dtype=wp.vec3), dt: float,
                  pos_out: wp.array(dtype=wp.vec3), vel_out: wp.array(dtype=wp.vec3)):
        wp.launch(bench_integrate, dim=pos.shape[0], inputs=[pos, vel, dt], outputs=[pos_out, vel_out])

    _kernels["particles"] = particles
    return particles


def jax_step(dt):
    """The same step in pure JAX."""
    import jax.numpy as jnp

    def step(pos, vel):
        v = vel + jnp.asarray([0.0, GRAVITY, 0.0], jnp.float32) * jnp.float32(dt)
        p = pos + v * jnp.float32(dt)
        below = p[:, 1:2] < 0.0
        flip = jnp.asarray([1.0, -BOUNCE, 1.0], jnp.float32)
        return jnp.where(below, p * flip, p), jnp.where(below, v * flip, v)
    return step


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("GRAPHD_SOCKET"), help="graphd's socket")
    ap.add_argument("--steps", type=int, default=1000, help="steps per scan (1000)")
    ap.add_argument("--repeats", type=int, default=7, help="timed scans per path; the median counts (7)")
    ap.add_argument("--n", type=int, default=1 << 16, help="particles (65536)")
    ap.add_argument("--dt", type=float, default=0.002)
    ap.add_argument("--modes", default=",".join(GRAPHD_MODES), help="graphd.warp modes, or 'none'")
    ap.add_argument("--warp-modes", default=",".join(WARP_MODES),
                    help="Warp's jax_callable graph modes (JAX is its default), or 'none'")
    ap.add_argument("--no-jax", action="store_true", help="leave out the pure JAX step")
    ap.add_argument("--strict", action="store_true", help="a failed Warp path fails the bench too")
    ap.add_argument("--build-only", action="store_true",
                    help="build the graphd.warp programs on the CPU and print them; no GPU, no daemon")
    ap.add_argument("--arch", default="90", help="the architecture for --build-only (90)")
    ap.add_argument("--cpu", action="store_true",
                    help="a check of the bench itself on JAX's CPU backend: Warp's JAX mode and pure JAX only")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.repeats < 1 or a.n < 1:
        ap.error("--steps, --repeats and --n must be positive")
    a.modes = mode_list(ap, "--modes", a.modes, GRAPHD_MODES)
    a.warp_modes = mode_list(ap, "--warp-modes", a.warp_modes, WARP_MODES, upper=True)
    if a.cpu:
        if a.modes or [m for m in a.warp_modes if m != "JAX"]:
            ap.error("--cpu runs Warp's JAX mode and pure JAX only: add --modes none --warp-modes JAX")
    if not a.build_only and a.modes and not a.socket:
        ap.error("no daemon: pass --socket or set GRAPHD_SOCKET (or --modes none)")
    return a


def need(what, hint):
    return scan_common.need("warp_scan_bench", what, hint)


def build_only(a):
    need("warp", "put warp-lang 1.19 on PYTHONPATH")
    import graphd.warp as gw
    from graphd.warp._core import FuncSpec, Function
    particles = warp_step()
    spec = FuncSpec.of_function(particles, 2)
    fn = Function(particles, spec)
    arch = gw.resolve_arch(a.arch)
    for mode in a.modes or GRAPHD_MODES:
        b = fn.build({0: (a.n,), 1: (a.n,), 3: (a.n,), 4: (a.n,)}, {2: float(a.dt)}, arch, mode)
        print(f"FIGURE {mode}, sm_{arch}: " + b.describe().replace("\n", "\n  "))
    return 0


class Path:
    def __init__(self, name, kind, make):
        self.name, self.kind, self.make = name, kind, make
        self.us = None
        self.result = None
        self.error = None
        self.note = ""


def run(a):
    jax = need("jax", "install jax with CUDA")
    import jax.numpy as jnp
    import numpy as np
    if a.modes or a.warp_modes:
        wp = need("warp", "put warp-lang 1.19 on PYTHONPATH")
    try:
        gpus = jax.devices("cpu" if a.cpu else "gpu")
    except RuntimeError as e:
        print(f"warp_scan_bench: jax sees no GPU ({e})", file=sys.stderr)
        return 2
    if a.socket:
        os.environ["GRAPHD_SOCKET"] = a.socket
    if a.modes:
        import graphd.warp as gw
        if gw.installed():  # Warp's own jax_callable is measured too
            gw.uninstall()
    if a.warp_modes:
        wp.init()
        from warp._src.jax.ffi import jax_callable as warp_jax_callable

    step_dt = float(a.dt)
    rng = np.random.default_rng(0)
    pos0 = jnp.asarray(rng.uniform(0.0, 2.0, size=(a.n, 3)).astype(np.float32))
    vel0 = jnp.asarray(rng.normal(0.0, 1.0, size=(a.n, 3)).astype(np.float32))

    def scan_of(call):
        def step(c, _):
            p, v = c
            v = v * jnp.float32(DAMPING)  # XLA work: the step's input is a temporary
            p, v = call(p, v)
            return (p, v), None
        return jax.jit(lambda p, v: jax.lax.scan(step, (p, v), None, length=a.steps)[0])

    def measure(path):
        fn = scan_of(path.make())
        out = jax.block_until_ready(fn(pos0, vel0))  # compile, capture
        times = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            out = jax.block_until_ready(fn(pos0, vel0))
            times.append(time.perf_counter() - t)
        path.us = statistics.median(times) / a.steps * 1e6
        path.result = [np.asarray(x) for x in out]

    paths = []
    # graphd.warp first: its recording (at trace time) must not overlap
    # Warp work in the process.
    for mode in a.modes:
        def make(mode=mode):
            f = gw.jax_callable(warp_step(), num_outputs=2, mode=mode)
            return lambda p, v: f(p, v, step_dt)
        paths.append(Path(f"graphd.warp {mode}", "graphd", make))
    for m in a.warp_modes:
        def make(m=m):
            f = warp_jax_callable(warp_step(), num_outputs=2, graph_mode=wp.JaxCallableGraphMode[m])
            return lambda p, v: f(p, v, step_dt)
        paths.append(Path(f"Warp jax_callable {m}" + (" (default)" if m == "JAX" else ""), "warp", make))
    if not a.no_jax:
        paths.append(Path("pure JAX", "jax", lambda: jax_step(step_dt)))

    for path in paths:
        try:
            measure(path)
        except Exception as e:  # noqa: BLE001: reported, the other paths still run
            path.error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"warp_scan_bench: {path.name} failed:", file=sys.stderr)
            traceback.print_exc()

    # The reference: Warp's default mode, run once more for determinism.
    ref, deterministic = None, True
    default = next((p for p in paths if p.kind == "warp" and p.name.startswith("Warp jax_callable JAX")), None)
    if default is not None and default.result is not None:
        ref = default.result
        again = jax.block_until_ready(scan_of(default.make())(pos0, vel0))
        deterministic = all(np.array_equal(x, np.asarray(y)) for x, y in zip(ref, again))
        default.note = "reference" + ("" if deterministic else " (not deterministic: others to a tolerance)")
    status = 0
    for path in paths:
        if path.error:
            path.note = "FAILED " + path.error
            if path.kind == "graphd" or a.strict:
                status = 1
            continue
        if ref is None or path is default:
            continue
        if all(np.array_equal(x, y) for x, y in zip(path.result, ref)):
            path.note = "bit for bit equal to Warp's default"
            continue
        diff = max(float(np.max(np.abs(x - y))) for x, y in zip(path.result, ref))
        close = all(np.allclose(x, y, rtol=1e-5, atol=1e-5) for x, y in zip(path.result, ref))
        if path.kind == "jax":
            path.note = f"max |diff| {diff:.3g} from Warp's default (XLA's own arithmetic)"
        elif not deterministic and close:
            path.note = f"within 1e-5 of Warp's default (max |diff| {diff:.3g})"
        else:
            path.note = f"DIFFERENT from Warp's default (max |diff| {diff:.3g})"
            if path.kind == "graphd" or a.strict:
                status = 1

    base = next((p.us for p in paths if p.kind == "jax" and p.us), None)
    device = gpus[0].device_kind
    print(f"step: {a.n} particles, gravity and a floor bounce; {a.steps} steps a scan, median of {a.repeats} "
          f"scans; {device}")
    for p in paths:
        if p.us is None:
            print(f"FIGURE warp scan, {p.name}: failed ({p.error})")
            continue
        ratio = f", {p.us / base:.2f}x pure JAX" if base else ""
        print(f"FIGURE warp scan, {p.name}: {p.us:.2f} us/step{ratio}; {p.note}")
    width = max(len(p.name) for p in paths) if paths else 10
    print(f"{'path':<{width}}  {'us/step':>9}  {'x JAX':>6}  result")
    for p in paths:
        us = f"{p.us:9.2f}" if p.us is not None else f"{'-':>9}"
        ratio = f"{p.us / base:6.2f}" if p.us is not None and base else f"{'-':>6}"
        print(f"{p.name:<{width}}  {us}  {ratio}  {p.note}")
    if a.modes and a.socket:
        scan_common.print_captures("warp_scan_bench", a.socket)
    return status


def main(argv=None):
    a = parse_args(argv)
    if a.build_only:
        return build_only(a)
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
