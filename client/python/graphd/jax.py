"""graphd from JAX: graphd.jax.program_callable turns a program builder
into a function that JAX can call under jit, vmap, scan and the rest.

    import graphd, graphd.jax, jax, numpy as np
    from graphd import Slot, f32, u32

    def build(x, *, mode):                      # x: jax.ShapeDtypeStruct
        n = x.shape[0]
        p = graphd.Program(mode)
        xs = p.add_slot("input", x.size * x.dtype.itemsize)
        ys = p.add_slot("output", x.size * x.dtype.itemsize)
        p.launch(mod_id, "scale", grid=n // 256, block=256,
                 args=[Slot(xs), Slot(ys), f32(2.0), u32(n)])
        return graphd.jax.Spec(p, results=[x], operand_slots=[xs],
                               result_slots=[ys], modules=[("cubin", cubin)])

    scale = graphd.jax.program_callable(build, mode="staged", vmap_method="broadcast_all")
    y = jax.jit(scale)(x)

At trace time, for each new tuple of operand shapes and dtypes, `build` is
called once (the result is cached per process), the program is finished and
its id computed locally, and the module and program bytes go into
libgraphd's client-side registry. The call is emitted as
jax.ffi.ffi_call(name, ...) with the attributes `program` (the id in hex)
and `slots` (the slot of each operand, then of each result), which the C
handler graphd_xla_replay (libgraphd_xla.so) reads at run time. The FFI
target is registered once per process, for platform CUDA.

docs/jax.md, "graphd.jax", describes the API."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Tuple, Union

import numpy as np
import jax

from ._lib import lib as _libgraphd
from ._lib import registry_add_module as _registry_add_module
from ._lib import registry_add_program as _registry_add_program
from . import _deprecated
from .errors import GraphdError, LibraryError, status_name
from .program import MODES, BytesLike, Program, _as_id
from .records import Mode, ModuleKind, VmapMethod

#: The vmap_method values program_callable takes.
VMAP_METHODS: Tuple[Optional[VmapMethod], ...] = (None, "sequential", "broadcast_all")

_log = logging.getLogger("graphd")


class Spec:
    """What `build` returns for one set of operand shapes.

    Attributes
    ----------
    program : graphd.Program or (bytes, bytes)
        A graphd.Program (finished here if it is not yet), or an
        (encoding, id) pair.
    results : list of jax.ShapeDtypeStruct
        The result shapes and dtypes, one per result.
    operand_slots : list of int or None
        The program slot each operand binds, in order; None for an
        operand with no elements, which binds nothing.
    result_slots : list of int or None
        The program slot each result binds, in order; None as for
        operands.
    modules : list of (str, bytes)
        The modules the program launches: (kind, bytes) pairs, kind
        "ptx", "cubin", "fatbin" or "host_elf".
    fixed : list of (int, int, int)
        (slot, address, nbytes) of slots bound at every call to memory of
        this process at a fixed address (device memory that outlives the
        calls, such as a library's buffers made before them), read and
        written. The address goes into the call as it is: that memory
        must stay allocated while the compiled call may run.

    An operand and a result that name the same slot form an in-out pair:
    XLA aliases the result to the operand's buffer (input_output_aliases),
    so the slot is updated in place. Each slot appears at most once among
    the operands and at most once among the results. Slots that no operand
    or result names are the program's own (scratch, or unstaged).

    Parameters
    ----------
    program
        As the attribute.
    results
        As the attribute: jax.ShapeDtypeStruct, or anything with .shape
        and .dtype.
    operand_slots, result_slots
        As the attributes (each slot an int, 0 to 2^32-1, or None).
    modules
        As the attribute ((kind, bytes-like) pairs).
    fixed
        As the attribute ((slot, address, nbytes) triples).

    Raises
    ------
    InvalidArgument
        When the result slots do not match the results, a slot is out of
        range or named twice among the operands or among the results, or a
        fixed binding is not (slot, address, nbytes) over a memory range
        with a slot of its own.
    """

    program: Union[Program, Tuple[BytesLike, Union[BytesLike, str]]]
    results: List[Any]
    operand_slots: List[Optional[int]]
    result_slots: List[Optional[int]]
    modules: List[Tuple[ModuleKind, bytes]]
    fixed: List[Tuple[int, ...]]

    def __init__(self, program: Union[Program, Tuple[BytesLike, Union[BytesLike, str]]], results: Iterable[Any],
                 operand_slots: Iterable[Optional[int]], result_slots: Iterable[Optional[int]],
                 modules: Iterable[Tuple[ModuleKind, BytesLike]] = (),
                 fixed: Iterable[Sequence[int]] = ()) -> None:
        self.program = program
        self.results = [jax.ShapeDtypeStruct(tuple(r.shape), np.dtype(r.dtype)) for r in results]
        self.operand_slots = [None if s is None else int(s) for s in operand_slots]
        self.result_slots = [None if s is None else int(s) for s in result_slots]
        self.modules = [(k, bytes(b)) for k, b in modules]
        self.fixed = [tuple(int(v) for v in f) for f in fixed]
        named = {s for s in self.operand_slots + self.result_slots if s is not None}
        for f in self.fixed:
            if len(f) != 3:
                raise GraphdError("INVALID_ARGUMENT", f"a fixed binding is (slot, address, nbytes), not {f}")
            slot, address, nbytes = f
            if not 0 <= slot <= 0xFFFFFFFF or slot in named:
                raise GraphdError("INVALID_ARGUMENT", f"fixed slot {slot} is out of range or an operand's or "
                                  "result's too")
            if not 0 < address < 1 << 63 or nbytes <= 0:
                raise GraphdError("INVALID_ARGUMENT", f"fixed slot {slot}: address 0x{address:x} and {nbytes} bytes "
                                  "are not a memory range")
            named.add(slot)
        if len(self.result_slots) != len(self.results):
            raise GraphdError("INVALID_ARGUMENT",
                              f"{len(self.results)} results but {len(self.result_slots)} result slots")
        for what, maybe in (("operand", self.operand_slots), ("result", self.result_slots)):
            slots = [s for s in maybe if s is not None]
            if len(set(slots)) != len(slots):
                raise GraphdError("INVALID_ARGUMENT", f"a slot is named by two {what}s: {slots}")
            for s in slots:
                if not 0 <= s <= 0xFFFFFFFF:
                    raise GraphdError("INVALID_ARGUMENT", f"{what} slot {s} is out of range")

    def aliases(self) -> Dict[int, int]:
        """The in-out pairs: an operand and a result that name one slot.

        Returns
        -------
        dict of int to int
            {operand index: result index}.
        """
        where = {s: i for i, s in enumerate(self.operand_slots) if s is not None}
        return {where[s]: j for j, s in enumerate(self.result_slots) if s in where}


class _Built:
    """One cached program: its spec, encoding, id and the ffi_call's
    static arguments (what program_callable's on_lower gets, and its
    function's `programs` holds)."""

    spec: Spec
    encoding: bytes
    id: bytes
    id_hex: str

    def __init__(self, spec: Spec, encoding: bytes, pid: bytes) -> None:
        self.spec = spec
        self.encoding = encoding
        self.id = pid
        self.id_hex = pid.hex()
        # -1: an empty buffer, bound to no slot (the handler checks it is empty).
        self.slots = np.array([-1 if s is None else s for s in spec.operand_slots + spec.result_slots],
                              dtype=np.int64)
        # (slot, address, bytes) triples, flat; None without any.
        self.fixed = np.array([v for f in spec.fixed for v in f], dtype=np.int64) if spec.fixed else None


# --- the FFI target and libgraphd_xla -----------------------------------------

_targets: set = set()
_xla = None
_lock = threading.Lock()


def _xla_candidates():
    env = os.environ.get("GRAPHD_XLA_LIB")
    if env:
        return [env]
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgraphd_xla.so")
    out = [here] if os.path.exists(here) else []
    found = ctypes.util.find_library("graphd_xla")
    if found:
        out.append(found)
    return out


def xla_lib() -> ctypes.CDLL:
    """libgraphd_xla, loaded once: from $GRAPHD_XLA_LIB, then
    libgraphd_xla.so next to this package, then find_library. libgraphd is
    loaded first (graphd._lib), so the handler's libgraphd is the same copy
    as the one the registry calls go to (the dynamic loader reuses a loaded
    library of the same soname).

    Returns
    -------
    ctypes.CDLL

    Raises
    ------
    LibraryError
        When libgraphd or libgraphd_xla cannot be loaded.
    """
    global _xla
    with _lock:
        if _xla is not None:
            return _xla
        _libgraphd()
        errors = []
        for path in _xla_candidates():
            try:
                _xla = ctypes.CDLL(path)
                return _xla
            except OSError as e:
                errors.append(f"{path}: {e}")
        where = "; ".join(errors) if errors else "none found: set GRAPHD_XLA_LIB to the path of libgraphd_xla.so"
        raise LibraryError("FAILED_PRECONDITION", f"cannot load libgraphd_xla: {where}")


def register_target(name: str = "graphd_replay", platform: str = "CUDA") -> None:
    """Registers graphd_xla_replay as an FFI target, once per process and
    (name, platform), for XLA's instantiate stage as well as execution: the
    handler keeps a state per executable there, so that a call checks the
    copies of its executable's constants on its first run only.
    program_callable() does this for CUDA; other platforms are for tests
    that only lower.

    Parameters
    ----------
    name
        The FFI target's name.
    platform
        The platform it is registered for.

    Raises
    ------
    LibraryError
        When libgraphd_xla cannot be loaded.
    """
    key = (name, platform.upper())
    if key in _targets:
        return
    fn = xla_lib().graphd_xla_replay
    with _lock:
        if key in _targets:
            return
        handler = jax.ffi.pycapsule(fn)
        jax.ffi.register_ffi_target(name, {"instantiate": handler, "execute": handler},
                                    platform=platform)
        _targets.add(key)


def set_socket_path(socket_path: Optional[Union[str, os.PathLike]]) -> None:
    """The daemon this process's graphd calls (the FFI handler's sessions)
    connect to, instead of libgraphd's default ($GRAPHD_SOCKET, ...). The
    environment is not touched.

    Parameters
    ----------
    socket_path : str, os.PathLike or None
        The socket; None goes back to the default.

    Raises
    ------
    FailedPrecondition
        When the handler already has sessions with another daemon (one
        daemon a process).
    InvalidArgument
        A path too long for a Unix socket.
    LibraryError
        libgraphd_xla cannot be loaded.
    """
    fn = xla_lib().graphd_xla_set_socket_path
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(512)
    path = None if socket_path is None else os.fsencode(socket_path)
    rc = fn(path, buf, len(buf))
    if rc:
        raise GraphdError(status_name(rc), buf.value.decode(errors="replace"))


def collect() -> None:
    """Waits until the last asynchronous replay on every stream this
    process's graphd calls used has finished with its buffers, and reports
    the first failed replay not reported yet. A failed asynchronous replay
    otherwise shows only at the next call on its device (its outputs are
    undefined): call this once the results are needed, at the end of a
    loop or a program.

    Raises
    ------
    GraphdError
        The subclass of the first failed replay's status (also logged as
        a warning on the "graphd" logger).
    LibraryError
        When libgraphd_xla cannot be loaded.
    """
    fn = xla_lib().graphd_xla_collect
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(1024)
    rc = fn(buf, len(buf))
    if rc:
        msg = buf.value.decode(errors="replace")
        _log.warning("graphd: an asynchronous replay failed: %s: %s", status_name(rc), msg)
        raise GraphdError(status_name(rc), msg)


def last_replays(program_ids: Iterable[Union[BytesLike, str]]) -> List[int]:
    """When each program was last replayed by this process's graphd calls.
    A compiled call replays without passing through Python: this is how
    Python learns that it ran.

    Parameters
    ----------
    program_ids
        Program ids: 32 bytes or 64 hex digits each.

    Returns
    -------
    list of int
        For each id, the number of the last call whose handler got it to
        the daemon to replay (from one sequence that grows with every such
        call), 0 when none did.

    Raises
    ------
    InvalidArgument
        For a malformed id.
    LibraryError
        When libgraphd_xla cannot be loaded.
    """
    ids = [_as_id(p, "program id") for p in program_ids]
    if not ids:
        return []
    fn = xla_lib().graphd_xla_last_replays
    fn.restype = None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint64)]
    out = (ctypes.c_uint64 * len(ids))()
    fn(b"".join(ids), len(ids), out)
    return list(out)


