"""Aggregate steps a second when N processes step the same model at once,
through one graphd and without it, in one run.

For each count of processes (--procs, default 1,2,4,8,16) and each way
(--hows):

  warp    each process steps the scene with MuJoCo MJX's own Warp path
          (warp.jax_callable in MJX's default graph mode, WARP): every
          process captures and launches its own CUDA graphs;
  graphd  each process calls graphd.warp.install() first, so MJX's step
          is replayed by the daemon on --socket, which serves them all;
  pure    (the jax scene only) the small step in pure XLA.

N fresh processes are started for each pair. Each builds every scene of
--scenes in turn; for each it compiles the scan, runs it twice (the
captures), says it is ready and waits; when all N are ready the parent
gives a common start a moment ahead, and each process then runs scans of
--length steps back to back, each from the scene's start and waited for,
until --seconds have passed since the start. (From the start, not from the
last scan's result: chained that way for 5 s on an H100, pendula and
contacts ended in a state that was not finite, with Warp alone and through
graphd alike, and a step over NaN need not cost what the scene's steps
cost.) A process's rate is the
steps of its finished scans over the time to the end of its last one; the
aggregate is the sum of the processes' rates.

Scenes: humanoid, pendula and contacts are mjx_scan_bench.py's three MJX
scenes (--worlds copies each, stepped by jax.vmap(mjx.step); a figure
counts world-steps); jax is jax_scan_bench.py's small step (a sine in XLA,
the test kernels' `scale` through graphd, an update), over --n floats,
through graphd.jax with the graphd way (asynchronous replays) and in pure
XLA with the pure way (a figure counts steps).

Prints a FIGURE line per scene, way and count (aggregate, per process mean,
least and most), a table per scene with graphd's aggregate as a ratio to
the anchor's (Warp alone, or pure XLA for jax), and a RESULT line of
key=value pairs for scripts/bench-report.py: procs_SCENE_WAY_N (aggregate a
second) for every measurement. With a daemon, Status is read around every
graphd measurement and the device workers' busy share of the run is
printed beside it where the daemon reports it, then a FIGURE line of the
daemon's captures with the worker's mean time to queue one replay of each.

Needs a GPU, jax with CUDA, graphd's Python package, libgraphd and
libgraphd_xla ($GRAPHD_LIB, $GRAPHD_XLA_LIB), a running daemon for the
graphd way (--socket, else $GRAPHD_SOCKET), warp-lang 1.18, mujoco and
mujoco-mjx 3.17 for the MJX scenes, and the test kernels' CUBIN
($GRAPHD_CUDA_KERNELS) for jax. --cpu runs the jax scene's pure way on
JAX's CPU backend (a check of the bench itself). Exit status 0; 1 when a
process failed or a scene's result is not finite; 2 for bad arguments or a
missing prerequisite."""

import argparse
import json
import math
import os
import select
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

MJX_SCENES = ("humanoid", "pendula", "contacts")
SCENES = (*MJX_SCENES, "jax")
HOWS = ("warp", "graphd", "pure")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("GRAPHD_SOCKET"), help="graphd's socket")
    ap.add_argument("--procs", default="1,2,4,8,16", help="counts of processes (1,2,4,8,16)")
    ap.add_argument("--scenes", default=",".join(SCENES), help="scenes, in order (all four)")
    ap.add_argument("--hows", default="warp,graphd,pure",
                    help="ways: warp and graphd for the MJX scenes, pure and graphd for jax")
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds each measurement runs (5)")
    ap.add_argument("--worlds", type=int, default=32, help="worlds per process in an MJX scene (32)")
    ap.add_argument("--length", type=int, default=100, help="steps per scan (100)")
    ap.add_argument("--n", type=int, default=1 << 16, help="floats per buffer in the jax scene")
    ap.add_argument("--ready-timeout", type=float, default=600.0,
                    help="seconds a process may take to build and compile a scene (600)")
    ap.add_argument("--cpu", action="store_true", help="JAX's CPU backend: the jax scene's pure way only")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--how", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        a.procs = [int(p) for p in a.procs.split(",") if p.strip()]
    except ValueError:
        ap.error(f"--procs: {a.procs!r} is not a list of numbers")
    if not a.procs or min(a.procs) < 1:
        ap.error("--procs: counts must be positive")
    a.scenes = [s.strip() for s in a.scenes.split(",") if s.strip()]
    a.hows = [h.strip() for h in a.hows.split(",") if h.strip()]
    for s in a.scenes:
        if s not in SCENES:
            ap.error(f"--scenes: {s!r} is not one of {', '.join(SCENES)}")
    for h in a.hows:
        if h not in HOWS:
            ap.error(f"--hows: {h!r} is not one of {', '.join(HOWS)}")
    if min(a.worlds, a.length, a.n) < 1 or a.seconds <= 0:
        ap.error("--worlds, --length, --n and --seconds must be positive")
    if a.cpu and (a.scenes != ["jax"] or a.hows != ["pure"]):
        ap.error("--cpu runs the jax scene's pure way only: add --scenes jax --hows pure")
    if not a.child and "graphd" in a.hows and not a.socket:
        ap.error("no daemon for the graphd way: pass --socket or set GRAPHD_SOCKET")
    return a


