"""End to end on the host backend: a graphd daemon as a subprocess, the host
test kernels as the module, programs built in Python, host memory from
graphd_host_alloc filled and read without numpy, and the daemon's
counters."""

import os
import shutil
import struct
import subprocess
import tempfile
import time
import unittest

from graphd import Client, GraphdError, Program, Slot, Struct, f32, u32
import graphd

import _env

N = 4096


class HostDaemonTest(unittest.TestCase):
    def setUp(self):
        graphd_bin = _env.path(self, "GRAPHD_BIN")
        _env.path(self, "GRAPHD_LIB")
        self.kernels = _env.path(self, "GRAPHD_HOST_KERNELS")
        self.dir = tempfile.mkdtemp(prefix="graphd-py-")
        self.sock = os.path.join(self.dir, "s")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.daemon = subprocess.Popen([graphd_bin, "--backend", "host", "--socket", self.sock],
                                       stdout=self.log, stderr=subprocess.STDOUT)
        self.addCleanup(self.stop_daemon)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.sock):
            if self.daemon.poll() is not None:
                self.fail(f"graphd exited with {self.daemon.returncode}: {self.daemon_log()}")
            if time.monotonic() > deadline:
                self.fail(f"graphd did not create {self.sock} in 20 s: {self.daemon_log()}")
            time.sleep(0.02)
        self.ctl = Client.connect(self.sock, timeout_ms=20000)
        self.addCleanup(self.ctl.close)
        dev = self.ctl.status()["devices"][0]
        self.assertEqual(dev["backend"], "host")
        self.c = Client.connect(self.sock, device_uuid=dev["uuid"], timeout_ms=20000)
        self.addCleanup(self.c.close)
        with open(self.kernels, "rb") as f:
            self.module = self.c.register_module("host_elf", f.read())

    def daemon_log(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop_daemon(self):
        if self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def counters(self):
        return self.ctl.status()["devices"][0]["counters"]

    def scale_program(self, a=3.0, **kw):
        p = Program("staged")
        x = p.add_slot("input", 4 * N)
        y = p.add_slot("output", 4 * N)
        p.launch(self.module, "scale", N // 256, 256, args=[Slot(x), Slot(y), f32(a), u32(N)], **kw)
        return p

    def test_module_id_is_the_one_python_computes(self):
        with open(self.kernels, "rb") as f:
            self.assertEqual(self.module, graphd.module_id("host_elf", f.read()))

    def test_scale_replays_give_correct_results_and_one_capture(self):
        p = self.scale_program()
        pid = self.c.register_program(p)
        self.assertEqual(pid, p.id)
        x, y = self.c.host_alloc(4 * N), self.c.host_alloc(4 * N)
        xs, ys = x.view.cast("f"), y.view.cast("f")
        stream = self.c.stream_attach()
        replays = 4
        for r in range(replays):
            for i in range(N):
                xs[i] = float(i + r)
            info = self.c.replay_bindings(stream, pid, [(0, x, 4 * N), (1, y.ptr, 4 * N)])
            self.assertEqual(info["captured"], 1 if r == 0 else 0)
            self.assertEqual(list(ys), [3.0 * (i + r) for i in range(N)], f"replay {r}")
        k = self.counters()
        self.assertEqual((k["captures"], k["replays"], k["errors"]), (1, replays, 0))
        self.assertEqual(k["captures_built"], 1)
        st = self.ctl.status()
        self.assertGreaterEqual(st["programs"], 1)
        self.assertGreaterEqual(st["modules"], 1)
        # The worker ran the replays: some of the time it served it was busy.
        w = st["devices"][0]["work"]
        self.assertGreater(w["busy_ns"], 0)
        self.assertLessEqual(w["busy_ns"], w["clock_ns"])
        # Every counter of the list by its name, the same figures.
        m = st["devices"][0]["metrics"]
        self.assertEqual(list(m), [x["name"] for x in graphd._lib.device_metrics()])
        self.assertEqual((m["captures"], m["replays"], m["errors"]), (1, replays, 0))
        self.assertEqual((m["worker_busy_ns"], m["worker_clock_ns"]), (w["busy_ns"], w["clock_ns"]))
        self.assertEqual(m["worker_replays"], w["replays"])
        self.assertEqual(m["replay_latency_count"], replays)
        later = self.ctl.status(wait=False)["devices"][0]["work"]
        self.assertGreater(later["clock_ns"], w["clock_ns"])
        self.assertGreaterEqual(later["busy_ns"], w["busy_ns"])
        stream.detach()
        # A view still alive: free() refuses, and frees nothing.
        with self.assertRaises(graphd.FailedPrecondition):
            x.free()
        self.assertEqual(x.live_views(), 1)
        xs.release()
        del ys
        x.free()
        y.free()
        with self.assertRaises(GraphdError):
            x.view

    def start_daemon_again(self):
        """A new daemon on the same socket (a restart), its log appended."""
        graphd_bin = _env.path(self, "GRAPHD_BIN")
        self.daemon = subprocess.Popen([graphd_bin, "--backend", "host", "--socket", self.sock],
                                       stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not os.path.exists(self.sock):
            if time.monotonic() > deadline:
                self.fail(f"graphd did not come back in 20 s: {self.daemon_log()}")
            time.sleep(0.02)

    def test_replays_go_on_across_a_restart(self):
        p = self.scale_program(a=2.0)
        pid = self.c.register_program(p)
        x, y = self.c.host_alloc(4 * N), self.c.host_alloc(4 * N)
        xs, ys = x.view.cast("f"), y.view.cast("f")
        stream = self.c.stream_attach()
        for i in range(N):
            xs[i] = float(i)
        self.c.replay_bindings(stream, pid, [(0, x, 4 * N), (1, y, 4 * N)])
        self.assertEqual(ys[N - 1], 2.0 * (N - 1))
        self.daemon.terminate()  # SIGTERM, as systemctl restart does
        self.assertEqual(self.daemon.wait(10), 0)
        self.start_daemon_again()
        # The next replay reconnects, gives the new session the program, and runs.
        for i in range(N):
            xs[i] = float(2 * i)
        info = self.c.replay_bindings(stream, pid, [(0, x, 4 * N), (1, y, 4 * N)])
        self.assertEqual(info["captured"], 1)
        self.assertEqual(list(ys), [4.0 * i for i in range(N)])
        stream.detach()
        # With reconnecting off, a call after the daemon went away fails at once.
        self.c.set_reconnect_wait(0)
        self.daemon.terminate()
        self.daemon.wait(10)
        with self.assertRaises(GraphdError) as e:
            self.c.replay_bindings(self.c.stream_attach(), pid, [(0, x, 4 * N), (1, y, 4 * N)])
        self.assertEqual(e.exception.code, "UNAVAILABLE")

    def test_list_and_evict_captures(self):
        p = self.scale_program(a=5.0)
        pid = self.c.register_program(p)
        x, y = self.c.host_alloc(4 * N), self.c.host_alloc(4 * N)
        stream = self.c.stream_attach()
        self.assertEqual(self.c.replay_bindings(stream, pid, [(0, x, 4 * N), (1, y, 4 * N)])["captured"], 1)
        caps = [c for c in self.c.list_captures() if c["program"] == pid.hex()]
        self.assertEqual(len(caps), 1)
        self.assertEqual(caps[0]["replays"], 1)
        self.assertEqual((caps[0]["graphs"], caps[0]["repoints"]), (1, 0))
        self.assertEqual(caps[0]["instances"], 1)
        self.assertGreater(caps[0]["queue_ns"], 0)
        self.assertIn(os.getpid(), caps[0]["pids"])
        self.assertEqual(self.c.busy_devices(), [])  # every worker answered
        # A dry run reports the capture and frees nothing.
        went, _ = self.c.evict(program=pid, dry_run=True)
        self.assertEqual([c["program"] for c in went], [pid.hex()])
        self.assertEqual(len(self.c.list_captures()), len(caps))
        went, nbytes = self.c.evict(program=pid)
        self.assertEqual(len(went), 1)
        self.assertEqual(went[0]["instances"], 1)
        self.assertEqual(nbytes, went[0]["staging_bytes"])
        self.assertEqual([c for c in self.c.list_captures() if c["program"] == pid.hex()], [])
        self.assertEqual(self.counters()["evictions"], 1)
        # graphd.clear(): what only this process used, from a fresh session.
        self.assertEqual(self.c.replay_bindings(stream, pid, [(0, x, 4 * N), (1, y, 4 * N)])["captured"], 1)
        went, nbytes = graphd.clear(self.sock)
        self.assertEqual([c["program"] for c in went], [pid.hex()])
        self.assertEqual(self.counters()["evictions"], 2)
        # No selector at all is refused, not read as "everything".
        with self.assertRaises(GraphdError):
            self.c.evict()
        # The next replay captures again and still computes.
        xs, ys = x.view.cast("f"), y.view.cast("f")
        for i in range(N):
            xs[i] = float(i)
        self.assertEqual(self.c.replay_bindings(stream, pid, [(0, x, 4 * N), (1, y, 4 * N)])["captured"], 1)
        self.assertEqual(list(ys), [5.0 * i for i in range(N)])
        stream.detach()
        del xs, ys
        x.free()
        y.free()

    def test_struct_with_pointer_fields_and_staged_ex(self):
        # pair_kernel(struct pair { const float *in; float *out; }, uint32_t n)
        p = Program("staged_ex")
        a = p.add_slot("input", 4 * N)
        b = p.add_slot("output", 4 * N)
        p.launch(self.module, "pair_kernel", N // 128, 128, args=[Struct(Slot(a), Slot(b)), u32(N)])
        pid = self.c.register_program(p)
        src, dst = self.c.host_alloc(4 * N), self.c.host_alloc(4 * N)
        struct.pack_into(f"<{N}f", src.view, 0, *[float(i) for i in range(N)])
        s = self.c.stream_attach()
        self.c.replay_bindings(s, pid, [(a, src, 4 * N), (b, dst, 4 * N)])
        self.assertEqual(list(struct.unpack_from(f"<{N}f", dst.view)), [2.0 * i + 1.0 for i in range(N)])

    def test_registration_by_encoding_and_prepare(self):
        p = self.scale_program(a=0.5)
        enc, pid = p.finish()
        self.assertEqual(self.c.register_program(enc, pid), pid)
        self.assertEqual(self.c.register_program(p), pid)  # again: cheap, same id
        self.c.prepare_program(pid)
        with self.assertRaises(GraphdError) as cm:
            self.c.register_program(enc, bytes(32))
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")

    def test_request_counters_move(self):
        def row(name):
            rows = [r for r in self.ctl.status()["requests"] if r["request"] == name]
            self.assertEqual(len(rows), 1, name)
            return rows[0]
        before = row("Ping")
        for _ in range(5):
            self.ctl.ping(b"x")
        after = row("Ping")
        self.assertEqual(after["calls"] - before["calls"], 5)
        self.assertEqual(after["errors"], before["errors"])
        self.assertGreater(after["handler_ns"], before["handler_ns"])
        # A Replay of a program the daemon does not know: a call, an error.
        r0 = row("Replay")
        stream = self.c.stream_attach()
        x = self.c.host_alloc(4 * N)
        with self.assertRaises(graphd.NotFound):
            self.c.replay_bindings(stream, bytes(32), [(0, x, 4 * N)])
        r1 = row("Replay")
        self.assertEqual((r1["calls"] - r0["calls"], r1["errors"] - r0["errors"]), (1, 1))
        stream.detach()
        x.free()

    def test_sessions_carry_their_records_figures(self):
        def mine(client):
            rows = [x for x in self.ctl.status()["session_info"] if x["id"] == client.session_id]
            self.assertEqual(len(rows), 1)
            return rows[0]
        data = mine(self.c)
        # Every key SessionInfo declares, and no other.
        self.assertEqual(set(data), set(graphd.records.SessionInfo.__annotations__))
        self.assertEqual((data["data"], data["pid"], data["uid"], data["gid"]),
                         (1, os.getpid(), os.getuid(), os.getgid()))
        self.assertEqual((data["admin"], data["busy"], data["flag_slots"], data["has_ring"]),
                         (1, 0, 0, 0))
        self.assertGreaterEqual(data["age_ms"], data["idle_ms"])
        self.assertEqual(mine(self.ctl)["busy"], 1)  # asking for this status
        # Left alone, it idles and ages; a stream gives it its flag page.
        time.sleep(0.3)
        later = mine(self.c)
        self.assertGreaterEqual(later["idle_ms"], data["idle_ms"] + 290)
        self.assertGreaterEqual(later["age_ms"], data["age_ms"] + 290)
        stream = self.c.stream_attach()
        now = mine(self.c)
        self.assertEqual(now["flag_slots"], 128)
        self.assertLess(now["idle_ms"], later["idle_ms"])
        stream.detach()

    def test_errors_carry_the_status_and_the_daemons_message(self):
        s = self.c.stream_attach()
        buf = self.c.host_alloc(4 * N)
        with self.assertRaises(GraphdError) as cm:
            self.c.replay_bindings(s, bytes(32), [(0, buf, 4 * N)])
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertTrue(cm.exception.message)
        self.assertTrue(str(cm.exception).startswith("graphd: NOT_FOUND: "))
        # A program naming a module that was never registered.
        p = Program()
        p.add_slot("input", 16)
        p.launch(bytes(32), "scale", 1, 1, args=[Slot(0)])
        with self.assertRaises(GraphdError) as cm:
            self.c.register_program(p)
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertIn("step 0 (launch scale)", cm.exception.message)
        # Two hidden parameters scale does not have: the device stage
        # refuses it at the replay that would capture it.
        pid = self.c.register_program(self.scale_program(hidden=2))
        with self.assertRaises(GraphdError) as cm:
            self.c.replay_bindings(s, pid, [(0, buf, 4 * N), (1, buf, 4 * N)])
        self.assertEqual(cm.exception.code, "INVALID_ARGUMENT", cm.exception.message)
        self.assertIn("step 0 (launch scale)", cm.exception.message)
        # A data-session call on a control session.
        with self.assertRaises(GraphdError) as cm:
            self.ctl.prepare_program(pid)
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")

    def test_connect_errors(self):
        with self.assertRaises(GraphdError) as cm:
            Client.connect(os.path.join(self.dir, "nothing"), timeout_ms=2000)
        self.assertEqual(cm.exception.code, "UNAVAILABLE")
        with self.assertRaises(GraphdError) as cm:
            Client.connect(self.sock, device_uuid=bytes(16), timeout_ms=2000)
        self.assertEqual(cm.exception.code, "NOT_FOUND")


if __name__ == "__main__":
    unittest.main()
