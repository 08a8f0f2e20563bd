"""ctypes bindings to libgraphd (client/include/graphd/graphd.h).

The library is found, on first use, through:
  1. $GRAPHD_LIB, a path to libgraphd.so;
  2. libgraphd.so next to this package (a wheel or an install may put it
     there);
  3. ctypes.util.find_library("graphd").
Importing graphd does not load it: the builder is pure Python.

Structures mirror graphd.h field for field; tests/abi_sizes.c prints the C
sizes and offsets, and the Python tests compare them with these.

Every failing call raises GraphdError(status name, libgraphd's message).
ctypes releases the GIL around each call; a Client may be used from
several threads, since libgraphd serialises calls on one handle (but the
message of a failure is read after the call, so under heavy concurrency on
one handle it may belong to another thread's failure)."""

import ctypes
import ctypes.util
import os
import threading

from .errors import GraphdError, status_name
from .program import MODES, MODULE_KINDS, ID_LEN, Program

_MODE_NAMES = {v: k for k, v in MODES.items()}

ERRMAX = 512

SESSION_DATA = 1
SESSION_CONTROL = 2

_u8, _u32, _u64, _i32 = ctypes.c_uint8, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
_int = ctypes.c_int


class graphd_connect_options(ctypes.Structure):
    _fields_ = [
        ("socket_path", ctypes.c_char_p),
        ("kind", _int),  # graphd_session_kind
        ("device_uuid", _u8 * 16),
        ("timeout_ms", _int),
        ("client_name", ctypes.c_char_p),
    ]


class graphd_device_counters(ctypes.Structure):
    _fields_ = [(n, _u64) for n in (
        "sessions", "regions", "region_bytes", "captures", "replays", "errors",
        "recaptures", "inflight", "captures_built", "staging_bytes", "evictions",
        "replay_p50_ns", "replay_p90_ns", "replay_p99_ns", "replay_max_ns")]


class graphd_device_info(ctypes.Structure):
    _fields_ = [
        ("ordinal", _u32),
        ("name", ctypes.c_char * 256),
        ("uuid", _u8 * 16),
        ("uuid_str", ctypes.c_char * 48),
        ("total_memory", _u64),
        ("free_memory", _u64),
        ("backend", ctypes.c_char * 16),
        ("epoch", _u64),
        ("mps_enabled", _int),
        ("state", ctypes.c_char * 16),
        ("counters", graphd_device_counters),
    ]


class graphd_session_info(ctypes.Structure):
    _fields_ = [
        ("id", _u64),
        ("pid", _u32),
        ("uid", _u32),
        ("data", _int),
        ("device", _i32),
        ("client_name", ctypes.c_char * 129),
        ("regions", _u64),
        ("region_bytes", _u64),
    ]


class graphd_daemon_status(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_char * 64),
        ("uptime_ms", _u64),
        ("pid", _u32),
        ("sessions", _u64),
        ("ndevices", _u32),
        ("devices", ctypes.POINTER(graphd_device_info)),
        ("nsession_info", _u32),
        ("session_info", ctypes.POINTER(graphd_session_info)),
        ("modules", _u64),
        ("module_bytes", _u64),
        ("programs", _u64),
    ]


class graphd_region_ref(ctypes.Structure):
    _fields_ = [("region_id", _u32), ("offset", _u64), ("size", _u64), ("import_ns", _u64)]


class graphd_binding(ctypes.Structure):
    _fields_ = [("slot", _u32), ("ptr", _u64), ("bytes", _u64)]


class graphd_replay_info(ctypes.Structure):
    _fields_ = [("captured", _int), ("capture_ns", _u64), ("server_ns", _u64)]


class graphd_prepare_info(ctypes.Structure):
    _fields_ = [("modules_loaded", _u64), ("load_ns", _u64)]


class graphd_capture_info(ctypes.Structure):
    _fields_ = [("program_id", _u8 * 32), ("device", _u32), ("mode", _u32),
                ("staging_bytes", _u64), ("nodes", _u32), ("replays", _u64),
                ("idle_ms", _u64), ("pids", _u32 * 16), ("npids", _u32), ("busy", _int),
                ("generation", _u32), ("created_unix_ms", _u64)]


