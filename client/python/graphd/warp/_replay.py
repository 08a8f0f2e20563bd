"""The same programs without JAX: graphd.warp.array_callable(func) is
called with Warp arrays on a CUDA device (and scalars), like func itself, and
replays the function's program through libgraphd on Warp's current stream
of that device."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from ..client import Client
from ..errors import GraphdError
from ._build import check_fixed
from ._core import FuncSpec, Function
from ._options import require_cuda, resolve_arch, resolve_mode, resolve_ordinal
from ._support import Refused, warp_modules
from ..records import Mode, ReplayInfo


class WarpCallable:
    """graphd.warp.array_callable's result. Every array argument is bound to its
    slot by pointer: arguments named in `inputs` are only read (input
    slots), those in `outputs` only written (output slots), the others both
    (inout). Scalars are static: each value is its own program.

    Parameters
    ----------
    func, inputs, outputs, mode, device
        As array_callable.
    socket
        array_callable's socket_path.

    Raises
    ------
    GraphdError, ValueError
        As array_callable.
    """

    def __init__(self, func: Callable[..., Any], inputs: Iterable[str] = (), outputs: Iterable[str] = (),
                 mode: Mode = "staged", device: Any = None,
                 socket: Optional[Union[str, os.PathLike]] = None) -> None:
        self.func = func
        self.mode = resolve_mode(mode)
        self.device = device
        self.socket = socket
        self.inputs, self.outputs = set(inputs or ()), set(outputs or ())
        if self.inputs & self.outputs:
            raise ValueError(f"{sorted(self.inputs & self.outputs)} named both in inputs and outputs")
        self._spec: Any = None  # the function's FuncSpec, made on first use
        self._fn: Any = None  # its Function
        self._sessions: Dict[Any, Dict[str, Any]] = {}
        self._lock = threading.Lock()

    def _function(self):
        if self._fn is None:
            spec = FuncSpec.of_function(self.func, 1)
            known = {a.name for a in spec.args}
            for n in self.inputs | self.outputs:
                if n not in known:
                    raise ValueError(f"{n!r} is not an argument of {spec.name}")
            for a in spec.args:
                if not a.is_array:
                    a.role = "input"
                elif a.name in self.inputs:
                    a.role = "input"
                elif a.name in self.outputs:
                    a.role = "output"
                else:
                    a.role = "inout"
            spec.stage_in = spec.stage_out = None
            self._spec = spec
            self._fn = Function(self.func, spec)
        return self._fn

    @property
    def programs(self) -> Dict[Any, Any]:
        """The programs built so far, by signature (a copy)."""
        return dict(self._fn.built) if self._fn else {}

    def build(self, *args: Any, arch: Any = None) -> Any:
        """The program for these arguments, built (or found) without
        replaying.

        Parameters
        ----------
        *args
            Warp arrays (or anything with .shape) and scalars, as func
            takes them.
        arch
            The architecture or device to compile for (None: the
            callable's device, else resolve_arch's default).

        Returns
        -------
        Built
            The program, its slots and modules (graphd.warp._build.Built).

        Raises
        ------
        ValueError
            For another number of arguments than func takes.
        Refused
            Where graphd cannot make func a program.
        """
        fn = self._function()
        spec = self._spec
        if len(args) != len(spec.args):
            raise ValueError(f"{spec.name} takes {len(spec.args)} arguments, got {len(args)}")
        shapes, statics = {}, {}
        for i, (a, v) in enumerate(zip(spec.args, args)):
            if a.is_array:
                shapes[i] = tuple(v.shape)
            else:
                statics[i] = a.type(v)
        target = arch if arch is not None else self.device
        return fn.build(shapes, statics, resolve_arch(target), self.mode, ordinal=resolve_ordinal(target))

    def __call__(self, *args: Any) -> ReplayInfo:
        """Replays func's program on these arguments, on Warp's current
        stream of their device.

        Parameters
        ----------
        *args
            Warp arrays on one CUDA device, contiguous, and scalars, as
            func takes them.

        Returns
        -------
        ReplayInfo
            The replay's info (captured, capture_ns, server_ns).

        Raises
        ------
        ValueError
            For another number of arguments than func takes.
        TypeError
            When an array argument is not a Warp array.
        Refused
            For an array on the CPU, or where graphd cannot make func a
            program.
        InvalidArgument
            For arrays on two devices, a non-contiguous array or no array at
            all.
        FailedPrecondition
            For a Warp without CUDA.
        GraphdError
            As Client.replay_bindings.
        """
        wp, _, _ = warp_modules()
        require_cuda()
        self._function()
        spec = self._spec
        if len(args) != len(spec.args):
            raise ValueError(f"{spec.name} takes {len(spec.args)} arguments, got {len(args)}")
        device = None
        for a, v in zip(spec.args, args):
            if a.is_array:
                if not isinstance(v, wp.array):
                    raise TypeError(f"argument {a.name} must be a Warp array, not {type(v).__name__}")
                if v.device.is_cpu:
                    raise Refused("cpu_device", f"argument {a.name} is on the CPU; graphd replays on CUDA devices "
                                  "only", code="INVALID_ARGUMENT")
                if device is not None and v.device != device:
                    raise GraphdError("INVALID_ARGUMENT", f"arguments on {device} and {v.device}: one device per call")
                if not v.is_contiguous:
                    raise GraphdError("INVALID_ARGUMENT", f"argument {a.name} is not contiguous; a slot is one byte "
                                      "range")
                device = v.device
        if device is None:
            raise GraphdError("INVALID_ARGUMENT", f"{spec.name} has no array argument to say which device to use")
        built = self.build(*args, arch=self.device if self.device is not None else device)
        check_fixed(built, spec.name)
        client, stream = self._session(device, built)
        bindings: List[Any] = []
        for i, a in enumerate(spec.args):
            if a.is_array and built.arg_slots[i] is not None:  # an empty array has no slot
                bindings.append((built.arg_slots[i], args[i].ptr, built.slots[built.arg_slots[i]].nbytes))
        # Warp arrays made outside the function, at their own address.
        bindings += [(f.slot, f.address, f.nbytes) for f in built.fixed]
        return client.replay_bindings(stream, built.id, bindings)

    def _session(self, device, built):
        """The data session of `device` (one per device), with the program
        and its modules registered, and Warp's current stream attached."""
        wp, _, _ = warp_modules()
        with self._lock:
            s = self._sessions.get(device.alias)
            if s is None:
                s = {"client": Client.connect(self.socket, device_uuid=device.uuid, client_name="graphd-warp"),
                     "programs": set(), "streams": {}}
                self._sessions[device.alias] = s
            c = s["client"]
            if built.id not in s["programs"]:
                for m in built.modules:
                    c.register_module(m.kind, m.data)
                c.register_program(built.encoding, built.id)
                s["programs"].add(built.id)
            cs = wp.get_stream(device).cuda_stream
            st = s["streams"].get(cs)
            if st is None:
                st = c.stream_attach(cs)
                s["streams"][cs] = st
            return c, st

    def close(self) -> None:
        """Closes the data sessions (detaching the streams)."""
        with self._lock:
            for s in self._sessions.values():
                s["client"].close()
            self._sessions.clear()


