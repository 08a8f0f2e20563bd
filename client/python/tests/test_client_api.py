"""The Client as its users lean on it, on the host backend: one exception
class per status, a missing or mismatched library told apart from a
stopped daemon, the old spellings warning, fork (an inherited Client
disowned in the child, the parent's replays exact), close() against calls
in other threads, each thread's own error text, host buffers that refuse
to be freed under a live view, and the "graphd" logger."""

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
import unittest
import warnings

import graphd
from graphd import Client, Program, Slot, f32, u32
from graphd import errors
from graphd._lib import check_version

from test_host_e2e import N, HostDaemonTest

BUILTIN = {
    "INVALID_ARGUMENT": ValueError, "DEADLINE_EXCEEDED": TimeoutError, "NOT_FOUND": LookupError,
    "PERMISSION_DENIED": PermissionError, "FAILED_PRECONDITION": RuntimeError,
    "OUT_OF_RANGE": ValueError, "UNIMPLEMENTED": NotImplementedError, "UNAVAILABLE": ConnectionError,
}


class ErrorClassTest(unittest.TestCase):
    def test_each_status_has_its_own_class(self):
        seen = set()
        for name, code in errors.STATUS_CODES.items():
            if name == "OK":
                continue
            for made in (graphd.GraphdError(name, "m"), graphd.GraphdError(code, "m")):
                cls = type(made)
                self.assertIsNot(cls, graphd.GraphdError, name)
                self.assertIs(cls, errors.error_class(name))
                self.assertEqual(cls.STATUS, name)
                self.assertEqual((made.code, made.status, made.message), (name, code, "m"))
                self.assertEqual(str(made), f"graphd: {name}: m")
                if name in BUILTIN:
                    self.assertIsInstance(made, BUILTIN[name])
                # Whole across processes (a multiprocessing worker's failure).
                back = pickle.loads(pickle.dumps(made))
                self.assertIs(type(back), cls)
                self.assertEqual((back.code, back.message), (name, "m"))
            seen.add(cls)
            self.assertIs(getattr(graphd, cls.__name__), cls, "exported from graphd")
        self.assertEqual(len(seen), len(errors.STATUS_CODES) - 1)
        with self.assertRaises(LookupError):
            raise graphd.GraphdError("NOT_FOUND", "x")
        self.assertIsInstance(graphd.InvalidArgumentType("INVALID_ARGUMENT", "t"), TypeError)

    def test_a_missing_library_is_not_unavailable(self):
        code = ("import graphd, graphd._lib as l\n"
                "try:\n    l.lib()\nexcept graphd.LibraryError as e:\n"
                "    assert not isinstance(e, graphd.Unavailable) and isinstance(e, ImportError), e\n"
                "    assert e.code == 'FAILED_PRECONDITION' and 'GRAPHD_LIB' not in e.message or True\n"
                "    print('LibraryError:', e)\n")
        env = dict(os.environ, GRAPHD_LIB="/nonexistent/libgraphd.so")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("cannot load libgraphd", out.stdout)

    def test_a_library_of_another_version_is_refused(self):
        major, minor, _ = (int(x) for x in graphd.__version__.split("."))
        for bad in (f"{major + 1}.0.0", f"{major}.{minor - 1}.9" if minor else "nonsense", "x.y"):
            with self.assertRaises(graphd.LibraryError) as cm:
                check_version(bad, "/some/libgraphd.so")
            self.assertIn(graphd.__version__, cm.exception.message)
        check_version(graphd.__version__, "here")
        check_version(f"{major}.{minor + 1}.0", "a newer minor of the same major")


