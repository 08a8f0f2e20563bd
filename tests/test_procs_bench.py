"""bench/procs_bench.py's own machinery on JAX's CPU backend: N processes
started, held until a common start, run for the time asked and counted;
the RESULT line carries a figure per count, and a failing process fails
the bench. Needs jax (the pure way only: no GPU, no daemon).
Usage: test_procs_bench.py SOURCE_DIR"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

SRC = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
BENCH = os.path.join(SRC, "bench", "procs_bench.py")


def bench(*args, env=None):
    return subprocess.run([sys.executable, BENCH, "--cpu", "--scenes", "jax", "--hows", "pure", *args],
                          capture_output=True, text=True, timeout=240, env=env)


class ProcsBench(unittest.TestCase):
    def test_counts_of_processes_each_give_a_figure(self):
        p = bench("--procs", "1,2", "--seconds", "0.5", "--length", "10", "--n", "1024")
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        result = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        self.assertEqual(len(result), 1, p.stdout)
        figures = dict(re.findall(r"(\S+?)=(\S+)", result[0][len("RESULT "):]))
        self.assertEqual(figures["procs_mps"], "0")
        for n in ("1", "2"):
            self.assertGreater(float(figures[f"procs_jax_pure_{n}"]), 0)
        two = [line for line in p.stdout.splitlines() if line.startswith("FIGURE procs jax pure N=2")]
        self.assertEqual(len(two), 1, p.stdout)

    def test_a_process_that_fails_fails_the_bench(self):
        # Children whose jax cannot be imported end before they are ready:
        # the bench names the count and exits 1, with no figure for it.
        with tempfile.TemporaryDirectory() as d:
            os.mkdir(os.path.join(d, "jax"))
            with open(os.path.join(d, "jax", "__init__.py"), "w") as f:
                f.write("raise ImportError('this jax is broken on purpose')\n")
            env = dict(os.environ, PYTHONPATH=d + os.pathsep + os.environ.get("PYTHONPATH", ""))
            p = bench("--procs", "2", "--seconds", "0.2", env=env)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("pure N=2", p.stderr)
        self.assertNotIn("procs_jax_pure_2", p.stdout)

    def test_bad_arguments_exit_2(self):
        for args in (("--procs", "0"), ("--procs", "x"), ("--seconds", "0")):
            p = bench(*args)
            self.assertEqual(p.returncode, 2, args)


if __name__ == "__main__":
    unittest.main()
