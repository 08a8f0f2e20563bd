"""graphctl's JSON against its schemas (docs/schemas/graphctl-*.schema.json,
JSON Schema 2020-12, every object closed to keys the schema does not name):
status, list, evict (dry run and real) and stats on a host daemon with a
capture made by graphd-demo; the exit codes graphctl documents (0 ok,
2 usage, 3 no daemon); and the sizes its text prints, in the same units in
list and stats.

Run by ctest with GRAPHD_BIN, GRAPHCTL_BIN, GRAPHD_DEMO_BIN and
GRAPHD_KERNELS set; needs python3-jsonschema (scripts/deps.sh)."""

import json
import os
import subprocess
import tempfile
import time
import unittest

import jsonschema

SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "schemas")


def schema(name):
    with open(os.path.join(SCHEMAS, f"graphctl-{name}.schema.json"), encoding="utf-8") as f:
        s = json.load(f)
    jsonschema.Draft202012Validator.check_schema(s)
    return s


def human(n):
    """Bytes as graphctl's text prints them."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    v, u = float(n), 0
    while v >= 1024 and u < 5:
        v, u = v / 1024, u + 1
    return f"{v:.1f} {units[u]}" if u else f"{n} B"


class GraphctlJsonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="graphctl-json-")
        cls.sock = os.path.join(cls.dir, "graphd.sock")
        cls.log = open(os.path.join(cls.dir, "graphd.log"), "w")
        cls.daemon = subprocess.Popen([os.environ["GRAPHD_BIN"], "--host-devices", "2", "--socket", cls.sock],
                                      stdout=cls.log, stderr=subprocess.STDOUT)
        for _ in range(100):
            if os.path.exists(cls.sock) and cls.ctl("ping").returncode == 0:
                break
            time.sleep(0.05)
        demo = subprocess.run([os.environ["GRAPHD_DEMO_BIN"], os.environ["GRAPHD_KERNELS"]],
                              env=dict(os.environ, GRAPHD_SOCKET=cls.sock), capture_output=True, text=True,
                              timeout=60)
        assert demo.returncode == 0, demo.stderr

    @classmethod
    def tearDownClass(cls):
        cls.daemon.terminate()
        cls.daemon.wait(30)
        cls.log.close()

    @classmethod
    def ctl(cls, *args, sock=None):
        return subprocess.run([os.environ["GRAPHCTL_BIN"], "--socket", sock or cls.sock, *args],
                              capture_output=True, text=True, timeout=60)

    def check(self, name, *args):
        r = self.ctl(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        jsonschema.validate(doc, schema(name), cls=jsonschema.Draft202012Validator)
        return doc

    def test_status(self):
        doc = self.check("status", "status", "--json")
        self.assertEqual(len(doc["devices"]), 2)
        self.assertEqual(doc["programs"], 1)
        # graphctl's own session: the one busy asking for this status (an
        # earlier graphctl's may linger until graphd sees it hang up), with
        # a control session's figures.
        [me] = [x for x in doc["session_list"] if x["busy"]]
        self.assertEqual((me["kind"], me["client_name"], me["device"]), ("control", "graphctl", -1))
        self.assertEqual((me["uid"], me["gid"]), (os.getuid(), os.getgid()))
        self.assertIs(me["admin"], True)  # the daemon's own user
        self.assertIs(me["has_ring"], False)
        self.assertEqual(me["flag_slots"], 0)
        self.assertGreaterEqual(me["age_ms"], me["idle_ms"])
        self.assertLessEqual(me["age_ms"], doc["uptime_ms"])

    def test_list_and_stats(self):
        caps = self.check("list", "list", "--json")
        self.assertEqual(len(caps), 1)
        self.assertEqual(caps[0]["generation"], 1)
        self.assertGreaterEqual(caps[0]["graphs"], 1)
        self.assertEqual(caps[0]["instances"], 1)  # the demo replays from one stream
        self.assertGreater(caps[0]["queue_ns"], 0)  # the worker's time to queue (and run) one
        stats = self.check("stats", "stats", "--json")
        self.assertEqual(stats["devices"][0]["captures"], 1)
        # A row per kind of request; the demo's replay among them.
        reqs = {r["request"]: r for r in stats["requests"]}
        self.assertGreaterEqual(reqs["Replay"]["calls"], 1)
        self.assertGreaterEqual(reqs["Hello"]["calls"], 2)
        self.assertIn("UnregisterRegion", reqs)

    def test_text_sizes_in_the_same_units(self):
        # list and stats (and status) print sizes alike, in binary units
        # with the unit named; list's columns are labelled.
        cap = json.loads(self.ctl("list", "--json").stdout)[0]
        want = human(cap["staging_bytes"])
        self.assertTrue(want.endswith(" KiB"), want)  # the demo's slots: tens of KiB
        lst = self.ctl("list")
        self.assertEqual(lst.returncode, 0, lst.stderr)
        lines = lst.stdout.splitlines()
        self.assertEqual(lines[0].split(), ["CAPTURE", "MODE", "STAGING", "NODES", "REPLAYS",
                                            "IDLE", "s", "STATE", "GEN", "INSTANCES", "GRAPHS",
                                            "REPOINTS", "QUEUE", "us", "PIDS"])
        row = lines[1].split()
        self.assertEqual(row[0], cap["capture"])
        self.assertEqual(" ".join(row[2:4]), want)
        self.assertEqual(int(row[4]), cap["nodes"])
        self.assertEqual(int(row[5]), cap["replays"])
        self.assertEqual(int(row[9]), cap["instances"])
        self.assertEqual(int(row[10]), cap["graphs"])
        self.assertAlmostEqual(float(row[12]), cap["queue_ns"] / 1e3, delta=0.051)
        st = self.ctl("stats")
        self.assertEqual(st.returncode, 0, st.stderr)
        self.assertEqual(st.stdout.split()[:3], ["DEVICE", "CAPTURES", "STAGING"])
        rows = [l.split() for l in st.stdout.splitlines()[1:]]
        dev = next(r for r in rows if r and r[0] == str(cap["device"]))
        self.assertEqual(" ".join(dev[2:4]), want, st.stdout)

    def test_z_evict(self):  # last: it empties the daemon
        dry = self.check("evict", "evict", "--all", "--dry-run", "--json")
        self.assertTrue(dry["dry_run"])
        self.assertEqual(len(dry["would_evict"]), 1)
        real = self.check("evict", "evict", "--all", "--json")
        self.assertEqual(len(real["evicted"]), 1)
        self.assertEqual(real["bytes"], dry["bytes"])

    def test_a_schemas_are_closed(self):
        # An undocumented key fails validation: the schemas cannot drift
        # behind the output silently.
        doc = self.check("status", "status", "--json")
        doc["surprise"] = 1
        with self.assertRaises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema("status"), cls=jsonschema.Draft202012Validator)
        # And a session without a figure the schema requires.
        doc = self.check("status", "status", "--json")
        del doc["session_list"][0]["idle_ms"]
        with self.assertRaises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema("status"), cls=jsonschema.Draft202012Validator)

    def test_exit_codes(self):
        self.assertEqual(self.ctl("frobnicate").returncode, 2)
        r = self.ctl("evict", "--json")  # no selector: a usage error, one line
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("say what to evict", r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertEqual(self.ctl("ping", sock=os.path.join(self.dir, "nobody.sock")).returncode, 3)


if __name__ == "__main__":
    unittest.main()
