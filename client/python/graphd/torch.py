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

import torch

from . import _deprecated
from .client import Client
from .arrays import slot_like
from .errors import GraphdError


def device_index(device=None):
    """The CUDA ordinal of `device` (a torch.device, "cuda:1", an int, a
    tensor; None: the current device)."""
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


def connect(device=None, socket_path=None, **kw):
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
        As graphd.Client.connect.
    """
    socket_path = _deprecated.renamed_kw(kw, "socket", "socket_path", socket_path, "graphd.torch.connect")
    kw.setdefault("client_name", "graphd-torch")
    return Client.connect_cuda(device_index(device), socket_path, **kw)


def current_stream(device=None):
    """torch.cuda.current_stream(device).cuda_stream: the stream
    Client.replay_arrays uses for tensors when none is given (0 is the legacy
    default stream)."""
    return torch.cuda.current_stream(device).cuda_stream


__all__ = ["connect", "current_stream", "device_index", "slot_like"]
