"""NVIDIA Warp steps through graphd: one import changes.

    from graphd.warp import jax_callable        # instead of: from warp import jax_callable

    step = jax_callable(my_warp_function, num_outputs=2, in_out_argnames=["state"])
    state, obs = jax.jit(step)(state, action)

graphd.warp.jax_callable and graphd.warp.jax_kernel take Warp's arguments
and keep Warp's call semantics (inputs, in-out and output arguments,
output_dims, static scalars, vmap), but instead of running the function in
a Python callback they turn it into a graphd program, at the first call
for each signature, and replay it through graphd.jax: the daemon captures
it once per device and every process that builds the same program shares
that capture.

How the program is made (docs/warp.md has the whole story): the function
runs once on Warp's CPU device with reserved, untouched memory while
graphd.warp records its launches, memsets and copies instead of running
them, and its capture_while loops and capture_if branches around them
(twice, to check that they depend on shapes only); array arguments
become slots, arrays the function allocates become temp slots, the
pointers inside the packed parameters become pointer patches; the modules
are compiled to CUBIN for the GPU's architecture by Warp's bundled NVRTC.
No GPU is needed to build a program.

graphd's own options are keyword arguments of their own: `mode`
("staged", "staged_ex", "direct" or "auto"), `device` (the target: an
architecture such as 90 or "sm_90", a JAX or Warp device; by default the
first GPU JAX sees) and `socket` (the daemon's socket).

install() (or GRAPHD_WARP_INSTALL=1 at `import graphd`) makes
warp.jax_callable and warp.jax_kernel these, so libraries that call them
run through graphd unchanged. array_callable() replays the same programs on
Warp arrays without JAX."""

from __future__ import annotations

import collections
import functools
import importlib
import importlib.util
import logging
import operator
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from ..client import Client
from ..errors import GraphdError
from ._support import REASONS, SUPPORTED_BELOW, SUPPORTED_MIN, Refused, warp_modules
from ._core import FuncSpec, Function
from ._build import check_fixed, compile_module, grid_for
from ._options import require_cuda, resolve_arch, resolve_mode, resolve_ordinal, use_socket
from ._replay import array_callable
from ..records import Mode, VmapMethod

if TYPE_CHECKING:
    from ._grad import DifferentiableKernel

#: A launch_dims: one shape, an int or a tuple.
LaunchDims = Union[int, Sequence[int]]
#: An output_dims: one shape for every output, or a dict of shapes by name.
Dims = Union[LaunchDims, Mapping[str, LaunchDims]]
#: The architectures and devices graphd.warp compiles for (resolve_arch).
Target = Any

__all__ = ["jax_callable", "jax_kernel", "clear_jax_callable_graph_cache", "array_callable", "install", "uninstall",
           "installed", "fallbacks", "FALLBACKS", "Refused", "REASONS", "SUPPORTED_MIN", "SUPPORTED_BELOW", "resolve_arch", "resolve_mode",
           "resolve_ordinal", "evict_captures", "compile_module", "grid_for"]

_VMAP: Dict[Optional[str], Optional[VmapMethod]] = {
    None: None, "broadcast_all": "broadcast_all", "sequential": "sequential", "sequential_unrolled": "sequential"}
# Warp's default bound on the graphs one jax_callable keeps.
_GRAPH_CACHE_MAX_DEFAULT = 32
# What jax_callable(fallback=...) takes: None refuses what graphd cannot
# serve, "warp" runs it as Warp's own callable (what install() sets).
FALLBACKS = (None, "warp")

_log = logging.getLogger("graphd.warp")


# --- the JAX callables ------------------------------------------------------------