def scenes_of(a, how):
    """The scenes a way applies to: warp to the MJX scenes, pure to jax,
    graphd to both."""
    if how == "warp":
        return [s for s in a.scenes if s in MJX_SCENES]
    if how == "pure":
        return [s for s in a.scenes if s == "jax"]
    return list(a.scenes)


# ---------------------------------------------------------------- the child

def say(**msg):
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def mjx_stepper(a, scene):
    """(run, state, steps a run): run(state) -> state after a scan of
    --length MJX steps of --worlds worlds."""
    import mjx_scan_bench as mb
    sim = mb.Sim(scene, a.worlds, seed=os.getpid())
    mx = sim.model()  # MJX's default graph mode: WARP on a GPU
    scan = sim.scan(a.length)

    def run(d):
        return scan(mx, d)
    return run, sim.d0, a.length * a.worlds


def jax_stepper(a, how):
    """The small step: obs = sin(s) + 1, act = 2 obs (graphd's `scale`
    kernel or XLA behind an optimization barrier), s = 0.99 s + 1e-3 act."""
    import jax
    import jax.numpy as jnp
    if how == "graphd":
        from scale_program import doubler
        double = doubler("direct", sync=False)
    else:
        def double(o):
            return jax.lax.optimization_barrier(o * 2.0)

    def step(s, _):
        obs = jnp.sin(s) + 1.0
        return s * 0.99 + double(obs) * 1e-3, None
    scan = jax.jit(lambda s: jax.lax.scan(step, s, None, length=a.length)[0])
    return scan, jnp.linspace(0.0, 1.0, a.n, dtype=jnp.float32), a.length


def finite(x):
    import jax
    import numpy as np
    leaves = [np.asarray(v) for v in jax.tree_util.tree_leaves(x) if hasattr(v, "dtype")]
    return all(np.isfinite(v).all() for v in leaves if v.dtype.kind == "f")


def child(a):
    """One process: every scene of its way, each after the parent's GO."""
    if a.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    if a.how == "graphd":
        os.environ["GRAPHD_SOCKET"] = a.socket
    if a.how in ("warp", "graphd") and any(s in MJX_SCENES for s in a.scenes):
        import warp as wp
        wp.config.quiet = True
        if a.how == "graphd":
            import graphd.warp as gw
            gw.install()
        wp.init()
    for scene in a.scenes:
        try:
            if scene == "jax":
                run, state, per_run = jax_stepper(a, a.how)
            else:
                run, state, per_run = mjx_stepper(a, scene)
            first = state
            for _ in range(2):  # compile, capture
                state = run(state)
            jax.block_until_ready(state)
        except Exception as e:  # noqa: BLE001: reported to the parent
            say(kind="fail", scene=scene, error=f"{type(e).__name__}: {e}")
            return 1
        say(kind="ready", scene=scene)
        line = sys.stdin.readline()
        if not line:
            return 1
        start = json.loads(line)["start"]
        while time.monotonic() < start:
            time.sleep(min(0.001, max(0.0, start - time.monotonic())))
        end = start + a.seconds
        steps = 0
        while True:
            state = run(first)
            jax.block_until_ready(state)
            steps += per_run
            last = time.monotonic()
            if last >= end:
                break
        say(kind="done", scene=scene, steps=steps, seconds=last - start, finite=bool(finite(state)))
    return 0