_STATS_FIELDS = ("calls", "sync_calls", "buffers", "unaliased", "bounced", "bounce_copies",
                 "id_queries", "handler_ns", "replay_ns", "wait_ns", "bounce_ns", "executables",
                 "stateless")


class _XlaStats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _STATS_FIELDS]


def xla_stats() -> Optional[Dict[str, int]]:
    """What this process's graphd calls did, counted since it started.
    Take the difference of two reads to time a stretch of calls.

    Returns
    -------
    dict of str to int, or None
        calls (sync_calls of them with a round trip), buffers bound,
        unaliased in-out operands copied, bounced calls and their
        bounce_copies, id_queries (the driver queries that checked
        constants' copies: on an executable's first call), the host time
        in ns spent in the handler (handler_ns), of it in libgraphd's
        replay call (replay_ns), of that waiting for room in the
        submission ring (wait_ns), and of handler_ns the part on the
        copies of buffers graphd cannot map (bounce_ns); executables
        given the handler's state, and stateless calls (their executable
        has none: they check every call). None unless GRAPHD_XLA_STATS=1
        was in the environment when the process made its first call: set
        it before then.

    Raises
    ------
    LibraryError
        When libgraphd_xla cannot be loaded.
    """
    fn = xla_lib().graphd_xla_stats_read
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_XlaStats), ctypes.c_size_t]
    out = _XlaStats()
    if not fn(ctypes.byref(out), ctypes.sizeof(out)):
        return None
    return {name: getattr(out, name) for name in _STATS_FIELDS}


