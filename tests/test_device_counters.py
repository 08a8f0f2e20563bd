"""scripts/device-counters.py: the per-device counters' list
(proto/include/graphd/device_counters.def) agrees with DeviceCounters in
proto/graphd.proto (names, field numbers, uint64) and with the operator
guide's table and graphctl stats' JSON schema, both written from it; and the check finds the drifts it is there for, planted
in a copy of the tree. Standard library only.
Usage: test_device_counters.py SOURCE_DIR"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SRC = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
SCRIPT = os.path.join(SRC, "scripts", "device-counters.py")
spec = importlib.util.spec_from_file_location("device_counters", SCRIPT)
dc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dc)


def run(root):
    return subprocess.run([sys.executable, SCRIPT, "check", "--root", root], capture_output=True,
                          text=True, timeout=60)


class DeviceCountersTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="device-counters-")
        for rel in dc.FILES:
            os.makedirs(os.path.join(self.tmp, os.path.dirname(rel)), exist_ok=True)
            shutil.copy(os.path.join(SRC, rel), os.path.join(self.tmp, rel))

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def edit(self, rel, old, new):
        path = os.path.join(self.tmp, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        self.assertIn(old, text)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text.replace(old, new, 1))

    def fails_with(self, what):
        r = run(self.tmp)
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn(what, r.stdout)

    def test_the_tree_agrees(self):
        r = run(SRC)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_every_entry_is_read(self):
        with open(os.path.join(SRC, dc.DEF), encoding="utf-8") as f:
            text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
        entries = dc.parse_list(text)
        self.assertEqual(len(entries), text.count("GRAPHD_DEVICE_COUNTER("))
        self.assertEqual(entries[0]["name"], "sessions")
        self.assertTrue(all(e["help"] for e in entries))

    def test_a_field_number_that_differs_is_named(self):
        self.edit(dc.PROTO, "uint64 recaptures = 7;", "uint64 recaptures = 70;")
        self.fails_with("recaptures: DeviceCounters.recaptures is field 70, the list says 7")

    def test_a_field_the_list_lacks_is_named(self):
        self.edit(dc.PROTO, "uint64 worker_clock_ns = 28;",
                  "uint64 worker_clock_ns = 28;\n  uint64 stray = 99;")
        self.fails_with("DeviceCounters.stray (field 99) is not in")

    def test_an_entry_the_proto_lacks_is_named(self):
        self.edit(dc.PROTO, "uint64 graphs = 26;", "")
        self.fails_with("graphs: DeviceCounters in proto/graphd.proto has no such field")

    def test_a_stale_table_is_named(self):
        self.edit(dc.GUIDE, "| `replays` | 5 |", "| `replays` | 6 |")
        self.fails_with("the device counters' table is not the list's")

    def test_a_stale_schema_is_named(self):
        self.edit(dc.SCHEMA, '"replays": {', '"replays_run": {')
        self.fails_with("a device's counters are not the list's")

    def test_prometheus_names_follow_the_rules(self):
        self.edit(dc.DEF, '"graphd_replays_total"', '"graphd_replays"')
        self.fails_with("a counter's name, and only a counter's, ends in _total")


if __name__ == "__main__":
    unittest.main()
