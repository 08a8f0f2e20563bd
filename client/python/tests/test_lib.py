"""The Python builder against libgraphd's C builder (same bytes, same ids,
same refusals), and the ctypes structures against the C layout."""

import importlib.util
import os
import random
import struct
import subprocess
import unittest

import graphd
from graphd import GraphdError, Program, Slot, Struct, f32, u32, u64
from graphd import _lib

import _env

MOD = bytes(range(32))


class _Both:
    """Makes the same calls on a Python Program and a C builder."""

    def __init__(self, mode="staged"):
        self.py = Program(mode)
        self.c = _lib.CProgram(mode)

    def __getattr__(self, name):
        def call(*a, **kw):
            r1 = getattr(self.py, name)(*a, **kw)
            r2 = getattr(self.c, name)(*a, **kw)
            assert r1 == r2, (name, r1, r2)
            return r1
        return call

    def finish(self):
        return self.py.finish(), self.c.finish()


class CrossTest(unittest.TestCase):
    def setUp(self):
        _env.path(self, "GRAPHD_LIB")
        _lib.lib()

    def same(self, b):
        (pe, pi), (ce, ci) = b.finish()
        self.assertEqual(pe.hex(), ce.hex())
        self.assertEqual(pi.hex(), ci.hex())
        return pi

    def test_golden_program_matches_c(self):
        b = _Both()
        b.add_slot("input", 256)
        b.add_slot("scratch", 64, staged=False)
        b.add_launch(MOD, "scale2", (2, 1, 1), (128, 1, 1))
        b.param_slot(0, 8, 0, 16)
        b.param(0, 0, struct.pack("<I", 0x11223344))
        b.add_memset(1, 0, 64, 4, 0xDEADBEEF)
        b.add_copy(1, 8, 0, 0, 32)
        self.assertEqual(self.same(b).hex(),
                         "ae2877ca7e5b3c71da9a23652fe136e43f26b98373b3fb091d2f58bd31494c5d")

    def test_several_programs_match_c(self):
        ids = set()
        # scale on the host kernels' layout, both modes.
        for mode in ("staged", "staged_ex"):
            b = _Both(mode)
            x, y = b.add_slot("input", 4096), b.add_slot("output", 4096)
            s = b.add_launch(MOD, "scale", (4, 1, 1), (256, 1, 1))
            b.param_slot(s, 0, x)
            b.param_slot(s, 8, y)
            b.param(s, 16, struct.pack("<f", 3.0))
            b.param(s, 20, struct.pack("<I", 1024))
            ids.add(self.same(b))
        # A struct with pointer fields, unstaged and inout slots, shared
        # memory, several launches and every step kind.
        b = _Both("staged_ex")
        a = b.add_slot("input", 1 << 20, staged=False)
        o = b.add_slot("inout", 1 << 20)
        t = b.add_slot("scratch", 512, staged=False)
        s = b.add_launch(MOD, "pair_kernel", (1024, 2, 3), (32, 4, 2), 49152)
        b.param(s, 0, b"\xaa" * 16)
        b.patch(s, 0, a, 8)
        b.patch(s, 8, o, 1 << 19)
        b.param(s, 16, struct.pack("<I", 7))
        b.add_memset(t, 0, 512, 2, 0xBEEF)
        b.add_copy(o, 0, t, 256, 256)
        s2 = b.add_launch(bytes(32), "_Z6kernelPfS_j", 7, 96)
        b.param(s2, 40, b"\x01")
        b.param_slot(s2, 16, t, 511)
        b.param(s2, 0, struct.pack("<d", 0.5))
        b.add_memset(o, 4, 8, 1, 0xFF)
        ids.add(self.same(b))
        # A launch with no parameters.
        b = _Both()
        b.add_slot("output", 1)
        b.add_launch(MOD, "noargs", 1, 1)
        ids.add(self.same(b))
        self.assertEqual(len(ids), 4)

    def test_random_programs_match_c(self):
        rng = random.Random(5)
        for _ in range(40):
            b = _Both(rng.choice(["staged", "staged_ex"]))
            nslots = rng.randint(1, 6)
            sizes = []
            for _ in range(nslots):
                role = rng.choice(["input", "output", "inout", "scratch", "temp"])
                n = rng.choice([1, 8, 64, 4096, 1 << 30])
                owned = role in ("scratch", "temp")
                b.add_slot(role, n, staged=None if owned else rng.random() < 0.8)
                sizes.append(n)
            for _ in range(rng.randint(1, 6)):
                k = rng.randint(0, 2)
                if k == 0:
                    s = b.add_launch(bytes(rng.randrange(256) for _ in range(32)), f"k{rng.randrange(99)}",
                                     rng.randint(1, 100), rng.choice([1, 32, 256]))
                    at = 0
                    for _ in range(rng.randint(0, 6)):
                        if rng.random() < 0.5:
                            at = (at + 7) // 8 * 8
                            sl = rng.randrange(nslots)
                            b.param_slot(s, at, sl, rng.randrange(sizes[sl]))
                            at += 8
                        else:
                            n = rng.choice([1, 2, 4, 8, 12])
                            b.param(s, at, bytes(rng.randrange(256) for _ in range(n)))
                            at += n
                        at += rng.choice([0, 0, 3])
                elif k == 1:
                    sl = rng.randrange(nslots)
                    es = rng.choice([1, 2, 4])
                    if sizes[sl] >= es:
                        b.add_memset(sl, 0, sizes[sl] // es * es, es, rng.randrange(1 << (8 * es)))
                else:
                    d, sr = rng.randrange(nslots), rng.randrange(nslots)
                    if d != sr:
                        n = min(sizes[d], sizes[sr])
                        b.add_copy(d, 0, sr, 0, n)
            if b.py.nsteps == 0:
                b.add_memset(0, 0, 1, 1, 0)
            self.same(b)

    def test_module_ids_match_c(self):
        for kind in ("ptx", "cubin", "fatbin", "host_elf"):
            for data in (b"abc", b"\0" * 1000, bytes(range(256)) * 300):
                self.assertEqual(graphd.module_id(kind, data), _lib.c_module_id(kind, data))

    def test_refusals_match_c(self):
        """The same bad call gets the same message from both builders."""
        cases = [
            lambda p: p.add_slot("input", 0),
            lambda p: p.add_slot("scratch", 8, staged=True),
            lambda p: p.add_slot("temp", 8, staged=True),
            lambda p: p.add_launch(MOD, "bad name", 1, 1),
            lambda p: p.add_launch(MOD, "k", (1, 70000, 1), (1, 1, 1)),
            lambda p: p.add_launch(MOD, "k", (1, 1, 1), (64, 32, 1)),
            lambda p: p.param(0, 16, b"\0" * 8) or p.param(0, 20, b"\0"),
            lambda p: p.param(0, graphd.program.MAX_PARAM_BYTES - 1, b"\0\0"),
            lambda p: p.param_slot(0, 12, 0),
            lambda p: p.param_slot(0, 0, 5),
            lambda p: p.param_slot(0, 0, 0, 64),
            lambda p: p.patch(0, 8, 0),
            lambda p: p.param(0, 0, bytes(16)) or p.patch(0, 8, 1) or p.patch(0, 8, 0),
            lambda p: p.param(3, 0, b"\0"),
            lambda p: p.add_memset(0, 0, 64, 4, 0) and p.param(1, 0, b"x"),
            lambda p: p.add_memset(0, 2, 8, 4, 0),
            lambda p: p.add_memset(0, 0, 8, 1, 0x1FF),
            lambda p: p.add_memset(1, 0, 128, 1, 0),
            lambda p: p.add_copy(0, 0, 0, 8, 16),
            lambda p: p.add_copy(0, 0, 1, 0, 65),
            lambda p: p.add_copy(0, 0, 7, 0, 1),
        ]
        for i, case in enumerate(cases):
            msgs = []
            for p in (Program(), _lib.CProgram()):
                p.add_slot("input", 64)
                p.add_slot("output", 64)
                p.add_launch(MOD, "k", 1, 32)
                with self.assertRaises(GraphdError, msg=f"case {i}") as cm:
                    case(p)
                msgs.append(cm.exception.message)
            self.assertEqual(msgs[0], msgs[1], f"case {i}")
        # finish of an empty program
        msgs = []
        for p in (Program(), _lib.CProgram()):
            with self.assertRaises(GraphdError) as cm:
                p.finish()
            msgs.append(cm.exception.message)
        self.assertEqual(msgs[0], msgs[1])

    def test_loops_and_branches_match_c(self):
        b = _Both()
        b.add_slot("inout", 64)
        x = b.add_slot("input", 4096)
        w = b.begin_while(0, 0)
        s = b.add_launch(MOD, "dec", 1, 32)
        b.param_slot(s, 0, 0)
        br = b.begin_if(0, 4)
        b.add_memset(0, 16, 8, 4, 1)
        b.else_(br)
        b.add_copy(0, 24, x, 0, 8)
        b.add_memset(0, 32, 8, 4, 3)
        b.end(br)
        b.end(w)
        e = b.begin_if(0, 60)
        b.else_(e)
        b.add_memset(0, 40, 8, 4, 4)
        b.end(e)
        self.same(b)

    def test_random_nested_programs_match_c(self):
        rng = random.Random(11)
        for _ in range(60):
            b = _Both(rng.choice(["staged", "staged_ex"]))
            b.add_slot("inout", 256)
            b.add_slot("scratch", 64, staged=False)
            open_ = []  # [step, kind, steps inside it so far, in its else]
            for _ in range(rng.randint(1, 30)):
                r = rng.random()
                if r < 0.2 and len(open_) < 8:
                    kind = rng.choice(["while", "if"])
                    slot = rng.randrange(2)
                    off = 4 * rng.randrange(16)
                    st = b.begin_while(slot, off) if kind == "while" else b.begin_if(slot, off)
                    open_.append([st, kind, 0, False])
                elif r < 0.35 and open_:
                    top = open_[-1]
                    if top[1] == "if" and not top[3] and rng.random() < 0.5:
                        b.else_(top[0])
                        top[3] = True
                    elif top[2]:
                        b.end(top[0])
                        open_.pop()
                        if open_:
                            open_[-1][2] += 1 + top[2]
                else:
                    if rng.random() < 0.5:
                        b.add_memset(rng.randrange(2), 4 * rng.randrange(8), 8, 4, rng.randrange(1 << 32))
                    else:
                        st = b.add_launch(MOD, f"k{rng.randrange(9)}", rng.randint(1, 9), 32)
                        b.param_slot(st, 0, rng.randrange(2), 8)
                        b.param(st, 8, struct.pack("<I", rng.randrange(1 << 32)))
                    if open_:
                        open_[-1][2] += 1
            # Close what is still open, with a step in each that has none.
            while open_:
                st, kind, n, _ = open_.pop()
                if n == 0:
                    b.add_memset(0, 0, 4, 4, 7)
                    n = 1
                b.end(st)
                if open_:
                    open_[-1][2] += 1 + n
            if b.py.nsteps == 0:
                b.add_memset(0, 0, 4, 4, 0)
            self.same(b)

    def test_loop_and_branch_refusals_match_c(self):
        def nest(p, depth):
            opened = [p.begin_while(0, 0) for _ in range(depth)]
            p.add_memset(0, 8, 8, 4, 0)
            for st in reversed(opened):
                p.end(st)
        def calls(*fs):
            """Runs the calls in order (each takes the builder)."""
            return lambda p: [f(p) for f in fs]
        W = lambda p: p.begin_while(0, 0)  # noqa: E731
        I = lambda p: p.begin_if(0, 4)  # noqa: E731
        M = lambda p: p.add_memset(0, 8, 8, 4, 0)  # noqa: E731
        cases = [
            lambda p: p.begin_while(0, 6),
            lambda p: p.begin_if(0, 64),
            lambda p: p.begin_if(3, 0),
            calls(W, M, I, lambda p: p.end(0)),
            calls(W, I, lambda p: p.else_(0)),
            calls(I, lambda p: p.else_(0), lambda p: p.else_(0)),
            calls(I, M, lambda p: p.end(0), lambda p: p.end(0)),
            calls(M, lambda p: p.end(0)),
            lambda p: p.end(7),
            calls(W, lambda p: p.else_(0)),
            calls(W, lambda p: p.param(0, 0, b"x")),
            # Refused at finish.
            calls(W, M, lambda p: p.finish()),
            calls(W, lambda p: p.end(0), lambda p: p.finish()),
            calls(I, lambda p: p.else_(0), lambda p: p.end(0), lambda p: p.finish()),
            calls(lambda p: nest(p, 9), lambda p: p.finish()),
        ]
        for i, case in enumerate(cases):
            msgs = []
            for p in (Program(), _lib.CProgram()):
                p.add_slot("inout", 64)
                with self.assertRaises(GraphdError, msg=f"case {i}") as cm:
                    case(p)
                msgs.append(cm.exception.message)
            self.assertEqual(msgs[0], msgs[1], f"case {i}")
        # 8 deep is allowed, and the same in both.
        built = []
        for p in (Program(), _lib.CProgram()):
            p.add_slot("inout", 64)
            nest(p, 8)
            built.append(p.finish())
        self.assertEqual(built[0], built[1])

    def test_launch_args_match_hand_written_c_calls(self):
        py = Program()
        py.add_slot("input", 64)
        py.add_slot("output", 64)
        py.launch(MOD, "pair_kernel", 1, 16, args=[Struct(Slot(0), Slot(1, 4)), u32(16), f32(0.5), u64(9)],
                  hidden=2)
        c = _lib.CProgram()
        c.add_slot("input", 64)
        c.add_slot("output", 64)
        c.add_launch(MOD, "pair_kernel", (1,), (16,))
        c.param(0, 0, bytes(16))
        c.patch(0, 0, 0)
        c.patch(0, 8, 1, 4)
        c.param(0, 16, struct.pack("<I", 16))
        c.param(0, 20, struct.pack("<f", 0.5))
        c.param(0, 24, struct.pack("<Q", 9))
        c.param(0, 32, bytes(8))
        c.param(0, 40, bytes(8))
        self.assertEqual(py.finish(), c.finish())


class AbiTest(unittest.TestCase):
    def test_ctypes_structures_match_the_c_layout(self):
        exe = _env.path(self, "GRAPHD_ABI_SIZES")
        out = subprocess.run([exe], check=True, capture_output=True, text=True, timeout=30).stdout
        checked = 0
        for line in out.splitlines():
            name, what, n = line.split()
            n = int(n)
            if what == "size" and name == "graphd_device_record":
                # Room for the counters a later library appends, read by
                # their offsets (_lib.record_metrics).
                self.assertGreaterEqual(ctypes_sizeof(_lib.STRUCTS[name]), n, name)
            elif what == "size":
                self.assertEqual(ctypes_sizeof(_lib.STRUCTS[name]), n, name)
            else:
                sname, field = name.split(".")
                self.assertEqual(getattr(_lib.STRUCTS[sname], field).offset, n, name)
            checked += 1
        self.assertGreater(checked, 30)
        # Every structure the bindings define is checked.
        sized = {l.split()[0] for l in out.splitlines() if l.split()[1] == "size"}
        self.assertEqual(sized, set(_lib.STRUCTS))


# The source tree's list of device counters and the script that reads it.
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
COUNTERS_SCRIPT = os.path.join(ROOT, "scripts", "device-counters.py")


class DeviceMetricsTest(unittest.TestCase):
    def test_the_library_lists_the_device_counters_of_the_list(self):
        # graphd_device_metric, which Client.status() reads its metrics by,
        # is device_counters.def entry for entry.
        _env.path(self, "GRAPHD_LIB")
        if not os.path.exists(COUNTERS_SCRIPT):
            self.skipTest("no source tree beside the tests")
        spec = importlib.util.spec_from_file_location("device_counters", COUNTERS_SCRIPT)
        dc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(dc)
        with open(os.path.join(ROOT, dc.DEF), encoding="utf-8") as f:
            listed = dc.parse_list(f.read())
        got = _lib.device_metrics()
        self.assertEqual([m["name"] for m in got], [e["name"] for e in listed])
        for m, e in zip(got, listed):
            self.assertEqual((m["field"], m["kind"], m["unit"], m["prometheus"], m["help"]),
                             (e["field"], e["kind"].lower(), dc.UNIT_WORD[e["unit"]],
                              e["prometheus"], e["help"]), m["name"])
            self.assertEqual(m["prometheus_own"], e["form"] == "LINE", m["name"])
            self.assertLessEqual(m["offset"] + 8, ctypes_sizeof(_lib.graphd_device_record))


def ctypes_sizeof(t):
    import ctypes
    return ctypes.sizeof(t)


if __name__ == "__main__":
    unittest.main()