class JaxCallable:
    """What graphd.warp.jax_callable and jax_kernel return: call it with
    JAX arrays (and static scalars) as Warp's would be called; it returns
    the list of outputs (in-out arguments first, then pure outputs).

    On a CPU device the call is Warp's own (`warp_own` makes it): the call
    lowers per platform, to Warp's FFI call for the CPU and to graphd's
    replay for CUDA. graph_cache_max bounds the programs the callable keeps
    captured (`captures`, oldest first; one over the bound is dropped and
    its capture evicted from the daemon, as Warp drops its oldest graph).

    Attributes
    ----------
    programs : dict
        {signature: Built} of everything built so far.
    captures : OrderedDict
        The programs kept captured, by hex id, oldest first.
    fallbacks : dict
        {signature: Refused} of the calls that run as Warp's own.
    """

    def __init__(self, function: Any, *, vmap_method: Optional[str], output_dims: Optional[Dims],
                 has_side_effect: bool, mode: Optional[Mode], graph_mode: Any, device: Target,
                 socket: Optional[Union[str, os.PathLike]], launch_dims: Optional[LaunchDims] = None,
                 kernel: bool = False, warp_own: Optional[Callable[[], Any]] = None,
                 graph_cache_max: Optional[int] = None, block_dim: Optional[int] = None,
                 module_preload_mode: Any = None, fallback: Optional[str] = None) -> None:
        if fallback not in FALLBACKS:
            raise GraphdError("INVALID_ARGUMENT", f"fallback {fallback!r} is not None or 'warp'")
        if fallback is not None and warp_own is None:
            raise GraphdError("FAILED_PRECONDITION", "fallback='warp' needs Warp's own jax_callable and jax_kernel "
                              "(warp._src.jax.ffi), which this Warp does not have")
        if vmap_method not in _VMAP:
            raise Refused("signature", f"vmap_method {vmap_method!r}: graphd.warp batches with 'broadcast_all' or "
                          "'sequential' (and 'sequential_unrolled', which replays like 'sequential')",
                          code="INVALID_ARGUMENT")
        self.function = function
        self.spec = function.spec
        self.vmap_method = vmap_method
        self.output_dims = output_dims
        self.launch_dims = launch_dims
        self.has_side_effect = has_side_effect
        self.graph_mode = graph_mode
        self.mode = resolve_mode(mode, graph_mode)
        self.device = device
        self.socket = socket
        self.is_kernel = kernel
        # Warp's attributes of its callable objects.
        self.kernel = function.kernel if kernel else None
        self.func = function.kernel.func if kernel else function.func
        self.num_outputs = self.spec.num_outputs
        self.num_inputs = self.spec.num_inputs
        self.num_in_out = sum(1 for a in self.spec.inputs if a.in_out)
        self.stage_in_argnames = set(self.spec.stage_in) if self.spec.stage_in else None
        self.stage_out_argnames = set(self.spec.stage_out) if self.spec.stage_out else None
        self.module_preload_mode = module_preload_mode
        self.block_dim = block_dim
        self._arch: Optional[int] = None
        self._calls: Dict[Any, Any] = {}  # {call signature: graphd.jax.program_callable's function}
        self._lock = threading.Lock()
        self._warp_own, self._warp = warp_own, None
        self.fallback = fallback
        # {signature: Refused} of the calls that run as Warp's own.
        self.fallbacks: Dict[Any, Refused] = {}
        self.captures = _Captures(self)
        self._graph_cache_max = graph_cache_max
        self.__name__ = self.spec.name
        use_socket(socket)

    @property
    def graph_cache_max(self) -> Optional[int]:
        """The bound on the programs kept captured (None: none).

        Setting it drops (and evicts) the oldest over the new bound, and
        sets Warp's own callable's too.

        Raises
        ------
        ValueError
            When set to something other than None or a non-negative
            integer.
        """
        return self._graph_cache_max

    @graph_cache_max.setter
    def graph_cache_max(self, value: Optional[int]) -> None:
        if value is not None and (isinstance(value, bool) or int(value) < 0):
            raise ValueError(f"graph_cache_max must be None or a non-negative integer, not {value!r}")
        self._graph_cache_max = None if value is None else int(value)
        self.captures.trim()
        if self._warp is not None:
            self._warp.graph_cache_max = value

    @property
    def graph_cache_size(self) -> int:
        """How many programs the callable keeps captured, those replayed
        since they were dropped included (see _Captures.sync)."""
        self.captures.sync()
        return len(self.captures)

    def warp_callable(self) -> Any:
        """Warp's own callable of the same function and options (what a
        call on a CPU device runs), made once.

        Returns
        -------
        Warp's callable, or None
            None where this Warp has no jax_callable and jax_kernel of its
            own.
        """
        if self._warp is None and self._warp_own is not None:
            self._warp = self._warp_own()
        return self._warp

    @property
    def arch(self) -> int:
        """The architecture the callable compiles for (resolve_arch of its
        device), found at first use.

        Raises
        ------
        Refused
            As resolve_arch.
        """
        if self._arch is None:
            self._arch = resolve_arch(self.device)
        return self._arch

    @property
    def programs(self) -> Dict[Any, Any]:
        """Everything built so far, {signature: Built} (a copy)."""
        return dict(self.function.built)

    def __call__(self, *args: Any, output_dims: Optional[Dims] = None, vmap_method: Optional[str] = None,
                 launch_dims: Optional[LaunchDims] = None) -> Any:
        """Calls the function as Warp's callable would be called.

        Parameters
        ----------
        *args
            JAX arrays (and static scalars), one per input and in-out
            argument.
        output_dims, launch_dims
            As jax_callable's and jax_kernel's, for this call (None: the
            callable's).
        vmap_method
            As jax_callable's, for this call (None: the callable's).

        Returns
        -------
        list of jax.Array
            The outputs: in-out arguments first, then pure outputs.

        Raises
        ------
        Refused
            Where graphd cannot serve the call and the callable has no
            fallback.
        GraphdError, TypeError, ValueError
            For arguments Warp's callable would refuse too.
        """
        import jax
        spec = self.spec
        if len(args) != spec.num_inputs:
            names = ", ".join(a.name for a in spec.inputs)
            s = "" if spec.num_inputs == 1 else "s"
            raise ValueError(f"Expected {spec.num_inputs} input{s} ({names}), but got {len(args)}")
        vmap_method = self.vmap_method if vmap_method is None else vmap_method
        if vmap_method not in _VMAP:
            raise Refused("signature", f"vmap_method {vmap_method!r} is not supported by graphd.warp",
                          code="INVALID_ARGUMENT")
        output_dims = self.output_dims if output_dims is None else output_dims
        launch_dims = self.launch_dims if launch_dims is None else launch_dims
        arrays, statics = [], {}
        for i, (a, v) in enumerate(zip(spec.inputs, args)):
            if a.is_array:
                if v.dtype != a.jax_dtype():
                    raise TypeError(f"Invalid data type for array argument '{a.name}', expected {a.jax_dtype()}, "
                                    f"got {v.dtype}")
                if v.ndim != a.outer_ndim:
                    raise TypeError(f"Invalid dimensionality for array argument '{a.name}', expected "
                                    f"{a.outer_ndim} dimensions, got {v.ndim}")
                if a.dtype_shape and tuple(v.shape[a.ndim:]) != a.dtype_shape:
                    raise TypeError(f"Invalid inner dimensions for array argument '{a.name}', expected "
                                    f"{a.dtype_shape}, got {tuple(v.shape[a.ndim:])}")
                arrays.append(v)
            else:
                if isinstance(v, jax.core.Tracer):
                    raise ValueError(f"Argument '{a.name}' must be a static value")
                statics[i] = a.type(v)
        if isinstance(launch_dims, int):
            launch_dims = (launch_dims,)
        elif launch_dims is not None:
            launch_dims = tuple(launch_dims)
        if self.is_kernel:
            dims = launch_dims
            if dims is None and spec.first_array is not None:
                dims = spec.inputs[spec.first_array].warp_shape(args[spec.first_array].shape)
            if dims is None:
                raise RuntimeError("Failed to determine launch dimensions")
            _validate_launch(dims, self.function.kernel, self.block_dim)
        out_dims = self._out_dims(args, output_dims, launch_dims)
        key = (tuple(sorted((i, type(v).__name__, repr(v)) for i, v in statics.items())),
               tuple(out_dims), vmap_method, launch_dims)
        with self._lock:
            fn = self._calls.get(key)
            if fn is None:
                from ..jax import program_callable
                fn = program_callable(self._builder(statics, out_dims, launch_dims), mode=self.mode,
                                 vmap_method=_VMAP[vmap_method], has_side_effect=self.has_side_effect,
                                 on_lower=_CudaLowering(self))
                self._calls[key] = fn

        def on_gpu(*arrays):
            # Programs are counted where a call is lowered for a GPU (the
            # callable's on_lower), not where it is traced: the CUDA branch
            # is traced for a CPU call too.
            out = fn(*arrays)
            return out if isinstance(out, list) else [out]

        warp = self.warp_callable()
        if warp is None:
            return on_gpu(*arrays)
        overrides = {"output_dims": output_dims, "vmap_method": vmap_method}
        if self.is_kernel:
            overrides["launch_dims"] = launch_dims

        def on_cpu(*arrays):
            it = iter(arrays)
            return list(warp(*[next(it) if a.is_array else v for a, v in zip(spec.inputs, args)], **overrides))

        if installed():
            try:
                self.arch
            except Refused as e:
                if e.reason != "cpu_device":
                    raise
                # No GPU to build for: every call is on the CPU, Warp's.
                return on_cpu(*arrays)
        if key in self.fallbacks:
            return on_cpu(*arrays)
        # Both branches see operands of one type inside shard_map (an FFI
        # call wants its operands to vary over the same mesh axes).
        from ..jax import _vary, _varying
        axes = frozenset().union(*(_varying(a) for a in arrays))
        varied = [_vary(a, axes) for a in arrays] if axes else arrays
        try:
            return jax.lax.platform_dependent(*varied, cpu=on_cpu, default=on_gpu)
        except Refused as e:
            # The program is recorded where the call is traced, so a
            # refusal comes here, inside the caller's trace: Warp's own
            # call of the same arrays takes the place of graphd's in it.
            if not self._falls_back(e):
                raise
            self._fall_back(key, e)
            return on_cpu(*arrays)

    def _falls_back(self, refusal):
        """Whether a refusal runs the call as Warp's: with fallback="warp",
        one that says graphd cannot serve the function; a bad argument
        (INVALID_ARGUMENT) is the caller's and raises either way."""
        return self.fallback == "warp" and refusal.code != "INVALID_ARGUMENT"

    def _fall_back(self, key, refusal):
        with self._lock:
            first = key not in self.fallbacks
            self.fallbacks.setdefault(key, refusal)
        if first:
            with _fallbacks_lock:
                _fallbacks.append(Fallback(self.spec.name, key, refusal.reason, str(refusal)))
            _log.info("%s runs as Warp's own %s (%s): %s", self.spec.name,
                      "jax_kernel" if self.is_kernel else "jax_callable", refusal.reason, refusal)

    def _out_dims(self, args, output_dims, launch_dims):
        """The Warp shape of each pure output, unbatched."""
        spec = self.spec
        out = []
        for a in spec.outputs:
            if isinstance(output_dims, dict):
                d = output_dims.get(a.name)
                if d is None:
                    raise ValueError(f"Missing output dimensions for argument '{a.name}'")
            elif output_dims is not None:
                d = output_dims
            elif self.is_kernel and launch_dims is not None:
                d = launch_dims
            else:
                if spec.first_array is None:
                    raise ValueError("Unable to determine output dimensions")
                f = spec.inputs[spec.first_array]
                d = f.warp_shape(args[spec.first_array].shape)
            d = (d,) if isinstance(d, int) else tuple(d)
            if len(d) == a.outer_ndim and a.dtype_shape:
                if d[a.ndim:] != a.dtype_shape:
                    raise ValueError(f"Invalid output dimensions for argument '{a.name}': {d}")
                d = d[:a.ndim]
            if len(d) != a.ndim:
                raise ValueError(f"Invalid output dimensions for argument '{a.name}': {d}")
            out.append(d)
        return out

    def _builder(self, statics, out_dims, launch_dims):
        spec = self.spec

        def build(*avals, mode):
            import jax
            from ..jax import Spec
            shapes, batch = {}, None
            array_inputs = [i for i, a in enumerate(spec.inputs) if a.is_array]
            for i, av in zip(array_inputs, avals):
                a = spec.args[i]
                nb = len(av.shape) - a.outer_ndim
                b = tuple(av.shape[:nb])
                if nb < 0 or (batch is not None and b != batch):
                    raise Refused("signature", f"{spec.name}: argument {a.name} has shape {tuple(av.shape)}, which "
                                  f"does not match the batch {batch}", code="INVALID_ARGUMENT")
                batch = b
                shapes[i] = a.warp_shape(av.shape)
            batch = batch or ()
            results, result_slots_of = [], []
            for i, av in zip(array_inputs, avals):
                if spec.args[i].in_out:
                    results.append(jax.ShapeDtypeStruct(tuple(av.shape), av.dtype))
                    result_slots_of.append(i)
            for k, a in enumerate(spec.outputs):
                i = spec.num_inputs + k
                outer = batch + out_dims[k] + a.dtype_shape
                results.append(jax.ShapeDtypeStruct(outer, a.jax_dtype()))
                result_slots_of.append(i)
                shapes[i] = a.warp_shape(outer)
            func = self.function.func
            if self.is_kernel:
                dims = shapes[spec.first_array] if launch_dims is None else _batched_launch(launch_dims, batch)
                func = _kernel_runner(self.function.kernel, dims, self.function.block_dim)
            built = self.function.build(shapes, statics, self.arch, mode, func=func,
                                        extra=("launch", launch_dims) if self.is_kernel else None,
                                        ordinal=resolve_ordinal(self.device))
            return Spec(built.program, results=results,
                           operand_slots=[built.arg_slots[i] for i in array_inputs],
                           result_slots=[built.arg_slots[i] for i in result_slots_of],
                           modules=built.spec_modules(),
                           fixed=[(f.slot, f.address, f.nbytes) for f in built.fixed])

        build.__name__ = spec.name
        return build


