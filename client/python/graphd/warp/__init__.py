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
become slots, arrays the function allocates become scratch slots, the
pointers inside the packed parameters become pointer patches; the modules
are compiled to CUBIN for the GPU's architecture by Warp's bundled NVRTC.
No GPU is needed to build a program.

graphd's own options are keyword arguments of their own: `mode`
("staged", "staged_ex", "direct" or "auto"), `device` (the target: an
architecture such as 90 or "sm_90", a JAX or Warp device; by default the
first GPU JAX sees) and `socket` (the daemon's socket).

install() (or GRAPHD_WARP_INSTALL=1 at `import graphd`) makes
warp.jax_callable and warp.jax_kernel these, so libraries that call them
run through graphd unchanged. callable() replays the same programs on Warp
arrays without JAX."""

import os
import threading

from .. import program as _program
from ..errors import GraphdError
from ._support import REASONS, SUPPORTED_BELOW, SUPPORTED_MIN, Refused, warp_modules
from ._core import FuncSpec, Function
from ._build import compile_module, grid_for

__all__ = ["jax_callable", "jax_kernel", "callable", "install", "uninstall", "installed", "Refused", "REASONS",
           "SUPPORTED_MIN", "SUPPORTED_BELOW", "resolve_arch", "resolve_mode", "compile_module", "grid_for"]

# JaxCallableGraphMode values (Warp's): staged_ex is the one graphd maps.
_GRAPH_MODE_WARP_STAGED_EX = 4
_VMAP = {None: None, "broadcast_all": "broadcast_all", "sequential": "sequential",
         "sequential_unrolled": "sequential"}


# --- graphd's own options ------------------------------------------------------


def resolve_mode(mode, graph_mode=None):
    """graphd's replay mode: "staged", "staged_ex" or "direct" as given;
    "auto" (or None) follows Warp's graph_mode: WARP_STAGED_EX gives
    staged_ex, any other the daemon's auto (staged or direct by the bytes
    against the kernel nodes to re-point)."""
    if mode in (None, "auto"):
        gm = int(graph_mode) if graph_mode is not None else None
        return "staged_ex" if gm == _GRAPH_MODE_WARP_STAGED_EX else "auto"
    if mode in _program.MODES:
        return mode
    raise GraphdError("INVALID_ARGUMENT", f"mode {mode!r} is not staged, staged_ex, direct or auto")


def _parse_arch(v):
    if isinstance(v, bool):
        raise GraphdError("INVALID_ARGUMENT", f"device {v!r} is not an architecture")
    if isinstance(v, int):
        return v
    s = str(v).strip().lower()
    if s == "cpu" or s.startswith("cpu"):
        raise Refused("cpu_device", "graphd replays on CUDA devices only; the CPU device is refused (use Warp's "
                      "own jax_callable for CPU)", code="INVALID_ARGUMENT")
    s = s.removeprefix("sm_").removeprefix("sm").removeprefix("compute_")
    if "." in s:
        major, minor = s.split(".", 1)
        if major.isdigit() and minor.isdigit():
            return int(major) * 10 + int(minor)
    if s.isdigit():
        return int(s)
    raise GraphdError("INVALID_ARGUMENT", f"device {v!r} is not an architecture (90, 'sm_90', '9.0'), a JAX "
                      "device or a Warp device")


def resolve_arch(device=None):
    """The SM architecture to compile for, as an int (90 for sm_90).

    device: None (then $GRAPHD_WARP_ARCH, else the first GPU JAX sees), an
    int or string architecture, a JAX device (its compute_capability) or a
    Warp device (its arch). A CPU device is refused."""
    if device is None:
        env = os.environ.get("GRAPHD_WARP_ARCH")
        if env:
            return _parse_arch(env)
        try:
            import jax
            gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
        except Exception:
            gpus = []
        if not gpus:
            raise Refused("cpu_device", "no CUDA device is visible to JAX, and graphd replays on CUDA devices only; "
                          "pass device= (for example device='sm_90') to build for a GPU elsewhere",
                          code="FAILED_PRECONDITION")
        device = gpus[0]
    if hasattr(device, "is_cpu") and hasattr(device, "arch"):  # a Warp device
        if device.is_cpu:
            return _parse_arch("cpu")
        return int(device.arch)
    if hasattr(device, "platform"):  # a JAX device
        if device.platform == "cpu":
            return _parse_arch("cpu")
        return _parse_arch(getattr(device, "compute_capability", None))
    return _parse_arch(device)


def _use_socket(socket):
    """The JAX handler connects to $GRAPHD_SOCKET (or the default): a
    socket given here is put there, once per process."""
    if socket is None:
        return
    socket = os.fspath(socket)
    cur = os.environ.get("GRAPHD_SOCKET")
    if cur and cur != socket:
        raise GraphdError("INVALID_ARGUMENT", f"socket {socket!r}: this process already uses GRAPHD_SOCKET={cur!r}; "
                          "the JAX handler has one daemon per process")
    os.environ["GRAPHD_SOCKET"] = socket


# --- the JAX callables ------------------------------------------------------------


class JaxCallable:
    """What graphd.warp.jax_callable and jax_kernel return: call it with
    JAX arrays (and static scalars) as Warp's would be called; it returns
    the list of outputs (in-out arguments first, then pure outputs).

    programs: {signature: Built} of everything built so far."""

    def __init__(self, function, *, vmap_method, output_dims, has_side_effect, mode, graph_mode, device, socket,
                 launch_dims=None, kernel=False):
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
        self.kernel = kernel
        self._arch = None
        self._calls = {}
        self._lock = threading.Lock()
        self.__name__ = self.spec.name
        _use_socket(socket)

    @property
    def arch(self):
        if self._arch is None:
            self._arch = resolve_arch(self.device)
        return self._arch

    @property
    def programs(self):
        return dict(self.function.built)

    def __call__(self, *args, output_dims=None, vmap_method=None, launch_dims=None):
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
        out_dims = self._out_dims(args, output_dims, launch_dims)
        key = (tuple(sorted((i, type(v).__name__, repr(v)) for i, v in statics.items())),
               tuple(out_dims), vmap_method, launch_dims)
        with self._lock:
            fn = self._calls.get(key)
            if fn is None:
                from .. import jax as gj
                fn = gj.callable(self._builder(statics, out_dims, launch_dims), mode=self.mode,
                                 vmap_method=_VMAP[vmap_method], has_side_effect=self.has_side_effect)
                self._calls[key] = fn
        out = fn(*arrays)
        return out if isinstance(out, list) else [out]

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
            elif self.kernel and launch_dims is not None:
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
            from .. import jax as gj
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
            if self.kernel:
                dims = shapes[spec.first_array] if launch_dims is None else _batched_launch(launch_dims, batch)
                func = _kernel_runner(self.function.kernel, dims, self.function.block_dim)
            built = self.function.build(shapes, statics, self.arch, mode, func=func,
                                        extra=("launch", launch_dims) if self.kernel else None)
            return gj.Spec(built.program, results=results,
                           operand_slots=[built.arg_slots[i] for i in array_inputs],
                           result_slots=[built.arg_slots[i] for i in result_slots_of],
                           modules=built.spec_modules())

        build.__name__ = spec.name
        return build


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


def jax_callable(func, num_outputs=1, graph_mode=None, vmap_method="broadcast_all", output_dims=None,
                 in_out_argnames=None, stage_in_argnames=None, stage_out_argnames=None, graph_cache_max=None,
                 module_preload_mode=None, has_side_effect=False, *, mode="auto", device=None, socket=None):
    """Warp's jax_callable, replayed through graphd.

    Warp's arguments keep their meaning: the function's annotated arguments
    are inputs (static scalars or arrays), then in-out arrays
    (in_out_argnames, counted in num_outputs), then pure output arrays;
    output_dims (a shape for every output, or a dict by name; by default
    the first input array's shape); vmap_method ("broadcast_all",
    "sequential"); stage_in_argnames / stage_out_argnames (arrays left out
    are copied in once, when the daemon captures, or never copied out, as
    Warp's staged graph modes do); has_side_effect.

    Accepted without effect: graph_cache_max and module_preload_mode (the
    daemon keeps captures; modules are compiled ahead of time here) and
    graph_mode other than for choosing mode="auto"'s mode (graphd always
    replays a captured graph, so NONE and JAX have no meaning).

    graphd's options: mode ("auto" follows graph_mode: WARP_STAGED_EX gives
    "staged_ex", anything else the daemon's auto choice of staged or
    direct), device (the architecture to compile for) and socket."""
    spec = FuncSpec.of_function(func, num_outputs, in_out_argnames=in_out_argnames,
                                stage_in_argnames=stage_in_argnames, stage_out_argnames=stage_out_argnames)
    return JaxCallable(_Fn(func, spec), vmap_method=vmap_method, output_dims=output_dims,
                       has_side_effect=has_side_effect, mode=mode, graph_mode=graph_mode, device=device,
                       socket=socket)


def jax_kernel(kernel, num_outputs=1, vmap_method="broadcast_all", launch_dims=None, output_dims=None,
               in_out_argnames=None, module_preload_mode=None, enable_backward=False, has_side_effect=False,
               block_dim=None, *, mode="auto", device=None, socket=None):
    """Warp's jax_kernel, replayed through graphd: one launch of `kernel`
    over launch_dims (by default the first input array's shape), with
    block_dim threads per block (256 by default). Returns the outputs as a
    list. enable_backward=True differentiates it as Warp does: the adjoint
    launch is a graphd program of its own (graphd.warp._grad). module_preload_mode
    is accepted without effect."""
    wp, ctx, _ = warp_modules()
    if not isinstance(kernel, ctx.Kernel):
        raise TypeError(f"jax_kernel() takes a Warp kernel, not {type(kernel).__name__}")
    if block_dim is not None and (isinstance(block_dim, bool) or int(block_dim) <= 0):
        raise ValueError("jax_kernel(): block_dim must be positive.")
    if enable_backward:
        from ._grad import differentiable_kernel
        return differentiable_kernel(jax_callable, kernel, num_outputs, vmap_method, launch_dims, output_dims,
                                     in_out_argnames, module_preload_mode, has_side_effect, block_dim, mode=mode,
                                     device=device, socket=socket)
    spec = FuncSpec.of_kernel(kernel, num_outputs, in_out_argnames=in_out_argnames)
    return JaxCallable(_Fn(None, spec, kernel=kernel, block_dim=block_dim), vmap_method=vmap_method,
                       output_dims=output_dims, has_side_effect=has_side_effect, mode=mode, graph_mode=None,
                       device=device, socket=socket, launch_dims=launch_dims, kernel=True)


# --- making warp.jax_callable these -----------------------------------------------

_originals = {}


def install():
    """Makes warp.jax_callable and warp.jax_kernel (and their home in
    warp._src.jax.ffi) graphd.warp's, so code that calls them gets graphd
    programs. Code that imported the names before install() keeps Warp's:
    install first (GRAPHD_WARP_INSTALL=1 with `import graphd` early does
    it). Returns True; uninstall() puts Warp's back."""
    wp, _, _ = warp_modules()
    import importlib
    targets = [wp]
    try:
        targets.append(importlib.import_module("warp._src.jax.ffi"))
    except ImportError:
        pass
    for mod in targets:
        for name, ours in (("jax_callable", jax_callable), ("jax_kernel", jax_kernel)):
            cur = getattr(mod, name, None)
            if cur is ours:
                continue
            _originals.setdefault((mod.__name__, name), cur)
            setattr(mod, name, ours)
    return True


def uninstall():
    """Puts Warp's own jax_callable and jax_kernel back."""
    import importlib
    for (modname, name), orig in list(_originals.items()):
        mod = importlib.import_module(modname)
        if orig is None:
            if hasattr(mod, name):
                delattr(mod, name)
        else:
            setattr(mod, name, orig)
        del _originals[(modname, name)]


def installed():
    """Whether warp.jax_callable is graphd.warp's."""
    try:
        import warp
    except ImportError:
        return False
    return getattr(warp, "jax_callable", None) is jax_callable


from ._replay import callable  # noqa: E402
