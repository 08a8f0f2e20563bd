"""graphd.warp's jax_callable and jax_kernel: Warp's two ways of calling
Warp code from JAX, with Warp's arguments, giving a JaxCallable, the same
object for the same function and options as Warp gives."""

from __future__ import annotations

import operator
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, List, Optional, Union

from ..errors import GraphdError
from ..records import Mode
from ._callable import Dims, Fn, JaxCallable, LaunchDims, Target
from ._core import FuncSpec
from ._own import find_warp_own, graph_mode_enum, mark_ours, preload_option
from ._support import warp_modules

if TYPE_CHECKING:
    from ._grad import DifferentiableKernel

# Warp's default bound on the graphs one jax_callable keeps.
_GRAPH_CACHE_MAX_DEFAULT = 32

# {key of a function and its options: the JaxCallable made for it}.
registry: dict = {}
registry_lock = threading.Lock()


def _hashable_dims(dims):
    """Warp's cache-key form of output_dims / launch_dims."""
    if isinstance(dims, dict):
        return tuple(sorted((k, _hashable_dims(v)) for k, v in dims.items()))
    if hasattr(dims, "__len__"):
        return tuple(dims)
    return dims


def _cached(key, make, update=None):
    """The callable made for key before (Warp returns the same object for
    the same function and options), or a new one; options that are no
    part of the key update the one found."""
    try:
        hash(key)
    except TypeError:
        return make()
    with registry_lock:
        hit = registry.get(key)
        if hit is None:
            hit = registry[key] = make()
        elif update is not None:
            update(hit)
        return hit


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


def callables() -> List[JaxCallable]:
    """Every JaxCallable made so far, for clearing what each keeps."""
    with registry_lock:
        return [c for c in registry.values() if isinstance(c, JaxCallable)]


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
    graph_mode = graph_mode_enum(graph_mode)
    in_out = tuple(in_out_argnames) if in_out_argnames else None
    stage_in = tuple(stage_in_argnames) if stage_in_argnames else None
    stage_out = tuple(stage_out_argnames) if stage_out_argnames else None
    key = ("callable", func, num_outputs, graph_mode, vmap_method, _hashable_dims(output_dims), in_out, stage_in,
           stage_out, module_preload_mode, has_side_effect, mode, device, socket, fallback)

    def warp_own():
        own = find_warp_own("jax_callable")
        if own is None:
            return None
        kw = preload_option(module_preload_mode)
        return own(func, num_outputs, graph_mode=graph_mode, vmap_method=vmap_method, output_dims=output_dims,
                   in_out_argnames=in_out_argnames, stage_in_argnames=stage_in_argnames,
                   stage_out_argnames=stage_out_argnames, graph_cache_max=graph_cache_max,
                   has_side_effect=has_side_effect, **kw)

    def make():
        spec = FuncSpec.of_function(func, num_outputs, in_out_argnames=in_out,
                                    stage_in_argnames=stage_in, stage_out_argnames=stage_out)
        return JaxCallable(Fn(func, spec), vmap_method=vmap_method, output_dims=output_dims,
                           has_side_effect=has_side_effect, mode=mode, graph_mode=graph_mode, device=device,
                           socket=socket, warp_own=warp_own if find_warp_own("jax_callable") else None,
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
        own = find_warp_own("jax_kernel")
        if own is None:
            return None
        kw = preload_option(module_preload_mode)
        return own(kernel, num_outputs, vmap_method=vmap_method, launch_dims=launch_dims, output_dims=output_dims,
                   in_out_argnames=in_out_argnames, has_side_effect=has_side_effect, block_dim=block_dim, **kw)

    def make():
        spec = FuncSpec.of_kernel(kernel, num_outputs, in_out_argnames=in_out)
        return JaxCallable(Fn(None, spec, kernel=kernel, block_dim=block_dim), vmap_method=vmap_method,
                           output_dims=output_dims, has_side_effect=has_side_effect, mode=mode, graph_mode=None,
                           device=device, socket=socket, launch_dims=launch_dims, kernel=True,
                           warp_own=warp_own if find_warp_own("jax_kernel") else None, block_dim=block_dim,
                           module_preload_mode=module_preload_mode, fallback=fallback)

    return _cached(key, make)


mark_ours("jax_callable", jax_callable)
mark_ours("jax_kernel", jax_kernel)
