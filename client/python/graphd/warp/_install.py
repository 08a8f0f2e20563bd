"""install(): Warp's jax_callable, jax_kernel and
clear_jax_callable_graph_cache made graphd.warp's, so that code calling
Warp's names gets graphd programs; uninstall() puts Warp's back, and
install_when_imported() is what GRAPHD_WARP_INSTALL=1 does at `import
graphd`."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from typing import Any

from ._callable import JaxCallable
from ._factory import callables, jax_callable, jax_kernel
from ._own import mark_ours, originals, warp_ffi
from ._support import Refused, warp_modules

_log = logging.getLogger("graphd.warp")


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
            originals.setdefault((mod.__name__, name), cur)
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
    own = originals.get(("warp", "clear_jax_callable_graph_cache"))
    if own is None:
        ffi = warp_ffi()
        own = getattr(ffi, "clear_jax_callable_graph_cache", None)
        own = None if own is clear_jax_callable_graph_cache else own
    if isinstance(callable, JaxCallable):
        callable.captures.clear()
        return
    if callable is None:
        for c in callables():
            c.captures.clear()
    if own is not None:
        own(callable)


def uninstall() -> None:
    """Puts Warp's own jax_callable, jax_kernel and
    clear_jax_callable_graph_cache back (undoes install())."""
    import importlib
    for (modname, name), orig in list(originals.items()):
        mod = importlib.import_module(modname)
        if orig is None:
            if hasattr(mod, name):
                delattr(mod, name)
        else:
            setattr(mod, name, orig)
        del originals[(modname, name)]


mark_ours("jax_callable", _installed_callable)
mark_ours("jax_kernel", _installed_kernel)
