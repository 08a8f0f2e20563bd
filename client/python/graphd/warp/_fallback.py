"""The calls that run as Warp's own instead of graphd's (a JaxCallable
made with fallback="warp", as install() makes them): what fallback= takes,
and the process's list of those that fell back."""

from __future__ import annotations

import collections
import threading
from typing import List

# What jax_callable(fallback=...) takes: None refuses what graphd cannot
# serve, "warp" runs it as Warp's own callable (what install() sets).
FALLBACKS = (None, "warp")

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


def note_fallback(fallback: Fallback) -> None:
    """Adds a call that fell back for the first time to fallbacks()."""
    with _fallbacks_lock:
        _fallbacks.append(fallback)
