"""graphd for CuPy: a data session on an array's GPU, the current stream,
and CuPy's NVRTC kernels (cupy.RawKernel) as graphd modules. Replays go
through Client.replay_arrays(program, *arrays), which binds CuPy arrays
directly (docs/cupy.md):

    k = graphd.cupy.Kernel(cupy.RawKernel(src, "scale"))
    p = graphd.Program()
    xs = graphd.arrays.slot_like(p, "input", x)
    ys = graphd.arrays.slot_like(p, "output", y)
    k.launch(p, n // 256, 256, [graphd.Slot(xs), graphd.Slot(ys), graphd.f32(2.0), graphd.u32(n)])
    with graphd.cupy.connect() as c:
        c.register_module(*k.module)
        c.replay_arrays(p, x, y)   # on cupy.cuda.get_current_stream()

Importing this module imports cupy."""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional, Tuple, Union

import cupy

from . import _deprecated
from .client import Client
from .arrays import slot_like
from .errors import GraphdError
from .program import Arg, Dim3, Program, module_id
from .records import ModuleKind

_INVALID = "INVALID_ARGUMENT"


#: A GPU the CuPy way: a cupy.cuda.Device, an ordinal, an array (its
#: device), or None (the current device).
Device = Union["cupy.cuda.Device", int, "cupy.ndarray", None]


def device_index(device: Device = None) -> int:
    """The CUDA ordinal of a CuPy device.

    Parameters
    ----------
    device
        A cupy.cuda.Device, an int, an array (its device); None: the
        current device.

    Returns
    -------
    int
        The device's id (anything without one is returned as it is).
    """
    if isinstance(device, cupy.ndarray):
        device = device.device
    if device is None:
        return cupy.cuda.Device().id
    return getattr(device, "id", device)


def connect(device: Device = None, socket_path: Optional[Union[str, os.PathLike]] = None,
            **kw: Any) -> Client:
    """A graphd Client (a data session) on a GPU.

    Parameters
    ----------
    device
        The GPU (a cupy.cuda.Device, an int, an array; None: the current device).
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
    socket_path = _deprecated.renamed_kw(kw, "socket", "socket_path", socket_path, "graphd.cupy.connect")
    kw.setdefault("client_name", "graphd-cupy")
    return Client.connect_cuda(device_index(device), socket_path, **kw)


def current_stream() -> int:
    """The stream Client.replay_arrays uses for CuPy arrays when none is
    given: cupy.cuda.get_current_stream().ptr.

    Returns
    -------
    int
        The CUstream handle (0 is the legacy default stream).
    """
    return cupy.cuda.get_current_stream().ptr


def compile_cubin(source: str, name: str, options: Iterable[str] = (),
                  arch: Optional[Union[int, str]] = None) -> bytes:
    """Compiles CUDA C++ with NVRTC (CuPy's binding of it) into a CUBIN.

    Parameters
    ----------
    source
        The CUDA C++ source.
    name
        A name for messages (and the source's file name, name.cu).
    options
        NVRTC options; any -arch or --gpu-architecture among them is
        dropped for `arch`.
    arch
        The architecture to compile for, as the digits of sm_XX (90,
        "90"; None: the current device's).

    Returns
    -------
    bytes
        The CUBIN.

    Raises
    ------
    InvalidArgument
        When NVRTC cannot compile it (with NVRTC's log).
    """
    from cupy_backends.cuda.libs import nvrtc
    if arch is None:
        arch = cupy.cuda.Device().compute_capability
    opts = tuple(o for o in options if not str(o).startswith(("-arch", "--gpu-architecture")))
    opts += (f"-arch=sm_{arch}",)
    prog = nvrtc.createProgram(source, f"{name}.cu", (), ())
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise GraphdError(_INVALID, f"NVRTC could not compile {name}: {e}\n{log}") from None
        return bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)


class Kernel:
    """A cupy.RawKernel (backend "nvrtc") as a graphd launch: its source
    compiled by NVRTC with the kernel's options into a CUBIN.

    Parameters
    ----------
    kernel
        The cupy.RawKernel (its code, name, options and backend are read).
    arch
        As compile_cubin (None: the current device's).

    Attributes
    ----------
    module : (str, bytes)
        ("cubin", bytes): register it with Client.register_module.
    module_id : bytes
        Its 32-byte id.
    name : str
        The entry's name (declare it extern "C" in the source).

    Raises
    ------
    InvalidArgument
        When kernel is not a RawKernel, its backend is not "nvrtc", or NVRTC
        cannot compile it.
    """

    name: str
    module: Tuple[ModuleKind, bytes]
    module_id: bytes

    def __init__(self, kernel: Any, arch: Optional[Union[int, str]] = None) -> None:
        code, name = getattr(kernel, "code", None), getattr(kernel, "name", None)
        if not isinstance(code, str) or not isinstance(name, str):
            raise GraphdError(_INVALID, f"{type(kernel).__name__} is not a cupy.RawKernel (it has no "
                              "code and name)")
        backend = getattr(kernel, "backend", "nvrtc")
        if backend != "nvrtc":
            raise GraphdError(_INVALID, f"kernel {name}: backend {backend!r}; graphd compiles RawKernels "
                              "with NVRTC (backend='nvrtc')")
        self.name = name
        self.module = ("cubin", compile_cubin(code, name, tuple(getattr(kernel, "options", ()) or ()), arch))
        self.module_id = module_id(*self.module)

    def launch(self, program: Program, grid: Dim3, block: Dim3, args: Iterable[Arg],
               shared_bytes: int = 0) -> int:
        """Adds a launch of this kernel to a program.

        Parameters
        ----------
        program
            The program.
        grid, block, shared_bytes
            As Program.add_launch.
        args
            Slot, u32(...), f32(...), ...: one per parameter.

        Returns
        -------
        int
            The step's index.

        Raises
        ------
        GraphdError, InvalidArgumentType
            As Program.launch.
        """
        return program.launch(self.module_id, self.name, grid, block, list(args),
                              shared_bytes=shared_bytes)


__all__ = ["connect", "current_stream", "device_index", "compile_cubin", "Kernel", "slot_like"]
