"""graphd for PyTorch: a data session on a tensor's GPU, and the current
stream. Replays go through Client.replay_arrays(program, *tensors), which
binds tensors directly (docs/pytorch.md):

    import torch, graphd, graphd.torch
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    p = graphd.Program()
    xs = graphd.arrays.slot_like(p, "input", x)
    ys = graphd.arrays.slot_like(p, "output", y)
    p.launch(mod, "scale", n // 256, 256, args=[graphd.Slot(xs), graphd.Slot(ys),
                                                 graphd.f32(2.0), graphd.u32(n)])
    with graphd.torch.connect() as c:
        c.register_module("cubin", cubin)
        c.replay_arrays(p, x, y)   # on torch.cuda.current_stream()

Importing this module imports torch."""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import torch

from . import _deprecated
from .client import Client
from .arrays import slot_like
from .errors import GraphdError


#: A GPU the PyTorch way: a torch.device, "cuda:1", an ordinal, a tensor
#: (its device), or None (the current device).
Device = Union["torch.device", str, int, "torch.Tensor", None]


def device_index(device: Device = None) -> int:
    """The CUDA ordinal of a PyTorch device.

    Parameters
    ----------
    device
        A torch.device, "cuda:1", an int, a tensor (its device); None: the
        current device.

    Returns
    -------
    int
        The ordinal as this process numbers it (an int is returned as it
        is).

    Raises
    ------
    InvalidArgument
        When the device is not a CUDA device.
    RuntimeError
        From torch.device, for a string that names no device.
    """
    if isinstance(device, torch.Tensor):
        device = device.device
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise GraphdError("INVALID_ARGUMENT", f"{d} is not a CUDA device; graphd replays on GPUs")
    return d.index if d.index is not None else torch.cuda.current_device()


def connect(device: Device = None, socket_path: Optional[Union[str, os.PathLike]] = None,
            **kw: Any) -> Client:
    """A graphd Client (a data session) on a GPU.

    Parameters
    ----------
    device
        The GPU (a torch.device, "cuda:1", an int, a tensor; None: the current device).
    socket_path : str, os.PathLike or None
        The daemon's socket (None: libgraphd's default). ``socket=`` is its
        deprecated old name.
    **kw
        As graphd.Client.connect (timeout_ms, client_name, reconnect_ms).

    Returns
    -------
    graphd.Client

    Raises
    ------
    GraphdError
        As device_index and graphd.Client.connect.
    """
    socket_path = _deprecated.renamed_kw(kw, "socket", "socket_path", socket_path, "graphd.torch.connect")
    kw.setdefault("client_name", "graphd-torch")
    return Client.connect_cuda(device_index(device), socket_path, **kw)


def current_stream(device: Device = None) -> int:
    """The stream Client.replay_arrays uses for tensors when none is given:
    torch.cuda.current_stream(device).cuda_stream.

    Parameters
    ----------
    device
        As torch.cuda.current_stream (a torch.device, "cuda:1", an int;
        None: the current device).

    Returns
    -------
    int
        The CUstream handle (0 is the legacy default stream).
    """
    return torch.cuda.current_stream(device).cuda_stream


__all__ = ["connect", "current_stream", "device_index", "slot_like"]
