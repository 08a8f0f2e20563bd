"""Environment variables that are switches, read by one rule in C
(common/env.c) and here: on when the value is 1, true, yes or on (any
case); off when unset, empty, 0, false, no, off or anything else.
docs/environment.md lists every variable graphd reads."""

import os

_ON = ("1", "true", "yes", "on")


def flag(name: str) -> bool:
    """Whether the switch `name` is on.

    Parameters
    ----------
    name
        The variable ("GRAPHD_WARP_INSTALL").

    Returns
    -------
    bool
    """
    return os.environ.get(name, "").strip().lower() in _ON