# --- building and registering programs ----------------------------------------


def _finish(spec, mode):
    prog = spec.program
    if isinstance(prog, Program):
        if prog.mode != MODES[mode]:
            got = {v: k for k, v in MODES.items()}.get(prog.mode, prog.mode)
            raise GraphdError("INVALID_ARGUMENT",
                              f"the callable's mode is {mode}, but build returned a {got} program")
        return prog.finish()
    encoding, pid = prog
    return bytes(encoding), _as_id(pid, "program id")


def _register(spec, encoding, pid):
    """Puts the modules and the program into libgraphd's client-side
    registry (copies; adding the same bytes again is harmless)."""
    for kind, data in spec.modules:
        registry_add_module(kind, data)
    registry_add_program(pid, encoding)


def registry_add_module(kind: Union[ModuleKind, int], data: BytesLike) -> bytes:
    """graphd_registry_add_module: keeps the module's bytes under its id in
    the process's client-side registry.

    Parameters
    ----------
    kind
        "ptx", "cubin", "fatbin", "host_elf", or its number (1 to 4).
    data
        The module's bytes.

    Returns
    -------
    bytes
        The 32-byte module id.

    Raises
    ------
    InvalidArgument
        For an unknown kind.
    GraphdError
        The registry's status when it refuses the module.
    LibraryError
        When libgraphd cannot be loaded.
    """
    return _registry_add_module(kind, data)


