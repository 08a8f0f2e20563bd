"""The package as installed from its wheel (GRAPHD_TEST_INSTALLED=1, see
scripts/wheel-test.sh): libgraphd and the XLA handler sit in the package,
the daemon and graphctl in graphd/_bin behind the console scripts, and
the shared libraries they need in graphd.libs (auditwheel's); everything
loads without any environment variable. In the source tree, only the
version and the console scripts' declaration are checked."""

import os
import re
import subprocess
import sys
import unittest

import _env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import jax  # noqa: F401  (graphd.jax needs it, and numpy)
    import numpy  # noqa: F401
    NO_JAX = ""
except ImportError as e:
    NO_JAX = (f"graphd.jax needs jax and numpy ({e}): scripts/py-deps.sh BUILD_DIR jax installs them "
              "where scripts/wheel-test.sh looks")


class PackagingTest(unittest.TestCase):
    def test_version_is_written_once(self):
        # graphd/_version.py is the one place: the wheel (pyproject.toml)
        # and the C project (CMakeLists.txt) read it; nothing else writes
        # a version.
        import graphd
        from graphd import _version
        self.assertEqual(graphd.__version__, _version.__version__)
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
            pyproject = f.read()
        self.assertIsNone(re.search(r'^version\s*=', pyproject, re.M), "pyproject.toml writes a version")
        self.assertIn('dynamic = ["version"]', pyproject)
        self.assertIn('metadata.version.input = "graphd/_version.py"', pyproject)
        top = os.path.dirname(os.path.dirname(ROOT))
        cmake = os.path.join(top, "CMakeLists.txt")
        if os.path.exists(cmake):  # a source tree
            with open(cmake, encoding="utf-8") as f:
                text = f.read()
            self.assertIn("client/python/graphd/_version.py", text)
            self.assertIsNone(re.search(r"project\(graphd VERSION [0-9]", text), "CMakeLists.txt writes a version")

    def test_py_typed_ships(self):
        import graphd
        here = os.path.dirname(os.path.abspath(graphd.__file__))
        self.assertTrue(os.path.exists(os.path.join(here, "py.typed")), "graphd/py.typed is missing")

    def test_console_scripts_run_the_package_binaries(self):
        # pyproject.toml declares them; graphd._commands runs graphd/_bin's.
        from graphd import _commands
        with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
            pyproject = f.read()
        for name in ("graphd", "graphctl"):
            self.assertIn(f'{name} = "graphd._commands:{name}"', pyproject)
            self.assertEqual(_commands.binary(name), os.path.join(_commands.BIN_DIR, name))

    @unittest.skipUnless(_env.INSTALLED, "not an installed wheel (GRAPHD_TEST_INSTALLED=1)")
    def test_installed_package_carries_and_finds_its_libraries(self):
        import graphd
        from graphd import _commands, _lib
        here = os.path.dirname(os.path.abspath(graphd.__file__))
        libs = os.path.join(os.path.dirname(here), "graphd.libs")
        self.assertNotIn(os.path.join("client", "python", "graphd"), here,
                         "the tests import the source tree, not the installed package")
        files = [os.path.join(here, n) for n in ("libgraphd.so", "libgraphd_xla.so")]
        files += [_commands.binary(n) for n in ("graphd", "graphctl")]
        for path in files:
            name = os.path.relpath(path, here)
            self.assertTrue(os.path.exists(path), name)
            dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
            self.assertIn("$ORIGIN", dyn, f"{name} has no $ORIGIN run path")
            # Every library it needs resolves; those graphd needs beyond
            # glibc come from the package or auditwheel's graphd.libs.
            ldd = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
            self.assertNotIn("not found", ldd, ldd)
            for dep in ("libgraphd.so", "libprotobuf-c", "libcrypto", "libuv", "libmicrohttpd"):
                for line in (l for l in ldd.splitlines() if dep in l and "=>" in l):
                    where = line.split("=>")[1].strip()
                    self.assertTrue(where.startswith((here + os.sep, libs + os.sep)),
                                    f"{name}: {dep} should come from the wheel: {line}")
        self.assertEqual(os.path.dirname(_lib.lib()._name), here)

    @unittest.skipUnless(_env.INSTALLED, "not an installed wheel (GRAPHD_TEST_INSTALLED=1)")
    def test_installed_console_scripts_answer_version(self):
        # The scripts pip wrote next to the environment's python.
        import graphd
        scripts = os.path.dirname(sys.executable)
        for name in ("graphd", "graphctl"):
            out = subprocess.run([os.path.join(scripts, name), "--version"], capture_output=True,
                                 text=True, check=True).stdout
            self.assertTrue(out.startswith(f"{name} {graphd.__version__}"), out)

    @unittest.skipUnless(_env.INSTALLED, "not an installed wheel (GRAPHD_TEST_INSTALLED=1)")
    @unittest.skipIf(NO_JAX, NO_JAX)
    def test_installed_jax_module_finds_the_package_handler(self):
        import graphd
        from graphd import jax as gj
        here = os.path.dirname(os.path.abspath(graphd.__file__))
        self.assertEqual(os.path.dirname(gj.xla_lib()._name), here)


if __name__ == "__main__":
    unittest.main()