class graphd_evict_options(ctypes.Structure):
    _fields_ = [("program", ctypes.c_char_p), ("device", _int), ("client_pid", _u32),
                ("session", _u64), ("idle_ms", _u64), ("all", _int), ("dry_run", _int)]


# The structures whose layout the tests compare with C (tests/abi_sizes.c).
STRUCTS = {c.__name__: c for c in (
    graphd_connect_options, graphd_device_counters, graphd_device_info, graphd_session_info,
    graphd_daemon_status, graphd_region_ref, graphd_binding, graphd_replay_info,
    graphd_prepare_info, graphd_capture_info, graphd_evict_options)}

_P = ctypes.c_void_p
_ID = ctypes.POINTER(_u8)  # uint8_t[32]

# name: (restype, argtypes). Status-returning calls have restype int.
_PROTOS = {
    "graphd_version": (ctypes.c_char_p, []),
    "graphd_status_name": (ctypes.c_char_p, [_int]),
    "graphd_strerror": (ctypes.c_char_p, [_int]),
    "graphd_connect_options_init": (None, [ctypes.POINTER(graphd_connect_options)]),
    "graphd_connect": (_int, [ctypes.POINTER(graphd_connect_options), ctypes.POINTER(_P),
                              ctypes.c_char_p, ctypes.c_size_t]),
    "graphd_close": (None, [_P]),
    "graphd_session_id": (_u64, [_P]),
    "graphd_last_error": (ctypes.c_char_p, [_P]),
    "graphd_ping": (_int, [_P, _P, ctypes.c_size_t]),
    "graphd_get_status": (_int, [_P, ctypes.POINTER(ctypes.POINTER(graphd_daemon_status))]),
    "graphd_daemon_status_free": (None, [ctypes.POINTER(graphd_daemon_status)]),
    "graphd_session_device": (_int, [_P, ctypes.POINTER(graphd_device_info)]),
    "graphd_uuid_format": (None, [_ID, ctypes.c_char_p, ctypes.c_char_p]),
    "graphd_uuid_parse": (_int, [ctypes.c_char_p, _ID]),
    "graphd_register_module": (_int, [_P, _int, ctypes.c_char_p, ctypes.c_size_t, _ID]),
    "graphd_register_program_encoding": (_int, [_P, _ID, ctypes.c_char_p, ctypes.c_size_t]),
    "graphd_prepare_program": (_int, [_P, _ID, ctypes.POINTER(graphd_prepare_info)]),
    "graphd_region_register": (_int, [_P, _u64, _u64, ctypes.POINTER(graphd_region_ref)]),
    "graphd_region_forget": (_int, [_P, _u64]),
    "graphd_region_unregister": (_int, [_P, _u32]),
    "graphd_set_region_cap": (_int, [_P, _u32]),
    "graphd_set_reconnect_wait": (_int, [_P, _int]),
    "graphd_region_count": (_u32, [_P]),
    "graphd_host_alloc": (_int, [_P, ctypes.c_size_t, ctypes.POINTER(_P)]),
    "graphd_host_free": (_int, [_P, _P]),
    "graphd_stream_attach": (_int, [_P, _P, ctypes.POINTER(_P)]),
    "graphd_stream_detach": (None, [_P]),
    "graphd_replay": (_int, [_P, _P, _ID, ctypes.POINTER(graphd_binding), ctypes.c_size_t,
                             ctypes.POINTER(graphd_replay_info)]),
    # The C builder, for cross-checking the Python one.
    "graphd_program_new": (_P, [_int]),
    "graphd_program_free": (None, [_P]),
    "graphd_program_error": (ctypes.c_char_p, [_P]),
    "graphd_program_add_slot": (_int, [_P, _int, _u64, _int]),
    "graphd_program_add_launch": (_int, [_P, _ID, ctypes.c_char_p, ctypes.POINTER(_u32),
                                         ctypes.POINTER(_u32), _u32]),
    "graphd_program_param": (_int, [_P, _u32, _u32, ctypes.c_char_p, _u32]),
    "graphd_program_param_slot": (_int, [_P, _u32, _u32, _u32, _u64]),
    "graphd_program_patch": (_int, [_P, _u32, _u32, _u32, _u64]),
    "graphd_program_add_memset": (_int, [_P, _u32, _u64, _u64, _u32, _u32]),
    "graphd_program_add_copy": (_int, [_P, _u32, _u64, _u32, _u64, _u64]),
    "graphd_program_begin_while": (_int, [_P, _u32, _u64]),
    "graphd_program_begin_if": (_int, [_P, _u32, _u64]),
    "graphd_program_else": (_int, [_P, _u32]),
    "graphd_program_end": (_int, [_P, _u32]),
    "graphd_program_finish": (_int, [_P, _ID]),
    "graphd_program_encoding": (_int, [_P, ctypes.POINTER(ctypes.POINTER(_u8)),
                                       ctypes.POINTER(ctypes.c_size_t)]),
    "graphd_module_id": (_int, [_int, ctypes.c_char_p, ctypes.c_size_t, _ID]),
    "graphd_list_captures": (_int, [_P, ctypes.POINTER(ctypes.POINTER(graphd_capture_info)),
                                    ctypes.POINTER(ctypes.c_size_t)]),
    "graphd_evict_options_init": (None, [ctypes.POINTER(graphd_evict_options)]),
    "graphd_busy_devices": (ctypes.c_size_t, [_P, ctypes.POINTER(_u32), ctypes.c_size_t]),
    "graphd_evict": (_int, [_P, ctypes.POINTER(graphd_evict_options),
                            ctypes.POINTER(ctypes.POINTER(graphd_capture_info)),
                            ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(_u64)]),
    # The client-side registry (for the XLA handler).
    "graphd_registry_add_module": (_int, [_int, ctypes.c_char_p, ctypes.c_size_t, _ID]),
    "graphd_registry_add_program": (_int, [_ID, ctypes.c_char_p, ctypes.c_size_t]),
    "graphd_registry_sync": (_int, [_P, _ID]),
}

