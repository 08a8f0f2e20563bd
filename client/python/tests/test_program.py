"""The pure-Python builder: the pinned golden encoding, module ids, typed
launch arguments, and every validation error. Needs neither libgraphd nor a
daemon."""

import hashlib
import struct
import unittest

import graphd
from graphd import GraphdError, Program, Slot, Struct, Raw, f32, f64, u8, u16, u32, u64, i32, i64
from graphd import program as gp

# From tests/test_program.c: derived by hand from docs/protocol.md
# ("Canonical encodings"), not printed from an encoder.
GOLDEN_HEX = (
    "47445047 01000000 00000000 02000000 03000000"
    "00000000 01000000 0001000000000000"
    "03000000 00000000 4000000000000000"
    "01000000"
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
    "06000000 7363616c6532"
    "02000000 01000000 01000000"
    "80000000 01000000 01000000"
    "00000000"
    "02000000 00000000 04000000 08000000 08000000"
    "10000000 44332211 00000000 0000000000000000"
    "01000000 08000000 00000000 1000000000000000"
    "02000000 01000000 04000000 efbeadde 0000000000000000 4000000000000000"
    "03000000 01000000 00000000 0800000000000000 0000000000000000 2000000000000000"
)
GOLDEN_ID_HEX = "ae2877ca7e5b3c71da9a23652fe136e43f26b98373b3fb091d2f58bd31494c5d"
MODULE = bytes(range(32))
ANY_MODULE = bytes([0x42]) + bytes(31)


def build_golden():
    p = Program("staged")
    assert p.add_slot("input", 256) == 0
    assert p.add_slot("scratch", 64, staged=False) == 1
    assert p.add_launch(MODULE, "scale2", (2, 1, 1), (128, 1, 1)) == 0
    # Declared out of order on purpose: finish sorts.
    p.param_slot(0, 8, 0, 16)
    p.param(0, 0, struct.pack("<I", 0x11223344))
    assert p.add_memset(1, 0, 64, 4, 0xDEADBEEF) == 1
    assert p.add_copy(1, 8, 0, 0, 32) == 2
    return p


def small():
    """Input and output slots of 256 bytes and one launch "scale2" (step 0)."""
    p = Program()
    p.add_slot("input", 256)
    p.add_slot("output", 256)
    p.add_launch(ANY_MODULE, "scale2", 1, 32)
    return p


class ContractTest(unittest.TestCase):
    """The Python builder's constants are the C ones (proto/include/graphd/encoding.h)."""

    def test_limits_and_version_match_the_c_header(self):
        import os
        import re
        header = os.path.join(os.path.dirname(__file__), "..", "..", "..", "proto", "include", "graphd", "encoding.h")
        if not os.path.exists(header):
            self.skipTest("proto/include/graphd/encoding.h is not beside this package (an installed copy)")
        with open(header) as f:
            text = f.read()
        defs = {}
        for m in re.finditer(r"#define GD_(\w+) \(?(\w+)(?: << (\d+))?\)?", text):
            name, value, shift = m.groups()
            v = int(value.rstrip("uUlL"), 0) if re.fullmatch(r"(0x)?[0-9a-fA-F]+[uUlL]*", value) else None
            if v is not None:
                defs[name] = v << int(shift) if shift else v
        checked = 0
        for name in dir(gp):
            if (name.startswith("MAX_") or name.endswith("_VERSION") or name.endswith("_MAGIC")) \
                    and name in defs:
                self.assertEqual(getattr(gp, name), defs[name], name)
                checked += 1
        self.assertGreaterEqual(checked, 14)


