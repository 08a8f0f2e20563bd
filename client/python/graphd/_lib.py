"""ctypes bindings to libgraphd (client/include/graphd/graphd.h): the
private layer under graphd.client. It holds the structures, the function
prototypes, the loading of the library, and the helpers that call it
without a session (ids, UUIDs, the client-side registry, the C program
builder for cross-checks). graphd.client.Client is the session built on
them.

The library is found, on first use, through:
  1. $GRAPHD_LIB, a path to libgraphd.so;
  2. libgraphd.so next to this package (a wheel or an install may put it
     there);
  3. ctypes.util.find_library("graphd").
Importing graphd does not load it: the builder is pure Python.

Structures mirror graphd.h field for field; tests/abi_sizes.c prints the C
sizes and offsets, and the Python tests compare them with these.

Every failing call raises GraphdError(status name, libgraphd's message)."""

import ctypes
import ctypes.util
import os
import threading
from typing import Any, Dict, List

from ._version import __version__
from .errors import GraphdError, LibraryError, status_name
from .program import ID_LEN, MODES, MODULE_KINDS, OWNED_ROLES, ROLES

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


class graphd_device_work(ctypes.Structure):
    _fields_ = [("replay_ns", _u64), ("replays", _u64), ("gpu_ns", _u64), ("gpu_replays", _u64)]


LATENCY_BOUNDS = 32


class graphd_latency_histogram(ctypes.Structure):
    _fields_ = [("nbounds", _u32), ("le_ns", _u64 * LATENCY_BOUNDS),
                ("le_count", _u64 * LATENCY_BOUNDS), ("count", _u64), ("sum_ns", _u64)]


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
        ("work", ctypes.POINTER(graphd_device_work)),
        ("launch_ns", ctypes.POINTER(_u64)),
        ("figures_age_ms", ctypes.POINTER(_u64)),
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
                ("generation", _u32), ("created_unix_ms", _u64), ("repoints", _u64),
                ("graphs", _u32)]


class graphd_capture_record(ctypes.Structure):
    _fields_ = [("size", _u32), ("instances", _u32), ("info", graphd_capture_info),
                ("queue_ns", _u64)]


class graphd_evict_options(ctypes.Structure):
    _fields_ = [("program", ctypes.c_char_p), ("device", _int), ("client_pid", _u32),
                ("session", _u64), ("idle_ms", _u64), ("all", _int), ("dry_run", _int)]


# Room past the fields named below for the counters a later libgraphd
# appends to graphd_device_record: they are read by their offsets in
# graphd_device_metric's list (device_metrics), never by name here.
RECORD_TAIL_ROOM = 64


class graphd_device_record(ctypes.Structure):
    _fields_ = [("size", _u32), ("index", _u32), ("info", graphd_device_info),
                ("work", graphd_device_work), ("launch_ns", _u64), ("figures_age_ms", _u64),
                ("replay_latency", graphd_latency_histogram), ("staging_budget_bytes", _u64),
                ("instances", _u64), ("graphs", _u64), ("worker_busy_ns", _u64),
                ("worker_clock_ns", _u64), ("tail", _u64 * RECORD_TAIL_ROOM)]


class graphd_session_record(ctypes.Structure):
    _fields_ = [("size", _u32), ("index", _u32), ("info", graphd_session_info), ("age_ms", _u64),
                ("idle_ms", _u64), ("gid", _u32), ("flag_slots", _u32), ("admin", _int),
                ("busy", _int), ("has_ring", _int)]


class graphd_metric_info(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("field", _u32), ("offset", _u32),
                ("kind", ctypes.c_char_p), ("unit", ctypes.c_char_p),
                ("prometheus", ctypes.c_char_p), ("prometheus_own", _int),
                ("help", ctypes.c_char_p)]


class graphd_request_record(ctypes.Structure):
    _fields_ = [("size", _u32), ("request", ctypes.c_char * 32), ("calls", _u64),
                ("errors", _u64), ("handler_ns", _u64)]


# The structures whose layout the tests compare with C (tests/abi_sizes.c).
STRUCTS = {c.__name__: c for c in (
    graphd_connect_options, graphd_device_counters, graphd_device_info, graphd_session_info,
    graphd_device_work, graphd_latency_histogram, graphd_daemon_status, graphd_region_ref,
    graphd_binding, graphd_replay_info, graphd_prepare_info, graphd_capture_info,
    graphd_capture_record, graphd_evict_options, graphd_device_record, graphd_session_record,
    graphd_metric_info, graphd_request_record)}

