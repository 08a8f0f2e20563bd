"""Gradients through graphd programs: jax_kernel(..., enable_backward=True).

Warp differentiates a kernel by launching its adjoint. Its jax_kernel
builds two jax_callables around the kernel, one that launches it and one
that zeroes the input gradients and launches the adjoint over the primal
inputs, the primal outputs and the output cotangents, and ties them
together with jax.custom_vjp (static scalars are its nondiff arguments),
inside a jax.jit whose static arguments are those scalars.

graphd does the same with graphd.warp's jax_callable: the forward launch
is one graphd program and the adjoint another, each recorded, captured
and replayed like any other program, under jit, grad, vmap and pmap.
Launch dimensions (explicit, or the first input array's shape) and the
block size are the same for both launches, as in Warp, so the adjoint
covers exactly the threads the forward ran.

What Warp refuses here is refused the same way: in_out_argnames and
output_dims (NotImplementedError), and per-call launch_dims, output_dims
or vmap_method (TypeError)."""

import inspect
import operator
import threading

from ._steps import resolve_block_dim
from ._support import Refused, warp_modules

_MISSING = object()
_cache: dict = {}
_cache_lock = threading.Lock()


def _params(kernel):
    return [p for p in inspect.signature(kernel.func).parameters.values()
            if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD]


def _annotate(func, name, params):
    """Gives func the signature jax_callable reads its arguments from."""
    func.__signature__ = inspect.Signature(params)
    func.__annotations__ = {p.name: p.annotation for p in params}
    func.__annotations__["return"] = None
    func.__name__ = func.__qualname__ = name
    return func


class DifferentiableKernel:
    """What jax_kernel(..., enable_backward=True) returns: call it with JAX
    arrays and static scalars, in the kernel's argument order up to its
    outputs; it returns the list of outputs and has a gradient (jax.grad,
    jax.vjp) with respect to every array input.

    forward, backward: the two graphd.warp jax_callables (their `programs`
    are the graphd programs built so far); block_dim: as given (None for
    Warp's default of 256); launch_dims: as given, normalised to a tuple (or
    an int)."""

    def __init__(self, jitted, forward, backward, launch_dims, block_dim, name):
        self._jitted = jitted
        self.forward, self.backward = forward, backward
        self.launch_dims, self.block_dim = launch_dims, block_dim
        self.__name__ = name

    def __call__(self, *args, launch_dims=_MISSING, output_dims=_MISSING, vmap_method=_MISSING):
        if launch_dims is not _MISSING:
            raise TypeError("jax_kernel(): launch_dims cannot be overridden per-call when enable_backward=True "
                            f"(this wrapper was created with launch_dims={self.launch_dims!r}); call jax_kernel() "
                            "again with other launch_dims for another wrapper")
        if output_dims is not _MISSING:
            raise TypeError("jax_kernel(): output_dims is not supported when enable_backward=True.")
        if vmap_method is not _MISSING:
            raise TypeError("jax_kernel(): vmap_method cannot be overridden per-call when enable_backward=True; it "
                            "is fixed when the wrapper is made: call jax_kernel() again with another vmap_method")
        return self._jitted(*args)

    @property
    def programs(self):
        """{signature: Built} of the forward and the adjoint programs."""
        out = dict(self.forward.programs)
        out.update(self.backward.programs)
        return out