def registry_add_program(program_id: Union[BytesLike, str], encoding: BytesLike) -> None:
    """graphd_registry_add_program: keeps a program's encoding in the
    process's client-side registry. Adding the same program again is
    accepted.

    Parameters
    ----------
    program_id
        Its id: 32 bytes or 64 hex digits.
    encoding
        Its canonical encoding (checked against the id; its modules must
        be added first).

    Raises
    ------
    GraphdError
        The registry's status when it refuses the program.
    LibraryError
        When libgraphd cannot be loaded.
    """
    _registry_add_program(program_id, encoding)


def _varying(x):
    """The mesh axes over which x varies inside shard_map (empty outside
    it, or with check_vma off): `manual_axis_type.varying` of its type, or
    `vma` in JAX releases that named it so."""
    t = jax.typeof(x)
    mat = getattr(t, "manual_axis_type", None)
    if mat is not None:
        return frozenset(getattr(mat, "varying", None) or ())
    return frozenset(getattr(t, "vma", None) or ())


def _vary(x, axes):
    """x typed as varying over `axes` too (a cast of its type only)."""
    missing = tuple(sorted(axes - _varying(x)))
    if not missing:
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, missing, to="varying")
    return jax.lax.pvary(x, missing)


# --- a hook run where a call is lowered ----------------------------------------


