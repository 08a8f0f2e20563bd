"""Warp's own jax_callable and jax_kernel, beside graphd.warp's: where
Warp keeps them (warp._src.jax.ffi), the originals install() put aside,
the options Warp's own callable is made with, and whether Warp's names
are graphd.warp's now.

graphd.warp's replacements are defined above this module; each of them
is named here (mark_ours) when its module is imported, so that telling
Warp's function from graphd.warp's needs no import upward."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Optional

# {(module name, attribute): what Warp had there} for every name install()
# replaced, so that uninstall() can put it back (None: Warp had none).
originals: Dict[Any, Any] = {}

# {Warp's name: the functions of graphd.warp that may stand under it}.
_ours: Dict[str, List[Callable[..., Any]]] = {"jax_callable": [], "jax_kernel": []}


def mark_ours(name: str, *functions: Callable[..., Any]) -> None:
    """Notes functions of graphd.warp that install() may put under Warp's
    name `name` ("jax_callable" or "jax_kernel")."""
    _ours[name].extend(functions)


def _is_ours(f: Any) -> bool:
    return any(f in functions for functions in _ours.values())


def warp_ffi() -> Optional[Any]:
    """warp._src.jax.ffi, or None where Warp has none."""
    try:
        return importlib.import_module("warp._src.jax.ffi")
    except ImportError:
        return None


def find_warp_own(name: str) -> Optional[Callable[..., Any]]:
    """Warp's own jax_callable or jax_kernel, installed or not."""
    ffi = warp_ffi()
    if ffi is None:
        return None
    f = originals.get((ffi.__name__, name)) or getattr(ffi, name, None)
    return None if _is_ours(f) else f


def preload_option(module_preload_mode):
    """Warp's module_preload_mode for Warp's own callable (the CPU path):
    as given, else NONE. Warp's default would load the module on the
    current device at every trace, a GPU included, where graphd runs it;
    a call on the CPU loads it for the CPU anyway."""
    if module_preload_mode is not None:
        return {"module_preload_mode": module_preload_mode}
    enum = getattr(warp_ffi(), "JaxModulePreloadMode", None)
    return {} if enum is None else {"module_preload_mode": enum.NONE}


def graph_mode_enum(graph_mode):
    """Warp's JaxCallableGraphMode of graph_mode (an int is normalised,
    None is Warp's default, JAX); the int where Warp has no enum."""
    ffi = warp_ffi()
    enum = getattr(ffi, "JaxCallableGraphMode", None)
    if enum is None:
        return None if graph_mode is None else int(graph_mode)
    return enum.JAX if graph_mode is None else enum(graph_mode)


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
    return getattr(warp, "jax_callable", None) in _ours["jax_callable"]