Fallback = collections.namedtuple("Fallback", "name signature reason message")
Fallback.__doc__ = """A call that runs as Warp's own instead of graphd's:
the function's name, the call's signature (static values, output and launch
dims, vmap_method), the refusal's reason (a key of REASONS) and its message."""

_fallbacks: list = []
_fallbacks_lock = threading.Lock()


def fallbacks() -> List[Fallback]:
    """Every call of this process that runs as Warp's own (fallback="warp",
    which install() sets): what is not on graphd.

    Returns
    -------
    list of Fallback
        (name, signature, reason, message) records, in the order they
        first fell back.
    """
    with _fallbacks_lock:
        return list(_fallbacks)


class _CudaLowering:
    """Run where a callable's replay of a program is lowered: for a GPU it
    checks that Warp has CUDA support and notes the program as in use
    (kept, or captured again), as Warp's graph cache counts a graph where
    it runs; lowered for the CPU only (the branch not taken), it does
    nothing."""

    def __init__(self, owner):
        self.owner = owner

    def __call__(self, built, platforms):
        if all(p == "cpu" for p in platforms):
            return
        require_cuda()
        ours = next((b for b in self.owner.function.built.values() if b.id_hex == built.id_hex), None)
        if ours is not None:
            check_fixed(ours, self.owner.spec.name)
        self.owner.captures.lowered(built)


