"""Client.replay_arrays(program, *arrays) on the host backend, with small arrays
that expose __cuda_array_interface__ or DLPack over graphd_host_alloc
memory (no framework, no numpy): bit-exact results, arrays checked against
their slots (size, dtype, contiguity, writability), views at an offset,
the stream each protocol names, and regions unregistered when the arrays
bound in them are gone."""

import ctypes
import gc
import os
import shutil
import struct
import subprocess
import tempfile
import time
import unittest

import graphd
from graphd import Client, GraphdError, Program, Slot, f32, u32
from graphd import arrays as garrays
from graphd._bind import Binder

import _env

N = 1024  # floats per array

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DLTENSOR = b"dltensor"
_DLTENSOR_VERSIONED = b"dltensor_versioned"


class CAIArray:
    """A 1-D (or given shape) array over `nbytes` at `ptr` with a
    __cuda_array_interface__; keeps `owner` (a HostBuffer) alive."""

    def __init__(self, owner, ptr, shape, typestr="<f4", strides=None, version=3, stream=None,
                 readonly=False):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, readonly), "strides": strides,
                                         "version": version}
        if version >= 3:
            self.__cuda_array_interface__["stream"] = stream


class DLArray:
    """The same through DLPack: __dlpack__ returns a capsule over a
    DLManagedTensor built here (legacy, or versioned with flags)."""

    def __init__(self, owner, ptr, shape, code=2, bits=32, strides=None, device=(1, 0),
                 versioned=False, readonly=False, byte_offset=0):
        self.owner = owner
        self.device = device
        self.calls = []
        nd = len(shape)
        self._shape = (ctypes.c_int64 * nd)(*shape)
        self._strides = (ctypes.c_int64 * nd)(*strides) if strides else None
        t = garrays._DLTensor()
        t.data = ptr - byte_offset
        t.byte_offset = byte_offset
        t.device = garrays._DLDevice(*device)
        t.ndim = nd
        t.dtype = garrays._DLDataType(code, bits, 1)
        t.shape = self._shape
        t.strides = self._strides
        if versioned:
            self._m = garrays._DLManagedTensorVersioned()
            self._m.version = garrays._DLPackVersion(1, 0)
            self._m.flags = 1 if readonly else 0
            self._name = _DLTENSOR_VERSIONED
        else:
            self._m = garrays._DLManagedTensor()
            self._name = _DLTENSOR
        self._m.dl_tensor = t

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        return _new_capsule(ctypes.addressof(self._m), self._name, None)


class Slotted:
    """An array that takes no weak reference."""

    __slots__ = ("owner", "__cuda_array_interface__")

    def __init__(self, owner, ptr, n):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False),
                                         "version": 2}


def floats(buf, off, n):
    return struct.unpack_from(f"<{n}f", buf.view, off)


def fill(buf, off, values):
    struct.pack_into(f"<{len(values)}f", buf.view, off, *values)


