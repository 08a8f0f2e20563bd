"""graphd.warp's own options, below everything that takes them: the replay
mode (`mode`, or Warp's graph_mode), the target device (`device`: an
architecture to compile for, and the CUDA ordinal the recorded function
sees), the daemon's socket, and whether this Warp can build for CUDA."""

from __future__ import annotations

import os
from typing import Any, Optional

from ..errors import GraphdError
from ..records import Mode
from ..program import MODES
from ._support import Refused, warp_modules

# JaxCallableGraphMode values (Warp's): staged_ex is the one graphd maps.
GRAPH_MODE_WARP_STAGED_EX = 4


def resolve_mode(mode: Optional[Mode], graph_mode: Optional[int] = None) -> Mode:
    """graphd's replay mode for a Warp call.

    Parameters
    ----------
    mode
        "staged", "staged_ex" or "direct", taken as given; "auto" (or
        None) follows graph_mode.
    graph_mode
        Warp's JaxCallableGraphMode (or its int): WARP_STAGED_EX gives
        "staged_ex", any other the daemon's "auto" (staged or direct by
        the bytes against the kernel nodes to re-point).

    Returns
    -------
    str
        "staged", "staged_ex", "direct" or "auto".

    Raises
    ------
    InvalidArgument
        For an unknown mode.
    """
    if mode in (None, "auto"):
        gm = int(graph_mode) if graph_mode is not None else None
        return "staged_ex" if gm == GRAPH_MODE_WARP_STAGED_EX else "auto"
    if mode in MODES:
        return mode
    raise GraphdError("INVALID_ARGUMENT", f"mode {mode!r} is not staged, staged_ex, direct or auto")


def _parse_arch(v):
    if isinstance(v, bool):
        raise GraphdError("INVALID_ARGUMENT", f"device {v!r} is not an architecture")
    if isinstance(v, int):
        return v
    s = str(v).strip().lower()
    if s == "cpu" or s.startswith("cpu"):
        raise Refused("cpu_device", "graphd replays on CUDA devices only; the CPU device is refused (use Warp's "
                      "own jax_callable for CPU)", code="INVALID_ARGUMENT")
    s = s.removeprefix("sm_").removeprefix("sm").removeprefix("compute_")
    if "." in s:
        major, minor = s.split(".", 1)
        if major.isdigit() and minor.isdigit():
            return int(major) * 10 + int(minor)
    if s.isdigit():
        return int(s)
    raise GraphdError("INVALID_ARGUMENT", f"device {v!r} is not an architecture (90, 'sm_90', '9.0'), a JAX "
                      "device or a Warp device")


def resolve_arch(device: Any = None) -> int:
    """The SM architecture to compile for.

    Parameters
    ----------
    device
        None (then $GRAPHD_WARP_ARCH, else the first GPU JAX sees), an int
        or string architecture (90, "sm_90", "9.0"), a JAX device (its
        compute_capability) or a Warp device (its arch).

    Returns
    -------
    int
        The architecture (90 for sm_90).

    Raises
    ------
    Refused
        For a CPU device (reason "cpu_device"), or when device is None and
        no GPU is to be found.
    InvalidArgument
        For something that is not an architecture.
    """
    if device is None:
        env = os.environ.get("GRAPHD_WARP_ARCH")
        if env:
            return _parse_arch(env)
        try:
            import jax
            gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
        except Exception:
            gpus = []
        if not gpus:
            raise Refused("cpu_device", "no CUDA device is visible to JAX, and graphd replays on CUDA devices only; "
                          "pass device= (for example device='sm_90') to build for a GPU elsewhere",
                          code="FAILED_PRECONDITION")
        device = gpus[0]
    if hasattr(device, "is_cpu") and hasattr(device, "arch"):  # a Warp device
        if device.is_cpu:
            return _parse_arch("cpu")
        return int(device.arch)
    if hasattr(device, "platform"):  # a JAX device
        if device.platform == "cpu":
            return _parse_arch("cpu")
        return _parse_arch(getattr(device, "compute_capability", None))
    return _parse_arch(device)


def resolve_ordinal(device: Any = None) -> int:
    """The CUDA ordinal of the device a call is for, which the recorded
    function sees as Warp's current device.

    Parameters
    ----------
    device
        A Warp or JAX device, or anything else (None, an architecture),
        which says nothing about the ordinal.

    Returns
    -------
    int
        That of a Warp or JAX GPU device given (0 for a Warp CPU device),
        else of JAX's default device when it is a GPU, else of the first
        GPU JAX sees, else 0.
    """
    if hasattr(device, "is_cuda") and hasattr(device, "ordinal"):  # a Warp device
        return int(device.ordinal) if device.is_cuda else 0
    if hasattr(device, "platform") and device.platform in ("gpu", "cuda"):
        return int(getattr(device, "local_hardware_id", None) or 0)
    try:
        import jax
        default = jax.config.jax_default_device
        if hasattr(default, "platform") and default.platform in ("gpu", "cuda"):
            return int(getattr(default, "local_hardware_id", None) or 0)
        gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
    except Exception:
        gpus = []
    return int(getattr(gpus[0], "local_hardware_id", None) or 0) if gpus else 0


def use_socket(socket):
    """The daemon this process's JAX handler connects to: a socket given
    here goes to graphd.jax.set_socket_path (the environment is not
    written); another one once the handler has sessions is refused."""
    if socket is None:
        return
    from ..jax import set_socket_path
    set_socket_path(os.fspath(socket))


def require_cuda():
    """Refuses a CUDA call where Warp says its build has no CUDA support
    (Warp's own message): such a Warp cannot build CUDA modules, and Warp's
    own callables refuse the call the same way."""
    _, ctx, _ = warp_modules()
    if not getattr(ctx.runtime, "is_cuda_enabled", True):
        raise GraphdError("FAILED_PRECONDITION", "This Warp build does not include CUDA support")