def array_callable(func: Callable[..., Any], *, inputs: Iterable[str] = (), outputs: Iterable[str] = (),
                   mode: Mode = "staged", device: Any = None,
                   socket_path: Optional[Union[str, os.PathLike]] = None,
                   socket: Optional[Union[str, os.PathLike]] = None) -> WarpCallable:
    """A function of Warp arrays (on one CUDA device) and scalars that
    replays func's graphd program on Warp's current stream of that device
    (graphd.warp.callable is its old spelling).

    Parameters
    ----------
    func
        The Warp function (its arguments annotated as Warp's).
    inputs
        The names of the arrays that are only read.
    outputs
        The names of the arrays that are only written (the rest are read
        and written).
    mode
        "staged", "staged_ex", "direct" or "auto".
    device
        Overrides the architecture to compile for (an architecture, or a
        JAX or Warp device).
    socket_path
        The daemon's socket (None: libgraphd's default).
    socket
        socket_path's deprecated old name.

    Returns
    -------
    WarpCallable
        Each call returns the replay's info (captured, capture_ns,
        server_ns).

    Raises
    ------
    InvalidArgument
        For an unknown mode.
    ValueError
        For an array named both in inputs and in outputs.
    """
    if socket is not None:
        from .. import _deprecated
        _deprecated.warn("graphd.warp.array_callable(socket=...)", "graphd.warp.array_callable(socket_path=...)")
        socket_path = socket if socket_path is None else socket_path
    return WarpCallable(func, inputs=inputs, outputs=outputs, mode=mode, device=device, socket=socket_path)