class _Captures(collections.OrderedDict):
    """{program id (hex): Built} a JaxCallable keeps captured, oldest
    first. Dropping one (over graph_cache_max, or clear(), which Warp's
    clear_jax_callable_graph_cache calls) evicts the daemon's captures of it
    that only this process replayed; the next replay captures it again."""

    def __init__(self, owner):
        super().__init__()
        self._owner = owner
        # {id hex: [built, the last replay seen]} of every program lowered
        # for a GPU: a compiled call replays (and the daemon captures a
        # dropped program again) without Python seeing it, so the replays
        # are read back from the handler (graphd.jax.last_replays).
        self._seen = {}

    def lowered(self, built):
        """Notes a program lowered for a GPU: in use, and watched."""
        self._seen.setdefault(built.id_hex, [built, 0])
        self.keep(built)

    def _replays(self):
        """{id hex: last replay} of the watched programs; {} where there is
        no handler to ask."""
        if not self._seen:
            return {}
        from ..jax import last_replays
        ids = list(self._seen)
        try:
            return dict(zip(ids, last_replays(ids)))
        except (GraphdError, AttributeError, OSError):
            return {}

    def sync(self):
        """Keeps, in the order they ran, the watched programs replayed since
        last seen: in use again, or captured again by the daemon after they
        were dropped (as Warp's cache counts a graph each time one is
        captured)."""
        ran = []
        for pid, seq in self._replays().items():
            entry = self._seen[pid]
            if seq > entry[1]:
                entry[1] = seq
                ran.append((seq, pid))
        for _, pid in sorted(ran):
            self.keep(self._seen[pid][0])

    def keep(self, built):
        """Notes a program (anything with its id_hex) as in use."""
        self[built.id_hex] = built
        self.move_to_end(built.id_hex)
        self.trim()

    def trim(self):
        limit = self._owner.graph_cache_max
        dropped = []
        while limit is not None and len(self) > limit:
            dropped.append(self.popitem(last=False)[0])
        if dropped:
            evict_captures(dropped, self._owner.socket)

    def clear(self):
        # What ran before counts no more: only replays after this do.
        for pid, seq in self._replays().items():
            self._seen[pid][1] = max(self._seen[pid][1], seq)
        dropped = list(self)
        super().clear()
        if dropped:
            evict_captures(dropped, self._owner.socket)


