"""The in-tree build backend makes an installable wheel with no packages
beyond the standard library."""

import os
import sys
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "_build"))
import graphd_build  # noqa: E402


class PackagingTest(unittest.TestCase):
    def test_wheel_holds_the_package_and_a_consistent_record(self):
        with tempfile.TemporaryDirectory() as d:
            name = graphd_build.build_wheel(d)
            self.assertEqual(name, "graphd-0.1.0-py3-none-any.whl")
            with zipfile.ZipFile(os.path.join(d, name)) as z:
                names = set(z.namelist())
                for m in ("__init__.py", "program.py", "_lib.py", "errors.py"):
                    self.assertIn(f"graphd/{m}", names)
                record = z.read("graphd-0.1.0.dist-info/RECORD").decode().split()
                self.assertEqual({r.split(",")[0] for r in record}, names)
                self.assertIn("Name: graphd", z.read("graphd-0.1.0.dist-info/METADATA").decode())

    def test_version_matches_the_package(self):
        import graphd
        self.assertEqual(graphd_build._meta()[1], graphd.__version__)


if __name__ == "__main__":
    unittest.main()