_lib = None
_lib_lock = threading.Lock()


def _candidates():
    env = os.environ.get("GRAPHD_LIB")
    if env:
        return [env]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgraphd.so")
    out = [here] if os.path.exists(here) else []
    found = ctypes.util.find_library("graphd")
    if found:
        out.append(found)
    return out


def lib():
    """The loaded libgraphd, with argument and result types set. Raises
    GraphdError UNAVAILABLE when it cannot be found or loaded."""
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            try:
                l = ctypes.CDLL(path)
            except OSError as e:
                errors.append(f"{path}: {e}")
                continue
            for name, (res, args) in _PROTOS.items():
                f = getattr(l, name)
                f.restype = res
                f.argtypes = args
            _lib = l
            return l
        where = "; ".join(errors) if errors else "set GRAPHD_LIB to the path of libgraphd.so"
        raise GraphdError("UNAVAILABLE", f"cannot load libgraphd: {where}")


def version():
    """libgraphd's version string."""
    return lib().graphd_version().decode()


def _id_arg(id_bytes):
    b = bytes(id_bytes)
    if len(b) != ID_LEN:
        raise GraphdError("INVALID_ARGUMENT", f"an id is {ID_LEN} bytes, not {len(b)}")
    return (_u8 * ID_LEN).from_buffer_copy(b)


def uuid_parse(s):
    """16 bytes from "GPU-…", "HOST-…" or bare hex (graphd_uuid_parse)."""
    out = (_u8 * 16)()
    st = lib().graphd_uuid_parse(s.encode(), out)
    if st:
        raise GraphdError(st, f"cannot parse the device UUID {s!r}")
    return bytes(out)


def uuid_format(uuid, prefix=None):
    out = ctypes.create_string_buffer(48)
    lib().graphd_uuid_format((_u8 * 16).from_buffer_copy(bytes(uuid)),
                             prefix.encode() if prefix else None, out)
    return out.value.decode()


def _struct_dict(s):
    """A ctypes structure as a dict of Python values (bytes arrays of
    uint8 become bytes; char arrays become str)."""
    out = {}
    for name, typ in s._fields_:
        v = getattr(s, name)
        if isinstance(v, ctypes.Structure):
            v = _struct_dict(v)
        elif isinstance(v, bytes):
            v = v.decode(errors="replace")
        elif isinstance(v, ctypes.Array):
            v = bytes(v)
        out[name] = v
    return out


