"""Client.replay_arrays(program, *arrays, stream=None): a program replayed
on framework arrays (PyTorch tensors, CuPy arrays, anything with DLPack or
`__cuda_array_interface__`; see arrays.py), for one Client.

What it adds to the binding libgraphd does:
  - each array is checked against its slot: C-contiguous, exactly the
    slot's bytes (libgraphd checks a binding against the whole
    allocation, which under a caching allocator is a segment holding many
    tensors, so a smaller tensor would read and write its neighbours),
    the slot's dtype where add_slot was given one, and writable when the
    slot is written;
  - the stream is the one given, else the framework's current stream
    (PyTorch, CuPy, Warp), else the stream an array's
    `__cuda_array_interface__` names, else the legacy default stream;
    an array whose interface names another stream is waited for;
  - a region is held while an array bound in it (or the array it is a
    view of) is alive: when the last one is gone (its last reference dropped, before its framework can free
    or reuse the memory), the region is unregistered, so the daemon never
    keeps an import of memory its owner has freed. Arrays that take no
    weak reference have their region unregistered after the replay.

DESIGN: the region table is guarded by the Binder's lock; the C calls are
made outside it. A weak reference's callback may run in any thread, at the
moment the array's last reference goes, even inside a section that holds
the lock (the garbage collector): it only queues the array as gone, and
whoever gets the lock next, or lets it go, drains the queue."""

import collections
import sys
import threading
import weakref

from ._cuda import stream_wait
from .arrays import LEGACY_STREAM, describe, has_protocol
from .errors import GraphdError
from .program import ROLES, Program

_INVALID = "INVALID_ARGUMENT"
_ROLE_NAMES = {v: k for k, v in ROLES.items()}
_WRITTEN = (ROLES["output"], ROLES["inout"])
_MAX_STREAMS = 64  # of libgraphd's 127 a handle; older ones are detached
_RELEASED_KEPT = 4096  # region ids remembered as let go
HELD, WEAKLESS, STALE = "held", "weakless", "stale"


def stream_handle(stream):
    """A CUstream int from what a caller may pass as a stream: an int, a
    graphd Stream, a torch.cuda.Stream or Warp stream (.cuda_stream), a
    CuPy stream (.ptr)."""
    if stream is None or isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise GraphdError(_INVALID, f"stream {stream!r} is not a CUDA stream: pass an int (a CUstream), "
                      "a torch.cuda.Stream, a CuPy stream or a graphd Stream")


def framework_stream(obj):
    """The current stream of the framework that made obj (PyTorch, CuPy,
    Warp), as an int; None for another kind of array, and for an array
    that is not in GPU memory (the binding then refuses it as such)."""
    top = type(obj).__module__.split(".", 1)[0]
    mod = sys.modules.get(top)
    if mod is None:
        return None
    if top == "torch":
        if not obj.is_cuda:
            return None
        return mod.cuda.current_stream(obj.device).cuda_stream
    if top == "cupy":
        with obj.device:
            return mod.cuda.get_current_stream().ptr
    if top == "warp":
        if not obj.device.is_cuda:
            return None
        return mod.get_stream(obj.device).cuda_stream
    return None


def owner(obj):
    """The array whose memory obj views (PyTorch's `_base`, CuPy's and
    NumPy's `base`, followed while they are arrays), else obj: a view made
    for one call then leaves the region held for as long as its base
    lives."""
    for _ in range(64):
        base = getattr(obj, "_base", None)
        if base is None:
            base = getattr(obj, "base", None)
        if base is None or base is obj or not has_protocol(base):
            return obj
        obj = base
    return obj


def _same_stream(a, b):
    """Whether two CUstream ints are the same stream: the default stream
    (None or 0) is the legacy one (1), as in PyTorch and CuPy."""
    def norm(s):
        return LEGACY_STREAM if not s else s
    return norm(a) == norm(b)