def evict_captures(program_ids: Iterable[str], socket: Optional[Union[str, os.PathLike]] = None) -> None:
    """Asks the daemon to evict the captures of these programs that only
    this process replayed. Without a daemon there is nothing captured, and
    nothing to do: nothing is raised (a refused eviction is skipped too).

    Parameters
    ----------
    program_ids
        The programs' ids in hex.
    socket
        The daemon's socket (None: libgraphd's default).
    """
    try:
        c = Client.connect(os.fspath(socket) if socket is not None else None)
    except GraphdError:
        return
    with c:
        for pid in program_ids:
            try:
                c.evict(program=pid, client_pid=os.getpid())
            except GraphdError:
                pass


def _validate_launch(dims, kernel, block_dim):
    """Warp's trace-time check of a kernel's launch dims (its errors)."""
    try:
        ffi = importlib.import_module("warp._src.jax.ffi")
    except ImportError:
        return
    check = getattr(ffi, "_validate_ffi_kernel_launch_bounds", None)
    if check is not None:
        check(tuple(dims), kernel, block_dim)


def _batched_launch(launch_dims, batch):
    """Launch dims given for one element, for a batch of them: the batch
    size rolled into the first dimension, as Warp does (the batched
    arrays' leading dims are folded into their first the same way)."""
    n = 1
    for d in batch:
        n *= d
    return (n * launch_dims[0],) + tuple(launch_dims[1:])


def _kernel_runner(kernel, dims, block_dim):
    def run(*args):
        wp, _, _ = warp_modules()
        wp.launch(kernel, dim=dims, inputs=list(args), block_dim=block_dim)
    return run


class _Fn(Function):
    def __init__(self, func, spec, kernel=None, block_dim=None):
        super().__init__(func, spec)
        self.kernel, self.block_dim = kernel, block_dim


_registry: dict = {}
_registry_lock = threading.Lock()


def _hashable_dims(dims):
    """Warp's cache-key form of output_dims / launch_dims."""
    if isinstance(dims, dict):
        return tuple(sorted((k, _hashable_dims(v)) for k, v in dims.items()))
    if hasattr(dims, "__len__"):
        return tuple(dims)
    return dims


def _warp_ffi():
    """warp._src.jax.ffi, or None where Warp has none."""
    try:
        return importlib.import_module("warp._src.jax.ffi")
    except ImportError:
        return None


def _warp_own(name):
    """Warp's own jax_callable or jax_kernel, installed or not."""
    ffi = _warp_ffi()
    if ffi is None:
        return None
    f = _originals.get((ffi.__name__, name)) or getattr(ffi, name, None)
    return None if f in (jax_callable, jax_kernel, _installed_callable, _installed_kernel) else f


def _cached(key, make, update=None):
    """The callable made for key before (Warp returns the same object for
    the same function and options), or a new one; options that are no
    part of the key update the one found."""
    try:
        hash(key)
    except TypeError:
        return make()
    with _registry_lock:
        hit = _registry.get(key)
        if hit is None:
            hit = _registry[key] = make()
        elif update is not None:
            update(hit)
        return hit


def _preload(module_preload_mode):
    """Warp's module_preload_mode for Warp's own callable (the CPU path):
    as given, else NONE. Warp's default would load the module on the
    current device at every trace, a GPU included, where graphd runs it;
    a call on the CPU loads it for the CPU anyway."""
    if module_preload_mode is not None:
        return {"module_preload_mode": module_preload_mode}
    enum = getattr(_warp_ffi(), "JaxModulePreloadMode", None)
    return {} if enum is None else {"module_preload_mode": enum.NONE}


def _graph_mode(graph_mode):
    """Warp's JaxCallableGraphMode of graph_mode (an int is normalised,
    None is Warp's default, JAX); the int where Warp has no enum."""
    ffi = _warp_ffi()
    enum = getattr(ffi, "JaxCallableGraphMode", None)
    if enum is None:
        return None if graph_mode is None else int(graph_mode)
    return enum.JAX if graph_mode is None else enum(graph_mode)