class DescribeTest(unittest.TestCase):
    """The protocols, read without a daemon."""

    def setUp(self):
        self.mem = (ctypes.c_float * 64)()
        self.ptr = ctypes.addressof(self.mem)

    def test_dtype_names_agree_across_spellings(self):
        for s in ("float32", "<f4", "f4", "float"):
            self.assertEqual(garrays.dtype_name(s), "float32")
        self.assertEqual(garrays.dtype_name("|b1"), "bool")
        self.assertEqual(garrays.dtype_name("<i8"), "int64")
        self.assertEqual(garrays.dtype_name("bfloat16"), "bfloat16")

    def test_dlpack_cuda_array_is_given_the_consumers_stream(self):
        a = DLArray(None, self.ptr, (64,), device=(2, 0))
        garrays.describe(a, stream=0x5000)
        garrays.describe(a, stream=None)
        garrays.describe(a, stream=0)
        # A stream handle as is; the default stream as the legacy one (1).
        self.assertEqual(a.calls, [{"stream": 0x5000}, {"stream": 1}, {"stream": 1}])

    def test_dlpack_cpu_array_is_given_no_stream(self):
        a = DLArray(None, self.ptr, (64,))
        garrays.describe(a, stream=0x5000)
        self.assertEqual(a.calls, [{}])

    def test_a_cpu_tensor_asks_its_framework_for_no_stream(self):
        # A stand-in for torch whose current_stream refuses a CPU device,
        # as PyTorch's does: asking it would hide graphd's own refusal.
        import sys
        import types
        from graphd._bind import framework_stream

        fake = types.ModuleType("torch")

        def current_stream(device):
            raise ValueError(f"Expected a cuda device, but got: {device}")

        fake.cuda = types.SimpleNamespace(current_stream=current_stream)
        tensor = type("Tensor", (), {"__module__": "torch", "device": "cpu", "is_cuda": False})
        saved = sys.modules.get("torch")
        sys.modules["torch"] = fake
        try:
            self.assertIsNone(framework_stream(tensor()))
            tensor.is_cuda, tensor.device = True, "cuda:0"
            with self.assertRaisesRegex(ValueError, "cuda:0"):
                framework_stream(tensor())
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved

    def test_dlpack_address_adds_the_byte_offset(self):
        info = garrays.describe(DLArray(None, self.ptr + 16, (8,), byte_offset=16))
        self.assertEqual((info.ptr, info.nbytes, info.dtype), (self.ptr + 16, 32, "float32"))

    def test_axes_of_length_one_may_have_any_stride(self):
        info = garrays.describe(CAIArray(None, self.ptr, (4, 1, 8), strides=(32, 999, 4)))
        self.assertEqual(info.nbytes, 128)
        info = garrays.describe(DLArray(None, self.ptr, (1, 8), strides=(77, 1)))
        self.assertEqual(info.nbytes, 32)

    def test_transposed_arrays_are_refused(self):
        with self.assertRaisesRegex(GraphdError, "not contiguous"):
            garrays.describe(CAIArray(None, self.ptr, (4, 8), strides=(4, 16)))
        with self.assertRaisesRegex(GraphdError, "not contiguous"):
            garrays.describe(DLArray(None, self.ptr, (4, 8), strides=(1, 4)))

    def test_cai_stream_zero_is_refused_and_one_and_two_are_kept(self):
        with self.assertRaisesRegex(GraphdError, "stream 0"):
            garrays.describe(CAIArray(None, self.ptr, (8,), stream=0))
        self.assertEqual(garrays.describe(CAIArray(None, self.ptr, (8,), stream=1)).stream, 1)
        self.assertEqual(garrays.describe(CAIArray(None, self.ptr, (8,), stream=2)).stream, 2)
        # Version 2 has no stream key: nothing to wait for.
        self.assertIsNone(garrays.describe(CAIArray(None, self.ptr, (8,), version=2)).stream)

    def test_an_object_with_no_protocol_is_refused(self):
        with self.assertRaisesRegex(GraphdError, "neither __cuda_array_interface__ nor __dlpack__"):
            garrays.describe(b"1234")

    def test_replay_stream_comes_from_the_interface_when_nothing_else_names_one(self):
        b = Binder(None)
        a = CAIArray(None, self.ptr, (8,), stream=0x7000)
        self.assertEqual(b._replay_stream(None, [a], host=False), 0x7000)

        class CupyStream:
            ptr = 0x9000
        self.assertEqual(b._replay_stream(CupyStream(), [a], host=False), 0x9000)
        self.assertEqual(b._replay_stream(2, [a], host=False), 2)
        self.assertIsNone(b._replay_stream(None, [CAIArray(None, self.ptr, (8,), version=2)],
                                           host=False))


class RegionLifetimeTest(unittest.TestCase):
    """The Binder's region table alone, with a stand-in client."""

    class Client:
        _h = 1

        def __init__(self):
            self.unregistered = []

        def region_unregister(self, rid):
            self.unregistered.append(rid)

    def setUp(self):
        self.mem = (ctypes.c_float * 8)()
        self.c = self.Client()
        self.b = Binder(self.c)

    def array(self):
        return CAIArray(None, ctypes.addressof(self.mem), (8,))

    def test_an_array_gone_while_the_lock_is_held_is_let_go_when_it_is_free(self):
        from graphd._bind import HELD
        a = self.array()
        self.assertEqual(self.b._hold(5, a), HELD)
        with self.b._lock:  # as when the garbage collector runs inside a section
            del a
            self.assertEqual(self.c.unregistered, [])
        self.assertEqual(self.b.held_regions(), [])
        self.assertEqual(self.c.unregistered, [5])

    def test_a_hold_racing_the_release_of_its_region_is_told_to_register_again(self):
        from graphd._bind import HELD, STALE
        a = self.array()
        self.b._hold(7, a)
        del a
        self.assertEqual(self.c.unregistered, [7])
        keep = self.array()
        self.assertEqual(self.b._hold(7, keep), STALE)  # registered before, let go since
        self.assertEqual(self.b._hold(8, keep), HELD)
        self.assertEqual(self.b.held_regions(), [8])


