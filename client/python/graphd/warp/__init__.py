"""NVIDIA Warp steps through graphd: one import changes.

    from graphd.warp import jax_callable        # instead of: from warp import jax_callable

    step = jax_callable(my_warp_function, num_outputs=2, in_out_argnames=["state"])
    state, obs = jax.jit(step)(state, action)

graphd.warp.jax_callable and graphd.warp.jax_kernel take Warp's arguments
and keep Warp's call semantics (inputs, in-out and output arguments,
output_dims, static scalars, vmap), but instead of running the function in
a Python callback they turn it into a graphd program, at the first call
for each signature, and replay it through graphd.jax: the daemon captures
it once per device and every process that builds the same program shares
that capture.

How the program is made (docs/warp.md has the whole story): the function
runs once on Warp's CPU device with reserved, untouched memory while
graphd.warp records its launches, memsets and copies instead of running
them, and its capture_while loops and capture_if branches around them
(twice, to check that they depend on shapes only); array arguments
become slots, arrays the function allocates become temp slots, the
pointers inside the packed parameters become pointer patches; the modules
are compiled to CUBIN for the GPU's architecture by Warp's bundled NVRTC.
No GPU is needed to build a program.

graphd's own options are keyword arguments of their own: `mode`
("staged", "staged_ex", "direct" or "auto"), `device` (the target: an
architecture such as 90 or "sm_90", a JAX or Warp device; by default the
first GPU JAX sees) and `socket` (the daemon's socket).

install() (or GRAPHD_WARP_INSTALL=1 at `import graphd`) makes
warp.jax_callable and warp.jax_kernel these, so libraries that call them
run through graphd unchanged. array_callable() replays the same programs on
Warp arrays without JAX."""

from __future__ import annotations

# The modules below, from the bottom: _support (Warp's presence and the
# refusals), _steps, _options, _params, _record, _build, _core, _grad and
# _replay build and replay programs; _own (Warp's own callables), _fallback,
# _captures, _callable (JaxCallable), _factory (jax_callable, jax_kernel)
# and _install (install, uninstall) serve them from JAX. This module only
# gathers their public names.
from ..client import Client
from ..errors import GraphdError
from ..records import Mode, VmapMethod
from ._support import REASONS, SUPPORTED_BELOW, SUPPORTED_MIN, Refused, warp_modules
from ._core import FuncSpec, Function
from ._build import check_fixed, compile_module, grid_for
from ._options import require_cuda, resolve_arch, resolve_mode, resolve_ordinal, use_socket
from ._replay import array_callable
from ._own import installed
from ._fallback import FALLBACKS, Fallback, fallbacks
from ._captures import evict_captures
from ._callable import Dims, JaxCallable, LaunchDims, Target
from ._factory import jax_callable, jax_kernel
from ._factory import registry as _registry  # noqa: F401: every callable made, which tests clear
from ._install import clear_jax_callable_graph_cache, install, install_when_imported, uninstall

__all__ = ["jax_callable", "jax_kernel", "clear_jax_callable_graph_cache", "array_callable", "install", "uninstall",
           "installed", "fallbacks", "FALLBACKS", "Refused", "REASONS", "SUPPORTED_MIN", "SUPPORTED_BELOW", "resolve_arch", "resolve_mode",
           "resolve_ordinal", "evict_captures", "compile_module", "grid_for"]


# Old spellings, kept for the code that uses them: looked up on the module
# (graphd.warp.callable, `from graphd.warp import callable`) without being
# bound in it, so that callable() here is still the builtin.
_OLD_NAMES = {"callable": "array_callable"}


def __getattr__(name):
    new = _OLD_NAMES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .. import _deprecated
    _deprecated.warn(f"graphd.warp.{name}", f"graphd.warp.{new}")
    return globals()[new]