# --------------------------------------------------------------- the parent

# The device counters read around a graphd measurement: the worker's busy
# time and clock, its time in the replay path and the replays it took (of
# that, the time in graph launches), and the ring entries it held for their
# ready writes (--ready-hold-rings), with their wait and those held to the
# bound.
WORK_COUNTERS = ("worker_busy_ns", "worker_clock_ns", "worker_replay_ns", "worker_replays",
                 "worker_launch_ns", "ready_holds", "ready_hold_ns", "ready_holds_expired")


def workers_busy(socket):
    """Per device, the WORK_COUNTERS that Status reports (a dict; a counter
    the daemon does not report is left out), else None."""
    if not socket:
        return None
    try:
        import graphd
        with graphd.Client.connect(socket) as c:
            devs = c.status()["devices"]
    except Exception:  # noqa: BLE001: the figure is optional
        return None
    out = []
    for d in devs:
        m = d.get("metrics") or {}
        out.append({k: m[k] for k in WORK_COUNTERS if k in m})
    return out


def busy_share(before, after):
    """The busiest device worker's share of the interval, or None."""
    if not before or not after or len(before) != len(after):
        return None
    shares = [(b["worker_busy_ns"] - a["worker_busy_ns"]) / (b["worker_clock_ns"] - a["worker_clock_ns"])
              for a, b in zip(before, after)
              if "worker_busy_ns" in a and "worker_busy_ns" in b
              and b.get("worker_clock_ns", 0) > a.get("worker_clock_ns", 0)]
    return max(shares) if shares else None


def work_note(before, after):
    """What the workers did over the interval, summed over devices: their
    time a replay (and of it in launches), and the ready holds, as text
    for a FIGURE line ("" when Status reports none of it)."""
    if not before or not after or len(before) != len(after):
        return ""

    def delta(k):
        return sum(b.get(k, 0) - a.get(k, 0) for a, b in zip(before, after))

    replays = delta("worker_replays")
    parts = []
    if replays > 0:
        parts.append(f"worker {delta('worker_replay_ns') / replays / 1e3:.1f} us a replay "
                     f"({delta('worker_launch_ns') / replays / 1e3:.1f} in launches, "
                     f"{replays:,} replays)")
    if all("ready_holds" in a for a in before):
        holds = delta("ready_holds")
        mean = delta("ready_hold_ns") / holds / 1e3 if holds else 0.0
        parts.append(f"ready holds {holds:,} (mean {mean:.1f} us, {delta('ready_holds_expired'):,} "
                     f"to the bound)")
    return ", ".join(parts)


def captures_note(socket):
    """The daemon's captures as text for a FIGURE line: per capture its
    program (12 hex digits), the worker's mean time to queue one replay,
    its instances and repoints ("" when the list cannot be read)."""
    if not socket:
        return ""
    try:
        import graphd
        with graphd.Client.connect(socket) as c:
            caps = c.list_captures()
    except Exception:  # noqa: BLE001: the figure is optional
        return ""
    return "; ".join(f"{c['program'][:12]} queue {c.get('queue_ns', 0) / 1e3:.1f} us, "
                     f"{c['instances']} instances, {c['repoints']:,} repoints" for c in caps)


