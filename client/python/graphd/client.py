"""The public client of graphd: Client, one libgraphd session (a control
session, or a data session bound to one device), with the Stream and
HostBuffer it hands out, and clear().

It sits on the ctypes binding (graphd._lib, which loads libgraphd on first
use) and, for programs replayed on framework arrays, on the array path
(graphd._bind). Every failing call raises the GraphdError subclass of its
status (graphd.errors), with libgraphd's message for the calling thread's
own failure.

Threads: a Client may be used from several threads at once (libgraphd
serialises the calls on one handle); close() waits for the calls in
progress and refuses new ones.

fork(): a Client belongs to the process that connected it. In a child of
fork() every inherited Client is disowned at once (os.register_at_fork):
its calls raise FailedPrecondition, and closing or dropping it touches
nothing the parent's session shares with the child (libgraphd's
graphd_forget). A child that wants graphd connects afresh.

Logging: the "graphd" logger reports reconnects to a new daemon (INFO) and
the captures an eviction freed (INFO)."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from . import _deprecated
from ._bind import Binder
from ._cuda import device_uuid as _cuda_device_uuid
from ._lib import (ERRMAX, SESSION_CONTROL, SESSION_DATA, capture_records_free, graphd_binding,
                   graphd_capture_record, graphd_connect_options, graphd_daemon_status,
                   graphd_device_info, graphd_device_record, graphd_evict_options, graphd_prepare_info,
                   graphd_region_ref, graphd_replay_info, id_arg, lib, record_metrics, status_requests,
                   status_sessions, struct_dict, uuid_parse)
from .errors import FailedPrecondition, GraphdError, InvalidArgument, InvalidArgumentType
from .program import ID_LEN, MODES, MODULE_KINDS, Program
from .records import (CaptureInfo, DaemonStatus, DeviceInfo, ModuleKind, PrepareInfo, RegionRef,
                      ReplayInfo)

log = logging.getLogger("graphd")

_MODE_NAMES = {v: k for k, v in MODES.items()}

#: A binding of replay_bindings: (slot, pointer or HostBuffer, bytes).
Binding = Tuple[int, Union[int, "HostBuffer"], int]

# Every live Client, so that a child of fork disowns them all.
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for c in list(_clients):
        c._disown()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class HostBuffer:
    """Memory from graphd_host_alloc on one Client: a shared memfd mapping
    that host devices import.

    Attributes
    ----------
    ptr : int
        Its address.
    size : int
        Its bytes.

    Use it as a context manager to free it at the end of a block. free()
    (and the Client's close()) refuse while a view of it is alive, since
    the memory would go from under the view.
    """

    def __init__(self, client: "Client", ptr: int, size: int) -> None:
        self.client = client
        self.ptr = ptr
        self.size = size
        self._freed = False
        # Each view's buffer object: alive while the view (or anything made
        # from it, a cast, a slice, a NumPy array) is.
        self._type: Any = type("HostBytes", (ctypes.c_ubyte * size,), {"__hash__": object.__hash__})
        self._exports: "weakref.WeakSet[Any]" = weakref.WeakSet()

    @property
    def view(self) -> memoryview:
        """A writable memoryview of the bytes.

        Returns
        -------
        memoryview
            Format "B", `size` bytes. Release it (``del``, or
            ``memoryview.release()``, or ``with b.view as v:``) before
            free().

        Raises
        ------
        FailedPrecondition
            When the buffer was freed, or its Client closed.
        """
        if self._freed:
            raise FailedPrecondition("FAILED_PRECONDITION", "the host buffer was freed")
        exp = self._type.from_address(self.ptr)
        exp._owner = self  # the buffer (and its Client) outlive every view
        self._exports.add(exp)
        return memoryview(exp).cast("B")

    def live_views(self) -> int:
        """How many views of the buffer are alive.

        Returns
        -------
        int
            Views not yet released or collected.
        """
        return len(self._exports)

    def free(self) -> None:
        """Frees the memory (graphd_host_free, which also unregisters its
        region). Idempotent.

        Raises
        ------
        FailedPrecondition
            While a view of it is alive (nothing is freed), or when its
            Client was inherited through fork (the memory is the parent's
            too, and stays mapped).
        """
        if self._freed:
            return
        n = self.live_views()
        if n:
            raise FailedPrecondition("FAILED_PRECONDITION",
                                     f"{n} view(s) of this host buffer are alive: release them (del, "
                                     "memoryview.release(), or `with buf.view as v:`) before free()")
        self.client._host_free(self)
        self._freed = True

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.free()


class Stream:
    """A client stream attached to a data session (graphd_stream).

    Attributes
    ----------
    cuda_stream : int or None
        The CUstream it was attached with (None: the legacy default
        stream, and what host devices use).

    Use it as a context manager to detach it at the end of a block.
    """

    cuda_stream: Optional[int] = None

    def __init__(self, client: "Client", handle: Optional[int]) -> None:
        self.client = client
        self.handle = handle

    def detach(self) -> None:
        """Detaches the stream (graphd_stream_detach); work already queued
        is not affected. Idempotent."""
        if self.handle:
            self.client._detach(self)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


class Client:
    """One libgraphd session: a control session (status, list, evict) or a
    data session bound to one device. Make one with :meth:`connect` (or
    :meth:`connect_cuda`); use it as a context manager, or close() it::

        with Client.connect(socket_path) as ctl:
            dev = ctl.status()["devices"][0]
        with Client.connect(socket_path, device_uuid=dev["uuid"]) as c:
            ...
    """

    def __init__(self, handle: int) -> None:
        self._h: Optional[int] = handle
        self._pid = os.getpid()
        self._cv = threading.Condition(threading.Lock())
        self._users = 0  # calls in progress; guarded by _cv
        self._closing = False
        self._inherited = False
        self._streams: List[Stream] = []
        self._host: List[HostBuffer] = []
        self._binder: Optional[Binder] = None  # the array path's state, made on first use
        self._session = 0
        _clients.add(self)
        self._session = lib().graphd_session_id(handle)

    # --- connecting -----------------------------------------------------

    @classmethod
    def connect_cuda(cls, ordinal: int = 0, socket_path: Optional[Union[str, os.PathLike]] = None,
                     **kw: Any) -> "Client":
        """A data session on a CUDA device of this process.

        Parameters
        ----------
        ordinal
            The device as this process numbers it (CUDA_VISIBLE_DEVICES
            applies); its UUID comes from the driver.
        socket_path
            The daemon's socket (None: libgraphd's default).
        **kw
            As :meth:`connect` (timeout_ms, client_name, reconnect_ms).

        Returns
        -------
        Client

        Raises
        ------
        FailedPrecondition
            When the CUDA driver cannot be loaded.
        GraphdError
            As :meth:`connect`.
        """
        socket_path = _deprecated.renamed_kw(kw, "socket", "socket_path", socket_path,
                                             "Client.connect_cuda")
        return cls.connect(socket_path, device_uuid=_cuda_device_uuid(ordinal), **kw)

    @classmethod
    def connect(cls, socket_path: Optional[Union[str, os.PathLike]] = None,
                device_uuid: Optional[Union[str, bytes]] = None, timeout_ms: int = 0,
                client_name: Optional[str] = "graphd-python",
                reconnect_ms: Optional[int] = None) -> "Client":
        """Connects to the daemon: a data session when device_uuid is
        given, else a control session.

        Every call goes through libgraphd, which reconnects by itself when
        the daemon went away (a restart) and sends the call again when it
        never ran. A replay that may have run is not sent again: it raises
        Unavailable.

        Parameters
        ----------
        socket_path
            The daemon's socket; None is libgraphd's default
            ($GRAPHD_SOCKET, else /run/graphd/graphd.sock for root, else
            $XDG_RUNTIME_DIR/graphd.sock; docs/environment.md).
        device_uuid
            The device of a data session: 16 bytes, or a string such as
            "HOST-..." or "GPU-...".
        timeout_ms
            The bound of each call in milliseconds (0: 30000).
        client_name
            Shown in the daemon's logs and stats.
        reconnect_ms
            How long a call that finds the daemon gone waits for a new one
            (None: libgraphd's default, 30000 or $GRAPHD_RECONNECT_MS; 0:
            never).

        Returns
        -------
        Client

        Raises
        ------
        Unavailable
            No daemon listens on the socket.
        NotFound
            The daemon serves no device with that UUID.
        PermissionDenied
            The socket refuses this user.
        InvalidArgument
            A malformed UUID, socket path or name.
        LibraryError
            libgraphd cannot be loaded, or is too old.
        """
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
                raise InvalidArgument("INVALID_ARGUMENT", f"a device UUID is 16 bytes, not {len(u)}")
            o.kind = SESSION_DATA
            o.device_uuid[:] = list(u)
        else:
            o.kind = SESSION_CONTROL
        h = ctypes.c_void_p()
        err = ctypes.create_string_buffer(ERRMAX)
        st = l.graphd_connect(ctypes.byref(o), ctypes.byref(h), err, ERRMAX)
        if st:
            raise GraphdError(st, err.value.decode(errors="replace"))
        assert h.value is not None
        c = cls(h.value)
        if reconnect_ms is not None:
            c.set_reconnect_wait(reconnect_ms)
        return c

    def set_reconnect_wait(self, ms: int) -> None:
        """How long a call that finds the daemon gone waits for a new one.

        The call is then sent again, once, if the old daemon never started
        it; the flag page, streams and programs synced from the registry
        carry over, and regions register again as they are next used.

        Parameters
        ----------
        ms
            Milliseconds, retrying with backoff (0: never reconnect).

        Raises
        ------
        InvalidArgument
            For a negative wait.
        """
        h = self._enter()
        try:
            st = lib().graphd_set_reconnect_wait(h, int(ms))
        finally:
            self._leave()
        if st:
            raise InvalidArgument("INVALID_ARGUMENT", "the reconnect wait must be 0 or more milliseconds")

    # --- life ------------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # Best effort; close() explicitly.
        try:
            self.close()
        except Exception:
            pass

    @property
    def closed(self) -> bool:
        """Whether the client is closed (or was inherited through fork)."""
        return self._h is None

    def close(self) -> None:
        """Detaches the streams, frees the host buffers and closes the
        session; waits for the calls other threads have in progress and
        refuses later ones. Idempotent. In a child of fork it only forgets
        the inherited handle (the parent's session is not touched).

        Raises
        ------
        FailedPrecondition
            While a view of one of its host buffers is alive (nothing is
            closed then), or when called from inside one of its own calls.
        """
        with self._cv:
            if self._h is None or self._closing:
                return
            views = sum(b.live_views() for b in self._host)
            if views:
                raise FailedPrecondition("FAILED_PRECONDITION",
                                         f"{views} view(s) of this client's host buffers are alive: release "
                                         "them before close(), whose unmapping would leave them dangling")
            self._closing = True
            while self._users:
                self._cv.wait()
            h = self._h
        l = lib()
        if self._binder is not None:
            self._binder.close()
        for s in list(self._streams):
            if s.handle:
                l.graphd_stream_detach(s.handle)
                s.handle = None
        self._streams = []
        for b in self._host:
            b._freed = True
        self._host = []
        with self._cv:
            self._h = None
            self._closing = False
        l.graphd_close(h)

    def _disown(self) -> None:
        """In a child of fork: forgets the inherited handle (graphd_forget:
        the child's memory and descriptors only) and refuses every later
        call. Host buffers stay mapped (their memory is shared with the
        parent) and their views valid."""
        h, self._h = self._h, None
        self._inherited = True
        self._cv = threading.Condition(threading.Lock())  # the parent's may have been held
        self._users = 0
        self._closing = False
        for s in self._streams:
            s.handle = None
        self._streams = []
        self._binder = None
        if h:
            lib().graphd_forget(h)

    def _enter(self) -> int:
        """The handle for one call: counts the call in progress (close()
        waits for it). Raises FailedPrecondition on a closed client."""
        with self._cv:
            h = self._h
            if h is None or self._closing:
                if self._inherited:
                    raise FailedPrecondition("FAILED_PRECONDITION",
                                             f"this Client was inherited through fork() from process "
                                             f"{self._pid}: a child must connect afresh")
                raise FailedPrecondition("FAILED_PRECONDITION", "the client is closed")
            self._users += 1
            return h

    def _leave(self) -> None:
        with self._cv:
            self._users -= 1
            if not self._users:
                self._cv.notify_all()

    def _handle(self) -> int:
        """The handle, for a check that the client is open."""
        h = self._enter()
        self._leave()
        return h

    def _call(self, name: str, *args: Any) -> Any:
        """libgraphd's `name`(handle, *args); a failing status raises, with
        the message of this thread's own failure."""
        h = self._enter()
        try:
            l = lib()
            st = getattr(l, name)(h, *args)
            if st:
                self._raise(l, h, st)
            self._watch_session(l, h)
            return st
        finally:
            self._leave()

    def _raise(self, l: Any, h: int, st: int) -> None:
        buf = ctypes.create_string_buffer(ERRMAX)
        got = l.graphd_last_error_r(h, buf, ERRMAX)
        msg = buf.value.decode(errors="replace")
        raise GraphdError(got if got else st, msg)

    def _watch_session(self, l: Any, h: int) -> None:
        sid = l.graphd_session_id(h)
        if sid != self._session:
            log.info("graphd: reconnected to a new daemon (session %d, was %d); regions register again",
                     sid, self._session)
            self._session = sid

    def _check(self, st: int, what: Optional[str] = None) -> None:
        if st:
            l = lib()
            self._raise(l, self._handle(), st)

    @property
    def session_id(self) -> int:
        """The daemon's id of this session (graphd_session_id)."""
        return int(lib().graphd_session_id(self._handle()))

    def ping(self, payload: bytes = b"") -> None:
        """A round trip to the daemon, echoing payload.

        Parameters
        ----------
        payload
            Bytes the daemon echoes back.

        Raises
        ------
        Unavailable, DeadlineExceeded, DataLoss
            As for any call.
        """
        self._call("graphd_ping", payload, len(payload))

    def status(self, wait: bool = True) -> DaemonStatus:
        """The daemon's status.

        Parameters
        ----------
        wait
            False answers at once from each device's last figures, without
            waiting up to 500 ms for a busy worker (graphd_get_status_now).

        Returns
        -------
        DaemonStatus
            version, uptime_ms, pid, sessions, modules, module_bytes,
            programs; devices (graphd_device_info's fields, uuid as bytes,
            counters as a dict, figures_age_ms, work: replay_ns over
            replays, of it launch_ns in the driver's graph launches,
            gpu_ns over gpu_replays sampled, and busy_ns over clock_ns,
            the worker's busy time and its time base; and metrics, every
            device counter of graphd's list by its name, as graphctl
            stats --json has them: the library's graphd_device_metric);
            session_info, one per open session (graphd_session_info's
            fields with the record's gid, age_ms, idle_ms, admin, busy,
            flag_slots and has_ring: see SessionInfo); requests, one per
            kind of request the daemon knows: its name (request), calls,
            errors (answered with a status other than OK) and handler_ns
            (the daemon's loop thread's time in their handler).
        """
        l = lib()
        p = ctypes.POINTER(graphd_daemon_status)()
        self._call("graphd_get_status" if wait else "graphd_get_status_now", ctypes.byref(p))
        try:
            s = p.contents
            out: Dict[str, Any] = {n: getattr(s, n) for n in ("uptime_ms", "pid", "sessions", "modules",
                                                              "module_bytes", "programs")}
            out["version"] = s.version.decode(errors="replace")
            devices = []
            for i in range(s.ndevices):
                r = graphd_device_record()
                if l.graphd_daemon_status_device(p, i, ctypes.byref(r), ctypes.sizeof(r)):
                    raise GraphdError("INTERNAL", f"graphd_daemon_status_device refused device {i}")
                work = dict(struct_dict(r.work), launch_ns=r.launch_ns, busy_ns=r.worker_busy_ns,
                            clock_ns=r.worker_clock_ns)
                devices.append(dict(struct_dict(r.info), figures_age_ms=r.figures_age_ms, work=work,
                                    metrics=record_metrics(r)))
            out["devices"] = devices
            out["session_info"] = status_sessions(p)
            out["requests"] = status_requests(p)
        finally:
            l.graphd_daemon_status_free(p)
        return out  # type: ignore[return-value]

    def device(self) -> DeviceInfo:
        """The device of a data session, as at connect.

        Returns
        -------
        DeviceInfo

        Raises
        ------
        FailedPrecondition
            On a control session.
        """
        d = graphd_device_info()
        self._call("graphd_session_device", ctypes.byref(d))
        return struct_dict(d)  # type: ignore[return-value]

    def register_module(self, kind: Union[ModuleKind, int], data: bytes) -> bytes:
        """Registers GPU code or a host module with the daemon.

        A copy goes into the process's client-side registry too, so that a
        session made after a daemon restart can be given it again.

        Parameters
        ----------
        kind
            "ptx", "cubin", "fatbin" or "host_elf" (or 1 to 4).
        data
            The module's bytes.

        Returns
        -------
        bytes
            The 32-byte module id.

        Raises
        ------
        InvalidArgument
            An unknown kind, or a module the daemon refuses.
        """
        k = MODULE_KINDS.get(kind, kind) if isinstance(kind, str) else kind
        if not isinstance(k, int) or not 1 <= k <= 4:
            raise InvalidArgument("INVALID_ARGUMENT",
                                  f"module kind {kind!r} is not ptx, cubin, fatbin or host_elf")
        data = bytes(data)
        out = (ctypes.c_uint8 * ID_LEN)()
        self._call("graphd_register_module", k, data, len(data), out)
        lib().graphd_registry_add_module(k, data, len(data), None)
        return bytes(out)

    def register_program(self, program: Union[Program, bytes],
                         program_id: Optional[bytes] = None) -> bytes:
        """Registers a program.

        It goes through the client-side registry when its modules are
        there (they are when this class registered them), so that libgraphd
        gives it to a new session after a daemon restart.

        Parameters
        ----------
        program
            A Program (finished here if it is not), or its canonical
            encoding.
        program_id
            The encoding's 32-byte id (with an encoding only).

        Returns
        -------
        bytes
            The program id.

        Raises
        ------
        InvalidArgument
            An encoding without its id, or a program the daemon refuses.
        NotFound
            A module the program launches is not registered.
        """
        if isinstance(program, Program):
            enc, pid = program.finish()
        else:
            if program_id is None:
                raise InvalidArgument("INVALID_ARGUMENT", "an encoding needs its program id")
            enc, pid = bytes(program), bytes(program_id)
        if lib().graphd_registry_add_program(id_arg(pid), enc, len(enc)) == 0:
            self._call("graphd_registry_sync", id_arg(pid))
        else:
            self._call("graphd_register_program_encoding", id_arg(pid), enc, len(enc))
        return pid

    def prepare_program(self, program_id: bytes) -> PrepareInfo:
        """Runs the device stage of validation now (the first replay would).

        Parameters
        ----------
        program_id
            A registered program's 32-byte id.

        Returns
        -------
        PrepareInfo
            modules_loaded (0: all were cached) and load_ns.

        Raises
        ------
        NotFound
            The program is not registered.
        InvalidArgument
            A launch does not fit its function.
        """
        info = graphd_prepare_info()
        self._call("graphd_prepare_program", id_arg(program_id), ctypes.byref(info))
        return struct_dict(info)  # type: ignore[return-value]

    # --- regions and host memory ----------------------------------------

    def region_register(self, ptr: int, nbytes: int) -> RegionRef:
        """Registers (or finds in the cache) the region holding [ptr, ptr + nbytes).

        Parameters
        ----------
        ptr
            A CUdeviceptr, or a host buffer's address, as an int.
        nbytes
            Bytes from ptr.

        Returns
        -------
        RegionRef
            region_id, the pointer's offset in it, its size, and import_ns
            when this call registered it.

        Raises
        ------
        FailedPrecondition
            Memory graphd cannot share (stream-ordered pools), or on
            another device.
        """
        ref = graphd_region_ref()
        self._call("graphd_region_register", ptr, nbytes, ctypes.byref(ref))
        return struct_dict(ref)  # type: ignore[return-value]

    def region_forget(self, ptr: int) -> None:
        """Unregisters the cached region holding ptr (do it before freeing
        cudaMalloc memory).

        Parameters
        ----------
        ptr
            An address in the region.

        Raises
        ------
        NotFound
            No cached region holds ptr.
        """
        self._call("graphd_region_forget", ptr)

    def region_unregister(self, region_id: int) -> None:
        """Unregisters a region by id; the daemon unmaps it once the work
        queued on it is done.

        Parameters
        ----------
        region_id
            From region_register.

        Raises
        ------
        NotFound
            No such region.
        """
        self._call("graphd_region_unregister", region_id)

    def held_regions(self) -> List[int]:
        """The region ids that replay_arrays holds for arrays still alive.

        Returns
        -------
        list of int
        """
        return self._binder.held_regions() if self._binder is not None else []

    def region_count(self) -> int:
        """The regions in this handle's cache.

        Returns
        -------
        int
        """
        h = self._enter()
        try:
            return int(lib().graphd_region_count(h))
        finally:
            self._leave()

    def host_alloc(self, nbytes: int) -> HostBuffer:
        """Host-device memory (graphd_host_alloc).

        Parameters
        ----------
        nbytes
            Its size.

        Returns
        -------
        HostBuffer
            Free it with HostBuffer.free() (or a `with` block); close()
            frees the rest.

        Raises
        ------
        ResourceExhausted
            No memory, or over the daemon's --host-memory.
        """
        p = ctypes.c_void_p()
        self._call("graphd_host_alloc", nbytes, ctypes.byref(p))
        assert p.value is not None
        b = HostBuffer(self, p.value, nbytes)
        self._host.append(b)
        return b

    def _host_free(self, b: HostBuffer) -> None:
        self._call("graphd_host_free", b.ptr)
        self._host.remove(b)

    # --- streams and replay ---------------------------------------------

    def stream_attach(self, cuda_stream: Optional[int] = None) -> Stream:
        """Attaches a CUDA stream for replays.

        Parameters
        ----------
        cuda_stream
            A CUstream as an int; None is the legacy default stream, and
            what host devices take.

        Returns
        -------
        Stream
            Detach it with Stream.detach() (or a `with` block).

        Raises
        ------
        ResourceExhausted
            All GRAPHD_MAX_STREAMS (128) slots are attached.
        InvalidArgument
            A CUDA stream on a host device.
        """
        s = ctypes.c_void_p()
        self._call("graphd_stream_attach", cuda_stream, ctypes.byref(s))
        st = Stream(self, s.value)
        st.cuda_stream = cuda_stream
        self._streams.append(st)
        return st

    def _detach(self, s: Stream) -> None:
        if s in self._streams:
            self._streams.remove(s)
        h, s.handle = s.handle, None
        if h is not None and self._h is not None:
            lib().graphd_stream_detach(h)

    def replay_arrays(self, program: Program, *arrays: Any, stream: Any = None) -> ReplayInfo:
        """Replays a Program on framework arrays (PyTorch tensors, CuPy
        arrays, anything with DLPack or __cuda_array_interface__).

        Parameters
        ----------
        program
            A Program, registered here on first use (its modules must be
            registered).
        *arrays
            One per slot that is not scratch or temp, in slot order (or one
            dict {slot: array}); None leaves a slot unbound. Each is
            contiguous, exactly its slot's size, of the slot's dtype where
            add_slot named one, and writable for a slot the program writes.
        stream
            An int CUstream, a torch.cuda.Stream, a CuPy stream or a graphd
            Stream; None takes the arrays' framework's current stream (see
            docs/pytorch.md, "Streams"). None on a host device.

        Returns
        -------
        ReplayInfo
            captured, capture_ns, server_ns.

        Raises
        ------
        InvalidArgument
            An array that does not fit its slot (named in the message).
        """
        self._handle()
        if self._binder is None:
            self._binder = Binder(self)
        return self._binder.replay(program, arrays, stream=stream)  # type: ignore[return-value]

    def replay_bindings(self, stream: Stream, program_id: bytes,
                        bindings: Sequence[Binding]) -> ReplayInfo:
        """Replays a registered program on raw pointers.

        Parameters
        ----------
        stream
            A Stream of this client (stream_attach).
        program_id
            The program's 32-byte id.
        bindings
            (slot, ptr, nbytes) tuples: ptr an int (CUdeviceptr or host
            address) or a HostBuffer; nbytes the slot's size, checked only
            against the whole allocation.

        Returns
        -------
        ReplayInfo
            captured, capture_ns, server_ns.

        Raises
        ------
        InvalidArgumentType
            A stream that is not a graphd Stream, or a malformed binding.
        NotFound
            The program is not registered.
        FailedPrecondition
            A detached stream.
        Unavailable
            The daemon went away after taking the replay (its outputs are
            undefined).
        """
        if not isinstance(stream, Stream):
            raise InvalidArgumentType("INVALID_ARGUMENT",
                                      f"replay_bindings takes a graphd Stream (stream_attach) first, "
                                      f"not {type(stream).__name__}; a Program on framework arrays is "
                                      "replay_arrays(program, *arrays)")
        n = len(bindings)
        arr = (graphd_binding * max(n, 1))()
        for i, b in enumerate(bindings):
            try:
                slot, ptr, nbytes = b
                arr[i].slot = slot
                arr[i].ptr = ptr.ptr if isinstance(ptr, HostBuffer) else ptr
                arr[i].bytes = nbytes
            except (TypeError, ValueError):
                raise InvalidArgumentType("INVALID_ARGUMENT",
                                          f"binding {i} is {b!r}, not (slot, ptr, nbytes) with ptr an "
                                          "int or a HostBuffer") from None
        if not stream.handle:
            raise FailedPrecondition("FAILED_PRECONDITION", "the stream is detached")
        info = graphd_replay_info()
        h = self._enter()
        try:
            l = lib()
            st = l.graphd_replay(h, stream.handle, id_arg(program_id), arr, n, ctypes.byref(info))
            if st:
                self._raise(l, h, st)
            self._watch_session(l, h)
        finally:
            self._leave()
        return struct_dict(info)  # type: ignore[return-value]

    def replay(self, *args: Any, stream: Any = None) -> ReplayInfo:
        """Deprecated: replay_arrays(program, *arrays) or
        replay_bindings(stream, program_id, bindings), told apart by the
        first argument (a Stream or not).

        Returns
        -------
        ReplayInfo

        Raises
        ------
        InvalidArgument
            As the call it stands for.
        """
        if args and not isinstance(args[0], Stream):
            _deprecated.warn("Client.replay(program, *arrays)", "Client.replay_arrays(program, *arrays)")
            return self.replay_arrays(args[0], *args[1:], stream=stream)
        _deprecated.warn("Client.replay(stream, program_id, bindings)",
                         "Client.replay_bindings(stream, program_id, bindings)")
        if len(args) != 3 or stream is not None:
            raise InvalidArgument("INVALID_ARGUMENT",
                                  "replay(stream, program_id, bindings) takes three arguments; "
                                  "the Stream is the first (replay_bindings)")
        return self.replay_bindings(*args)

    # --- captures --------------------------------------------------------

    @staticmethod
    def _captures(ptr: Any, n: int) -> List[CaptureInfo]:
        """The records of graphd_list_capture_records or
        graphd_evict_records as dicts; frees the array."""
        out: List[CaptureInfo] = []
        for i in range(n):
            r = ptr[i]
            c = r.info
            out.append({"program": bytes(c.program_id).hex(), "device": c.device,
                        "mode": _MODE_NAMES.get(c.mode, str(c.mode)), "instances": r.instances,
                        "staging_bytes": c.staging_bytes, "nodes": c.nodes,
                        "replays": c.replays, "idle_ms": c.idle_ms,
                        "pids": list(c.pids[:c.npids]), "busy": bool(c.busy),
                        "generation": c.generation, "created_unix_ms": c.created_unix_ms,
                        "repoints": c.repoints, "graphs": c.graphs, "queue_ns": r.queue_ns})
        if ptr:
            capture_records_free(ptr)
        return out

    def list_captures(self) -> List[CaptureInfo]:
        """Every capture on every device.

        Returns
        -------
        list of CaptureInfo
            program (hex id), device (the daemon's index), mode, instances,
            staging_bytes (over its instances), nodes, replays, idle_ms,
            pids, busy, generation, created_unix_ms, repoints, graphs.
            Devices whose worker was busy past the daemon's bound are
            missing (busy_devices()).
        """
        ptr = ctypes.POINTER(graphd_capture_record)()
        n = ctypes.c_size_t()
        self._call("graphd_list_capture_records", ctypes.sizeof(graphd_capture_record),
                   ctypes.byref(ptr), ctypes.byref(n))
        return self._captures(ptr, n.value)

    def evict(self, program: Optional[Union[bytes, str]] = None, device_index: Optional[int] = None,
              client_pid: int = 0, session: int = 0, idle_ms: int = 0, all: bool = False,
              dry_run: bool = False, **kw: Any) -> Tuple[List[CaptureInfo], int]:
        """Frees captures; the next replay of an evicted program captures again.

        Every selector given must match; at least one, or all=True.

        Parameters
        ----------
        program
            A program id (bytes) or its hex, or a prefix of 6+ hex digits.
        device_index
            The daemon's index of a device (a record's ``device``).
        client_pid
            Captures this process used (its shared ones stay).
        session
            Captures the process of this session used.
        idle_ms
            Captures idle at least this long.
        all
            Every capture (an admin's right).
        dry_run
            Report what would go; change nothing.
        **kw
            The deprecated ``device=`` (device_index) and ``idle_s=``
            (idle_ms / 1000).

        Returns
        -------
        tuple
            (the captures evicted, the staging bytes freed).

        Raises
        ------
        PermissionDenied
            Captures of another user's process, or all=True, without the
            admin's right.
        InvalidArgument
            No selector.
        """
        device_index = _deprecated.renamed_kw(kw, "device", "device_index", device_index, "Client.evict")
        if "idle_s" in kw:
            _deprecated.warn("Client.evict(idle_s=...)", "Client.evict(idle_ms=...)")
            idle_ms = int(kw.pop("idle_s") * 1000)
        if kw:
            raise InvalidArgumentType("INVALID_ARGUMENT",
                                      f"Client.evict() got unexpected keywords {sorted(kw)}")
        o = graphd_evict_options()
        lib().graphd_evict_options_init(ctypes.byref(o))
        if program is not None:
            o.program = (program.hex() if isinstance(program, (bytes, bytearray)) else
                         str(program)).encode()
        if device_index is not None:
            o.device = device_index
        o.client_pid = client_pid
        o.session = session
        o.idle_ms = int(idle_ms)
        o.all = 1 if all else 0
        o.dry_run = 1 if dry_run else 0
        ptr = ctypes.POINTER(graphd_capture_record)()
        n = ctypes.c_size_t()
        nbytes = ctypes.c_uint64()
        self._call("graphd_evict_records", ctypes.byref(o), ctypes.sizeof(graphd_capture_record),
                   ctypes.byref(ptr), ctypes.byref(n), ctypes.byref(nbytes))
        gone = self._captures(ptr, n.value)
        if gone and not dry_run:
            log.info("graphd: evicted %d capture(s), %d staging bytes freed (%s)", len(gone),
                     nbytes.value, ", ".join(c["program"][:12] for c in gone[:8]))
        return gone, nbytes.value

    def busy_devices(self) -> List[int]:
        """The devices the last list_captures or evict could not reach
        within the daemon's bound (their worker was inside a long job).

        Returns
        -------
        list of int
            Daemon device indexes: a list lacks their captures; an eviction
            there runs when the worker is free and is not in the result.
        """
        buf = (ctypes.c_uint32 * 64)()
        h = self._enter()
        try:
            n = lib().graphd_busy_devices(h, buf, 64)
        finally:
            self._leave()
        return [buf[i] for i in range(min(n, 64))]

    def clear(self) -> Tuple[List[CaptureInfo], int]:
        """Evicts every capture only this process used, on every device.

        Returns
        -------
        tuple
            As evict().
        """
        return self.evict(client_pid=os.getpid())


def clear(socket_path: Optional[Union[str, os.PathLike]] = None, device_index: Optional[int] = None,
          **kw: Any) -> Tuple[List[CaptureInfo], int]:
    """Evicts every capture only this process replayed, through a short
    control session: how a JAX program, whose calls go through the FFI
    handler's own sessions, frees its captures. Shared captures stay.

    Parameters
    ----------
    socket_path
        The daemon's socket (None: libgraphd's default).
    device_index
        One device by the daemon's index (None: every device).
    **kw
        The deprecated ``device=`` (device_index).

    Returns
    -------
    tuple
        (the captures evicted, the staging bytes freed).

    Raises
    ------
    Unavailable
        No daemon.
    """
    device_index = _deprecated.renamed_kw(kw, "device", "device_index", device_index, "graphd.clear")
    if kw:
        raise InvalidArgumentType("INVALID_ARGUMENT", f"graphd.clear() got unexpected keywords {sorted(kw)}")
    with Client.connect(socket_path) as c:
        return c.evict(client_pid=os.getpid(), device_index=device_index)


__all__ = ["Client", "Stream", "HostBuffer", "Binding", "clear"]
