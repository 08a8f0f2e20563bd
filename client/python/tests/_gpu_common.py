"""What the GPU tests that start their own graphd share: a daemon on its
own socket with every wait bounded ($GRAPHD_BIN, as CTest sets it), the
skip that GRAPHD_REQUIRE_GPU=1 turns into a failure, and a test case with
a hang watchdog."""

import faulthandler
import os
import signal
import subprocess
import time
import unittest

REQUIRE = os.environ.get("GRAPHD_REQUIRE_GPU") == "1"


def unavailable(why):
    """Skips the test for want of `why`; under GRAPHD_REQUIRE_GPU=1 fails it."""
    if REQUIRE:
        raise AssertionError(f"GRAPHD_REQUIRE_GPU=1 but {why}")
    raise unittest.SkipTest(why)


def require_built(*names):
    """Fails unless each environment variable names an existing file."""
    for var in names:
        p = os.environ.get(var)
        if not p or not os.path.exists(p):
            raise AssertionError(f"${var} is {p!r}: set it to the build's file (ctest sets it)")


class Daemon:
    """A graphd on its own socket, every wait bounded; its output goes to
    the file `log`, or with none to this process's."""

    def __init__(self, sock, log=None, log_level="info"):
        self.sock, self.log, self.log_level = sock, log, log_level
        self.proc = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        argv = [os.environ["GRAPHD_BIN"], "--backend", "cuda", "--socket", self.sock,
                "--log-level", self.log_level]
        if self.log:
            with open(self.log, "ab") as f:
                self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT)
        else:
            self.proc = subprocess.Popen(argv)
        see = f"; see {self.log}" if self.log else ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(self.sock):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"graphd exited with {self.proc.returncode}{see}")
            time.sleep(0.025)
        self.stop()
        raise AssertionError(f"graphd did not create its socket in 30 s{see}")

    def kill(self):
        """SIGKILL, as a crash would end it."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


class GpuTestCase(unittest.TestCase):
    """A test that runs longer than HANG_S seconds is hung: every thread's
    stack is dumped and the process exits. The class's daemon, if it made
    one, is stopped after its tests."""

    HANG_S = 300

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "daemon", None):
            cls.daemon.stop()

    def setUp(self):
        faulthandler.dump_traceback_later(self.HANG_S, exit=True)

    def tearDown(self):
        faulthandler.cancel_dump_traceback_later()