class GoldenTest(unittest.TestCase):
    def test_golden_program_has_the_pinned_bytes_and_id(self):
        enc, pid = build_golden().finish()
        want = bytes.fromhex(GOLDEN_HEX.replace(" ", ""))
        self.assertEqual(len(want), 254)
        self.assertEqual(enc.hex(), want.hex())
        self.assertEqual(pid.hex(), GOLDEN_ID_HEX)
        self.assertEqual(hashlib.sha256(want).hexdigest(), GOLDEN_ID_HEX)

    def test_finish_twice_gives_the_same_and_then_nothing_changes(self):
        p = build_golden()
        a = p.finish()
        self.assertEqual(p.finish(), a)
        self.assertEqual(p.id_hex, GOLDEN_ID_HEX)
        self.assertEqual(p.encoding, a[0])
        for call in (lambda: p.add_slot("input", 8), lambda: p.param(0, 32, b"x"),
                     lambda: p.add_memset(1, 0, 4, 4, 0), lambda: p.add_copy(1, 0, 0, 0, 4)):
            with self.assertRaises(GraphdError) as cm:
                call()
            self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")
            self.assertIn("the program is finished and can no longer change", cm.exception.message)

    def test_no_encoding_before_finish(self):
        with self.assertRaises(GraphdError) as cm:
            small().encoding
        self.assertEqual(cm.exception.code, "FAILED_PRECONDITION")

    def test_declaration_order_does_not_change_the_id(self):
        def build(order):
            p = Program("staged_ex")
            p.add_slot("inout", 64)
            p.add_launch(MODULE, "k", 1, 1)
            calls = [lambda: p.param(0, 0, b"\1\2\3\4"), lambda: p.param_slot(0, 8, 0, 4),
                     lambda: p.param(0, 16, bytes(16)), lambda: p.patch(0, 24, 0, 8)]
            for k in order:
                calls[k]()
            return p.finish()
        self.assertEqual(build([0, 1, 2, 3]), build([2, 3, 1, 0]))

    def test_mode_changes_the_id(self):
        def build(mode):
            p = Program(mode)
            p.add_slot("input", 64)
            p.add_memset(0, 0, 64, 1, 0)
            return p.finish()
        a, b = build("staged"), build("staged_ex")
        self.assertNotEqual(a[1], b[1])
        self.assertEqual(a[0][8:12], b"\0\0\0\0")
        self.assertEqual(b[0][8:12], b"\1\0\0\0")


class ModuleIdTest(unittest.TestCase):
    def test_module_id_is_pinned(self):
        # From tests/test_program.c, computed apart from graphd.
        self.assertEqual(graphd.module_id("ptx", b"abc").hex(),
                         "5eedc206cb058a60cb9ca9ead53131a2db6e68af89951d7b6be1792e8ec7411e")
        self.assertEqual(graphd.module_id(1, b"abc"), graphd.module_id("ptx", b"abc"))

    def test_module_id_depends_on_kind_and_bytes(self):
        ids = {graphd.module_id(k, b"abc") for k in ("ptx", "cubin", "fatbin", "host_elf")}
        ids |= {graphd.module_id("ptx", b"abd"), graphd.module_id("ptx", b"abcd")}
        self.assertEqual(len(ids), 6)
        self.assertEqual(graphd.module_id("cubin", bytearray(b"abc")),
                         graphd.module_id("cubin", memoryview(b"abc")))

    def test_module_id_refuses_empty_bytes_and_unknown_kinds(self):
        for kind, data in (("ptx", b""), (0, b"abc"), (5, b"abc"), ("elf", b"abc"), (True, b"abc")):
            with self.assertRaises(GraphdError) as cm:
                graphd.module_id(kind, data)
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")