class LoweringHook:
    """What on_lowering() runs: fn(platforms), the tuple of platforms a
    computation is lowered for ("cuda", "cpu", ...), each time the values
    it passes through are lowered, and at every eager call (with the
    platform of the default backend). Compared by identity, as JAX compares
    the parameters of the equations it caches.

    Parameters
    ----------
    fn
        fn(platforms): called with a tuple of platform names.
    name
        Shown in its repr (and so in JAX's printed programs).
    """

    def __init__(self, fn: Callable[[Tuple[str, ...]], object], name: str = "") -> None:
        self.fn, self.name = fn, name

    def __repr__(self) -> str:
        return f"LoweringHook({self.name})"


_hook_p = None


def _hook_primitive():
    """graphd_lowering: the identity on its operands, whose lowering runs
    its hook. Made once, at the first use."""
    global _hook_p
    if _hook_p is not None:
        return _hook_p
    with _lock:
        if _hook_p is not None:
            return _hook_p
        from jax.extend.core import Primitive
        from jax.interpreters import ad, batching, mlir
        p = Primitive("graphd_lowering")
        p.multiple_results = True

        def impl(*args, hook):
            hook.fn((jax.default_backend(),))
            return list(args)

        def lowering(ctx, *args, hook):
            hook.fn(tuple(ctx.module_context.platforms))
            return list(args)

        def batch(args, dims, *, hook):
            return p.bind(*args, hook=hook), list(dims)

        def jvp(primals, tangents, *, hook):
            return p.bind(*primals, hook=hook), list(tangents)

        p.def_impl(impl)
        p.def_abstract_eval(lambda *avals, hook: list(avals))
        mlir.register_lowering(p, lowering)
        batching.primitive_batchers[p] = batch
        ad.primitive_jvps[p] = jvp
        _hook_p = p
    return _hook_p


def on_lowering(values: Sequence[Any], hook: LoweringHook) -> List[Any]:
    """Values passed through an identity whose lowering runs a hook: what
    depends on the returned values is lowered with it.
    jax.lax.platform_dependent traces every branch but lowers only the
    taken one, so a hook in one branch says that branch is compiled for
    the platforms it is given.

    Parameters
    ----------
    values
        JAX arrays or tracers.
    hook
        What the lowering (or an eager call) runs.

    Returns
    -------
    list
        The same values, one per value given (an empty list for none).
    """
    if not values:
        return []
    return list(_hook_primitive().bind(*values, hook=hook))