def differentiable_kernel(jax_callable, kernel, num_outputs=1, vmap_method="broadcast_all", launch_dims=None,
                          output_dims=None, in_out_argnames=None, module_preload_mode=None, has_side_effect=False,
                          block_dim=None, **graphd_options):
    """jax_kernel(kernel, ..., enable_backward=True) through graphd.
    jax_callable is graphd.warp's (passed in, so this module does not
    import the package); graphd_options (mode, device, socket) go to it.
    The same arguments give the same jitted function, as Warp's cache
    does."""
    import jax

    wp, _, types_mod = warp_modules()
    if in_out_argnames:
        raise NotImplementedError("jax_kernel(): Input-output arguments (in_out_argnames) are not supported when "
                                  "enable_backward=True.")
    if output_dims is not None:
        raise NotImplementedError("jax_kernel(): output_dims is not yet supported when enable_backward=True.")

    params = _params(kernel)
    nparams = len(params)
    num_inputs = nparams - num_outputs
    if num_outputs < 1 or num_inputs < 0:
        raise ValueError(f"jax_kernel(): num_outputs={num_outputs} for a kernel of {nparams} arguments")
    static_args = []
    for i, p in enumerate(params[:num_inputs]):
        if not types_mod.matches_array_class(p.annotation, wp.array):
            if p.annotation not in types_mod.value_types:
                raise TypeError(f"Invalid type for argument '{p.name}', expected array or scalar, got "
                                f"{p.annotation}")
            static_args.append(i)
    if hasattr(launch_dims, "__len__"):
        launch_dims = tuple(launch_dims)
    if block_dim is not None:
        block_dim = operator.index(block_dim)
    name = kernel.key
    key = (kernel.func, kernel.sig, num_outputs, vmap_method, module_preload_mode, has_side_effect, launch_dims,
           block_dim, tuple(sorted(graphd_options.items())))
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return DifferentiableKernel(*hit, launch_dims, block_dim, name)

    def dims_of(args):
        """The launch dimensions of both launches: the explicit ones, or
        the first input array's Warp shape."""
        if launch_dims is not None:
            return launch_dims
        for i, p in enumerate(params[:num_inputs]):
            if i not in static_args:
                return tuple(args[i].shape)[:p.annotation.ndim]
        raise RuntimeError("Unable to determine launch dimensions, at least one input array is required")

    def forward(*args):
        wp.launch(kernel, dim=dims_of(args), inputs=args[:num_inputs], outputs=args[num_inputs:],
                  block_dim=block_dim)

    def adjoint(*args):
        options = kernel.module.resolve_options(wp.config, block_dim=resolve_block_dim(block_dim)) | kernel.options
        if not options.get("enable_backward", True):
            raise Refused("kernel", f"kernel {kernel.key} is compiled without its adjoint (enable_backward=False "
                          "on the kernel, its module or wp.config), so it has no gradient to launch")
        inputs = list(args[:num_inputs])
        outputs = list(args[num_inputs:nparams])
        grad_out = list(args[nparams:nparams + num_outputs])
        grad_in = list(args[nparams + num_outputs:])
        for g in grad_in:
            g.zero_()
        # A static scalar's adjoint parameter is its own value, as Warp passes it.
        for i in static_args:
            grad_in.insert(i, inputs[i])
        wp.launch(kernel, dim=dims_of(inputs), inputs=inputs, outputs=outputs, adj_inputs=grad_in,
                  adj_outputs=grad_out, adjoint=True, block_dim=block_dim)

    def adj_param(p):
        return inspect.Parameter("adj_" + p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=p.annotation)

    diff = [i for i in range(num_inputs) if i not in static_args]
    _annotate(forward, f"{name}_forward", params)
    _annotate(adjoint, f"{name}_adjoint", params + [adj_param(p) for p in params[num_inputs:]]
              + [adj_param(params[i]) for i in diff])
    common = dict(vmap_method=vmap_method, has_side_effect=has_side_effect, **graphd_options)
    if module_preload_mode is not None:  # else the callable's own default
        common["module_preload_mode"] = module_preload_mode

    fwd = jax_callable(forward, num_outputs=num_outputs, **common)
    bwd = jax_callable(adjoint, num_outputs=len(diff), **common)

    def fwd_rule(*args):
        out = fwd(*args)
        return out, ([args[i] for i in diff], list(out))

    def bwd_rule(*rest):
        statics = rest[:len(static_args)]
        (primal_in, primal_out), cotangents = rest[len(static_args)], rest[len(static_args) + 1]
        inputs = list(primal_in)
        for i, v in zip(static_args, statics):
            inputs.insert(i, v)
        # Each input gradient has its input's Warp shape (batch dimensions
        # under vmap are added by the callable).
        out_dims = {}
        for i, x in zip(diff, primal_in):
            ann = params[i].annotation
            inner = len(ann.dtype._shape_) if hasattr(ann.dtype, "_wp_scalar_type_") else 0
            shape = tuple(x.shape)[:len(x.shape) - inner]
            out_dims["adj_" + params[i].name] = shape[len(shape) - ann.ndim:]
        grads = bwd(*inputs, *primal_out, *cotangents, output_dims=out_dims)
        return tuple(grads)

    def call(*args):
        return fwd(*args)

    vjp = jax.custom_vjp(call, nondiff_argnums=tuple(static_args))
    vjp.defvjp(fwd_rule, bwd_rule)

    def user(*args):
        return vjp(*args)

    user.__signature__ = inspect.signature(kernel.func)
    user.__name__ = user.__qualname__ = name
    jitted = jax.jit(user, static_argnames=tuple(params[i].name for i in static_args))
    with _cache_lock:
        hit = _cache.setdefault(key, (jitted, fwd, bwd))
    return DifferentiableKernel(*hit, launch_dims, block_dim, name)