class HostBuffer:
    """Memory from graphd_host_alloc on one Client: a shared memfd mapping
    that host devices import. `ptr` is its address as an int, `size` its
    bytes, and `view` a writable memoryview of it (valid until free() or
    the Client's close)."""

    def __init__(self, client, ptr, size):
        self.client = client
        self.ptr = ptr
        self.size = size
        self._arr = (ctypes.c_ubyte * size).from_address(ptr)

    @property
    def view(self):
        if self._arr is None:
            raise GraphdError("FAILED_PRECONDITION", "the host buffer was freed")
        return memoryview(self._arr).cast("B")

    def free(self):
        if self._arr is not None:
            self._arr = None
            self.client._host_free(self)


class Stream:
    """A client stream attached to a data session (graphd_stream);
    cuda_stream is the CUstream it was attached with (None: default)."""

    cuda_stream = None

    def __init__(self, client, handle):
        self.client = client
        self.handle = handle

    def detach(self):
        if self.handle:
            self.client._detach(self)


class Client:
    """One libgraphd session: a control session (status) or a data session
    bound to one device. Use as a context manager, or close() it.

        with Client.connect(socket) as ctl:
            dev = ctl.status()["devices"][0]
        with Client.connect(socket, device_uuid=dev["uuid"]) as c:
            ...
    """

    def __init__(self, handle):
        self._h = handle
        self._streams = []
        self._host = []
        self._binder = None  # the array path's state (_bind.Binder), made on first use

    @classmethod
    def connect_cuda(cls, ordinal=0, socket_path=None, **kw):
        """A data session on CUDA device `ordinal` as this process numbers
        its devices (CUDA_VISIBLE_DEVICES applies): its UUID comes from the
        driver. Other arguments as connect()."""
        from . import _cuda
        return cls.connect(socket_path, device_uuid=_cuda.device_uuid(ordinal), **kw)

    @classmethod
    def connect(cls, socket_path=None, device_uuid=None, timeout_ms=0, client_name="graphd-python",
                reconnect_ms=None):
        """Connects: a data session when device_uuid (16 bytes, or a string
        such as "HOST-…" or "GPU-…") is given, else a control session.
        socket_path None means libgraphd's default ($GRAPHD_SOCKET, …).

        Every call goes through libgraphd, which reconnects by itself when
        the daemon went away (a restart): it waits up to reconnect_ms for a
        daemon on the socket (None: libgraphd's default, 30000 or
        $GRAPHD_RECONNECT_MS; 0: off) and sends the call again when it
        never ran. A replay that may have run is not sent again: it raises
        GraphdError UNAVAILABLE (see set_reconnect_wait)."""
        l = lib()
        o = graphd_connect_options()
        l.graphd_connect_options_init(ctypes.byref(o))
        # Keep the encoded strings alive for the call.
        sock = os.fsencode(socket_path) if socket_path is not None else None
        name = client_name.encode() if client_name is not None else None
        o.socket_path = sock
        o.client_name = name
        o.timeout_ms = int(timeout_ms)
        if device_uuid is not None:
            u = uuid_parse(device_uuid) if isinstance(device_uuid, str) else bytes(device_uuid)
            if len(u) != 16:
                raise GraphdError("INVALID_ARGUMENT", f"a device UUID is 16 bytes, not {len(u)}")
            o.kind = SESSION_DATA
            o.device_uuid[:] = list(u)
        else:
            o.kind = SESSION_CONTROL
        h = _P()
        err = ctypes.create_string_buffer(ERRMAX)
        st = l.graphd_connect(ctypes.byref(o), ctypes.byref(h), err, ERRMAX)
        if st:
            raise GraphdError(st, err.value.decode(errors="replace"))
        c = cls(h.value)
        if reconnect_ms is not None:
            c.set_reconnect_wait(reconnect_ms)
        return c

    def set_reconnect_wait(self, ms):
        """How long a call that finds the daemon gone waits for a new one,
        in milliseconds, retrying with backoff (0: never reconnect). The
        call is then sent again, once, if the old daemon never started it;
        the flag page, streams and programs synced from the registry carry
        over, and regions register again as they are next used."""
        st = lib().graphd_set_reconnect_wait(self._h, int(ms))
        if st:
            raise GraphdError(st, "the reconnect wait must be 0 or more milliseconds")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # Best effort; close() explicitly.
        try:
            self.close()
        except Exception:
            pass

    def close(self):
        """Detaches the streams, forgets the host buffers (libgraphd unmaps
        them) and closes the session. Idempotent."""
        if not self._h:
            return
        if self._binder is not None:
            self._binder.close()
        for s in list(self._streams):
            s.detach()
        for b in self._host:
            b._arr = None
        self._host = []
        h, self._h = self._h, None
        lib().graphd_close(h)

    def _handle(self):
        if not self._h:
            raise GraphdError("FAILED_PRECONDITION", "the client is closed")
        return self._h

    def _check(self, st, what=None):
        if st:
            msg = lib().graphd_last_error(self._h) or b""
            msg = msg.decode(errors="replace") or (what or "")
            raise GraphdError(st, msg)

    @property
    def session_id(self):
        return lib().graphd_session_id(self._handle())

    def ping(self, payload=b""):
        self._check(lib().graphd_ping(self._handle(), payload, len(payload)))

    def status(self):
        """The daemon's status as a dict: version, uptime_ms, pid, sessions,
        modules, module_bytes, programs, devices (a list of dicts with the
        fields of graphd_device_info, its counters as a dict, uuid as
        bytes) and session_info (a list of dicts)."""
        l = lib()
        p = ctypes.POINTER(graphd_daemon_status)()
        self._check(l.graphd_get_status(self._handle(), ctypes.byref(p)))
        try:
            s = p.contents
            out = {n: getattr(s, n) for n in ("uptime_ms", "pid", "sessions", "modules",
                                               "module_bytes", "programs")}
            out["version"] = s.version.decode(errors="replace")
            out["devices"] = [_struct_dict(s.devices[i]) for i in range(s.ndevices)]
            out["session_info"] = [_struct_dict(s.session_info[i]) for i in range(s.nsession_info)]
        finally:
            l.graphd_daemon_status_free(p)
        return out

    def device(self):
        """The device of a data session, as a dict (see status())."""
        d = graphd_device_info()
        self._check(lib().graphd_session_device(self._handle(), ctypes.byref(d)))
        return _struct_dict(d)

    def register_module(self, kind, data):
        """Registers a module (kind "ptx", "cubin", "fatbin", "host_elf" or
        1 to 4) and returns its 32-byte id. A copy goes into the process's
        client-side registry too, so that a session made after a daemon
        restart can be given it again."""
        k = MODULE_KINDS.get(kind, kind) if isinstance(kind, str) else kind
        if not isinstance(k, int) or not 1 <= k <= 4:
            raise GraphdError("INVALID_ARGUMENT", f"module kind {kind!r} is not ptx, cubin, fatbin or host_elf")
        data = bytes(data)
        out = (_u8 * ID_LEN)()
        self._check(lib().graphd_register_module(self._handle(), k, data, len(data), out))
        lib().graphd_registry_add_module(k, data, len(data), None)
        return bytes(out)

    def register_program(self, program, program_id=None):
        """Registers a program: a Program (finished here if it is not), or
        its canonical encoding with program_id. Returns the id. It goes
        through the client-side registry when its modules are there (they
        are when this class registered them), so that libgraphd gives it to
        the new session after a daemon restart before sending a replay
        again."""
        if isinstance(program, Program):
            enc, pid = program.finish()
        else:
            if program_id is None:
                raise GraphdError("INVALID_ARGUMENT", "an encoding needs its program id")
            enc, pid = bytes(program), bytes(program_id)
        l = lib()
        if l.graphd_registry_add_program(_id_arg(pid), enc, len(enc)) == 0:
            self._check(l.graphd_registry_sync(self._handle(), _id_arg(pid)))
        else:
            self._check(l.graphd_register_program_encoding(self._handle(), _id_arg(pid), enc, len(enc)))
        return pid

    def prepare_program(self, program_id):
        """Runs the device stage of validation now; returns
        {"modules_loaded", "load_ns"}."""
        info = graphd_prepare_info()
        self._check(lib().graphd_prepare_program(self._handle(), _id_arg(program_id), ctypes.byref(info)))
        return _struct_dict(info)

    # --- regions and host memory ----------------------------------------

    def region_register(self, ptr, nbytes):
        ref = graphd_region_ref()
        self._check(lib().graphd_region_register(self._handle(), ptr, nbytes, ctypes.byref(ref)))
        return _struct_dict(ref)

    def region_forget(self, ptr):
        self._check(lib().graphd_region_forget(self._handle(), ptr))

    def region_unregister(self, region_id):
        """Unregisters a region by id (graphd_region_unregister); the daemon
        unmaps it once the work queued on it is done."""
        self._check(lib().graphd_region_unregister(self._handle(), region_id))

    def held_regions(self):
        """The region ids that replay(program, *arrays) holds registered
        for arrays still alive."""
        return self._binder.held_regions() if self._binder is not None else []

    def region_count(self):
        return lib().graphd_region_count(self._handle())

    def host_alloc(self, nbytes):
        """Host-device memory of nbytes bytes (graphd_host_alloc), as a
        HostBuffer. Free with HostBuffer.free(); close() frees the rest."""
        p = _P()
        self._check(lib().graphd_host_alloc(self._handle(), nbytes, ctypes.byref(p)))
        b = HostBuffer(self, p.value, nbytes)
        self._host.append(b)
        return b

    def _host_free(self, b):
        self._host.remove(b)
        self._check(lib().graphd_host_free(self._handle(), b.ptr))

    # --- streams and replay ---------------------------------------------

    def stream_attach(self, cuda_stream=None):
        """Attaches a CUDA stream (a CUstream as an int; None is the legacy
        default stream, and what host devices use)."""
        s = _P()
        self._check(lib().graphd_stream_attach(self._handle(), cuda_stream, ctypes.byref(s)))
        st = Stream(self, s.value)
        st.cuda_stream = cuda_stream
        self._streams.append(st)
        return st

    def _detach(self, s):
        self._streams.remove(s)
        h, s.handle = s.handle, None
        lib().graphd_stream_detach(h)

    def replay(self, *args, stream=None):
        """Replays a program. Two forms:

        replay(program, *arrays, stream=None): a Program (registered here
        on first use; its modules must be registered) on framework arrays
        (PyTorch tensors, CuPy arrays, anything with DLPack or
        __cuda_array_interface__), one per slot that is not scratch, in
        slot order (or one dict {slot: array}). Each array must be
        contiguous, exactly its slot's size, of the slot's dtype where
        add_slot named one, and writable for a slot the program writes.
        The stream is `stream` (an int CUstream, a torch.cuda.Stream, a
        CuPy stream), else the arrays' framework's current stream, else
        the stream an array's __cuda_array_interface__ names, else the
        legacy default stream; on a host device there is none. A region
        stays registered while an array bound in it is alive
        (docs/pytorch.md, "Memory").

        replay(stream, program_id, bindings): a registered program on a
        Stream with bindings, each a (slot, ptr, nbytes) tuple, where ptr
        is an int (CUdeviceptr or host address) or a HostBuffer; nbytes is
        the slot's size, checked only against the whole allocation.

        Returns {"captured", "capture_ns", "server_ns"}."""
        if args and not isinstance(args[0], Stream):
            if self._binder is None:
                from ._bind import Binder
                self._binder = Binder(self)
            self._handle()
            return self._binder.replay(args[0], args[1:], stream=stream)
        if len(args) != 3 or stream is not None:
            raise GraphdError("INVALID_ARGUMENT", "replay(stream, program_id, bindings) takes "
                              "three arguments; the Stream is the first")
        return self._replay_bindings(*args)

    def _replay_bindings(self, stream, program_id, bindings):
        n = len(bindings)
        arr = (graphd_binding * max(n, 1))()
        for i, (slot, ptr, nbytes) in enumerate(bindings):
            arr[i].slot = slot
            arr[i].ptr = ptr.ptr if isinstance(ptr, HostBuffer) else ptr
            arr[i].bytes = nbytes
        if not stream.handle:
            raise GraphdError("FAILED_PRECONDITION", "the stream is detached")
        info = graphd_replay_info()
        self._check(lib().graphd_replay(self._handle(), stream.handle, _id_arg(program_id), arr, n,
                                        ctypes.byref(info)))
        return _struct_dict(info)


    def _captures(self, ptr, n):
        out = []
        for i in range(n):
            c = ptr[i]
            out.append({"program": bytes(c.program_id).hex(), "device": c.device,
                        "mode": _MODE_NAMES.get(c.mode, c.mode),
                        "staging_bytes": c.staging_bytes, "nodes": c.nodes,
                        "replays": c.replays, "idle_ms": c.idle_ms,
                        "pids": list(c.pids[:c.npids]), "busy": bool(c.busy),
                        "generation": c.generation, "created_unix_ms": c.created_unix_ms})
        if ptr:
            _libc_free(ptr)
        return out

    def list_captures(self):
        """Every capture on every device, as dicts."""
        ptr = ctypes.POINTER(graphd_capture_info)()
        n = ctypes.c_size_t()
        self._check(lib().graphd_list_captures(self._handle(), ctypes.byref(ptr), ctypes.byref(n)))
        return self._captures(ptr, n.value)

    def evict(self, program=None, device=None, client_pid=0, session=0, idle_s=0, all=False,
              dry_run=False):
        """Frees captures (all given selectors must match; or all=True, an
        admin's right). The next replay of an evicted program captures
        again. Returns (captures evicted, staging bytes freed)."""
        o = graphd_evict_options()
        lib().graphd_evict_options_init(ctypes.byref(o))
        if program is not None:
            o.program = (program.hex() if isinstance(program, (bytes, bytearray)) else
                         str(program)).encode()
        if device is not None:
            o.device = device
        o.client_pid = client_pid
        o.session = session
        o.idle_ms = int(idle_s * 1000)
        o.all = 1 if all else 0
        o.dry_run = 1 if dry_run else 0
        ptr = ctypes.POINTER(graphd_capture_info)()
        n = ctypes.c_size_t()
        nbytes = _u64()
        self._check(lib().graphd_evict(self._handle(), ctypes.byref(o), ctypes.byref(ptr),
                                       ctypes.byref(n), ctypes.byref(nbytes)))
        return self._captures(ptr, n.value), nbytes.value

    def busy_devices(self):
        """The devices the last list_captures or evict could not reach
        within the daemon's bound (their worker was inside a long job): a
        list lacks their captures; an eviction there runs when the worker
        is free and is not in the result."""
        buf = (_u32 * 64)()
        n = lib().graphd_busy_devices(self._handle(), buf, 64)
        return [buf[i] for i in range(min(n, 64))]

    def clear(self):
        """Evicts every capture this process alone used, on every device."""
        return self.evict(client_pid=os.getpid())


