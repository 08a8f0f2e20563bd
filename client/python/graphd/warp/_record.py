"""Recording what a Warp function does, without a GPU.

The function runs once on Warp's "cpu" device with arrays of the right
shapes whose memory is reserved but never touched (anonymous mappings with
MAP_NORESERVE: no physical memory is used until a page is written, and
nothing here writes them). While it runs:

- wp.launch (and Warp's own internal calls to it) is replaced by a recorder
  that packs the kernel's parameters with Warp's own packing code, exactly
  as a CUDA launch would pass them, and runs nothing;
- the CPU device's allocator hands out reserved memory and notes every
  allocation (each becomes a daemon-owned temp slot);
- the CPU device's memset and memtile (array.zero_, fill_, wp.zeros) and
  the native host-to-host copy (wp.copy) are recorded as steps instead of
  being run;
- wp.capture_while and wp.capture_if become loops and branches: their
  callbacks run once each, while the recorder collects what they launch
  as the loop body or the branch's sides, over the int32 that the
  condition array's pointer (its first element) points at;
- everything else that would run work or read values on the host is
  refused: other native host functions (scans, sorts, mesh builds,
  non-contiguous copies and fills), reading values (array.numpy(),
  .list(), numpy conversion), synchronisation, graph capture inside the
  function and capture_pause/resume (host code between graph parts);
- Warp's native functions that work on a CUDA device at once (the refit
  of a BVH or mesh made before the calls, sorts, scans) are refused too:
  they would run once, while recording, and never when the program
  replays.

Everything is put back when the function returns or raises. Recording
holds a process-wide lock: two recordings never overlap, and other threads
should not use Warp's CPU device meanwhile."""

import ctypes
import mmap
import sys
import threading

from ._params import pack_launch, warp_arrays
from ._steps import Buffer, CondRec, CopyRec, MemsetRec, resolve_block_dim
from ._support import Refused, warp_modules

_LOCK = threading.RLock()

# --- reserved memory -----------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _reserve(nbytes):
    """Address of nbytes of zero-filled memory that costs nothing until
    touched."""
    n = max(int(nbytes), 1)
    p = _libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE,
                   mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
    if p is None or p == _MAP_FAILED:
        raise MemoryError(f"cannot reserve {n} bytes of address space for recording")
    return p


def _release(ptr, nbytes):
    _libc.munmap(ptr, max(int(nbytes), 1))


# --- Warp arrays' memory ---------------------------------------------------------


def array_extent(arr):
    """(address, bytes) of the memory a Warp array's elements span (its
    strides included); (0, 0) for an empty one."""
    _, _, types_mod = warp_modules()
    if not arr.ptr or any(d == 0 for d in arr.shape):
        return 0, 0
    n = types_mod.type_size_in_bytes(arr.dtype)
    for d, st in zip(arr.shape, arr.strides):
        n += (d - 1) * st
    return int(arr.ptr), int(n)


# --- the recorder ----------------------------------------------------------------


# Reserved memory handed out by recordings and still mapped ({address:
# bytes}): an array made by an earlier recording (cached across calls) is
# never a fixed buffer.
_RESERVED: dict = {}


class _Allocator:
    """The CPU device's allocator while recording."""

    deallocate_requires_context_guard = False

    def __init__(self, rec, kind):
        self.rec = rec
        self.memory_kind = kind
        self.live = {}

    def allocate(self, nbytes):
        p = _reserve(nbytes)
        self.live[p] = nbytes
        _RESERVED[p] = int(nbytes)
        self.rec.buffers.append(Buffer(p, int(nbytes), alloc=self.rec.allocs, what="an array allocated inside the function"))
        self.rec.allocs += 1
        return p

    def deallocate(self, ptr, nbytes):
        n = self.live.pop(ptr, None)
        _RESERVED.pop(ptr, None)
        if n is not None:
            for b in self.rec.buffers:
                if b.alloc is not None and b.alive and b.base == ptr:
                    b.alive = False
            _release(ptr, n)


def _refuser(reason, text):
    def refuse(*args, **kwargs):
        raise Refused(reason, text)
    return refuse


# Native host functions that stay usable while recording: memory management
# and queries. Others that do work on the host are refused (see _deny).
_NATIVE_ALLOWED = {"wp_alloc_host", "wp_free_host", "wp_host_compiler_version"}
# Native functions that work on a CUDA device's memory at once: while
# recording they could only reach arrays made outside the function.
_DEVICE_WORK = ("wp_memset_device", "wp_memtile_device", "wp_memcpy_h2d", "wp_memcpy_d2h", "wp_memcpy_d2d",
                "wp_memcpy_peer", "wp_array_copy_device", "wp_array_fill_device")
