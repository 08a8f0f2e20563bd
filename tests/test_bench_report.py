"""scripts/bench-report.py: the targets come out of the RESULT lines of a
run's logs, each figure beside its anchor from the same run, met or missed
by its target; the JSON holds every figure; a run without figures fails.
Standard library only (the plot is left out where matplotlib is missing).
Usage: test_bench_report.py SOURCE_DIR"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
SCRIPT = os.path.join(SRC, "scripts", "bench-report.py")

REPLAY = (
    "noise before\n"
    "RESULT mps=1 echo_p50_us=10.00 staged_p50_us=30.00 staged_async_call_p50_us=1.50 "
    "staged_async_chain_us=13.00 staged_chain_us=30.00\n"
    "RESULT inproc_sync_p50_us=15.00 inproc_chain_us=10.00 inproc_first_us=500.0 "
    "region_vmm_us=1600.0 restart_us=4.0 recaptures=0\n"
    "RESULT floor_steps=256 floor_one_stream_us=6.00 floor_host_us=12.00 floor_device_us=10.00\n"
    "RESULT big_mib=64 direct_big_p50_us=60.00 direct_big_chain_us=70.00 "
    "inproc_big_staged_p50_us=130.00 inproc_big_fixed_p50_us=58.00 inproc_big_chain_us=120.00\n")
JAX = "RESULT jax_steps=1000 jax_pure_us=10.00 jax_staged_async_us=17.00 jax_staged_async_recaptures=2\n"
SCALING = ("RESULT scaling_sync_devices=1 scaling_sync_clients=8 scaling_sync_procs_rps=70000\n"
           "RESULT scaling_async_devices=1 scaling_async_clients=8 scaling_async_procs_rps=210000\n")
LARGE = "RESULT slots=250 inproc_async_us=200.0 inproc_gpu_us=190.0 direct_async_us=230.0 direct_async_gpu_us=195.0\n"
MJX = ("RESULT mjx_worlds=128 mjx_graphd_auto_repeat_us=600.0 mjx_graphd_auto_repeat_gpu_us=500.0 "
       "mjx_graphd_auto_change_us=610.0 mjx_warp_WARP_repeat_us=700.0 mjx_warp_WARP_repeat_gpu_us=400.0 "
       "mjx_warp_WARP_change_us=1500.0 mjx_graphd_auto_recaptures=0 mjx_graphd_auto_repeat_bindings=300.0 "
       "mjx_graphd_auto_repeat_host_us=36.00 mjx_graphd_auto_repeat_host_wait_us=400.00 "
       "mjx_graphd_auto_repeat_worker_us=80.00 mjx_graphd_auto_repeat_worker_own_us=50.00\n"
       "RESULT mjx_pendula_graphd_auto_repeat_us=500.0 mjx_pendula_warp_WARP_repeat_us=480.0 "
       "mjx_pendula_graphd_auto_repeat_bindings=100.0 mjx_pendula_graphd_auto_repeat_host_us=14.5\n")


def run(out):
    return subprocess.run([sys.executable, SCRIPT, out], capture_output=True, text=True,
                          env=dict(os.environ, MPLBACKEND="Agg"))


class BenchReport(unittest.TestCase):
    def test_targets_beside_their_anchors(self):
        with tempfile.TemporaryDirectory() as out:
            for name, text in (("bench-mps.log", REPLAY), ("bench-jax-mps.log", JAX),
                               ("scaling-mps.log", SCALING), ("large-mps.log", LARGE),
                               ("mjx-bench-mps.log", MJX)):
                with open(os.path.join(out, name), "w") as f:
                    f.write(text)
            p = run(out)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("== targets, under MPS (-M)", p.stdout)
            with open(os.path.join(out, "bench.json")) as f:
                rep = json.load(f)
            self.assertEqual(rep["runs"]["mps"]["floor_host_us"], 12.0)
            rows = {(t["figure"], t["anchor"]): t for t in rep["targets"]["mps"]}

            def row(figure, anchor):
                return rows[(figure, anchor)]
            # 13 us against 1.2 x 10 us: missed; against 1.1 x 12 us: met.
            chain = "async chain per dependent replay"
            self.assertFalse(row(chain, "in-process staged chain")["met"])
            self.assertAlmostEqual(row(chain, "in-process staged chain")["ratio"], 1.3)
            self.assertTrue(row(chain, "hand-off floor, host-pinned flags")["met"])
            self.assertIsNone(row(chain, "hand-off floor, device flags")["met"])
            # Overhead over pure XLA: 7 us, missed (6 us).
            jax = row("JAX scan step, staged async, overhead", "pure XLA step")
            self.assertAlmostEqual(jax["value"], 7.0)
            self.assertFalse(jax["met"])
            self.assertTrue(row("async call, host, p50", "(absolute)")["met"])
            # 30 against 15 + 10: missed.
            sync = row("sync replay p50", "in-process sync p50 + socket echo p50")
            self.assertEqual(sync["anchor_value"], 25.0)
            self.assertFalse(sync["met"])
            self.assertTrue(row("direct, 64 MiB slots, replay to sync",
                                "in-process staged, to sync")["met"])
            self.assertFalse(row("direct, 64 MiB slots, async chain step",
                                 "in-process staged chain step")["met"])
            self.assertTrue(row("replays/s, 8 client processes, async", "(absolute)")["met"])
            self.assertTrue(row("replays/s, 8 client processes, async", "the same, sync")["met"])
            # large_bench: 230 against 1.1 x 200, missed; its GPU time reported.
            large = row("large_bench direct, async, fixed bindings",
                        "in-process graph on fixed buffers, back to back")
            self.assertAlmostEqual(large["ratio"], 1.15)
            self.assertFalse(large["met"])
            self.assertIsNone(row("large_bench direct, GPU time per replay (sampled)",
                                  "in-process graph, GPU time per launch")["met"])
            # MJX: 600 against 700 met, 610 against 0.6 x 1500 met, GPU 500
            # against 400 missed; pendula 500 against 1.02 x 480 missed, and
            # its missing figures leave their rows out.
            self.assertTrue(row("MJX humanoid, graphd auto, repeating addresses",
                                "Warp WARP mode, repeating")["met"])
            self.assertTrue(row("MJX humanoid, graphd auto, changing addresses",
                                "Warp WARP mode, changing")["met"])
            self.assertFalse(row("MJX humanoid, graphd auto, GPU time per step",
                                 "Warp's own graph, GPU time per step")["met"])
            self.assertFalse(row("MJX pendula, graphd auto, repeating addresses",
                                 "Warp WARP mode, repeating")["met"])
            self.assertNotIn(("MJX pendula, graphd auto, changing addresses", "Warp WARP mode, changing"), rows)
            self.assertNotIn(("MJX contacts, graphd auto, repeating addresses", "Warp WARP mode, repeating"),
                             rows)
            # Host work a call: 36 us against 5 + 0.1 x 300 missed; pendula
            # 14.5 against 15 met; the worker's time beside the GPU's.
            host = row("MJX humanoid, graphd auto, host work a call (300 bindings, ring waits left out)",
                       "5 us + 0.1 us a binding")
            self.assertEqual(host["anchor_value"], 35.0)
            self.assertFalse(host["met"])
            self.assertTrue(row("MJX pendula, graphd auto, host work a call (100 bindings, ring waits left out)",
                                "5 us + 0.1 us a binding")["met"])
            worker = row("MJX humanoid, graphd auto, the worker's own time a replay (300 bindings, "
                         "graph launches left out)", "the step's GPU time (graphd)")
            self.assertAlmostEqual(worker["ratio"], 0.1)
            self.assertIsNone(worker["met"])
            self.assertNotIn(("MJX pendula, graphd auto, the worker's own time a replay (100 bindings, "
                              "graph launches left out)",
                              "the step's GPU time (graphd)"), rows)
            self.assertFalse(row("first register of a VMM region", "(absolute)")["met"])
            self.assertTrue(row("restarted client, first result",
                                "in-process module load + capture")["met"])
            # The JAX scan's two re-captures count.
            rc = row("re-captures while addresses change (replay_bench, JAX scans)", "(absolute)")
            self.assertEqual(rc["value"], 2)
            self.assertFalse(rc["met"])
            with open(os.path.join(out, "bench.md")) as f:
                md = f.read()
            self.assertIn("| async chain per dependent replay | 13.00 us | in-process staged chain", md)

    def test_processes_against_their_anchors(self):
        # Under MPS graphd's aggregate must reach Warp alone's at every
        # count; without MPS it is reported; the JAX step is reported
        # against pure XLA either way.
        procs = ("RESULT procs_mps={} procs_contacts_warp_1=1000 procs_contacts_graphd_1=1100 "
                 "procs_contacts_warp_4=3000 procs_contacts_graphd_4=1000 "
                 "procs_jax_pure_4=500 procs_jax_graphd_4=400\n")
        with tempfile.TemporaryDirectory() as out:
            for run_name, mps in (("mps", 1), ("nomps", 0)):
                with open(os.path.join(out, f"procs-{run_name}.log"), "w") as f:
                    f.write(procs.format(mps))
            p = run(out)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(out, "bench.json")) as f:
                rep = json.load(f)
            for run_name in ("mps", "nomps"):
                rows = {t["figure"]: t for t in rep["targets"][run_name]}
                one, four = rows["1 processes, contacts, aggregate steps/s"], rows["4 processes, contacts, aggregate steps/s"]
                self.assertAlmostEqual(four["ratio"], 1000 / 3000)
                self.assertEqual(one["anchor"], "Warp alone, 1 processes")
                jax = rows["4 processes, jax, aggregate steps/s"]
                self.assertIsNone(jax["met"])
                self.assertAlmostEqual(jax["ratio"], 0.8)
                if run_name == "mps":
                    self.assertTrue(one["met"])
                    self.assertFalse(four["met"])
                else:
                    self.assertIsNone(one["met"])
                    self.assertIsNone(four["met"])

    def test_a_run_without_figures_fails(self):
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "bench-mps.log"), "w") as f:
                f.write("replay_bench: FAIL: no daemon\n")
            p = run(out)
            self.assertEqual(p.returncode, 1)
            self.assertIn("no RESULT lines", p.stderr)


if __name__ == "__main__":
    unittest.main()