_P = ctypes.c_void_p
_ID = ctypes.POINTER(_u8)  # uint8_t[32]

# name: (restype, argtypes). Status-returning calls have restype int.
_PROTOS = {
    "graphd_version": (ctypes.c_char_p, []),
    "graphd_version_number": (_u32, []),
    "graphd_forget": (None, [_P]),
    "graphd_last_error_r": (_int, [_P, ctypes.c_char_p, ctypes.c_size_t]),
    "graphd_daemon_status_device": (_int, [ctypes.POINTER(graphd_daemon_status), _u32,
                                           ctypes.POINTER(graphd_device_record), ctypes.c_size_t]),
    "graphd_daemon_status_session": (_int, [ctypes.POINTER(graphd_daemon_status), _u32,
                                            ctypes.POINTER(graphd_session_record), ctypes.c_size_t]),
    "graphd_capture_info_free": (None, [ctypes.POINTER(graphd_capture_info)]),
    "graphd_device_metric": (ctypes.POINTER(graphd_metric_info), [_u32]),
    "graphd_daemon_status_requests": (_int, [ctypes.POINTER(graphd_daemon_status), ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.POINTER(graphd_request_record)),
                                             ctypes.POINTER(ctypes.c_size_t)]),
    "graphd_request_records_free": (None, [ctypes.POINTER(graphd_request_record)]),
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
    "graphd_get_status_now": (_int, [_P, ctypes.POINTER(ctypes.POINTER(graphd_daemon_status))]),
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
    "graphd_list_capture_records": (_int, [_P, ctypes.c_size_t,
                                           ctypes.POINTER(ctypes.POINTER(graphd_capture_record)),
                                           ctypes.POINTER(ctypes.c_size_t)]),
    "graphd_evict_records": (_int, [_P, ctypes.POINTER(graphd_evict_options), ctypes.c_size_t,
                                    ctypes.POINTER(ctypes.POINTER(graphd_capture_record)),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(_u64)]),
    "graphd_capture_records_free": (None, [ctypes.POINTER(graphd_capture_record)]),
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


def _parse_version(text):
    try:
        return tuple(int(x) for x in text.split(".")[:3])
    except ValueError:
        return None


def check_version(found, path, what="libgraphd"):
    """Refuses a library older than this package, or of another major
    version (another SONAME): its ctypes prototypes would not match.

    Parameters
    ----------
    found : str
        The library's version string (graphd_version()).
    path : str
        Where it was loaded from, for the message.
    what : str
        The library's name, for the message.

    Raises
    ------
    LibraryError
        When the versions do not fit.
    """
    want = _parse_version(__version__)
    got = _parse_version(found)
    if got is None or want is None or got[0] != want[0] or got[:2] < want[:2]:
        raise LibraryError("FAILED_PRECONDITION",
                           f"{what} {found} at {path} does not fit the graphd package {__version__}: it "
                           f"needs {want[0]}.{want[1]} or a later {want[0]}.x. Install the matching "
                           "library (pip install graphd puts both in one wheel), or point GRAPHD_LIB at "
                           "the libgraphd.so of the same build")


def lib():
    """The loaded libgraphd, with argument and result types set.

    Returns
    -------
    ctypes.CDLL
        The library, loaded once per process from $GRAPHD_LIB, else
        libgraphd.so next to this package, else find_library("graphd").

    Raises
    ------
    LibraryError
        When it cannot be found or loaded, lacks a function this package
        calls, or is older than this package (graphd_version()). Not
        Unavailable: waiting does not bring a library.
    """
    global _lib
    if _lib is not None:  # no lock once loaded (nor in a child of fork)
        return _lib
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
            try:
                l.graphd_version.restype = ctypes.c_char_p
                found = l.graphd_version().decode()
            except AttributeError:
                errors.append(f"{path}: not libgraphd (no graphd_version)")
                continue
            check_version(found, path)
            for name, (res, args) in _PROTOS.items():
                try:
                    f = getattr(l, name)
                except AttributeError:
                    raise LibraryError("FAILED_PRECONDITION",
                                       f"libgraphd {found} at {path} has no {name}: it is older than "
                                       f"the graphd package {__version__}") from None
                f.restype = res
                f.argtypes = args
            _lib = l
            return l
        where = "; ".join(errors) if errors else "none found: set GRAPHD_LIB to the path of libgraphd.so"
        raise LibraryError("FAILED_PRECONDITION", f"cannot load libgraphd: {where}")


def version():
    """libgraphd's version string."""
    return lib().graphd_version().decode()