_NATIVE_TEXT = {
    "wp_array_copy_host": "a copy between non-contiguous arrays (graphd copies contiguous byte ranges; "
                          "copy into a contiguous array with a kernel instead)",
    "wp_array_fill_host": "fill_ on a non-contiguous array (graphd memsets contiguous byte ranges)",
    "wp_cpu_launch_kernel": "a kernel run on the CPU",
}
# Warp's methods behind the native functions that work on a CUDA device at
# once (on a BVH, mesh, volume or hash grid made outside the function: one
# made inside is on the recording's CPU device), for the refusal's text.
_DEVICE_METHOD = {
    "wp_bvh_refit_device": "Bvh.refit",
    "wp_bvh_rebuild_device": "Bvh.rebuild",
    "wp_mesh_refit_device": "Mesh.refit",
    "wp_mesh_set_points_device": "setting Mesh.points",
    "wp_mesh_set_velocities_device": "setting Mesh.velocities",
    "wp_hash_grid_update_device": "HashGrid.build",
    "wp_hash_grid_reserve_device": "HashGrid.reserve",
}


def _native_device_work(name):
    """Whether Warp's native function `name` does work on a CUDA device at
    once (a refit, sort, scan, build...): recorded, it would run then, once,
    and never when the program replays. Memory management, the destruction
    of objects made before (the garbage collector may run them while
    recording) and the wp_cuda_* driver functions are not such work."""
    return ("_device" in name and not name.startswith(("wp_cuda_", "wp_alloc_device", "wp_free_device"))
            and not name.endswith("_destroy_device") and name not in _DEVICE_WORK)


