"""graphctl top on a host daemon with two devices: refreshes as plain
frames when stdout is not a terminal (--count of them), the screen cleared
on a terminal, replays a second and the worker's busy share while
graphd-demo replays on device 0 and none once it stops, memory free and
total, Ctrl-C ending it with status 0, and its usage errors.

Run by ctest with GRAPHD_BIN, GRAPHCTL_BIN, GRAPHD_DEMO_BIN and
GRAPHD_KERNELS set; the standard library only."""

import os
import pty
import re
import signal
import subprocess
import tempfile
import threading
import time
import unittest

COLUMNS = ["DEVICE", "STATE", "REPLAYS/s", "BUSY", "MEMORY", "FREE", "/", "TOTAL", "CAPTURES",
           "STAGING", "ERRORS/s"]
ROW = re.compile(r"^(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+ \S+) / (\S+ \S+)\s+(\d+)\s+(\S+ \S+)\s+(\S+)$")


def frames(text):
    """The refreshes of plain output: lists of lines, header first."""
    return [f.splitlines() for f in text.strip("\n").split("\n\n")]


def rows(frame):
    """A frame's device rows as dicts, after checking its two header lines."""
    assert frame[0].startswith("graphd "), frame
    assert frame[1].split() == COLUMNS, frame[1]
    out = []
    for line in frame[2:]:
        m = ROW.match(line)
        assert m, f"not a device row: {line!r}"
        out.append(dict(device=int(m[1]), state=m[2], rate=m[3], busy=m[4], free=m[5],
                        total=m[6], captures=int(m[7]), staging=m[8], errors=m[9]))
    return out


class GraphctlTopTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="graphctl-top-")
        cls.sock = os.path.join(cls.dir, "graphd.sock")
        cls.log = open(os.path.join(cls.dir, "graphd.log"), "w")
        cls.daemon = subprocess.Popen([os.environ["GRAPHD_BIN"], "--host-devices", "2", "--socket", cls.sock],
                                      stdout=cls.log, stderr=subprocess.STDOUT)
        for _ in range(100):
            if os.path.exists(cls.sock) and cls.ctl("ping").returncode == 0:
                break
            time.sleep(0.05)
        cls.demo()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.terminate()
        cls.daemon.wait(30)
        cls.log.close()

    @classmethod
    def ctl(cls, *args, **kw):
        return subprocess.run([os.environ["GRAPHCTL_BIN"], "--socket", cls.sock, *args],
                              capture_output=True, text=True, timeout=60, **kw)

    @classmethod
    def demo(cls):
        r = subprocess.run([os.environ["GRAPHD_DEMO_BIN"], "--socket", cls.sock, os.environ["GRAPHD_KERNELS"]],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr

    def test_plain_frames_follow_the_replays(self):
        # graphd-demo replays on device 0 (three replays a run) without
        # pause while top refreshes twice.
        done = threading.Event()

        def load():
            while not done.is_set():
                self.demo()

        t = threading.Thread(target=load)
        t.start()
        try:
            r = self.ctl("top", "--count", "2", "--interval", "0.5")
        finally:
            done.set()
            t.join()
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("\x1b", r.stdout)  # no terminal: no escapes
        fs = frames(r.stdout)
        self.assertEqual(len(fs), 2, r.stdout)
        busy = []
        for f in fs:
            devs = rows(f)
            self.assertEqual([d["device"] for d in devs], [0, 1])
            for d in devs:
                self.assertEqual(d["state"], "ok")
                self.assertEqual(d["total"], "1.0 GiB")
                self.assertTrue(re.fullmatch(r"\d+\.\d %", d["busy"].replace("%", " %")), d)
                self.assertLessEqual(float(d["busy"].rstrip("%")), 100.0)
                self.assertEqual(float(d["errors"]), 0.0)
            self.assertEqual(devs[0]["captures"], 1)
            self.assertEqual(devs[1]["rate"], "0.0")  # nothing ran on device 1
            busy.append((float(devs[0]["rate"]), float(devs[0]["busy"].rstrip("%"))))
        self.assertTrue(any(rate > 0 for rate, _ in busy), r.stdout)

        # Idle now: no replays a second, an idle worker.
        r = self.ctl("top", "--count", "1", "--interval", "0.3")
        self.assertEqual(r.returncode, 0, r.stderr)
        (f,) = frames(r.stdout)
        for d in rows(f):
            self.assertEqual((d["rate"], d["busy"], d["errors"]), ("0.0", "0.0%", "0.0"), f)

    def test_a_terminal_gets_the_screen_cleared(self):
        master, slave = pty.openpty()
        try:
            p = subprocess.Popen([os.environ["GRAPHCTL_BIN"], "--socket", self.sock, "top", "--count", "2",
                                  "--interval", "0.2"], stdout=slave, stderr=subprocess.PIPE)
            os.close(slave)
            out = b""
            while True:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the other end closed
                    break
                if not chunk:
                    break
                out += chunk
            err = p.stderr.read()
            p.stderr.close()
            self.assertEqual(p.wait(30), 0, err)
        finally:
            os.close(master)
        text = out.decode()
        self.assertEqual(text.count("\x1b[H\x1b[2J"), 2, repr(text))
        self.assertIn("(Ctrl-C ends)", text)

    def test_ctrl_c_ends_it_with_status_0(self):
        p = subprocess.Popen([os.environ["GRAPHCTL_BIN"], "--socket", self.sock, "top", "--interval", "0.2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        self.assertGreaterEqual(len(frames(out)), 1, out)
        for f in frames(out):
            rows(f)

    def test_usage_errors(self):
        for args in (["--count", "0"], ["--count"], ["--interval", "0.01"], ["--interval", "soon"],
                     ["--bogus"]):
            r = self.ctl("top", *args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
            self.assertIn("try 'graphctl --help'", r.stderr)


if __name__ == "__main__":
    unittest.main()