class HostArraysTest(unittest.TestCase):
    def setUp(self):
        graphd_bin = _env.path(self, "GRAPHD_BIN")
        _env.path(self, "GRAPHD_LIB")
        kernels = _env.path(self, "GRAPHD_HOST_KERNELS")
        self.dir = tempfile.mkdtemp(prefix="graphd-arrays-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        sock = os.path.join(self.dir, "s")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.addCleanup(self.log.close)
        d = subprocess.Popen([graphd_bin, "--backend", "host", "--socket", sock],
                             stdout=self.log, stderr=subprocess.STDOUT)
        self.addCleanup(self._stop, d)
        deadline = time.monotonic() + 20
        while not os.path.exists(sock):
            if d.poll() is not None or time.monotonic() > deadline:
                self.fail(f"graphd did not start: {self._log()}")
            time.sleep(0.02)
        with Client.connect(sock, timeout_ms=20000) as ctl:
            uuid = ctl.status()["devices"][0]["uuid"]
        self.c = Client.connect(sock, device_uuid=uuid, timeout_ms=20000)
        self.addCleanup(self.c.close)
        with open(kernels, "rb") as f:
            self.mod = self.c.register_module("host_elf", f.read())

    def _log(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    @staticmethod
    def _stop(d):
        d.terminate()
        try:
            d.wait(10)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait(10)

    def scale(self, a=3.0, dtype=None):
        p = Program("staged")
        x = p.add_slot("input", 4 * N, dtype=dtype)
        y = p.add_slot("output", 4 * N, dtype=dtype)
        p.launch(self.mod, "scale", N // 256, 256, args=[Slot(x), Slot(y), f32(a), u32(N)])
        return p

    def buffers(self, pad=0):
        xb, yb = self.c.host_alloc(4 * N + 2 * pad), self.c.host_alloc(4 * N + 2 * pad)
        fill(xb, 0, [float(i) - 0.25 for i in range(N + 2 * pad // 4)])
        fill(yb, 0, [-7.0] * (N + 2 * pad // 4))
        return xb, yb

    def test_cai_arrays_replay_bit_exact(self):
        xb, yb = self.buffers()
        x, y = CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,))
        info = self.c.replay_arrays(self.scale(), x, y)
        self.assertTrue(info["captured"])
        want = [3.0 * (float(i) - 0.25) for i in range(N)]
        self.assertEqual(floats(yb, 0, N), tuple(struct.unpack(f"<{N}f", struct.pack(f"<{N}f", *want))))
        self.assertFalse(self.c.replay_arrays(self.scale(), x, y)["captured"])

    def test_dlpack_arrays_replay_bit_exact_legacy_and_versioned(self):
        for versioned in (False, True):
            xb, yb = self.buffers()
            x = DLArray(xb, xb.ptr, (N // 4, 4), versioned=versioned)
            y = DLArray(yb, yb.ptr, (N,), versioned=versioned)
            self.c.replay_arrays(self.scale(a=0.5), x, y)
            self.assertEqual(floats(yb, 0, N), tuple((float(i) - 0.25) * 0.5 for i in range(N)))
            self.assertEqual(x.calls, [{}])  # host arrays: no stream

    def test_an_array_smaller_than_its_slot_is_refused_and_its_neighbours_untouched(self):
        xb, yb = self.buffers()
        x = CAIArray(xb, xb.ptr, (N,))
        y = CAIArray(yb, yb.ptr, (N // 2,))  # the slot is N floats: the rest is a neighbour's
        with self.assertRaisesRegex(GraphdError, r"slot 1, output\) is 2048 bytes .* the slot is "
                                    r"4096 bytes") as e:
            self.c.replay_arrays(self.scale(), x, y)
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertEqual(floats(yb, 0, N), (-7.0,) * N)
        with self.assertRaisesRegex(GraphdError, "is 8192 bytes"):
            self.c.replay_arrays(self.scale(), x, CAIArray(yb, yb.ptr, (2 * N,)))

    def test_a_view_at_an_offset_binds_exactly_its_bytes(self):
        pad = 64  # bytes before and after each view
        xb, yb = self.buffers(pad=pad)
        x = DLArray(xb, xb.ptr + pad, (N,))
        y = CAIArray(yb, yb.ptr + pad, (N,))
        self.c.replay_arrays(self.scale(a=2.0), x, y)
        out = floats(yb, 0, N + pad // 2)
        self.assertEqual(out[:pad // 4], (-7.0,) * (pad // 4))
        self.assertEqual(out[pad // 4:pad // 4 + N],
                         tuple(2.0 * (float(i) - 0.25) for i in range(pad // 4, pad // 4 + N)))
        self.assertEqual(out[pad // 4 + N:], (-7.0,) * (pad // 4))

    def test_slot_dtype_and_writability_are_checked(self):
        xb, yb = self.buffers()
        p = self.scale(dtype="float32")
        with self.assertRaisesRegex(GraphdError, "is int32, but the slot holds float32"):
            self.c.replay_arrays(p, CAIArray(xb, xb.ptr, (N,), typestr="<i4"), CAIArray(yb, yb.ptr, (N,)))
        with self.assertRaisesRegex(GraphdError, "read-only, but the program writes"):
            self.c.replay_arrays(p, CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,), readonly=True))
        with self.assertRaisesRegex(GraphdError, "read-only, but the program writes"):
            self.c.replay_arrays(p, CAIArray(xb, xb.ptr, (N,)),
                          DLArray(yb, yb.ptr, (N,), versioned=True, readonly=True))
        # A read-only input is fine.
        self.c.replay_arrays(p, CAIArray(xb, xb.ptr, (N,), readonly=True), CAIArray(yb, yb.ptr, (N,)))
        self.assertEqual(floats(yb, 0, 1), (3.0 * -0.25,))

    def test_device_count_and_stream_mismatches_are_refused(self):
        xb, yb = self.buffers()
        x, y = CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,))
        with self.assertRaisesRegex(GraphdError, "on a CUDA device, but this session's device is a host"):
            self.c.replay_arrays(self.scale(), DLArray(xb, xb.ptr, (N,), device=(2, 0)), y)
        with self.assertRaisesRegex(GraphdError, "binds 2 slots .* but 1 arrays"):
            self.c.replay_arrays(self.scale(), x)
        with self.assertRaisesRegex(GraphdError, "takes no CUDA stream"):
            self.c.replay_arrays(self.scale(), x, y, stream=0x1234)
        with self.assertRaisesRegex(GraphdError, "not contiguous"):
            self.c.replay_arrays(self.scale(), CAIArray(xb, xb.ptr, (N // 2, 2), strides=(4, 2048)), y)
        # The dict form names the slots.
        self.c.replay_arrays(self.scale(), {1: y, 0: x})
        self.assertEqual(floats(yb, 4, 1), (3.0 * 0.75,))

    def test_a_region_is_unregistered_when_the_arrays_bound_in_it_are_gone(self):
        xb, yb = self.buffers()
        x = CAIArray(xb, xb.ptr, (N,))
        x2 = DLArray(xb, xb.ptr, (N,))  # the same region as x
        y = CAIArray(yb, yb.ptr, (N,))
        p = self.scale()
        self.c.replay_arrays(p, x, y)
        self.c.replay_arrays(p, x2, y)
        self.assertEqual(self.c.region_count(), 2)
        self.assertEqual(len(self.c.held_regions()), 2)
        del x
        gc.collect()
        self.assertEqual(self.c.region_count(), 2)  # x2 still holds the region
        del x2
        self.assertEqual(self.c.region_count(), 1)
        del y
        self.assertEqual(self.c.region_count(), 0)
        self.assertEqual(self.c.held_regions(), [])
        # Bound again, the memory registers again and replays right.
        self.c.replay_arrays(p, CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,)))
        self.assertEqual(floats(yb, 0, 2), (3.0 * -0.25, 3.0 * 0.75))

    def test_a_view_holds_its_region_for_as_long_as_its_base_lives(self):
        xb, yb = self.buffers()
        xbase, ybase = CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,))
        x, y = CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,))
        x.base, y.base = xbase, ybase  # as CuPy's and NumPy's views say it
        self.c.replay_arrays(self.scale(), x, y)
        del x, y  # views made for the call
        self.assertEqual(self.c.region_count(), 2)
        del xbase
        self.assertEqual(self.c.region_count(), 1)
        del ybase
        self.assertEqual(self.c.region_count(), 0)

    def test_an_array_without_weak_references_holds_no_region_after_the_replay(self):
        xb, yb = self.buffers()
        x, y = Slotted(xb, xb.ptr, N), Slotted(yb, yb.ptr, N)
        self.c.replay_arrays(self.scale(), x, y)
        self.assertEqual(self.c.region_count(), 0)
        self.assertEqual(floats(yb, 4, 1), (3.0 * 0.75,))

    def test_memory_freed_and_allocated_again_replays_into_the_new_memory(self):
        p = self.scale()
        xb, yb = self.buffers()
        self.c.replay_arrays(p, CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,)))
        yb.free()  # the array bound to it is gone already
        yb2 = self.c.host_alloc(4 * N)
        fill(yb2, 0, [0.0] * N)
        y2 = CAIArray(yb2, yb2.ptr, (N,))
        self.c.replay_arrays(p, CAIArray(xb, xb.ptr, (N,)), y2)
        self.assertEqual(floats(yb2, 0, 2), (3.0 * -0.25, 3.0 * 0.75))

    def test_replay_arrays_and_replay_bindings_each_take_their_form(self):
        xb, yb = self.buffers()
        p = self.scale()
        pid = self.c.register_program(p)
        s = self.c.stream_attach()
        self.c.replay_bindings(s, pid, [(0, xb, 4 * N), (1, yb.ptr, 4 * N)])
        self.assertEqual(floats(yb, 4, 1), (3.0 * 0.75,))
        # Each refuses the other's arguments, naming the one that takes them.
        with self.assertRaisesRegex(GraphdError, "takes a graphd.Program.*replay_bindings"):
            self.c.replay_arrays(pid, CAIArray(xb, xb.ptr, (N,)))
        with self.assertRaisesRegex(GraphdError, "takes a graphd Stream.*replay_arrays"):
            self.c.replay_bindings(p, pid, [(0, xb, 4 * N), (1, yb.ptr, 4 * N)])
        with self.assertRaisesRegex(GraphdError, r"binding 1 is \(1, \d+\), not \(slot, ptr, nbytes\)"):
            self.c.replay_bindings(s, pid, [(0, xb, 4 * N), (1, yb.ptr)])
        with self.assertRaisesRegex(GraphdError, r"binding 0 is .*, not \(slot, ptr, nbytes\) with ptr an int"):
            self.c.replay_bindings(s, pid, [(0, "x", 4 * N)])

    def test_replay_is_still_both_told_apart_by_the_first_argument(self):
        # The old spelling: a Stream first is replay_bindings, anything
        # else replay_arrays (stream= included).
        xb, yb = self.buffers()
        p = self.scale()
        pid = self.c.register_program(p)
        s = self.c.stream_attach()
        self.c.replay(s, pid, [(0, xb, 4 * N), (1, yb.ptr, 4 * N)])
        self.assertEqual(floats(yb, 4, 1), (3.0 * 0.75,))
        info = self.c.replay(self.scale(a=2.0), CAIArray(xb, xb.ptr, (N,)), CAIArray(yb, yb.ptr, (N,)), stream=None)
        self.assertEqual(floats(yb, 4, 1), (2.0 * 0.75,))
        self.assertEqual(set(info), {"captured", "capture_ns", "server_ns"})
        with self.assertRaisesRegex(GraphdError, "takes a graphd.Program"):
            self.c.replay(pid, CAIArray(xb, xb.ptr, (N,)))
        with self.assertRaisesRegex(GraphdError, "takes three arguments; the Stream is the first"):
            self.c.replay(s, pid)

if __name__ == "__main__":
    unittest.main()