def id_arg(id_bytes):
    """A 32-byte id as the uint8_t[32] a call takes; another length is
    refused."""
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


def struct_dict(s):
    """A ctypes structure as a dict of Python values (bytes arrays of
    uint8 become bytes; char arrays become str)."""
    out = {}
    for name, typ in s._fields_:
        v = getattr(s, name)
        if isinstance(v, ctypes.Structure):
            v = struct_dict(v)
        elif isinstance(v, bytes):
            v = v.decode(errors="replace")
        elif isinstance(v, ctypes.Array):
            v = bytes(v)
        out[name] = v
    return out


_metrics_cache: List[Dict[str, Any]] = []


def device_metrics():
    """The device counters this libgraphd knows (graphd_device_metric), as
    dicts of graphd_metric_info's fields, in the list's order."""
    if not _metrics_cache:
        out, i = [], 0
        while (p := lib().graphd_device_metric(i)):
            m = p.contents
            out.append({"name": m.name.decode(), "field": m.field, "offset": m.offset,
                        "kind": m.kind.decode(), "unit": m.unit.decode(),
                        "prometheus": m.prometheus.decode(), "prometheus_own": bool(m.prometheus_own),
                        "help": m.help.decode()})
            i += 1
        _metrics_cache[:] = out
    return list(_metrics_cache)


def record_metrics(r):
    """Every device counter of a graphd_device_record the library filled, by
    name: those past the bytes it filled are not in it."""
    raw = ctypes.string_at(ctypes.addressof(r), min(r.size, ctypes.sizeof(r)))
    return {m["name"]: _u64.from_buffer_copy(raw, m["offset"]).value
            for m in device_metrics() if m["offset"] + 8 <= len(raw)}


def status_sessions(p):
    """The sessions of a status from libgraphd (a pointer to
    graphd_daemon_status), each as a dict of graphd_session_record's
    figures: its graphd_session_info's fields and those past it."""
    l = lib()
    out = []
    for i in range(p.contents.nsession_info):
        r = graphd_session_record()
        st = l.graphd_daemon_status_session(p, i, ctypes.byref(r), ctypes.sizeof(r))
        if st:
            raise GraphdError(status_name(st), f"graphd_daemon_status_session refused session {i}")
        d = struct_dict(r)
        info = d.pop("info")
        del d["size"], d["index"]
        out.append(dict(info, **d))
    return out


def status_requests(p):
    """The request counters of a status from libgraphd (a pointer to
    graphd_daemon_status), as dicts of graphd_request_record's fields."""
    l = lib()
    recs = ctypes.POINTER(graphd_request_record)()
    n = ctypes.c_size_t()
    st = l.graphd_daemon_status_requests(p, ctypes.sizeof(graphd_request_record), ctypes.byref(recs),
                                         ctypes.byref(n))
    if st:
        raise GraphdError(status_name(st), "graphd_daemon_status_requests failed")
    try:
        return [{k: v for k, v in struct_dict(recs[i]).items() if k != "size"}
                for i in range(n.value)]
    finally:
        l.graphd_request_records_free(recs)


def capture_info_free(ptr):
    """Frees a list of captures from libgraphd (graphd_capture_info_free)."""
    lib().graphd_capture_info_free(ptr)


def capture_records_free(ptr):
    """Frees a list of capture records from libgraphd
    (graphd_capture_records_free)."""
    lib().graphd_capture_records_free(ptr)


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
        r = ROLES.get(role, role)
        if staged is None:
            staged = r not in OWNED_ROLES
        return self._idx(self._l.graphd_program_add_slot(self._p, r, nbytes, int(bool(staged))))

    def add_launch(self, module_id, function, grid, block, shared_bytes=0):
        def dim3(v):
            v = (v,) if isinstance(v, int) else tuple(v)
            return (_u32 * 3)(*(v + (1,) * (3 - len(v))))
        g, b = dim3(grid), dim3(block)
        return self._idx(self._l.graphd_program_add_launch(self._p, id_arg(module_id), function.encode(),
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
    st = lib().graphd_registry_add_program(id_arg(program_id), encoding, len(encoding))
    if st:
        raise GraphdError(st, f"graphd_registry_add_program refused program {bytes(program_id).hex()}")
    return None


def status_name_c(code):
    return lib().graphd_status_name(code).decode()


__all__ = ["CProgram", "STRUCTS", "lib", "version", "uuid_parse", "uuid_format", "c_module_id", "status_name",
           "registry_add_module", "registry_add_program"]
