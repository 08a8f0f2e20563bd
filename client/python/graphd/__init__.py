"""graphd: the Python client of the graphd daemon.

- graphd.program: a pure-Python program builder that produces the same
  canonical encoding and SHA-256 id as libgraphd's C builder, and module
  ids. It needs neither libgraphd nor a daemon.
- graphd._lib: ctypes bindings to libgraphd (loaded on first use; see its
  docstring for how it is found): Client (connect, status, register
  modules and programs, streams, host memory, replay).

See docs/jax.md."""

from .errors import GraphdError, STATUS_CODES, status_name
from .program import (
    Program, Arg, Slot, Scalar, Struct, Raw, module_id, id_hex,
    i8, u8, i16, u16, i32, u32, i64, u64, f16, f32, f64,
    ROLES, MODES, MODULE_KINDS,
)
from ._lib import Client, Stream, HostBuffer, clear

__version__ = "0.1.0"

__all__ = [
    "GraphdError", "STATUS_CODES", "status_name",
    "Program", "Arg", "Slot", "Scalar", "Struct", "Raw", "module_id", "id_hex",
    "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f16", "f32", "f64",
    "ROLES", "MODES", "MODULE_KINDS",
    "Client", "Stream", "HostBuffer", "clear",
]