def _graphd_options(where, device, arch, socket_path, socket):
    """graphd's own options of jax_callable and jax_kernel, as
    (what to compile for, the socket): arch and socket_path, with the old
    spellings (an architecture as device=, socket=) warned about."""
    from .. import _deprecated
    if socket is not None:
        if socket_path is not None:
            raise GraphdError("INVALID_ARGUMENT", f"graphd.warp.{where}: give socket_path= only (socket= is its "
                              "old name)")
        _deprecated.warn(f"graphd.warp.{where}(socket=...)", f"graphd.warp.{where}(socket_path=...)", stacklevel=4)
        socket_path = socket
    if isinstance(device, (int, str)) and not isinstance(device, bool):
        if arch is not None:
            raise GraphdError("INVALID_ARGUMENT", f"graphd.warp.{where}: an architecture goes in arch= (device= is "
                              "a JAX or Warp device)")
        _deprecated.warn(f"graphd.warp.{where}(device=<architecture>)", f"graphd.warp.{where}(arch=...)",
                         stacklevel=4)
        arch, device = device, None
    if arch is not None and device is not None:
        raise GraphdError("INVALID_ARGUMENT", f"graphd.warp.{where}: give arch= or device=, not both")
    return (arch if arch is not None else device), socket_path


def jax_callable(func: Callable[..., Any], num_outputs: int = 1, graph_mode: Any = None,
                 vmap_method: Optional[str] = "broadcast_all", output_dims: Optional[Dims] = None,
                 in_out_argnames: Optional[Iterable[str]] = None, stage_in_argnames: Optional[Iterable[str]] = None,
                 stage_out_argnames: Optional[Iterable[str]] = None,
                 graph_cache_max: Optional[int] = _GRAPH_CACHE_MAX_DEFAULT, module_preload_mode: Any = None,
                 has_side_effect: bool = False, *, mode: Optional[Mode] = "auto", device: Target = None,
                 arch: Optional[Union[int, str]] = None, socket_path: Optional[Union[str, os.PathLike]] = None,
                 fallback: Optional[str] = None, socket: Optional[Union[str, os.PathLike]] = None) -> JaxCallable:
    """Warp's jax_callable, replayed through graphd.

    Warp's arguments keep their meaning: the function's annotated arguments
    are inputs (static scalars or arrays), then in-out arrays
    (in_out_argnames, counted in num_outputs), then pure output arrays;
    output_dims (a shape for every output, or a dict by name; by default
    the first input array's shape); vmap_method ("broadcast_all",
    "sequential"); stage_in_argnames / stage_out_argnames (arrays left out
    are copied in once, when the daemon captures, or never copied out, as
    Warp's staged graph modes do); has_side_effect.

    As Warp's, the same function and options give the same object back
    (graph_cache_max is no part of that key: it updates the object found);
    an integer graph_mode becomes Warp's JaxCallableGraphMode. A call on a
    CPU device runs Warp's own jax_callable of the same arguments.

    graph_cache_max (Warp's default 32, None for no bound) bounds the
    programs the callable keeps captured in the daemon: the oldest over it
    is evicted (the captures only this process replayed), and captured
    again if it is replayed again. module_preload_mode is accepted without
    effect on the GPU (modules are compiled ahead of time here); graph_mode
    other than for choosing mode="auto"'s mode has no effect on the GPU
    (graphd always replays a captured graph).

    graphd's options: mode ("auto" follows graph_mode: WARP_STAGED_EX gives
    "staged_ex", anything else the daemon's auto choice of staged or
    direct), arch (the architecture to compile for: 90, "sm_90"; by
    default $GRAPHD_WARP_ARCH, else the first GPU JAX sees), device (a JAX
    or Warp GPU device to compile for; an architecture given here is the
    deprecated spelling of arch), socket_path (the daemon's socket, for
    this process's JAX handler: graphd.jax.set_socket_path; `socket` is its
    deprecated name), and fallback:
    None (the default) raises Refused where graphd cannot serve the
    function; "warp" (what install() sets) runs that signature as Warp's
    own jax_callable of the same arguments instead, logged once at INFO on
    the "graphd.warp" logger and listed by fallbacks().

    Parameters
    ----------
    func
        The Warp function (its arguments annotated as Warp's).
    num_outputs, graph_mode, vmap_method, output_dims, in_out_argnames
        As Warp's.
    stage_in_argnames, stage_out_argnames, graph_cache_max
        As Warp's.
    module_preload_mode, has_side_effect
        As Warp's.
    mode, arch, device, socket_path, fallback
        graphd's options, as above.
    socket
        socket_path's deprecated old name.

    Returns
    -------
    JaxCallable
        The same object for the same function and options.

    Raises
    ------
    InvalidArgument
        For an unknown mode or fallback, or options given twice (socket and
        socket_path, arch and device).
    FailedPrecondition
        For fallback="warp" without Warp's own jax_callable.
    Refused
        For a function or vmap_method graphd.warp cannot take (at the
        first call, for what only a call shows).
    """
    device, socket = _graphd_options("jax_callable", device, arch, socket_path, socket)
    graph_mode = _graph_mode(graph_mode)
    in_out = tuple(in_out_argnames) if in_out_argnames else None
    stage_in = tuple(stage_in_argnames) if stage_in_argnames else None
    stage_out = tuple(stage_out_argnames) if stage_out_argnames else None
    key = ("callable", func, num_outputs, graph_mode, vmap_method, _hashable_dims(output_dims), in_out, stage_in,
           stage_out, module_preload_mode, has_side_effect, mode, device, socket, fallback)

    def warp_own():
        own = _warp_own("jax_callable")
        if own is None:
            return None
        kw = _preload(module_preload_mode)
        return own(func, num_outputs, graph_mode=graph_mode, vmap_method=vmap_method, output_dims=output_dims,
                   in_out_argnames=in_out_argnames, stage_in_argnames=stage_in_argnames,
                   stage_out_argnames=stage_out_argnames, graph_cache_max=graph_cache_max,
                   has_side_effect=has_side_effect, **kw)

    def make():
        spec = FuncSpec.of_function(func, num_outputs, in_out_argnames=in_out,
                                    stage_in_argnames=stage_in, stage_out_argnames=stage_out)
        return JaxCallable(_Fn(func, spec), vmap_method=vmap_method, output_dims=output_dims,
                           has_side_effect=has_side_effect, mode=mode, graph_mode=graph_mode, device=device,
                           socket=socket, warp_own=warp_own if _warp_own("jax_callable") else None,
                           graph_cache_max=graph_cache_max, module_preload_mode=module_preload_mode,
                           fallback=fallback)

    def update(c):
        c.graph_cache_max = graph_cache_max

    return _cached(key, make, update)


