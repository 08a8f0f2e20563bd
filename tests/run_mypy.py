"""mypy over the graphd Python package (client/python/graphd, which ships
py.typed), with the settings of client/python/pyproject.toml.

mypy comes from the directory $GRAPHD_MYPY_PATH names (a pip --target
directory: CMake's GRAPHD_PYMYPY, by default BUILD/pymypy, where
scripts/py-deps.sh BUILD mypy installs it). Without it the test fails and
says how to install it (under CTest, tests/py_needs.sh checks first).

Usage: run_mypy.py PACKAGE_DIR (client/python)"""
import os
import subprocess
import sys

MYPY = "mypy==2.4.1"


def main():
    pkg = sys.argv[1]
    where = os.environ.get("GRAPHD_MYPY_PATH", "")
    env = dict(os.environ)
    env["PYTHONPATH"] = where
    probe = subprocess.run([sys.executable, "-c", "import mypy"], env=env, capture_output=True)
    if probe.returncode:
        print(f"FAIL: mypy is not installed in GRAPHD_MYPY_PATH={where or '(unset)'}; install it with\n"
              f"    scripts/py-deps.sh BUILD mypy   (or: python3 -m pip install --target "
              f"{where or 'BUILD/pymypy'} {MYPY})")
        return 1
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml"], cwd=pkg, env=env)
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
