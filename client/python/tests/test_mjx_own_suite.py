"""MuJoCo MJX's own tests of its Warp implementation
(mujoco/mjx/warp/*_test.py, shipped in the mujoco-mjx wheel) on JAX's CPU
devices, as an MJX user runs them: each file in a process of its own, once
with Warp alone and once with GRAPHD_WARP_INSTALL=1 in a sitecustomize
that imports graphd (the way a whole environment is switched to
graphd.warp). Every test that passes alone must pass under graphd: on CPU
devices MJX's calls are Warp's own, and nothing graphd.warp does at import
or install may disturb the process (its output, its subprocesses, the
order of imports).

forward_test runs its test_step cases (-k test_step), as MJX's own
instructions run it; the other files whole. No daemon is started and
$GRAPHD_SOCKET names none. Skipped without mujoco-mjx, warp-lang or jax,
but failed where $GRAPHD_TEST_NEED_MJX_SUITE=1 (the CTest entry that puts
them there)."""

import glob
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

NEEDED = os.environ.get("GRAPHD_TEST_NEED_MJX_SUITE") == "1"
ARGS = {"forward_test.py": ["-k", "test_step"]}


def _mjx_warp_dir():
    for mod in ("jax", "warp", "mujoco"):
        try:
            __import__(mod)
        except ImportError:
            return None, f"no {mod}"
    import importlib.util
    spec = importlib.util.find_spec("mujoco.mjx")
    if spec is None or not spec.submodule_search_locations:
        return None, "no mujoco.mjx (mujoco-mjx)"
    d = os.path.join(list(spec.submodule_search_locations)[0], "warp")
    if not glob.glob(os.path.join(d, "*_test.py")):
        return None, f"this mujoco-mjx ships no tests in {d}"
    return d, None


def _outcomes(xml_path):
    """{test id: ok|fail|error|skip} from absltest's XML report."""
    out = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        tid = f"{case.get('classname')}.{case.get('name')}"
        if case.find("failure") is not None:
            out[tid] = "fail"
        elif case.find("error") is not None:
            out[tid] = "error"
        elif case.get("result") == "suppressed" or case.get("status") == "notrun" or case.find("skipped") is not None:
            out[tid] = "skip"
        else:
            out[tid] = "ok"
    return out


class MjxOwnSuite(unittest.TestCase):
    def run_file(self, path, installed, tmp):
        name = os.path.basename(path)
        xml = os.path.join(tmp, f"{name}-{int(installed)}.xml")
        env = dict(os.environ, JAX_PLATFORMS="cpu", GRAPHD_SOCKET=os.path.join(tmp, "no-daemon.sock"))
        env.pop("GRAPHD_WARP_INSTALL", None)
        if installed:
            site = os.path.join(tmp, "site")
            os.makedirs(site, exist_ok=True)
            with open(os.path.join(site, "sitecustomize.py"), "w") as f:
                f.write("import os\nos.environ.setdefault('GRAPHD_WARP_INSTALL', '1')\nimport graphd  # noqa\n")
            env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
        # As a module of its package, never as a script: a script's folder
        # goes first on sys.path, and MJX's warp/ holds a types.py and an
        # io.py that would stand in for the standard library's (unseen only
        # where a .pth file imported those first).
        module = "mujoco.mjx.warp." + name[:-len(".py")]
        args = [sys.executable, "-m", module, f"--xml_output_file={xml}"]
        args += ["--"] + ARGS[name] if name in ARGS else []
        p = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
        if not os.path.exists(xml):
            self.fail(f"{name} ({'graphd' if installed else 'alone'}) wrote no report, exit {p.returncode}:\n"
                      f"{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
        return _outcomes(xml), p.stderr

    def test_everything_mjx_passes_passes_under_graphd(self):
        d, why = _mjx_warp_dir()
        if why:
            if NEEDED:
                self.fail(why)
            self.skipTest(why)
        passed_alone = passed_ours = 0
        lost = []
        with tempfile.TemporaryDirectory() as tmp:
            for path in sorted(glob.glob(os.path.join(d, "*_test.py"))):
                alone, _ = self.run_file(path, False, tmp)
                ours, log = self.run_file(path, True, tmp)
                name = os.path.basename(path)
                passes = [t for t, o in alone.items() if o == "ok"]
                passed_alone += len(passes)
                passed_ours += sum(o == "ok" for o in ours.values())
                lost += [f"{name} {t}: {ours.get(t, 'no outcome')}\n{log[-1500:]}"
                         for t in passes if ours.get(t) != "ok"]
                print(f"MJX {name}: {len(passes)} of {len(alone)} pass alone, "
                      f"{sum(o == 'ok' for o in ours.values())} of {len(ours)} under graphd", file=sys.stderr)
        self.assertGreater(passed_alone, 0, "MJX's tests passed nothing with Warp alone: the setup is wrong")
        self.assertEqual(lost, [], "passes with Warp alone, not under GRAPHD_WARP_INSTALL=1:\n" + "\n".join(lost))


if __name__ == "__main__":
    unittest.main()