def clear(socket_path=None, device=None):
    """Evicts every capture only this process replayed (on one device, or
    on all), through a short control session: how a JAX program, whose
    calls go through the FFI handler's own sessions, frees its captures.
    Shared captures stay (evicting them is an admin's right). Returns
    (captures evicted, staging bytes freed)."""
    with Client.connect(socket_path) as c:
        return c.evict(client_pid=os.getpid(), device=device)


def _libc_free(ptr):
    ctypes.CDLL(None).free(ctypes.cast(ptr, ctypes.c_void_p))


class CProgram:
    """The C builder (graphd_program_*) driven from Python, call for call
    like Program; used to check that both produce the same bytes and ids.
    Errors raise GraphdError with graphd_program_error()'s message."""

    def __init__(self, mode="staged"):
        self._l = lib()
        m = MODES.get(mode, mode)
        self._p = self._l.graphd_program_new(m)
        if not self._p:
            raise GraphdError("RESOURCE_EXHAUSTED", "graphd_program_new failed")

    def __del__(self):
        if getattr(self, "_p", None):
            self._l.graphd_program_free(self._p)
            self._p = None

    def _err(self, st):
        raise GraphdError(st, self._l.graphd_program_error(self._p).decode())

    def _idx(self, r):
        if r < 0:
            # The index calls do not return a status; the message says it.
            self._err("INVALID_ARGUMENT")
        return r

    def _st(self, st):
        if st:
            self._err(st)

    def add_slot(self, role, nbytes, staged=None):
        from .program import ROLES
        r = ROLES.get(role, role)
        if staged is None:
            staged = r != 3
        return self._idx(self._l.graphd_program_add_slot(self._p, r, nbytes, int(bool(staged))))

    def add_launch(self, module_id, function, grid, block, shared_bytes=0):
        def dim3(v):
            v = (v,) if isinstance(v, int) else tuple(v)
            return (_u32 * 3)(*(v + (1,) * (3 - len(v))))
        g, b = dim3(grid), dim3(block)
        return self._idx(self._l.graphd_program_add_launch(self._p, _id_arg(module_id), function.encode(),
                                                           g, b, shared_bytes))

    def param(self, step, offset, data):
        data = bytes(data)
        self._st(self._l.graphd_program_param(self._p, step, offset, data, len(data)))

    def param_slot(self, step, offset, slot, slot_offset=0):
        self._st(self._l.graphd_program_param_slot(self._p, step, offset, slot, slot_offset))

    def patch(self, step, offset, slot, slot_offset=0):
        self._st(self._l.graphd_program_patch(self._p, step, offset, slot, slot_offset))

    def add_memset(self, slot, offset, nbytes, element_size, value):
        return self._idx(self._l.graphd_program_add_memset(self._p, slot, offset, nbytes, element_size, value))

    def add_copy(self, dst_slot, dst_offset, src_slot, src_offset, nbytes):
        return self._idx(self._l.graphd_program_add_copy(self._p, dst_slot, dst_offset, src_slot,
                                                         src_offset, nbytes))

    def begin_while(self, slot, offset=0):
        return self._idx(self._l.graphd_program_begin_while(self._p, slot, offset))

    def begin_if(self, slot, offset=0):
        return self._idx(self._l.graphd_program_begin_if(self._p, slot, offset))

    def else_(self, step):
        self._st(self._l.graphd_program_else(self._p, step))

    def end(self, step):
        self._st(self._l.graphd_program_end(self._p, step))

    def finish(self):
        out = (_u8 * ID_LEN)()
        self._st(self._l.graphd_program_finish(self._p, out))
        ptr = ctypes.POINTER(_u8)()
        n = ctypes.c_size_t()
        self._st(self._l.graphd_program_encoding(self._p, ctypes.byref(ptr), ctypes.byref(n)))
        return ctypes.string_at(ptr, n.value), bytes(out)


