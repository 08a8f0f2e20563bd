"""The Python builder against libgraphd's C builder (same bytes, same ids,
same refusals), and the ctypes structures against the C layout."""

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
                role = rng.choice(["input", "output", "inout", "scratch"])
                n = rng.choice([1, 8, 64, 4096, 1 << 30])
                b.add_slot(role, n, staged=None if role == "scratch" else rng.random() < 0.8)
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
            if what == "size":
                self.assertEqual(ctypes_sizeof(_lib.STRUCTS[name]), n, name)
            else:
                sname, field = name.split(".")
                self.assertEqual(getattr(_lib.STRUCTS[sname], field).offset, n, name)
            checked += 1
        self.assertGreater(checked, 30)
        # Every structure the bindings define is checked.
        sized = {l.split()[0] for l in out.splitlines() if l.split()[1] == "size"}
        self.assertEqual(sized, set(_lib.STRUCTS))


def ctypes_sizeof(t):
    import ctypes
    return ctypes.sizeof(t)


if __name__ == "__main__":
    unittest.main()
