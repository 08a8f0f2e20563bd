"""The programs a JaxCallable keeps captured in the daemon, as Warp's
graph cache keeps graphs: bounded by graph_cache_max, the oldest evicted
from the daemon when dropped."""

from __future__ import annotations

import collections
import os
from typing import Iterable, Optional, Union

from ..client import Client
from ..errors import GraphdError


class Captures(collections.OrderedDict):
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