class Binder:
    def __init__(self, client):
        self.client = client
        self._lock = threading.Lock()
        self._regions = {}  # region id -> {id(array): weakref}; guarded by _lock
        self._dead = collections.deque()  # (region id, key) of arrays gone, to drain
        # Regions let go lately (guarded by _lock): ids grow within a
        # session, so a hold racing a release is seen here.
        self._released = set()
        self._released_order = collections.deque()
        self._programs = set()  # program ids registered through here
        self._streams = {}  # CUstream int (None: default) -> graphd Stream, oldest first
        self._backend = None

    # --- what the session is ------------------------------------------------

    def _host(self):
        if self._backend is None:
            self._backend = self.client.device()["backend"]
        return self._backend == "host"

    def _stream(self, handle):
        s = self._streams.get(handle)
        if s is None or not s.handle:
            if len(self._streams) >= _MAX_STREAMS:
                old = next(iter(self._streams))
                self._streams.pop(old).detach()
            s = self.client.stream_attach(handle)
            self._streams[handle] = s
        return s

    # --- region lifetimes ---------------------------------------------------

    def _hold(self, region_id, obj):
        """Keeps region_id registered while obj, or the array it is a view
        of, is alive. Returns HELD; WEAKLESS when that takes no weak
        reference; STALE when the region was let go between its
        registration and now (register again)."""
        obj = owner(obj)
        key = id(obj)
        try:
            ref = weakref.ref(obj, lambda _r, rid=region_id, k=key: self._gone(rid, k))
        except TypeError:
            return WEAKLESS
        with self._lock:
            stale = region_id in self._released
            if not stale:
                held = self._regions.setdefault(region_id, {})
                if key not in held:
                    held[key] = ref
        self._drain()
        return STALE if stale else HELD

    def _gone(self, region_id, key):
        # Any thread, any moment (the garbage collector's too, inside a
        # section holding the lock): queue it, and drain if the lock is free.
        self._dead.append((region_id, key))
        self._drain()

    def _drain(self):
        """Lets go of the regions whose last array is gone. Whoever holds
        the lock drains after letting it go, so nothing queued is left."""
        while self._dead:
            if not self._lock.acquire(blocking=False):
                return
            ready = []
            try:
                while self._dead:
                    rid, key = self._dead.popleft()
                    held = self._regions.get(rid)
                    if held is None or held.pop(key, None) is None or held:
                        continue
                    del self._regions[rid]
                    self._released_order.append(rid)
                    self._released.add(rid)
                    if len(self._released_order) > _RELEASED_KEPT:
                        self._released.discard(self._released_order.popleft())
                    ready.append(rid)
            finally:
                self._lock.release()
            for rid in ready:
                self._unregister(rid)

    def _unregister(self, region_id):
        if not self.client._h:
            return
        try:
            self.client.region_unregister(region_id)
        except GraphdError:
            # Gone already (libgraphd's LRU, or an address reused by a new
            # allocation, unregistered it; or the daemon restarted).
            pass

    def held_regions(self):
        """The region ids held for live arrays (for tests)."""
        self._drain()
        with self._lock:
            out = sorted(self._regions)
        self._drain()
        return out

    def close(self):
        with self._lock:
            self._regions.clear()
            self._dead.clear()
        self._streams.clear()

    # --- replay --------------------------------------------------------------

    def replay(self, program, arrays, stream=None):
        if not isinstance(program, Program):
            raise GraphdError(_INVALID, f"replay_arrays(program, *arrays) takes a graphd.Program, not "
                              f"{type(program).__name__}; for a program id and (slot, ptr, nbytes) "
                              "bindings call replay_bindings(stream, program_id, bindings)")
        enc, pid = program.finish()
        bound = [i for i in range(program.nslots) if program.slot(i)[0] not in ("scratch", "temp")]
        if len(arrays) == 1 and isinstance(arrays[0], dict):
            pairs = sorted(arrays[0].items())
            for slot, _ in pairs:
                if slot not in bound:
                    raise GraphdError(_INVALID, f"slot {slot} is not a slot of the program that is "
                                      f"bound (those are {bound}; scratch and temp slots are never bound)")
        else:
            if len(arrays) != len(bound):
                raise GraphdError(_INVALID, f"the program binds {len(bound)} slots ({bound}: every "
                                  f"slot but scratch and temp ones, in order) but {len(arrays)} arrays were "
                                  "given")
            pairs = list(zip(bound, arrays))
        host = self._host()
        handle = self._replay_stream(stream, [a for _, a in pairs if a is not None], host)
        infos = []
        for k, (slot, a) in enumerate(pairs):
            if a is None:
                continue  # left unbound: the daemon says whether it may be
            infos.append((slot, a, self._check(program, slot, a, k, handle, host)))
        if pid not in self._programs:
            self.client.register_program(enc, pid)
            self._programs.add(pid)
        gs = self._stream(None if host else handle)
        bindings, after = [], []
        for slot, a, info in infos:
            size = program.slot(slot)[2]
            for _ in range(8):
                rid = self.client.region_register(info.ptr, size)["region_id"]
                how = self._hold(rid, a)
                if how != STALE:
                    break
            if how == WEAKLESS:
                after.append(rid)
            bindings.append((slot, info.ptr, size))
        try:
            return self.client.replay_bindings(gs, pid, bindings)
        finally:
            # The daemon unmaps these once the replay queued on them is done.
            for rid in after:
                with self._lock:
                    held = bool(self._regions.get(rid))
                self._drain()
                if not held:
                    self._unregister(rid)

    def _replay_stream(self, stream, objs, host):
        if host:
            if stream not in (None, 0):
                raise GraphdError(_INVALID, "a host device's session takes no CUDA stream: the "
                                  "replay has run when the call returns")
            return None
        if stream is not None:
            return stream_handle(stream)
        for a in objs:
            s = framework_stream(a)
            if s is not None:
                return s
        for a in objs:
            cai = getattr(a, "__cuda_array_interface__", None) if hasattr(
                a, "__cuda_array_interface__") else None
            if isinstance(cai, dict) and cai.get("version", 0) >= 3 and cai.get("stream"):
                return cai["stream"]
        return None

    def _check(self, program, slot, a, k, handle, host):
        role, _, size = program.slot(slot)
        what = f"argument {k} (slot {slot}, {role})"
        info = describe(a, what, stream=handle, cpu=host)
        if host and info.device == "cuda" and info.protocol == "DLPack":
            raise GraphdError(_INVALID, f"{what} is on a CUDA device, but this session's device "
                              "is a host device")
        if not host and info.device == "cpu":
            raise GraphdError(_INVALID, f"{what} is on the CPU, but this session's device is a "
                              "GPU: move it there first (.cuda() in PyTorch, cupy.asarray)")
        if info.nbytes != size:
            raise GraphdError(_INVALID, f"{what} is {info.nbytes} bytes ({info.dtype}, shape "
                              f"{info.shape}), but the slot is {size} bytes: an array bound to a "
                              "slot must be exactly its size (bind a view of the right length, "
                              "t[:n])")
        want = program.slot_dtype(slot)
        if want is not None and info.dtype != want:
            raise GraphdError(_INVALID, f"{what} is {info.dtype}, but the slot holds {want}")
        if info.readonly and ROLES[role] in _WRITTEN:
            raise GraphdError(_INVALID, f"{what} is read-only, but the program writes the slot")
        if not info.ptr:
            raise GraphdError(_INVALID, f"{what} has a null data pointer")
        if info.stream is not None and not host and not _same_stream(info.stream, handle):
            stream_wait(handle, info.stream)
        return info