class ProgramCallable(Protocol):
    """What program_callable returns: a function of JAX arrays, with the
    programs it built.

    Attributes
    ----------
    programs : dict
        The programs built so far, by the operands' ((shape, dtype name),
        ...): each has .spec, .encoding, .id and .id_hex.
    build_for : callable
        build_for(*avals): the program for those operand shapes and dtypes
        (built, registered and cached as a call would).
    """

    programs: Dict[Tuple[Tuple[Tuple[int, ...], str], ...], _Built]
    build_for: Callable[..., _Built]
    __name__: str

    def __call__(self, *args: Any) -> Any:
        """Replays the program for these operands.

        Parameters
        ----------
        *args
            JAX arrays, one per operand (inside or outside jax.jit).

        Returns
        -------
        jax.Array or list of jax.Array
            One array per result; a single array when there is one.
        """
        ...


def program_callable(build: Callable[..., Spec], *, mode: Mode = "staged", name: str = "graphd_replay",
                     vmap_method: Optional[VmapMethod] = None, has_side_effect: bool = False,
                     register: bool = True, sync: bool = False,
                     on_lower: Optional[Callable[[_Built, Tuple[str, ...]], object]] = None
                     ) -> ProgramCallable:
    """A JAX-callable function that replays a graphd program (the old
    spelling graphd.jax.callable is the same function). It works inside
    and outside jax.jit.

    Parameters
    ----------
    build
        build(*operands, mode=mode) gets the traced operands as
        jax.ShapeDtypeStruct and returns a Spec: the program for exactly
        those shapes (built with graphd.Program(mode)), its modules, the
        result shapes and dtypes, and the slot of each operand and result.
        It is called once per distinct tuple of (shape, dtype) in the
        process.
    mode
        "staged", "staged_ex", "direct" or "auto": the mode the program
        must have.
    name
        The FFI target name (registered once per process, for CUDA, with
        graphd_xla_replay from libgraphd_xla).
    vmap_method
        How the function batches under jax.vmap. None: vmap raises.
        "sequential": a lax.map over the batch, the unbatched program
        replayed once per element. "broadcast_all": every operand is
        broadcast to the batch (batch axis first) and `build` is called
        with the batched shapes: one program for the whole batch, a
        different one per batch size.
    has_side_effect
        Passed to ffi_call (keeps a call whose results are unused).
    register
        False skips registering the FFI target (for lowering to an already
        registered target).
    sync
        True: each call waits for graphd's answer (a round trip per call),
        so a failed replay raises at its own call. False (the default):
        replays are submitted through the session's ring and the call
        returns at once; a failed replay raises at the next call on the
        same device, or in collect(). $GRAPHD_XLA_SYNC=1 makes every call
        sync.
    on_lower
        on_lower(program, platforms), run where a call is lowered (see
        on_lowering), with the program it replays (its id in .id_hex) and
        the platforms it is lowered for.

    Returns
    -------
    ProgramCallable
        A function that takes JAX arrays (positionally) and returns a list
        of arrays, one per result (a single array when there is one
        result).

    Raises
    ------
    InvalidArgument
        For an unknown mode or vmap_method. (The returned function raises
        InvalidArgument when build returns something other than a Spec,
        names another number of operand slots, or returns a program of
        another mode, and LibraryError when libgraphd_xla cannot be
        loaded.)
    """
    if mode not in MODES:
        raise GraphdError("INVALID_ARGUMENT", f"mode {mode!r} is not staged, staged_ex, direct or auto")
    if vmap_method not in VMAP_METHODS:
        raise GraphdError("INVALID_ARGUMENT",
                          f"vmap_method {vmap_method!r} is not None, 'sequential' or 'broadcast_all'")
    cache: Dict[Tuple[Tuple[Tuple[int, ...], str], ...], _Built] = {}
    cache_lock = threading.Lock()

    def built_for(args):
        # The dtype's name: the byte-order string of JAX's extra dtypes is
        # only their size ("<V2" for bfloat16, "<V1" for every float8).
        key = tuple((tuple(a.shape), np.dtype(a.dtype).name) for a in args)
        with cache_lock:
            b = cache.get(key)
        if b is not None:
            return b
        avals = [jax.ShapeDtypeStruct(tuple(a.shape), np.dtype(a.dtype)) for a in args]
        spec = build(*avals, mode=mode)
        if not isinstance(spec, Spec):
            raise GraphdError("INVALID_ARGUMENT", f"build returned {type(spec).__name__}, not graphd.jax.Spec")
        if len(spec.operand_slots) != len(args):
            raise GraphdError("INVALID_ARGUMENT",
                              f"{len(args)} operands but build named {len(spec.operand_slots)} operand slots")
        encoding, pid = _finish(spec, mode)
        _register(spec, encoding, pid)
        b = _Built(spec, encoding, pid)
        with cache_lock:
            cache.setdefault(key, b)
            return cache[key]

    def call(*args):
        if register:
            register_target(name)
        b = built_for(args)
        spec = b.spec
        if on_lower is not None and args:
            hook = LoweringHook(lambda platforms: on_lower(b, platforms), b.id_hex[:16])
            args = on_lowering(list(args), hook)
        attrs = dict(program=b.id_hex, slots=b.slots)
        if b.fixed is not None:
            attrs["fixed"] = b.fixed
        if sync:
            attrs["sync"] = True
        # Inside shard_map the operands of one call must vary over the
        # same mesh axes, and the results vary as they do: a result that
        # carries a loop's state must have the type of what it replaces.
        axes = frozenset().union(*(_varying(a) for a in args))
        if axes:
            args = [_vary(a, axes) for a in args]
        out = jax.ffi.ffi_call(name, spec.results, has_side_effect=has_side_effect,
                               input_output_aliases=spec.aliases() or None)(*args, **attrs)
        if axes:
            out = [_vary(o, axes) for o in out]
        if on_lower is not None and not args:
            hook = LoweringHook(lambda platforms: on_lower(b, platforms), b.id_hex[:16])
            out = on_lowering(list(out), hook)
        return out

    def unwrap(out):
        return out[0] if len(out) == 1 else list(out)

    if vmap_method is None:
        def fun(*args):
            return unwrap(call(*args))
    else:
        @jax.custom_batching.custom_vmap
        def batched(*args):
            return list(call(*args))

        @batched.def_vmap
        def _rule(axis_size, in_batched, *args):
            if vmap_method == "broadcast_all":
                args = [a if bt else jax.numpy.broadcast_to(a, (axis_size,) + tuple(a.shape))
                        for a, bt in zip(args, in_batched)]
                out = batched(*args)
            else:
                idx = [i for i, bt in enumerate(in_batched) if bt]

                def one(xs):
                    full = list(args)
                    for i, x in zip(idx, xs):
                        full[i] = x
                    return batched(*full)

                out = jax.lax.map(one, [args[i] for i in idx])
            return list(out), [True] * len(out)

        def fun(*args):
            return unwrap(batched(*args))

    out: Any = fun  # a function, with the attributes of ProgramCallable
    out.programs = cache
    out.build_for = lambda *avals: built_for(avals)
    out.__name__ = getattr(build, "__name__", "graphd_callable")
    out.__doc__ = getattr(build, "__doc__", None)
    return out


# Old spellings, kept for the code that uses them: looked up on the module
# (graphd.jax.callable, `from graphd.jax import callable`) without being
# bound in it, so that callable() here is still the builtin.
_OLD_NAMES = {"callable": "program_callable"}


def __getattr__(name):
    new = _OLD_NAMES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    _deprecated.warn(f"graphd.jax.{name}", f"graphd.jax.{new}")
    return globals()[new]


__all__ = ["Spec", "program_callable", "register_target", "xla_lib", "registry_add_module",
           "registry_add_program", "VMAP_METHODS", "LoweringHook", "on_lowering", "last_replays",
           "collect", "xla_stats", "set_socket_path", "ProgramCallable"]
