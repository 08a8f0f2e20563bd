"""A graphd for the GPU tests that start their own: on its own socket,
with every wait bounded ($GRAPHD_BIN, as CTest sets it)."""

import os
import signal
import subprocess
import time


class Daemon:
    """A graphd on its own socket, every wait bounded."""

    def __init__(self, sock, log):
        self.sock, self.log = sock, log
        self.proc = None

    def start(self):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen([os.environ["GRAPHD_BIN"], "--backend", "cuda", "--socket", self.sock,
                                          "--log-level", "info"], stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(self.sock):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"graphd exited with {self.proc.returncode}; see {self.log}")
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"graphd did not create its socket in 30 s; see {self.log}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
