"""The time per step of an RL-style lax.scan whose step
calls a graphd callable, against the same step in pure XLA, in one run.

Each step: obs = sin(s) + 1 (an XLA temporary), act = double(obs) (graphd's
`scale` kernel, or the same product in XLA behind an optimization barrier),
s = 0.99 s + 1e-3 act. The scan is jitted once; each repeat times a whole
scan of --steps steps to block_until_ready, and the median repeat is
divided by the step count. graphd's overhead per step is the difference,
for each mode both sync (a round trip per call) and async (the default:
submitted through the session's ring). XLA hands the callable different
buffers from step to step; the daemon's re-capture and capture counters
are read around the timed repeats, which must build nothing.

Needs a running graphd (--socket, else $GRAPHD_SOCKET), libgraphd and
libgraphd_xla ($GRAPHD_LIB, $GRAPHD_XLA_LIB), the test kernels' CUBIN
($GRAPHD_CUDA_KERNELS) and graphd's Python package on PYTHONPATH.
Prints lines starting FIGURE, and RESULT lines of key=value for
scripts/bench-report.py."""

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import graphd
import graphd.jax as gj
from scale_program import doubler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("GRAPHD_SOCKET"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--n", type=int, default=1 << 16, help="floats per buffer")
    ap.add_argument("--modes", default="staged,staged_ex,direct")
    a = ap.parse_args()
    if a.socket:
        os.environ["GRAPHD_SOCKET"] = a.socket

    def scan_of(double):
        def step(s, _):
            obs = jnp.sin(s) + 1.0
            act = double(obs)
            return s * 0.99 + act * 1e-3, None
        return jax.jit(lambda s: jax.lax.scan(step, s, None, length=a.steps)[0])

    def built():
        """Re-captures and captures built so far, over the daemon's devices."""
        with graphd.Client.connect(os.environ["GRAPHD_SOCKET"]) as c:
            devs = c.status()["devices"]
        return (sum(d["counters"]["recaptures"] for d in devs),
                sum(d["counters"]["captures_built"] for d in devs))

    def per_step_us(fn, s0):
        fn(s0).block_until_ready()  # compile, capture
        before = built()
        times = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            fn(s0).block_until_ready()
            times.append(time.perf_counter() - t)
        after = built()
        return (statistics.median(times) / a.steps * 1e6, fn(s0),
                (after[0] - before[0], after[1] - before[1]))

    s0 = jnp.linspace(0.0, 1.0, a.n, dtype=jnp.float32)
    ref_us, ref, _ = per_step_us(scan_of(lambda o: jax.lax.optimization_barrier(o * 2.0)), s0)
    print(f"FIGURE jax scan, pure XLA: {ref_us:.2f} us/step ({a.steps} steps, n={a.n}, "
          f"median of {a.repeats}, device {jax.devices()[0].device_kind})")
    results = [f"jax_steps={a.steps}", f"jax_pure_us={ref_us:.2f}"]
    for mode in a.modes.split(","):
        for sync in (True, False):
            how = "sync" if sync else "async"
            us, got, (recaptures, captures) = per_step_us(
                scan_of(doubler(mode, sync)), s0)
            gj.collect()
            same = np.array_equal(np.asarray(got), np.asarray(ref))
            print(f"FIGURE jax scan, graphd {mode} {how}: {us:.2f} us/step, overhead {us - ref_us:.2f} "
                  f"us/step, ratio {us / ref_us:.2f}x, result {'equal to' if same else 'DIFFERENT from'} "
                  f"pure XLA; while timed: {recaptures} re-captures, {captures} captures built")
            results += [f"jax_{mode}_{how}_us={us:.2f}", f"jax_{mode}_{how}_recaptures={recaptures}",
                        f"jax_{mode}_{how}_captures={captures}"]
            if not same:
                raise SystemExit(1)
    print("RESULT " + " ".join(results))
    with graphd.Client.connect(os.environ["GRAPHD_SOCKET"]) as c:
        for cap in c.list_captures():
            print(f"FIGURE capture of program {cap['program'][:16]} device {cap['device']} mode {cap['mode']}: "
                  f"{cap['replays']} replays, {cap['graphs']} executable graphs, {cap['repoints']} repoints")


if __name__ == "__main__":
    main()