def jax_kernel(kernel: Any, num_outputs: int = 1, vmap_method: Optional[str] = "broadcast_all",
               launch_dims: Optional[LaunchDims] = None, output_dims: Optional[Dims] = None,
               in_out_argnames: Optional[Iterable[str]] = None, module_preload_mode: Any = None,
               enable_backward: bool = False, has_side_effect: bool = False, block_dim: Optional[int] = None, *,
               mode: Optional[Mode] = "auto", device: Target = None, arch: Optional[Union[int, str]] = None,
               socket_path: Optional[Union[str, os.PathLike]] = None, fallback: Optional[str] = None,
               socket: Optional[Union[str, os.PathLike]] = None) -> Union[JaxCallable, DifferentiableKernel]:
    """Warp's jax_kernel, replayed through graphd: one launch of a kernel,
    whose call returns the outputs as a list.

    Parameters
    ----------
    kernel
        The Warp kernel (@wp.kernel).
    num_outputs, vmap_method, output_dims, in_out_argnames, has_side_effect
        As Warp's (and jax_callable's).
    launch_dims
        The launch's shape (None: the first input array's shape).
    module_preload_mode
        Accepted without effect.
    enable_backward
        True differentiates it as Warp does: the adjoint launch is a
        graphd program of its own (graphd.warp._grad).
    block_dim
        Threads per block (None: 256).
    mode, device, arch, socket_path, socket
        As jax_callable's.
    fallback
        As jax_callable's (with enable_backward, each launch falls back on
        its own).

    Returns
    -------
    JaxCallable, or DifferentiableKernel with enable_backward
        The same object for the same kernel and options.

    Raises
    ------
    TypeError
        When kernel is not a Warp kernel, or block_dim not an integer.
    ValueError
        When block_dim is not positive.
    NotImplementedError
        For in_out_argnames with enable_backward, as Warp's.
    GraphdError, Refused
        As jax_callable.
    """
    device, socket = _graphd_options("jax_kernel", device, arch, socket_path, socket)
    wp, ctx, _ = warp_modules()
    if not isinstance(kernel, ctx.Kernel):
        raise TypeError(f"jax_kernel() takes a Warp kernel, not {type(kernel).__name__}")
    if block_dim is not None:
        # Warp's checks and errors.
        if isinstance(block_dim, bool):
            raise TypeError("jax_kernel(): block_dim must be an integer or None.")
        try:
            block_dim = operator.index(block_dim)
        except TypeError:
            raise TypeError("jax_kernel(): block_dim must be an integer or None.") from None
        if block_dim <= 0:
            raise ValueError("jax_kernel(): block_dim must be positive.")
    if enable_backward:
        from ._grad import differentiable_kernel
        return differentiable_kernel(jax_callable, kernel, num_outputs, vmap_method, launch_dims, output_dims,
                                     in_out_argnames, module_preload_mode, has_side_effect, block_dim, mode=mode,
                                     device=device, socket=socket, fallback=fallback)
    in_out = tuple(in_out_argnames) if in_out_argnames else None
    key = ("kernel", kernel.func, kernel.sig, num_outputs, vmap_method, _hashable_dims(launch_dims),
           _hashable_dims(output_dims), in_out, module_preload_mode, has_side_effect, block_dim, mode, device, socket,
           fallback)

    def warp_own():
        own = _warp_own("jax_kernel")
        if own is None:
            return None
        kw = _preload(module_preload_mode)
        return own(kernel, num_outputs, vmap_method=vmap_method, launch_dims=launch_dims, output_dims=output_dims,
                   in_out_argnames=in_out_argnames, has_side_effect=has_side_effect, block_dim=block_dim, **kw)

    def make():
        spec = FuncSpec.of_kernel(kernel, num_outputs, in_out_argnames=in_out)
        return JaxCallable(_Fn(None, spec, kernel=kernel, block_dim=block_dim), vmap_method=vmap_method,
                           output_dims=output_dims, has_side_effect=has_side_effect, mode=mode, graph_mode=None,
                           device=device, socket=socket, launch_dims=launch_dims, kernel=True,
                           warp_own=warp_own if _warp_own("jax_kernel") else None, block_dim=block_dim,
                           module_preload_mode=module_preload_mode, fallback=fallback)

    return _cached(key, make)


