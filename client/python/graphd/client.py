"""The public client of graphd: Client, one libgraphd session (a control
session, or a data session bound to one device), with the Stream and
HostBuffer it hands out, and clear().

It sits on the ctypes binding (graphd._lib, which loads libgraphd on first
use) and, for programs replayed on framework arrays, on the array path
(graphd._bind). Every failing call raises GraphdError(status name,
libgraphd's message). ctypes releases the GIL around each call; a Client
may be used from several threads, since libgraphd serialises calls on one
handle (but the message of a failure is read after the call, so under
heavy concurrency on one handle it may belong to another thread's
failure)."""

import ctypes
import os

from ._cuda import device_uuid
from ._bind import Binder
from ._lib import (ERRMAX, SESSION_CONTROL, SESSION_DATA, graphd_binding, graphd_capture_info,
                   graphd_connect_options, graphd_daemon_status, graphd_device_info, graphd_evict_options,
                   graphd_prepare_info, graphd_region_ref, graphd_replay_info, id_arg, lib, libc_free,
                   struct_dict, uuid_parse)
from .errors import GraphdError
from .program import ID_LEN, MODES, MODULE_KINDS, Program

_MODE_NAMES = {v: k for k, v in MODES.items()}


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
        return cls.connect(socket_path, device_uuid=device_uuid(ordinal), **kw)

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
        h = ctypes.c_void_p()
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

    def status(self, wait=True):
        """The daemon's status as a dict: version, uptime_ms, pid, sessions,
        modules, module_bytes, programs, devices (a list of dicts with the
        fields of graphd_device_info, its counters as a dict, uuid as
        bytes, figures_age_ms: how old its free memory and GPU time are,
        and "work": the worker's time in the replay path,
        replay_ns over replays, launch_ns of it in the driver's graph
        launches, where the worker waits while the device's queue is full,
        and the device's time running the replays it timed, gpu_ns over
        gpu_replays) and session_info (a list of dicts). wait=False answers
        at once from each device's last figures, without waiting up to
        500 ms on a busy worker."""
        l = lib()
        p = ctypes.POINTER(graphd_daemon_status)()
        ask = l.graphd_get_status if wait else l.graphd_get_status_now
        self._check(ask(self._handle(), ctypes.byref(p)))
        try:
            s = p.contents
            out = {n: getattr(s, n) for n in ("uptime_ms", "pid", "sessions", "modules",
                                               "module_bytes", "programs")}
            out["version"] = s.version.decode(errors="replace")
            out["devices"] = [dict(struct_dict(s.devices[i]),
                                   figures_age_ms=s.figures_age_ms[i],
                                   work=dict(struct_dict(s.work[i]), launch_ns=s.launch_ns[i]))
                              for i in range(s.ndevices)]
            out["session_info"] = [struct_dict(s.session_info[i]) for i in range(s.nsession_info)]
        finally:
            l.graphd_daemon_status_free(p)
        return out

    def device(self):
        """The device of a data session, as a dict (see status())."""
        d = graphd_device_info()
        self._check(lib().graphd_session_device(self._handle(), ctypes.byref(d)))
        return struct_dict(d)

    def register_module(self, kind, data):
        """Registers a module (kind "ptx", "cubin", "fatbin", "host_elf" or
        1 to 4) and returns its 32-byte id. A copy goes into the process's
        client-side registry too, so that a session made after a daemon
        restart can be given it again."""
        k = MODULE_KINDS.get(kind, kind) if isinstance(kind, str) else kind
        if not isinstance(k, int) or not 1 <= k <= 4:
            raise GraphdError("INVALID_ARGUMENT", f"module kind {kind!r} is not ptx, cubin, fatbin or host_elf")
        data = bytes(data)
        out = (ctypes.c_uint8 * ID_LEN)()
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
        if l.graphd_registry_add_program(id_arg(pid), enc, len(enc)) == 0:
            self._check(l.graphd_registry_sync(self._handle(), id_arg(pid)))
        else:
            self._check(l.graphd_register_program_encoding(self._handle(), id_arg(pid), enc, len(enc)))
        return pid

    def prepare_program(self, program_id):
        """Runs the device stage of validation now; returns
        {"modules_loaded", "load_ns"}."""
        info = graphd_prepare_info()
        self._check(lib().graphd_prepare_program(self._handle(), id_arg(program_id), ctypes.byref(info)))
        return struct_dict(info)

    # --- regions and host memory ----------------------------------------

    def region_register(self, ptr, nbytes):
        ref = graphd_region_ref()
        self._check(lib().graphd_region_register(self._handle(), ptr, nbytes, ctypes.byref(ref)))
        return struct_dict(ref)

    def region_forget(self, ptr):
        self._check(lib().graphd_region_forget(self._handle(), ptr))

    def region_unregister(self, region_id):
        """Unregisters a region by id (graphd_region_unregister); the daemon
        unmaps it once the work queued on it is done."""
        self._check(lib().graphd_region_unregister(self._handle(), region_id))

    def held_regions(self):
        """The region ids that replay_arrays holds registered for arrays
        still alive."""
        return self._binder.held_regions() if self._binder is not None else []

    def region_count(self):
        return lib().graphd_region_count(self._handle())

    def host_alloc(self, nbytes):
        """Host-device memory of nbytes bytes (graphd_host_alloc), as a
        HostBuffer. Free with HostBuffer.free(); close() frees the rest."""
        p = ctypes.c_void_p()
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
        s = ctypes.c_void_p()
        self._check(lib().graphd_stream_attach(self._handle(), cuda_stream, ctypes.byref(s)))
        st = Stream(self, s.value)
        st.cuda_stream = cuda_stream
        self._streams.append(st)
        return st

    def _detach(self, s):
        self._streams.remove(s)
        h, s.handle = s.handle, None
        lib().graphd_stream_detach(h)

    def replay_arrays(self, program, *arrays, stream=None):
        """Replays a Program (registered here on first use; its modules
        must be registered) on framework arrays (PyTorch tensors, CuPy
        arrays, anything with DLPack or __cuda_array_interface__), one per
        slot that is not scratch, in slot order (or one dict {slot:
        array}). Each array must be contiguous, exactly its slot's size, of
        the slot's dtype where add_slot named one, and writable for a slot
        the program writes. The stream is `stream` (an int CUstream, a
        torch.cuda.Stream, a CuPy stream), else the arrays' framework's
        current stream, else the stream an array's __cuda_array_interface__
        names, else the legacy default stream; on a host device there is
        none. A region stays registered while an array bound in it is alive
        (docs/pytorch.md, "Memory").

        Returns {"captured", "capture_ns", "server_ns"}."""
        if self._binder is None:
            self._binder = Binder(self)
        self._handle()
        return self._binder.replay(program, arrays, stream=stream)

    def replay_bindings(self, stream, program_id, bindings):
        """Replays a registered program, by its 32-byte id, on a Stream of
        this client (stream_attach) with bindings, each a (slot, ptr,
        nbytes) tuple, where ptr is an int (CUdeviceptr or host address) or
        a HostBuffer; nbytes is the slot's size, checked only against the
        whole allocation.

        Returns {"captured", "capture_ns", "server_ns"}."""
        if not isinstance(stream, Stream):
            raise GraphdError("INVALID_ARGUMENT", f"replay_bindings takes a graphd Stream (stream_attach) first, "
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
                raise GraphdError("INVALID_ARGUMENT", f"binding {i} is {b!r}, not (slot, ptr, nbytes) with ptr an "
                                  "int or a HostBuffer") from None
        if not stream.handle:
            raise GraphdError("FAILED_PRECONDITION", "the stream is detached")
        info = graphd_replay_info()
        self._check(lib().graphd_replay(self._handle(), stream.handle, id_arg(program_id), arr, n,
                                        ctypes.byref(info)))
        return struct_dict(info)

    def replay(self, *args, stream=None):
        """The old spelling of replay_arrays and replay_bindings, told
        apart by the first argument: replay(stream, program_id, bindings)
        with a Stream first is replay_bindings; replay(program, *arrays,
        stream=None) is replay_arrays."""
        if args and not isinstance(args[0], Stream):
            return self.replay_arrays(args[0], *args[1:], stream=stream)
        if len(args) != 3 or stream is not None:
            raise GraphdError("INVALID_ARGUMENT", "replay(stream, program_id, bindings) takes three arguments; "
                              "the Stream is the first (replay_bindings)")
        return self.replay_bindings(*args)

    def _captures(self, ptr, n):
        out = []
        for i in range(n):
            c = ptr[i]
            out.append({"program": bytes(c.program_id).hex(), "device": c.device,
                        "mode": _MODE_NAMES.get(c.mode, c.mode),
                        "staging_bytes": c.staging_bytes, "nodes": c.nodes,
                        "replays": c.replays, "idle_ms": c.idle_ms,
                        "pids": list(c.pids[:c.npids]), "busy": bool(c.busy),
                        "generation": c.generation, "created_unix_ms": c.created_unix_ms,
                        "repoints": c.repoints, "graphs": c.graphs})
        if ptr:
            libc_free(ptr)
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
        nbytes = ctypes.c_uint64()
        self._check(lib().graphd_evict(self._handle(), ctypes.byref(o), ctypes.byref(ptr),
                                       ctypes.byref(n), ctypes.byref(nbytes)))
        return self._captures(ptr, n.value), nbytes.value

    def busy_devices(self):
        """The devices the last list_captures or evict could not reach
        within the daemon's bound (their worker was inside a long job): a
        list lacks their captures; an eviction there runs when the worker
        is free and is not in the result."""
        buf = (ctypes.c_uint32 * 64)()
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



__all__ = ["Client", "Stream", "HostBuffer", "clear"]