def c_module_id(kind, data):
    """graphd_module_id() through libgraphd, for cross-checking."""
    k = MODULE_KINDS.get(kind, kind) if isinstance(kind, str) else kind
    out = (_u8 * ID_LEN)()
    data = bytes(data)
    st = lib().graphd_module_id(k, data, len(data), out)
    if st:
        raise GraphdError(st, "graphd_module_id failed")
    return bytes(out)


def registry_add_module(kind, data):
    """graphd_registry_add_module: keeps a copy of the module's bytes in the
    process's client-side registry, from which the XLA handler gives them
    to each session. Returns the 32-byte module id."""
    k = MODULE_KINDS.get(kind, kind) if isinstance(kind, str) else kind
    if not isinstance(k, int) or not 1 <= k <= 4:
        raise GraphdError("INVALID_ARGUMENT", f"module kind {kind!r} is not ptx, cubin, fatbin or host_elf")
    data = bytes(data)
    out = (_u8 * ID_LEN)()
    st = lib().graphd_registry_add_module(k, data, len(data), out)
    if st:
        raise GraphdError(st, f"graphd_registry_add_module refused a {kind} module of {len(data)} bytes")
    return bytes(out)


def registry_add_program(program_id, encoding):
    """graphd_registry_add_program: keeps a copy of a program's canonical
    encoding, checked against its id; its modules must be added first.
    Adding the same program again is accepted."""
    if isinstance(program_id, str):
        program_id = bytes.fromhex(program_id)
    encoding = bytes(encoding)
    st = lib().graphd_registry_add_program(_id_arg(program_id), encoding, len(encoding))
    if st:
        raise GraphdError(st, f"graphd_registry_add_program refused program {bytes(program_id).hex()}")
    return None


def status_name_c(code):
    return lib().graphd_status_name(code).decode()


__all__ = ["Client", "Stream", "HostBuffer", "CProgram", "lib", "version", "uuid_parse",
           "uuid_format", "c_module_id", "status_name", "registry_add_module",
           "registry_add_program"]