class ClientApiTest(unittest.TestCase):
    # The host daemon of test_host_e2e, without its tests.
    setUp = HostDaemonTest.setUp
    daemon_log = HostDaemonTest.daemon_log
    stop_daemon = HostDaemonTest.stop_daemon

    def program(self):
        p = Program("staged")
        x, y = p.add_slot("input", 4 * N), p.add_slot("output", 4 * N)
        p.launch(self.module, "scale", N // 256, 256, args=[Slot(x), Slot(y), f32(2.0), u32(N)])
        return p, self.c.register_program(p)

    def test_old_spellings_warn(self):
        p, pid = self.program()
        with self.c.host_alloc(4 * N) as x, self.c.host_alloc(4 * N) as y, self.c.stream_attach() as s:
            with self.assertWarns(DeprecationWarning) as w:
                self.c.replay(s, pid, [(0, x, 4 * N), (1, y, 4 * N)])
            self.assertIn("replay_bindings", str(w.warning))
            with self.assertWarns(DeprecationWarning) as w:
                self.ctl.evict(device=0, idle_s=3600, dry_run=True)
            self.assertIn("device_index", str(w.warning))
            with self.assertWarns(DeprecationWarning):
                graphd.clear(self.sock, device=0)
            with self.assertRaises(graphd.InvalidArgument):
                self.ctl.evict(device=0, device_index=0)

    def test_evictions_are_logged(self):
        p, pid = self.program()
        with self.c.host_alloc(4 * N) as x, self.c.host_alloc(4 * N) as y, self.c.stream_attach() as s:
            self.c.replay_bindings(s, pid, [(0, x, 4 * N), (1, y, 4 * N)])
        with self.assertLogs("graphd", logging.INFO) as logs:
            gone, freed = self.c.clear()
        self.assertEqual(len(gone), 1)
        self.assertIn("evicted 1 capture", "\n".join(logs.output))

    def test_each_thread_reads_its_own_error(self):
        bad = {}

        def fail(k):
            pid = bytes([k]) * 32
            for _ in range(100):
                try:
                    self.c.prepare_program(pid)
                except graphd.NotFound as e:
                    if pid.hex()[:12] not in e.message:
                        bad[k] = e.message
                        return
                else:
                    bad[k] = "no error"
                    return

        threads = [threading.Thread(target=fail, args=(k,)) for k in range(1, 5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(bad, {})

    def test_close_waits_for_calls_and_refuses_later_ones(self):
        stop = threading.Event()
        seen = []

        def pinger():
            while not stop.is_set():
                try:
                    self.c.ping(b"x")
                except graphd.FailedPrecondition as e:
                    seen.append(e.message)
                    return

        t = threading.Thread(target=pinger)
        t.start()
        time.sleep(0.05)
        self.c.close()
        stop.set()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertTrue(self.c.closed)
        self.assertEqual(seen, ["the client is closed"])
        with self.assertRaises(graphd.FailedPrecondition):
            self.c.ping()

    def test_host_buffer_refuses_free_and_close_under_a_view(self):
        b = self.c.host_alloc(64)
        v = b.view[8:16]  # a slice of a view keeps the memory in use too
        with self.assertRaises(graphd.FailedPrecondition):
            b.free()
        with self.assertRaises(graphd.FailedPrecondition):
            self.c.close()
        self.assertFalse(self.c.closed)
        v.release()
        self.assertEqual(b.live_views(), 0)
        with b.view as w:
            w[0] = 7
        b.free()
        self.c.close()

    def test_fork_child_disowns_and_parent_stays_exact(self):
        p, pid = self.program()
        x, y = self.c.host_alloc(4 * N), self.c.host_alloc(4 * N)
        s = self.c.stream_attach()
        xs = x.view.cast("f")
        for i in range(N):
            xs[i] = float(i)
        self.c.replay_bindings(s, pid, [(0, x, 4 * N), (1, y, 4 * N)])
        session = self.c.session_id
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # the child: report, then leave without cleanup
            os.close(r)
            msg = "ok"
            try:
                if not self.c.closed:
                    msg = "the inherited client is still open"
                else:
                    try:
                        self.c.ping()
                        msg = "a call on the inherited client ran"
                    except graphd.FailedPrecondition as e:
                        if "fork" not in e.message:
                            msg = f"wrong refusal: {e.message}"
                    t0 = time.monotonic()
                    self.c.close()
                    del self.c
                    if time.monotonic() - t0 > 0.5:
                        msg = "dropping the inherited client waited"
                    if xs[5] != 5.0:  # the shared mapping stays readable
                        msg = "the host buffer's view went away"
                    with Client.connect(self.sock) as fresh:
                        fresh.ping()
            except BaseException as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {e}"
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            got = f.read().decode()
        os.waitpid(child, 0)
        self.assertEqual(got, "ok")
        # The parent's session is the same and replays exactly.
        self.assertEqual(self.c.session_id, session)
        for k in range(3):
            for i in range(N):
                xs[i] = float(i * (k + 1))
            self.c.replay_bindings(s, pid, [(0, x, 4 * N), (1, y, 4 * N)])
            ys = y.view.cast("f")
            self.assertEqual(list(ys), [2.0 * i * (k + 1) for i in range(N)])
            ys.release()
        xs.release()
        s.detach()
        x.free()
        y.free()


class DeprecatedModuleNamesTest(unittest.TestCase):
    def test_jax_and_warp_old_names_warn(self):
        for mod, old, new in (("graphd.jax", "callable", "program_callable"),
                              ("graphd.warp", "callable", "array_callable")):
            try:
                m = __import__(mod, fromlist=["_"])
            except Exception as e:  # noqa: BLE001: jax or warp missing
                self.skipTest(f"{mod} is not importable here ({e})")
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                self.assertIs(getattr(m, old), getattr(m, new))
            self.assertTrue(any(issubclass(x.category, DeprecationWarning) and new in str(x.message)
                                for x in w), [str(x.message) for x in w])


if __name__ == "__main__":
    unittest.main()