# --- making warp.jax_callable these -----------------------------------------------

_originals: dict = {}


@functools.wraps(jax_callable)
def _installed_callable(*args, fallback="warp", **kwargs):
    """jax_callable as install() puts it in Warp's place: what graphd
    cannot serve runs as Warp's own."""
    return jax_callable(*args, fallback=fallback, **kwargs)


@functools.wraps(jax_kernel)
def _installed_kernel(*args, fallback="warp", **kwargs):
    """jax_kernel as install() puts it in Warp's place (see
    _installed_callable)."""
    return jax_kernel(*args, fallback=fallback, **kwargs)


def install() -> bool:
    """Makes warp.jax_callable, warp.jax_kernel and
    warp.clear_jax_callable_graph_cache (and their home in
    warp._src.jax.ffi) graphd.warp's, so code that calls them gets graphd
    programs. Code that imported the names before install() keeps Warp's:
    install first (GRAPHD_WARP_INSTALL=1 with `import graphd` early does
    it). What graphd cannot serve runs as Warp's own (fallback="warp"; see
    jax_callable and fallbacks()); uninstall() puts Warp's back. Warp is
    not initialised here: it starts on first use, as it does alone.

    Returns
    -------
    bool
        True.

    Raises
    ------
    Refused
        When Warp is missing (reason "warp_missing") or a release
        graphd.warp does not support ("warp_version").
    """
    wp, _, _ = warp_modules(init=False)
    targets = [wp]
    try:
        targets.append(importlib.import_module("warp._src.jax.ffi"))
    except ImportError:
        pass
    for mod in targets:
        for name, ours in (("jax_callable", _installed_callable), ("jax_kernel", _installed_kernel),
                           ("clear_jax_callable_graph_cache", clear_jax_callable_graph_cache)):
            cur = getattr(mod, name, None)
            if cur is ours:
                continue
            _originals.setdefault((mod.__name__, name), cur)
            setattr(mod, name, ours)
    return True


def _install_or_warn():
    try:
        install()
    except Refused as e:
        _log.warning("GRAPHD_WARP_INSTALL=1: graphd.warp is not installed (%s); Warp's own "
                    "jax_callable and jax_kernel stay", e)


class _InstallOnImport:
    """A finder on sys.meta_path that installs graphd.warp right after
    `warp` is first imported, then takes itself off the path."""

    def find_spec(self, name, path=None, target=None):
        if name != "warp":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec("warp")  # the other finders'
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _install_or_warn()
        spec.loader.exec_module = exec_module
        return spec


def install_when_imported() -> None:
    """What GRAPHD_WARP_INSTALL=1 does at `import graphd`: install() at
    once if warp is imported already, else as soon as it is, so that a
    process that never uses Warp (a sitecustomize reaches every Python
    process) neither imports it nor prints anything. A Warp that
    graphd.warp does not support is left as it is, with a warning."""
    if "warp" in sys.modules:
        _install_or_warn()
    elif not any(isinstance(f, _InstallOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _InstallOnImport())


def clear_jax_callable_graph_cache(callable: Any = None) -> None:  # noqa: A002: Warp's keyword (tests/test_names.py)
    """Warp's clear_jax_callable_graph_cache for graphd.warp's callables
    too. install() puts it in warp's place.

    Parameters
    ----------
    callable
        A JaxCallable: drops what it keeps captured (and evicts it, see
        JaxCallable); one of Warp's: Warp's own function clears it; None:
        what every callable keeps, Warp's included.
    """
    own = _originals.get(("warp", "clear_jax_callable_graph_cache"))
    if own is None:
        ffi = _warp_ffi()
        own = getattr(ffi, "clear_jax_callable_graph_cache", None)
        own = None if own is clear_jax_callable_graph_cache else own
    if isinstance(callable, JaxCallable):
        callable.captures.clear()
        return
    if callable is None:
        with _registry_lock:
            ours = [c for c in _registry.values() if isinstance(c, JaxCallable)]
        for c in ours:
            c.captures.clear()
    if own is not None:
        own(callable)


def uninstall() -> None:
    """Puts Warp's own jax_callable, jax_kernel and
    clear_jax_callable_graph_cache back (undoes install())."""
    import importlib
    for (modname, name), orig in list(_originals.items()):
        mod = importlib.import_module(modname)
        if orig is None:
            if hasattr(mod, name):
                delattr(mod, name)
        else:
            setattr(mod, name, orig)
        del _originals[(modname, name)]


def installed() -> bool:
    """Whether warp.jax_callable is graphd.warp's.

    Returns
    -------
    bool
        False too when warp cannot be imported.
    """
    try:
        import warp
    except ImportError:
        return False
    return getattr(warp, "jax_callable", None) in (jax_callable, _installed_callable)


# Old spellings, kept for the code that uses them: looked up on the module
# (graphd.warp.callable, `from graphd.warp import callable`) without being
# bound in it, so that callable() here is still the builtin.
_OLD_NAMES = {"callable": "array_callable"}


def __getattr__(name):
    new = _OLD_NAMES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .. import _deprecated
    _deprecated.warn(f"graphd.warp.{name}", f"graphd.warp.{new}")
    return globals()[new]
