"""Warp's own JAX interop tests (warp.tests.interop.test_jax, shipped in the
warp-lang wheel) on JAX's CPU devices, as a Warp user runs them: once with
Warp alone and once with graphd.warp installed first, each in a process of
its own. Every test that passes with Warp alone must pass under install():
graphd serves GPUs, so a call placed on a CPU device runs Warp's own
implementation unchanged, and the options, caching and errors Warp's tests
check are Warp's.

No daemon is started and $GRAPHD_SOCKET names none: on CPU devices nothing
may need one. Skipped without warp-lang or jax, but failed where
$GRAPHD_TEST_NEED_WARP_SUITE=1 (the CTest entries that put them there)."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

SUITE = "warp.tests.interop.test_jax"
NEEDED = os.environ.get("GRAPHD_TEST_NEED_WARP_SUITE") == "1"


def _child(out_path, install):
    """Runs the suite in this process, writing each test's outcome to out_path."""
    if install:
        import graphd.warp as gw

        gw.install()
        if not gw.installed():
            raise SystemExit("graphd.warp.install() did not take")
    import unittest as ut

    suite = ut.defaultTestLoader.loadTestsFromName(SUITE)
    outcome = {}

    class Result(ut.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcome[test.id()] = "ok"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcome[test.id()] = "fail"

        def addError(self, test, err):
            super().addError(test, err)
            outcome[test.id()] = "error"

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                outcome[test.id()] = "a subtest failed"

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcome[test.id()] = "skip"

    runner = ut.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=Result)
    runner.run(suite)
    with open(out_path, "w") as f:
        json.dump({"installed": install, "outcome": outcome}, f)


def _available():
    for mod in ("jax", "warp"):
        try:
            __import__(mod)
        except ImportError:
            return f"no {mod}"
    import importlib.util

    if importlib.util.find_spec(SUITE) is None:
        return f"this warp-lang ships no {SUITE}"
    return None


class WarpOwnSuite(unittest.TestCase):
    def run_suite(self, install, tmp):
        out = os.path.join(tmp, f"outcome-{int(install)}.json")
        env = dict(os.environ, JAX_PLATFORMS="cpu", GRAPHD_SOCKET=os.path.join(tmp, "no-daemon.sock"))
        env.pop("GRAPHD_WARP_INSTALL", None)
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", out, str(int(install))],
                           cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
        if p.returncode != 0 or not os.path.exists(out):
            self.fail(f"the suite ({'installed' if install else 'alone'}) exited {p.returncode}:\n"
                      f"{p.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)["outcome"], p.stderr

    def test_everything_warp_passes_passes_installed(self):
        why = _available()
        if why:
            if NEEDED:
                self.fail(why)
            self.skipTest(why)
        with tempfile.TemporaryDirectory() as tmp:
            alone, _ = self.run_suite(False, tmp)
            ours, log = self.run_suite(True, tmp)
        passed = sorted(t for t, o in alone.items() if o == "ok")
        # Warp's CPU cases are most of the suite there; a run that passes
        # next to nothing says the setup is wrong, not that graphd is right.
        self.assertGreaterEqual(len(passed), 40, f"Warp alone passed only {len(passed)} tests")
        lost = [f"{t}: {ours.get(t, 'no outcome')}" for t in passed if ours.get(t) != "ok"]
        self.assertEqual(lost, [], "passes with Warp alone, not under graphd.warp.install():\n"
                         + "\n".join(lost) + "\n" + log[-4000:])
        print(f"Warp's {SUITE}: {len(passed)} of {len(alone)} pass alone, "
              f"{sum(o == 'ok' for o in ours.values())} of {len(ours)} under install()", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3] == "1")
    else:
        unittest.main()