class Recorder:
    """Context manager: patches Warp for the recording and restores it."""

    def __init__(self, rec, func_name, ordinal=0, arch=None):
        self.rec = rec
        self.func_name = func_name
        self.ordinal, self.arch = ordinal, arch
        self.saved = []

    # --- patching ---

    def _patch(self, obj, name, value):
        had = name in vars(obj) if isinstance(obj, type) else hasattr(obj, "__dict__") and name in obj.__dict__
        self.saved.append((obj, name, had, getattr(obj, name, None)))
        setattr(obj, name, value)

    def _restore(self):
        for obj, name, had, old in reversed(self.saved):
            if had:
                setattr(obj, name, old)
            else:
                try:
                    delattr(obj, name)
                except AttributeError:
                    setattr(obj, name, old)
        self.saved.clear()

    def __enter__(self):
        _LOCK.acquire()
        try:
            self._install()
        except BaseException:
            self._restore()
            _LOCK.release()
            raise
        return self

    def __exit__(self, *exc):
        # Allocations still alive stay mapped (they cost address space only)
        # and are unmapped when their arrays go: an array that escaped the
        # function must not point at unmapped memory.
        try:
            self._restore()
        finally:
            _LOCK.release()

    def _install(self):
        wp, ctx, types_mod = warp_modules()
        runtime = ctx.runtime
        cpu = runtime.get_device("cpu")
        self.cpu = cpu
        self.default_alloc = _Allocator(self.rec, getattr(cpu.default_allocator, "memory_kind", None))
        self.pinned_alloc = _Allocator(self.rec, getattr(cpu.pinned_allocator, "memory_kind", None))
        self._patch(cpu, "default_allocator", self.default_alloc)
        self._patch(cpu, "pinned_allocator", self.pinned_alloc)
        self._patch(cpu, "memset", self._memset)
        self._patch(cpu, "memtile", self._memtile)

        core = runtime.core
        for name in _DEVICE_WORK:
            if hasattr(core, name):
                self._patch(core, name, _refuser("unknown_pointer", "the function sets or copies the memory of a "
                                                 "CUDA device itself (zero_, fill_ or wp.copy on an array made "
                                                 "outside the function or on an explicit CUDA device): that would "
                                                 "run now, once, not in the program; pass the array as an argument "
                                                 "or allocate it inside the function"))
        for name in [n for n in vars(core) if n.startswith("wp_")]:
            if name == "wp_memcpy_h2h":
                self._patch(core, name, self._memcpy)
            elif name in ("wp_memset_host", "wp_memtile_host"):
                self._patch(core, name, self._memset if name == "wp_memset_host" else self._memtile)
            elif name in _NATIVE_TEXT or (("_host" in name or "_cpu_" in name) and name not in _NATIVE_ALLOWED
                                         and not name.endswith("_destroy_host")
                                         and not name.startswith("wp_cuda_")):
                text = _NATIVE_TEXT.get(name, f"Warp's native {name}, which does work on the host that "
                                              "graphd cannot record")
                self._patch(core, name, _refuser("native", f"the function calls {text}"))
            elif _native_device_work(name):
                what = f" ({_DEVICE_METHOD[name]})" if name in _DEVICE_METHOD else ""
                self._patch(core, name, _refuser(
                    "native", f"the function calls Warp's native {name}{what}, which works on the GPU at once, "
                    "outside any graph: graphd would run it once, while recording the function, and never when "
                    "the program replays"))

        # The function's own code sees the CUDA device the call is for as
        # the current device (libraries key state by its ordinal); Warp's
        # code, under it, sees the CPU device the recording runs on.
        self.device = RecordingDevice(cpu, self.ordinal, self.arch)
        warp_get_device, runtime_get_device = ctx.get_device, runtime.get_device
        device = self.device

        def get_device(ident=None):
            if ident is device:
                return cpu
            if ident is None and not _from_warp(sys._getframe(1)):
                return device
            return warp_get_device(ident)

        def runtime_get(ident=None):
            return cpu if ident is device else runtime_get_device(ident)

        self._patch(wp, "get_device", get_device)
        self._patch(ctx, "get_device", get_device)
        self._patch(runtime, "get_device", runtime_get)

        launch = self._launch
        self._patch(wp, "launch", launch)
        self._patch(ctx, "launch", launch)
        # wp.launch_tiled resolves its block size for the device it runs on,
        # and on Warp's CPU device that is 1 (unless enable_cpu_blocks): the
        # program needs the size a GPU would get, also for the lane
        # dimension it appends.
        if hasattr(ctx, "_resolve_launch_block_dim"):
            self._patch(ctx, "_resolve_launch_block_dim", _gpu_block_dim)
        # Any real kernel execution path ends in Module.load: a launch that
        # got past the recorder (a reference to wp.launch taken before
        # recording, or a Launch object made earlier) is refused, not run.
        self._patch(ctx.Module, "load", _refuser(
            "unrecorded_launch", "a kernel launch bypassed graphd's recorder (a reference to wp.launch kept "
            "from before, or a Launch object made outside the function); call wp.launch inside the function"))

        sync = ("host_sync", "host synchronisation ({}) inside the function: a graph cannot wait for the host")
        for name in ("synchronize", "synchronize_device", "synchronize_stream", "synchronize_event"):
            r = _refuser(sync[0], sync[1].format(f"wp.{name}"))
            self._patch(wp, name, r)
            self._patch(ctx, name, r)
        for name in ("capture_pause", "capture_resume"):
            r = _refuser("host_callback", f"wp.{name} inside the function: host code between parts of a graph "
                         "is a host callback, which graphd does not replay")
            self._patch(wp, name, r)
            self._patch(ctx, name, r)
        # Warp's own capture_if/capture_while, reached through a reference
        # taken before recording, would read the condition on the host (the
        # reserved memory: zero) and record nothing for the branch or loop.
        # Both ask _get_apic_capture_for_device first: that is where they
        # are stopped.
        stale = {getattr(getattr(ctx, n, None), "__code__", None) for n in ("capture_if", "capture_while")}
        stale.discard(None)
        apic = getattr(ctx, "_get_apic_capture_for_device", None)
        if apic is not None and stale:
            def apic_guard(*args, **kwargs):
                if sys._getframe(1).f_code in stale:
                    raise Refused("conditional", "Warp's capture_if or capture_while was called through a reference "
                                  "taken before recording (for example `from warp import capture_while` at import): "
                                  "it would read the condition on the host; call wp.capture_if / wp.capture_while")
                return apic(*args, **kwargs)
            self._patch(ctx, "_get_apic_capture_for_device", apic_guard)
        for name, ours in (("capture_if", self._capture_if), ("capture_while", self._capture_while)):
            self._patch(wp, name, ours)
            self._patch(ctx, name, ours)
        for name in ("capture_begin", "capture_end", "capture_launch"):
            r = _refuser("nested_capture", f"wp.{name} inside the function: graphd captures the whole function "
                         "itself")
            self._patch(wp, name, r)
            self._patch(ctx, name, r)
        read = _refuser("host_sync", "reading array values on the host (numpy(), list(), print, numpy "
                        "conversion) inside the function: that waits for the GPU, and a launch sequence that "
                        "depends on values cannot be a graph")
        for name in ("numpy", "list", "__array__"):
            if hasattr(types_mod.array, name):
                self._patch(types_mod.array, name, read)
        self._patch(types_mod.array, "__array_interface__", property(read))
        self._patch(types_mod.array, "__cuda_array_interface__", property(_refuser(
            "host_sync", "handing an array to another library inside the function")))

    # --- the recorded operations ---

    def _resolve(self, ptr, nbytes, what, mark=True, outside=None):
        """(buffer, offset) of [ptr, ptr + nbytes). outside: a launch
        argument; a pointer into one of its Warp arrays that the recording
        does not know (made outside the function) becomes a fixed buffer."""
        hit = self.rec.find(ptr, max(int(nbytes), 1))
        if hit is None and outside is not None:
            hit = self._outside(ptr, max(int(nbytes), 1), outside)
        if hit is None:
            raise Refused("unknown_pointer", f"{what} uses memory at 0x{ptr:x} ({nbytes} bytes) that is neither an "
                          "argument of the function, nor allocated inside it, nor a Warp array a launch passes "
                          "(a raw address, host data, or a memset or copy of an array made outside the "
                          "function); pass it as an argument")
        if mark:
            hit[0].used = True
        return hit

    def _outside(self, ptr, nbytes, arg):
        """A fixed buffer for the Warp array of launch argument `arg` made
        outside the function that holds [ptr, ptr + nbytes), or None."""
        for arr in warp_arrays(arg):
            base, size = array_extent(arr)
            if any(r <= base < r + n for r, n in tuple(_RESERVED.items())):  # freed elsewhere meanwhile
                continue
            if base <= ptr and ptr + nbytes <= base + size:
                b = Buffer(base, size, fixed=arr, what=f"a Warp array made outside the function ({arr.device})")
                self.rec.buffers.append(b)
                return b, ptr - base
        return None

    def _memset(self, ptr, value, nbytes):
        nbytes = int(nbytes)
        if nbytes == 0:
            return True
        buf, off = self._resolve(ptr, nbytes, "a memset (zero_, fill_ or wp.zeros)")
        value &= 0xFF
        if off % 4 == 0 and nbytes % 4 == 0:
            self.rec.steps.append(MemsetRec(buf, off, nbytes, 4, value * 0x01010101))
        else:
            self.rec.steps.append(MemsetRec(buf, off, nbytes, 1, value))
        return True

    def _memtile(self, ptr, src, srcsize, count):
        srcsize, count = int(srcsize), int(count)
        nbytes = srcsize * count
        if nbytes == 0:
            return None
        pattern = ctypes.string_at(src, srcsize)
        # The shortest unit of 1, 2 or 4 bytes that the value repeats.
        for es in (1, 2, 4):
            if srcsize % es == 0 and pattern == pattern[:es] * (srcsize // es):
                break
        else:
            raise Refused("fill_value", f"fill_ with a {srcsize}-byte value that does not repeat every 1, 2 or 4 "
                          "bytes: graphd memsets take 1-, 2- or 4-byte elements; fill with a kernel instead")
        buf, off = self._resolve(ptr, nbytes, "fill_")
        if off % es:
            raise Refused("fill_value", f"fill_ at byte {off} of its buffer, not a multiple of its {es}-byte "
                          "element")
        if es == 1 and off % 4 == 0 and nbytes % 4 == 0:
            es, value = 4, pattern[0] * 0x01010101
        else:
            value = int.from_bytes(pattern[:es], "little")
        self.rec.steps.append(MemsetRec(buf, off, nbytes, es, value))
        return None

    def _memcpy(self, dst, src, nbytes):
        nbytes = int(nbytes)
        if nbytes == 0:
            return True
        s = self.rec.find(src, nbytes)
        if s is None:
            raise Refused("host_data", f"a copy of {nbytes} bytes from host memory into an array inside the function "
                          "(wp.array(data=...), assign or wp.copy from a NumPy array): the data would be baked "
                          "into the graph; pass it as an argument")
        d = self._resolve(dst, nbytes, "wp.copy")
        s[0].used = True
        self.rec.steps.append(CopyRec(d[0], d[1], s[0], s[1], nbytes))
        return True

    def _condition(self, condition, call, mark=True):
        """(buffer, offset) of the int32 a conditional step reads: the first
        element of the condition array, as Warp's conditional nodes read it."""
        wp, _, _ = warp_modules()
        if not isinstance(condition, wp.array) or condition.dtype is not wp.int32:
            raise TypeError("Condition must be a Warp array of int32 with a single element")
        if not condition.ptr:
            raise Refused("unknown_pointer", f"the condition of wp.{call} is an empty array: the condition is its "
                          "first element")
        return self._resolve(condition.ptr, 4, f"the condition of wp.{call}", mark=mark)

    def _side(self, fn, call, what, kwargs):
        """The records fn(**kwargs) makes, collected apart from the rest."""
        _, ctx, _ = warp_modules()
        if isinstance(fn, ctx.Graph):
            raise Refused("conditional", f"wp.{call} with a captured wp.Graph as {what}: graphd records the {what} "
                          "from a function; pass the function that launches its work")
        if not callable(fn):
            raise TypeError(f"{what} must be a Callable or a Graph")
        outer = self.rec.steps
        self.rec.steps = []
        try:
            fn(**kwargs)
            return self.rec.steps
        finally:
            self.rec.steps = outer

    def _capture_while(self, condition, while_body, stream=None, **kwargs):
        buf, off = self._condition(condition, "capture_while")
        body = self._side(while_body, "capture_while", "while_body", kwargs)
        if not body:
            raise Refused("conditional", "wp.capture_while: the loop body launches, sets and copies nothing, so "
                          "nothing in it can change the condition: the loop would never end once the condition is "
                          "non-zero")
        self.rec.steps.append(CondRec("while", buf, off, body, []))

    def _capture_if(self, condition, on_true=None, on_false=None, stream=None, **kwargs):
        if on_true is None and on_false is None:
            return  # Warp's no-op
        buf, off = self._condition(condition, "capture_if", mark=False)
        then = self._side(on_true, "capture_if", "on_true", kwargs) if on_true is not None else []
        orelse = self._side(on_false, "capture_if", "on_false", kwargs) if on_false is not None else []
        if then or orelse:  # with nothing on either side there is no step, and the condition is unused
            buf.used = True
            self.rec.steps.append(CondRec("if", buf, off, then, orelse))

    def _launch(self, kernel, dim, inputs=(), outputs=(), adj_inputs=(), adj_outputs=(), device=None,
                stream=None, adjoint=False, record_tape=True, record_cmd=False, max_blocks=0, block_dim=None):
        rec = pack_launch(self, kernel, dim, list(inputs) + list(outputs), list(adj_inputs) + list(adj_outputs),
                          adjoint, max_blocks, block_dim)
        if record_cmd:
            return _Command(self, rec)
        if rec is not None:
            self.rec.steps.append(rec)
        return None


def _from_warp(frame):
    """Whether a call comes from Warp's (or graphd.warp's) own code; Warp's
    tests are user code."""
    name = frame.f_globals.get("__name__", "")
    return (name == "warp" or name.startswith(("warp.", "graphd.warp"))) and not name.startswith("warp.tests")


class RecordingDevice:
    """What wp.get_device() gives the recorded function: the CUDA device
    the call is for (its ordinal, "cuda:N", is_cuda, its architecture),
    standing in for the CPU device the recording runs on. Passed back to
    Warp (wp.zeros(device=...), wp.ScopedDevice) it is the CPU device;
    anything else it does not say is the CPU device's."""

    def __init__(self, cpu, ordinal, arch):
        self._cpu = cpu
        self.ordinal = int(ordinal)
        self.alias = f"cuda:{self.ordinal}"
        self.arch = arch
        self.is_cuda, self.is_cpu = True, False

    def __getattr__(self, name):
        return getattr(self._cpu, name)

    def __str__(self):
        return self.alias

    def __repr__(self):
        return f'"{self.alias}"'



def _gpu_block_dim(device, block_dim):
    """A launch's block size as Warp resolves it for a CUDA device (any
    device: what the recording stands in for is a GPU)."""
    del device
    return resolve_block_dim(block_dim)


class _Command:
    """What wp.launch(record_cmd=True) returns while recording: launch()
    records the launch (again on each call)."""

    def __init__(self, recorder, rec):
        self._recorder, self._rec = recorder, rec

    def launch(self, stream=None):
        if self._rec is not None:
            self._recorder.rec.steps.append(self._rec)

    def __getattr__(self, name):
        raise Refused("launch_command", f"Launch.{name} on a recorded launch: graphd records Launch.launch() "
                      "only; change the launch's parameters by launching again")


def arg_buffer(rec, index, nbytes, what):
    """Reserved memory for argument `index` of nbytes bytes, known to the
    recording."""
    p = _reserve(nbytes)
    rec.buffers.append(Buffer(p, int(nbytes), arg=index, what=what))
    return p


def release_args(rec):
    for b in rec.buffers:
        if b.arg is not None:
            _release(b.base, b.size)
