"""JaxCallable: what graphd.warp.jax_callable and jax_kernel return, a
Warp function or kernel called from JAX as Warp's callable would be, its
programs built at the first call of each signature and replayed through
graphd.jax."""

from __future__ import annotations

import importlib
import logging
import os
import threading
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Union

from ..errors import GraphdError
from ..records import Mode, VmapMethod
from ._build import check_fixed
from ._captures import Captures
from ._core import Function
from ._fallback import FALLBACKS, Fallback, note_fallback
from ._options import require_cuda, resolve_arch, resolve_mode, resolve_ordinal, use_socket
from ._own import installed
from ._support import Refused, warp_modules

#: A launch_dims: one shape, an int or a tuple.
LaunchDims = Union[int, Sequence[int]]
#: An output_dims: one shape for every output, or a dict of shapes by name.
Dims = Union[LaunchDims, Mapping[str, LaunchDims]]
#: The architectures and devices graphd.warp compiles for (resolve_arch).
Target = Any

_VMAP: Dict[Optional[str], Optional[VmapMethod]] = {
    None: None, "broadcast_all": "broadcast_all", "sequential": "sequential", "sequential_unrolled": "sequential"}

_log = logging.getLogger("graphd.warp")


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
        self.captures = Captures(self)
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
        since they were dropped included (see Captures.sync)."""
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
            note_fallback(Fallback(self.spec.name, key, refusal.reason, str(refusal)))
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


class Fn(Function):
    """A Function as jax_callable and jax_kernel make it: with the kernel
    and block_dim of jax_kernel (None for a function)."""

    def __init__(self, func, spec, kernel=None, block_dim=None):
        super().__init__(func, spec)
        self.kernel, self.block_dim = kernel, block_dim