class Group:
    """N child processes of one way."""

    def __init__(self, a, how, n, scenes):
        self.a, self.how, self.n = a, how, n
        cmd = [sys.executable, os.path.abspath(__file__), "--child", "--how", how,
               "--scenes", ",".join(scenes), "--hows", how, "--worlds", str(a.worlds),
               "--length", str(a.length), "--n", str(a.n), "--seconds", str(a.seconds)]
        if a.socket:
            cmd += ["--socket", a.socket]
        if a.cpu:
            cmd.append("--cpu")
        env = dict(os.environ)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        self.procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       bufsize=1, env=env) for _ in range(n)]
        self.buf = {p.stdout.fileno(): "" for p in self.procs}

    def collect(self, kind, timeout):
        """One message of `kind` from every process, in process order; a
        failure or a process that ends or times out raises RuntimeError."""
        got = [None] * self.n
        deadline = time.monotonic() + timeout
        fds = {p.stdout.fileno(): i for i, p in enumerate(self.procs)}
        while any(g is None for g in got):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{sum(g is None for g in got)} of {self.n} processes did not say "
                                   f"{kind} within {timeout:.0f} s")
            waiting = [p.stdout for i, p in enumerate(self.procs) if got[i] is None]
            ready, _, _ = select.select(waiting, [], [], left)
            for f in ready:
                i = fds[f.fileno()]
                line = f.readline()
                if not line:
                    raise RuntimeError(f"process {i} ended (exit status {self.procs[i].wait()})")
                try:
                    msg = json.loads(line)
                except ValueError:
                    print(f"  [{self.how} {i}] {line.rstrip()}")
                    continue
                if msg.get("kind") == "fail":
                    raise RuntimeError(f"process {i}, scene {msg['scene']}: {msg['error']}")
                if msg.get("kind") == kind:
                    got[i] = msg
        return got

    def go(self, lead=0.5):
        start = time.monotonic() + lead
        for p in self.procs:
            p.stdin.write(json.dumps({"start": start}) + "\n")
            p.stdin.flush()

    def close(self):
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def measure(a, how, n, scenes, results, ok):
    """Runs N processes of `how` through `scenes`; stores aggregate and
    per-process rates in results[(scene, how, n)]."""
    g = Group(a, how, n, scenes)
    try:
        for scene in scenes:
            g.collect("ready", a.ready_timeout)
            before = workers_busy(a.socket) if how == "graphd" else None
            g.go()
            done = g.collect("done", a.seconds + 120)
            after = workers_busy(a.socket) if how == "graphd" else None
            rates = [d["steps"] / d["seconds"] for d in done]
            agg = sum(rates)
            busy = busy_share(before, after)
            results[(scene, how, n)] = agg
            unit = "world-steps/s" if scene in MJX_SCENES else "steps/s"
            fin = all(d["finite"] for d in done)
            print(f"FIGURE procs {scene} {how} N={n}: {agg:,.0f} {unit} aggregate, per process mean "
                  f"{agg / n:,.0f} (least {min(rates):,.0f}, most {max(rates):,.0f})"
                  + (f", worker busy {busy * 100:.0f}%" if busy is not None else "")
                  + (f", {note}" if (note := work_note(before, after)) else "")
                  + ("" if fin else ", RESULT NOT FINITE"), flush=True)
            if how == "graphd" and (caps := captures_note(a.socket)):
                print(f"FIGURE procs {scene} graphd N={n} captures: {caps}", flush=True)
            if not fin and scene == "jax":
                ok[0] = False
    except RuntimeError as e:
        print(f"procs_bench: {how} N={n}: {e}", file=sys.stderr, flush=True)
        ok[0] = False
    finally:
        g.close()


def main(argv=None):
    a = parse_args(argv)
    if a.child:
        return child(a)
    print(f"procs_bench: {a.seconds:g} s a measurement, scans of {a.length} steps, {a.worlds} worlds a "
          f"process in MJX scenes, jax scene over {a.n} floats; MPS "
          f"{'on' if os.environ.get('CUDA_MPS_PIPE_DIRECTORY') else 'not asked for'}", flush=True)
    results, ok = {}, [True]
    for n in a.procs:
        for how in a.hows:
            scenes = scenes_of(a, how)
            if scenes:
                measure(a, how, n, scenes, results, ok)
    for scene in a.scenes:
        anchor = "pure" if scene == "jax" else "warp"
        print(f"\n{scene}: aggregate a second by processes; graphd as a ratio to {anchor}")
        print(f"{'N':>4} {anchor:>14} {'graphd':>14} {'ratio':>7}")
        for n in a.procs:
            x, y = results.get((scene, anchor, n)), results.get((scene, "graphd", n))
            ratio = f"{y / x:.2f}x" if x and y else "n/a"
            print(f"{n:>4} {x or float('nan'):>14,.0f} {y or float('nan'):>14,.0f} {ratio:>7}")
    mps = 1 if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") else 0
    print(f"RESULT procs_mps={mps} " + " ".join(f"procs_{s}_{h}_{n}={v:.0f}" for (s, h, n), v in
                                               sorted(results.items()) if not math.isnan(v)), flush=True)
    return 0 if ok[0] else 1


if __name__ == "__main__":
    sys.exit(main())