class LaunchArgsTest(unittest.TestCase):
    def test_natural_alignment_matches_a_c_signature(self):
        # scale(const float *x, float *y, float a, uint32_t n): 0, 8, 16, 20.
        p = Program()
        x, y = p.add_slot("input", 64), p.add_slot("output", 64)
        s = p.add_launch(MODULE, "scale", 1, 16)
        self.assertEqual(p.launch_args(s, [Slot(x), Slot(y), f32(2.0), u32(16)]), [0, 8, 16, 20])
        q = Program()
        q.add_slot("input", 64), q.add_slot("output", 64)
        q.add_launch(MODULE, "scale", 1, 16)
        q.param_slot(0, 0, 0)
        q.param_slot(0, 8, 1)
        q.param(0, 16, struct.pack("<f", 2.0))
        q.param(0, 20, struct.pack("<I", 16))
        self.assertEqual(p.finish(), q.finish())

    def test_natural_alignment_pads_with_zeros(self):
        p = Program()
        p.add_slot("input", 64)
        s = p.add_launch(MODULE, "k", 1, 1)
        offs = p.launch_args(s, [u8(7), f64(1.5), u16(3), Slot(0, 4), i32(-1), i64(-2)])
        self.assertEqual(offs, [0, 8, 16, 24, 32, 40])
        enc, _ = p.finish()
        self.assertIn(b"\x07" + bytes(7) + struct.pack("<d", 1.5) + b"\x03\x00" + bytes(6) + bytes(8)
                      + b"\xff" * 4 + bytes(4) + struct.pack("<q", -2), enc)

    def test_explicit_offsets_are_used(self):
        p = Program()
        p.add_slot("input", 64)
        s = p.add_launch(MODULE, "k", 1, 1)
        self.assertEqual(p.launch_args(s, [u32(1), Slot(0)], offsets=[4, 16]), [4, 16])
        with self.assertRaises(GraphdError) as cm:
            p.launch_args(s, [u32(1)], offsets=[4, 8])
        self.assertIn("2 offsets for 1 arguments", cm.exception.message)

    def test_hidden_adds_trailing_zero_pointer_params(self):
        # Triton: (x, y, n) plus hidden global_scratch and profile_scratch.
        p = Program()
        x, y = p.add_slot("input", 64), p.add_slot("output", 64)
        s = p.launch(MODULE, "triton_k", 1, 32, args=[Slot(x), Slot(y), u32(16)], hidden=2)
        enc, _ = p.finish()
        l = p._steps[s]
        self.assertEqual(l.params, [(0, 8), (8, 8), (16, 4), (24, 8), (32, 8)])
        self.assertEqual(bytes(l.data[24:40]), bytes(16))
        self.assertEqual(l.patches, [(0, x, 0), (8, y, 0)])
        # With explicit offsets, the hidden ones follow the last argument.
        q = Program()
        q.add_slot("input", 64)
        t = q.add_launch(MODULE, "k", 1, 1)
        self.assertEqual(q.launch_args(t, [Slot(0), u64(5)], offsets=[0, 8], hidden=1), [0, 8, 16])

    def test_struct_with_pointer_fields_is_patched(self):
        # pair_kernel(struct pair { const float *in; float *out; }, uint32_t n)
        p = Program()
        a, b = p.add_slot("input", 64), p.add_slot("output", 64)
        s = p.add_launch(MODULE, "pair_kernel", 1, 16)
        self.assertEqual(p.launch_args(s, [Struct(Slot(a), Slot(b, 4)), u32(16)]), [0, 16])
        l = p._steps[s]
        self.assertEqual(l.params, [(0, 16), (16, 4)])
        self.assertEqual(l.patches, [(0, a, 0), (8, b, 4)])
        st = Struct(u8(1), Slot(a), f32(1.0))
        self.assertEqual((st.size, st.align, st.offsets), (24, 8, [0, 8, 16]))
        self.assertEqual(Struct(u8(1), u16(2), size=8).encode(), b"\x01\x00\x02\x00" + bytes(4))

    def test_a_struct_pointer_that_is_not_aligned_is_refused(self):
        p = Program()
        p.add_slot("input", 64)
        s = p.add_launch(MODULE, "k", 1, 1)
        with self.assertRaises(GraphdError) as cm:
            p.launch_args(s, [Struct(u32(1), Slot(0), offsets=[0, 4], align=4)])
        self.assertIn("step 0 (launch k): patch at offset 4 is not 8-byte aligned", cm.exception.message)
        # The refused call left nothing behind.
        self.assertEqual(p._steps[s].params, [])
        self.assertEqual(bytes(p._steps[s].data), b"")

    def test_launch_refuses_untyped_arguments_and_leaves_no_step(self):
        p = Program()
        p.add_slot("input", 64)
        with self.assertRaises(TypeError):
            p.launch(MODULE, "k", 1, 1, args=[Slot(0), 2.0])
        with self.assertRaises(GraphdError):
            p.launch(MODULE, "k", 1, 1, args=[Slot(5)])
        self.assertEqual(p.nsteps, 0)

    def test_scalars_check_their_range(self):
        for make, v in ((u8, 256), (u32, -1), (i32, 1 << 31), (u64, 1 << 64)):
            with self.assertRaises(GraphdError) as cm:
                make(v)
            self.assertEqual(cm.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(GraphdError):
            f32(1e40)
        self.assertEqual(Raw(b"abc", align=4).align, 4)
        self.assertEqual(graphd.f16(1.0).encode(), b"\x00\x3c")


class ErrorsTest(unittest.TestCase):
    """Each refusal raises GraphdError with the C builder's status and a
    message naming the step, slot or field."""

    def expect(self, call, code, needle):
        with self.assertRaises(GraphdError) as cm:
            call()
        self.assertEqual(cm.exception.code, code, cm.exception.message)
        self.assertIn(needle, cm.exception.message)
        self.assertIn(needle, str(cm.exception))
        return cm.exception

    def test_overlapping_parameters(self):
        p = small()
        p.param(0, 8, bytes(8))
        self.expect(lambda: p.param(0, 8, bytes(8)), "INVALID_ARGUMENT",
                    "step 0 (launch scale2): parameter at offset 8 (size 8) overlaps the parameter at "
                    "offset 8 (size 8)")
        self.expect(lambda: p.param(0, 4, bytes(8)), "INVALID_ARGUMENT",
                    "parameter at offset 4 (size 8) overlaps the parameter at offset 8")
        self.expect(lambda: p.param_slot(0, 8, 0), "INVALID_ARGUMENT", "parameter at offset 8 (size 8) overlaps")
        p.param(0, 4, bytes(4))
        p.param(0, 16, bytes(8))

    def test_bad_parameters(self):
        p = small()
        self.expect(lambda: p.param(0, 0, b""), "INVALID_ARGUMENT",
                    "step 0 (launch scale2): parameter at offset 0 has size 0")
        n = gp.MAX_PARAM_BYTES - 7
        self.expect(lambda: p.param(0, 8, bytes(n)), "RESOURCE_EXHAUSTED",
                    f"parameter at offset 8 (size {n}) ends past the limit of {gp.MAX_PARAM_BYTES} parameter bytes")
        p.param(0, 0, bytes(4096))
        self.expect(lambda: p.param(3, 0, bytes(4)), "INVALID_ARGUMENT", "step 3 does not exist; there are 1 steps")
        p.add_memset(0, 0, 16, 1, 0)
        self.expect(lambda: p.param(1, 0, bytes(4)), "INVALID_ARGUMENT",
                    "step 1 (memset): only a launch has parameters")
        self.expect(lambda: p.patch(1, 0, 0), "INVALID_ARGUMENT", "step 1 (memset): only a launch has parameters")
        self.expect(lambda: p.param(0, -1, b"x"), "INVALID_ARGUMENT", "parameter offset is -1")

    def test_caps_on_parameters_and_patches(self):
        p = small()
        for k in range(gp.MAX_PARAMS):
            p.param(0, k, b"\1")
        off = gp.MAX_PARAMS + 72
        self.expect(lambda: p.param(0, off, b"\1"), "RESOURCE_EXHAUSTED",
                    f"parameter at offset {off} is over the limit of {gp.MAX_PARAMS} parameters")
        p = small()
        p.param(0, 0, bytes(8 * (gp.MAX_PATCHES + 1)))
        for k in range(gp.MAX_PATCHES):
            p.patch(0, 8 * k, 0)
        self.expect(lambda: p.patch(0, 8 * gp.MAX_PATCHES, 0), "RESOURCE_EXHAUSTED",
                    f"patch at offset {8 * gp.MAX_PATCHES} is over the limit of {gp.MAX_PATCHES} patches")

    def test_bad_patches(self):
        p = small()
        p.param(0, 16, bytes(16))
        self.expect(lambda: p.patch(0, 20, 0), "INVALID_ARGUMENT",
                    "step 0 (launch scale2): patch at offset 20 is not 8-byte aligned")
        self.expect(lambda: p.patch(0, 32, 0), "INVALID_ARGUMENT",
                    "patch at offset 32 does not lie inside one declared parameter")
        self.expect(lambda: p.patch(0, 0, 0), "INVALID_ARGUMENT",
                    "patch at offset 0 does not lie inside one declared parameter")
        self.expect(lambda: p.patch(0, 16, 2), "INVALID_ARGUMENT",
                    "patch at offset 16 names slot 2; there are 2 slots")
        self.expect(lambda: p.patch(0, 16, 1, 256), "INVALID_ARGUMENT",
                    "patch at offset 16 points 256 bytes into slot 1, which has 256")
        p.patch(0, 16, 1, 255)
        self.expect(lambda: p.patch(0, 16, 0), "INVALID_ARGUMENT", "there is already a patch at offset 16")
        self.expect(lambda: p.param_slot(0, 4, 0), "INVALID_ARGUMENT", "patch at offset 4 is not 8-byte aligned")
        self.expect(lambda: p.param_slot(0, 40, 7), "INVALID_ARGUMENT", "patch at offset 40 names slot 7")
        p.param(0, 40, bytes(8))  # the refused param_slot left nothing at 40
        p.param(0, 48, bytes(4))
        p.param(0, 52, bytes(4))
        self.expect(lambda: p.patch(0, 48, 0), "INVALID_ARGUMENT",
                    "patch at offset 48 does not lie inside one declared parameter")

    def test_patch_zeroes_the_bytes_under_it(self):
        p = small()
        p.param(0, 0, b"\xff" * 16)
        p.patch(0, 8, 1)
        self.assertEqual(bytes(p._steps[0].data), b"\xff" * 8 + bytes(8))
        p.finish()

    def test_bad_slots(self):
        p = Program()
        self.expect(lambda: p.add_slot(5, 16), "INVALID_ARGUMENT",
                    "slot 0: role 5 is not input, output, inout, scratch or temp")
        self.expect(lambda: p.add_slot("in", 16), "INVALID_ARGUMENT",
                    "slot 0: role 'in' is not input, output, inout, scratch or temp")
        self.expect(lambda: p.add_slot("input", 0), "INVALID_ARGUMENT", "slot 0: size 0 is invalid")
        self.expect(lambda: p.add_slot("input", gp.MAX_SLOT_BYTES + 1), "RESOURCE_EXHAUSTED",
                    "slot 0: 1099511627777 bytes is over the limit of 1099511627776")
        self.expect(lambda: p.add_slot("scratch", 16, staged=True), "INVALID_ARGUMENT",
                    "slot 0: a scratch slot belongs to graphd and cannot be staged")
        self.expect(lambda: p.add_slot("temp", 16, staged=True), "INVALID_ARGUMENT",
                    "slot 0: a temp slot belongs to graphd and cannot be staged")
        self.assertEqual(p.add_slot("input", gp.MAX_SLOT_BYTES, staged=False), 0)
        self.assertEqual(p.slot(0), ("input", False, gp.MAX_SLOT_BYTES))
        for s in range(1, gp.MAX_SLOTS):
            self.assertEqual(p.add_slot("scratch", 8), s)
        self.assertEqual(p.slot(1), ("scratch", False, 8))
        self.expect(lambda: p.add_slot("scratch", 8), "RESOURCE_EXHAUSTED",
                    f"slot {gp.MAX_SLOTS}: over the limit of {gp.MAX_SLOTS} slots")

    def test_bad_launches(self):
        p = small()
        self.expect(lambda: p.add_launch(ANY_MODULE, "", 1, 32), "INVALID_ARGUMENT",
                    "step 1 (launch): the function name is empty")
        self.expect(lambda: p.add_launch(ANY_MODULE, "a" * 256, 1, 32), "RESOURCE_EXHAUSTED",
                    "step 1 (launch): the function name is longer than 255 bytes")
        self.assertEqual(p.add_launch(ANY_MODULE, "a" * 255, 1, 32), 1)
        self.expect(lambda: p.add_launch(ANY_MODULE, "bad name", 1, 32), "INVALID_ARGUMENT",
                    "step 2 (launch): the function name has a byte 0x20 that is not printable ASCII")
        self.expect(lambda: p.add_launch(ANY_MODULE, b"bad\x80", 1, 32), "INVALID_ARGUMENT",
                    "byte 0x80 that is not printable ASCII")
        self.expect(lambda: p.add_launch(b"short", "k", 1, 32), "INVALID_ARGUMENT",
                    "the module id is 5 bytes; it must be 32")
        for grid, block, needle in (
                ((0, 1, 1), 32, "step 2 (launch k): grid.x is 0; it must be 1 to 2147483647"),
                ((0x80000000,), 32, "grid.x is 2147483648; it must be 1 to 2147483647"),
                ((1, 65536), 32, "grid.y is 65536; it must be 1 to 65535"),
                ((1, 1, 0), 32, "grid.z is 0; it must be 1 to 65535"),
                (1, 1025, "block.x is 1025; it must be 1 to 1024"),
                (1, (1, 0, 1), "block.y is 0; it must be 1 to 1024"),
                (1, (1, 1, 65), "block.z is 65; it must be 1 to 64"),
                (1, (32, 32, 2), "step 2 (launch k): block has 2048 threads; the limit is 1024")):
            self.expect(lambda: p.add_launch(ANY_MODULE, "k", grid, block), "INVALID_ARGUMENT", needle)
        self.expect(lambda: p.add_launch(ANY_MODULE, "k", 1, 32, gp.MAX_SHARED_BYTES + 1), "RESOURCE_EXHAUSTED",
                    "232449 bytes of dynamic shared memory is over the limit of 232448")
        self.assertEqual(p.add_launch(ANY_MODULE.hex(), "k", (0x7FFFFFFF, 65535, 65535), (16, 1, 64),
                                      gp.MAX_SHARED_BYTES), 2)

    def test_bad_memsets_and_copies(self):
        p = small()
        self.expect(lambda: p.add_memset(0, 0, 16, 3, 0), "INVALID_ARGUMENT",
                    "step 1 (memset): element_size 3 is not 1, 2 or 4")
        self.expect(lambda: p.add_memset(0, 2, 16, 4, 0), "INVALID_ARGUMENT",
                    "step 1 (memset): offset 2 and bytes 16 must be multiples of the element size 4")
        self.expect(lambda: p.add_memset(0, 0, 0, 1, 0), "INVALID_ARGUMENT", "bytes non-zero")
        self.expect(lambda: p.add_memset(0, 0, 16, 1, 0x100), "INVALID_ARGUMENT",
                    "step 1 (memset): value 0x100 does not fit in 1 byte(s)")
        self.expect(lambda: p.add_memset(0, 0, 16, 2, 0x10000), "INVALID_ARGUMENT", "value 0x10000 does not fit in 2")
        self.expect(lambda: p.add_memset(2, 0, 16, 1, 0), "INVALID_ARGUMENT",
                    "step 1 (memset): slot 2 does not exist; there are 2 slots")
        self.expect(lambda: p.add_memset(1, 128, 132, 4, 0), "INVALID_ARGUMENT",
                    "step 1 (memset): 132 bytes at offset 128 are outside slot 1, which has 256")
        self.assertEqual(p.add_memset(1, 128, 128, 4, 0xFFFFFFFF), 1)
        self.expect(lambda: p.add_copy(1, 0, 0, 0, 0), "INVALID_ARGUMENT", "step 2 (copy): bytes is 0")
        self.expect(lambda: p.add_copy(1, 200, 0, 0, 57), "INVALID_ARGUMENT",
                    "step 2 (copy): 57 bytes at offset 200 are outside slot 1, which has 256")
        self.expect(lambda: p.add_copy(1, 0, 0, 255, 2), "INVALID_ARGUMENT",
                    "2 bytes at offset 255 are outside slot 0")
        self.expect(lambda: p.add_copy(1, 0, 9, 0, 2), "INVALID_ARGUMENT",
                    "step 2 (copy): slot 9 does not exist; there are 2 slots")
        self.expect(lambda: p.add_copy(0, 64, 0, 0, 65), "INVALID_ARGUMENT",
                    "step 2 (copy): source and destination overlap in slot 0")
        self.expect(lambda: p.add_copy(0, 0, 0, 64, 65), "INVALID_ARGUMENT", "overlap in slot 0")
        self.assertEqual(p.add_copy(0, 64, 0, 0, 64), 2)

    def test_cap_on_steps(self):
        p = small()
        for i in range(1, gp.MAX_STEPS):
            p.add_memset(0, 0, 4, 4, i)
        self.expect(lambda: p.add_memset(0, 0, 4, 4, 0), "RESOURCE_EXHAUSTED",
                    f"step {gp.MAX_STEPS} (memset): over the limit of {gp.MAX_STEPS} steps")
        self.expect(lambda: p.add_launch(ANY_MODULE, "k", 1, 32), "RESOURCE_EXHAUSTED",
                    f"over the limit of {gp.MAX_STEPS} steps")
        p.finish()  # MAX_STEPS steps is allowed

    def test_finish_refuses_an_empty_program_and_a_bad_mode(self):
        self.expect(lambda: Program().finish(), "INVALID_ARGUMENT", "the program has no steps")
        self.expect(lambda: Program("bogus"), "INVALID_ARGUMENT",
                    "mode 'bogus' is not staged (0), staged_ex (1), direct (2) or auto (3)")
        self.expect(lambda: Program(4), "INVALID_ARGUMENT", "mode 4 is not staged (0), staged_ex (1), direct (2) or auto (3)")

    def test_validator_backstop_has_the_daemons_messages(self):
        # Structures the builder cannot make, handed to validate() directly.
        l = gp._Launch(ANY_MODULE, b"k", (1, 1, 1), (1, 1, 1), 0)
        l.params, l.data = [(0, 4)], bytearray(b"\0\0\0\0\1")
        self.expect(lambda: gp.validate(0, [(0, 1, 8)], [l]), "INVALID_ARGUMENT",
                    "step 0 (launch k): 5 parameter bytes, but the parameters end at byte 4")
        l.params, l.data = [(0, 4), (8, 4)], bytearray(b"\0\0\0\0\1\0\0\0\0\0\0\0")
        self.expect(lambda: gp.validate(0, [(0, 1, 8)], [l]), "INVALID_ARGUMENT",
                    "step 0 (launch k): padding byte 4 between parameters must be zero")
        l.params, l.data, l.patches = [(0, 8)], bytearray(b"\1" + bytes(7)), [(0, 0, 0)]
        self.expect(lambda: gp.validate(0, [(0, 1, 8)], [l]), "INVALID_ARGUMENT",
                    "the 8 parameter bytes under the patch at offset 0 must be zero")
        self.expect(lambda: gp.validate(0, [(3, 1, 8)], [l]), "INVALID_ARGUMENT",
                    "slot 0: a scratch slot belongs to graphd and cannot be staged")
        self.expect(lambda: gp.validate(0, [(4, 1, 8)], [l]), "INVALID_ARGUMENT",
                    "slot 0: a temp slot belongs to graphd and cannot be staged")
        self.expect(lambda: gp.validate(0, [(0, 2, 8)], [l]), "INVALID_ARGUMENT", "slot 0: unknown flags 0x2")


# A loop around a memset, then a branch with one step on each side, over an
# inout slot of 64 bytes; derived by hand from docs/protocol.md ("While
# body", "If body").
COND_HEX = (
    "47445047 01000000 00000000 01000000 05000000"
    "02000000 01000000 4000000000000000"
    "04000000 00000000 0000000000000000 01000000"
    "02000000 00000000 04000000 00000000 0800000000000000 0800000000000000"
    "05000000 00000000 0400000000000000 01000000 01000000"
    "02000000 00000000 04000000 01000000 1000000000000000 0800000000000000"
    "02000000 00000000 04000000 02000000 1800000000000000 0800000000000000"
)


def cond_program():
    p = Program()
    p.add_slot("inout", 64)
    return p


class ConditionalTest(unittest.TestCase):
    expect = ErrorsTest.expect

    def test_encoding_is_the_hand_derived_one(self):
        p = cond_program()
        w = p.begin_while(0, 0)
        self.assertEqual(w, 0)
        self.assertEqual(p.add_memset(0, 8, 8, 4, 0), 1)
        self.assertIsNone(p.end(w))
        b = p.begin_if(0, 4)
        self.assertEqual(b, 2)
        p.add_memset(0, 16, 8, 4, 1)
        self.assertIsNone(p.else_(b))
        p.add_memset(0, 24, 8, 4, 2)
        p.end(b)
        enc, pid = p.finish()
        want = bytes.fromhex(COND_HEX.replace(" ", ""))
        self.assertEqual(len(want), 20 + 16 + 20 + 32 + 24 + 32 + 32)
        self.assertEqual(enc.hex(), want.hex())
        self.assertEqual(pid, hashlib.sha256(want).digest())
        steps = p._steps
        self.assertEqual([s.kind for s in steps], [gp.STEP_WHILE, gp.STEP_MEMSET, gp.STEP_IF, gp.STEP_MEMSET,
                                                   gp.STEP_MEMSET])
        self.assertEqual((steps[0].body, steps[0].orelse), (1, 0))
        self.assertEqual((steps[2].body, steps[2].orelse), (1, 1))

    def test_nested_counts(self):
        # The C builder's test: a loop holding a memset and a branch with
        # one step, then an else of two; one step after the loop.
        p = cond_program()
        w = p.begin_while(0, 0)
        p.add_memset(0, 8, 8, 4, 0)
        b = p.begin_if(0, 4)
        p.add_memset(0, 16, 8, 4, 1)
        p.else_(b)
        p.add_memset(0, 24, 8, 4, 2)
        p.add_memset(0, 32, 8, 4, 3)
        p.end(b)
        self.expect(p.finish, "INVALID_ARGUMENT", "step 0 (while) is not ended")
        p.end(w)
        p.add_memset(0, 40, 8, 4, 4)
        p.finish()
        s = p._steps
        self.assertEqual((s[0].body, s[0].orelse, s[2].body, s[2].orelse, len(s)), (5, 0, 1, 2, 7))

    def test_if_without_then_steps_and_without_else(self):
        p = cond_program()
        b = p.begin_if(0, 0)
        p.else_(b)
        p.add_memset(0, 8, 8, 4, 0)
        p.end(b)
        b2 = p.begin_if(0, 60)
        p.add_memset(0, 8, 8, 4, 1)
        p.end(b2)
        p.finish()
        s = p._steps
        self.assertEqual([(s[0].body, s[0].orelse), (s[2].body, s[2].orelse)], [(0, 1), (1, 0)])
        self.assertEqual(p.encoding[-28:], struct.pack("<IIIQQ", 0, 4, 1, 8, 8))

    def test_refusals(self):
        p = cond_program()
        self.expect(lambda: p.begin_while(0, 6), "INVALID_ARGUMENT",
                    "step 0 (while): the condition word at offset 6 is not 4-byte aligned")
        self.expect(lambda: p.begin_if(0, 64), "INVALID_ARGUMENT",
                    "step 0 (if): 4 bytes at offset 64 are outside slot 0, which has 64")
        self.expect(lambda: p.begin_if(1, 0), "INVALID_ARGUMENT",
                    "step 0 (if): slot 1 does not exist; there are 1 slots")
        self.assertEqual(p.nsteps, 0)
        w = p.begin_while(0, 0)
        p.add_memset(0, 8, 8, 4, 0)
        b = p.begin_if(0, 4)
        p.add_memset(0, 16, 8, 4, 1)
        self.expect(lambda: p.end(w), "FAILED_PRECONDITION", "end: step 0 is inside step 2, which is not ended yet")
        self.expect(lambda: p.else_(w), "FAILED_PRECONDITION",
                    "else: step 0 is inside step 2, which is not ended yet")
        p.else_(b)
        self.expect(lambda: p.else_(b), "FAILED_PRECONDITION", "else: step 2 is not a branch before its else")
        p.end(b)
        self.expect(lambda: p.end(b), "FAILED_PRECONDITION", "end: step 2 is ended already")
        self.expect(lambda: p.end(1), "INVALID_ARGUMENT", "end: step 1 is not a loop or a branch")
        self.expect(lambda: p.end(9), "INVALID_ARGUMENT", "end: step 9 is not a loop or a branch")
        self.expect(lambda: p.else_(w), "FAILED_PRECONDITION", "else: step 0 is not a branch before its else")
        self.expect(lambda: p.param(0, 0, b"x"), "INVALID_ARGUMENT", "step 0 (while): only a launch has parameters")
        p.end(w)
        p.finish()
        self.expect(lambda: p.begin_while(0, 0), "FAILED_PRECONDITION", "the program is finished")
        self.expect(lambda: p.end(0), "FAILED_PRECONDITION", "the program is finished")

    def test_empty_bodies_are_refused_at_finish(self):
        p = cond_program()
        p.end(p.begin_while(0, 0))
        self.expect(p.finish, "INVALID_ARGUMENT",
                    "step 0 (while): the body must have at least one step and there is no else")
        p = cond_program()
        b = p.begin_if(0, 0)
        p.else_(b)
        p.end(b)
        self.expect(p.finish, "INVALID_ARGUMENT", "step 0 (if): both branches are empty")

    def test_nesting_depth(self):
        def nested(depth):
            p = cond_program()
            opened = [p.begin_if(0, 0) if d % 2 else p.begin_while(0, 0) for d in range(depth)]
            p.add_memset(0, 8, 8, 4, 0)
            for s in reversed(opened):
                p.end(s)
            return p
        nested(gp.MAX_COND_DEPTH).finish()
        self.expect(nested(gp.MAX_COND_DEPTH + 1).finish, "RESOURCE_EXHAUSTED",
                    f"step {gp.MAX_COND_DEPTH}: conditional steps nest more than {gp.MAX_COND_DEPTH} deep")

    def test_validator_backstop(self):
        def m():
            return gp._Memset(0, 4, 0, 0, 4)

        def cond(kind, body, orelse, slot=0, offset=0):
            c = gp._Cond(kind, slot, offset)
            c.body, c.orelse = body, orelse
            return c
        slots = [(2, 1, 64)]
        self.expect(lambda: gp.validate(0, slots, [cond(gp.STEP_WHILE, 2, 0), m()]), "INVALID_ARGUMENT",
                    "step 0 (while): its 2 steps run past the end of the program")
        self.expect(lambda: gp.validate(0, slots, [cond(gp.STEP_IF, 2, 0), cond(gp.STEP_WHILE, 2, 0), m(), m()]),
                    "INVALID_ARGUMENT", "step 1 (while): its 2 steps run past the end of the enclosing branch")
        self.expect(lambda: gp.validate(0, slots, [cond(gp.STEP_WHILE, 1, 1), m(), m()]), "INVALID_ARGUMENT",
                    "step 0 (while): the body must have at least one step and there is no else")
        self.expect(lambda: gp.validate(0, slots, [cond(gp.STEP_IF, 1, 0, offset=62), m()]), "INVALID_ARGUMENT",
                    "step 0 (if): the condition word at offset 62 is not 4-byte aligned")
        self.expect(lambda: gp.validate(0, slots, [cond(gp.STEP_IF, 1, 0, offset=64), m()]), "INVALID_ARGUMENT",
                    "step 0 (if): bytes 64..68 are outside slot 0, which has 64")
        bad = m()
        bad.kind = 9
        self.expect(lambda: gp.validate(0, slots, [bad]), "INVALID_ARGUMENT",
                    "step 0: kind 9 is not launch, memset, copy, while or if")
        gp.validate(0, slots, [cond(gp.STEP_IF, 0, 1), m()])


if __name__ == "__main__":
    unittest.main()
