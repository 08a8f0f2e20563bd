"""graphd: the Python client of the graphd daemon.

- graphd.program: a pure-Python program builder that produces the same
  canonical encoding and SHA-256 id as libgraphd's C builder, and module
  ids. It needs neither libgraphd nor a daemon.
- graphd.client: Client, a libgraphd session (connect, status, register
  modules and programs, streams, host memory, replay_bindings), with its
  Stream and HostBuffer. It sits on graphd._lib, the private ctypes
  binding (libgraphd is loaded on first use; see its docstring for how it
  is found).

- graphd.arrays: framework arrays (DLPack, __cuda_array_interface__) as
  bindings; Client.replay_arrays(program, *arrays, stream=None) replays a
  Program on PyTorch tensors, CuPy arrays and the like.
- graphd.torch, graphd.cupy (imported on demand): a data session for a
  framework's device, and for CuPy a RawKernel's module. See
  docs/pytorch.md and docs/cupy.md.

- graphd.warp (imported on demand; needs warp-lang): Warp functions and
  kernels as graphd programs, for JAX (jax_callable, jax_kernel) and for
  Warp arrays (array_callable). See docs/warp.md.

- graphd.errors: GraphdError and one subclass per status (NotFound is a
  LookupError, Unavailable a ConnectionError, ...); graphd.records: the
  Literal and TypedDict types of the API. The package is typed (py.typed).
- The "graphd" logger reports reconnects, evictions and asynchronous
  failures; graphd.warp logs on "graphd.warp".

See docs/jax.md."""

from ._version import __version__
from .errors import (GraphdError, STATUS_CODES, status_name, error_class, InvalidArgument,
                     InvalidArgumentType, DeadlineExceeded, NotFound, AlreadyExists, PermissionDenied,
                     ResourceExhausted, FailedPrecondition, LibraryError, Aborted, OutOfRange,
                     Unimplemented, Internal, Unavailable, DataLoss)
from .program import (
    Program, Arg, Slot, Scalar, Struct, Raw, module_id, id_hex,
    i8, u8, i16, u16, i32, u32, i64, u64, f16, f32, f64,
    ROLES, MODES, MODULE_KINDS,
)
from .records import Mode, Role, ModuleKind
from .client import Client, Stream, HostBuffer, clear
from . import arrays, records
from .arrays import slot_like
from . import _env

# GRAPHD_WARP_INSTALL=1 (docs/environment.md): warp.jax_callable and
# warp.jax_kernel become graphd.warp's (docs/warp.md): at once if warp is
# imported already, else when it is. Import graphd before the code that
# takes those names from warp.
if _env.flag("GRAPHD_WARP_INSTALL"):
    from . import warp as _warp
    _warp.install_when_imported()

__all__ = [
    "__version__",
    "GraphdError", "STATUS_CODES", "status_name", "error_class",
    "InvalidArgument", "InvalidArgumentType", "DeadlineExceeded", "NotFound", "AlreadyExists",
    "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "LibraryError", "Aborted",
    "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
    "Program", "Arg", "Slot", "Scalar", "Struct", "Raw", "module_id", "id_hex",
    "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f16", "f32", "f64",
    "ROLES", "MODES", "MODULE_KINDS", "Mode", "Role", "ModuleKind",
    "Client", "Stream", "HostBuffer", "clear", "arrays", "records", "slot_like",
]
