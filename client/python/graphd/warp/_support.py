"""Which Warp graphd.warp works with, and the refusal it raises otherwise.

graphd.warp packs kernel parameters with Warp's own code and then finds the
pointers inside them by layout: the array descriptor (warp/native/array.h:
data pointer, grad pointer, shape, strides, ndim, flags), the launch bounds
(shape, size, coord_mult) and the indexed-array descriptor. It also uses a
few of Warp's internal functions (parameter packing, launch-bounds
construction, module hashing and compilation). Both are checked once, at
the first recording: a Warp outside the supported range, or one whose
layouts or functions differ from what graphd.warp knows, is refused with
the reason rather than packed wrongly."""

import ctypes
import os
import re

from ..errors import GraphdError

# The Warp releases graphd.warp was written and tested against: from
# SUPPORTED_MIN up to, not including, SUPPORTED_BELOW (1.18 is the one
# MuJoCo's MJX pins; its layouts are the same as 1.19's).
SUPPORTED_MIN = (1, 18, 0)
SUPPORTED_BELOW = (1, 20, 0)

# Each refusal has a short reason (Refused.reason) and a message.
REASONS = {
    "warp_version": "a Warp release or layout graphd.warp does not know",
    "warp_missing": "Warp is not importable",
    "cpu_device": "a CPU device",
    "host_sync": "host synchronisation or reading values on the host",
    "host_callback": "host code between parts of the graph",
    "conditional": "a capture_while/capture_if graphd cannot record (a wp.Graph as a body, a loop body that "
                   "does nothing, Warp's own function through a reference taken before recording)",
    "nested_capture": "graph capture inside the function",
    "value_dependent": "a launch sequence that depends on something other than shapes",
    "native": "Warp's native work graphd cannot record (on the host, or on a CUDA device at once)",
    "unrecorded_launch": "a launch that bypassed the recorder",
    "launch_command": "changing a recorded Launch object",
    "unknown_pointer": "memory that is neither an argument nor allocated inside the function",
    "host_data": "host data copied into an array inside the function",
    "fill_value": "a fill value graphd's memset cannot express",
    "param_type": "a kernel parameter type graphd.warp cannot pack",
    "kernel": "a kernel feature graphd cannot launch",
    "limits": "a program over the daemon's limits",
    "mode": "a graphd mode the daemon does not have",
    "signature": "a function signature graphd.warp cannot bind",
    "arch": "a GPU architecture Warp cannot compile for",
    "empty": "a function that does nothing on the GPU",
}


class Refused(GraphdError):
    """graphd.warp will not turn this Warp function into a graphd program.

    Parameters
    ----------
    reason
        One of REASONS' keys.
    message
        What was found.
    code
        The status name it carries as a GraphdError.

    Attributes
    ----------
    reason : str
        As given.
    """

    reason: str

    def __init__(self, reason: str, message: str, code: str = "UNIMPLEMENTED") -> None:
        super().__init__(code, message)
        self.reason = reason


_checked = None  # warp_modules(): imported, checked and initialised
_imported = None  # ... imported and checked


def parse_version(v):
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", str(v))
    if not m:
        return None
    return tuple(int(x or 0) for x in m.groups())


def check_version(version):
    """Refuses a Warp release outside [SUPPORTED_MIN, SUPPORTED_BELOW)."""
    v = parse_version(version)
    lo = ".".join(map(str, SUPPORTED_MIN))
    hi = ".".join(map(str, SUPPORTED_BELOW))
    if v is None or not SUPPORTED_MIN <= v < SUPPORTED_BELOW:
        raise Refused("warp_version", f"Warp {version} is not supported by graphd.warp, which knows the kernel "
                      f"parameter layouts of Warp {lo} up to (not including) {hi}", code="FAILED_PRECONDITION")


def _fields(ct):
    return [(n, getattr(ct, n).offset, ctypes.sizeof(t)) for n, t in ct._fields_]


def check_layouts(wp, ctx, types_mod, codegen):
    """Refuses a Warp whose descriptors or internal functions differ from
    the ones graphd.warp packs and patches."""
    problems = []
    if _fields(types_mod.array_t) != [("data", 0, 8), ("grad", 8, 8), ("shape", 16, 16), ("strides", 32, 16),
                                      ("ndim", 48, 2), ("flags", 50, 2)] or ctypes.sizeof(types_mod.array_t) != 56:
        problems.append(f"array_t is {_fields(types_mod.array_t)}")
    ia = getattr(types_mod, "indexedarray_t", None)
    if ia is None or _fields(ia) != [("data", 0, 56), ("indices", 56, 32), ("shape", 88, 16)]:
        problems.append("indexedarray_t differs")
    for n, (size, at) in {1: (24, 8), 2: (24, 8), 3: (32, 16), 4: (32, 16)}.items():
        b = types_mod.launch_bounds_t((1,) * n)
        if ctypes.sizeof(b) != size or type(b).size.offset != at:
            problems.append(f"launch_bounds_t<{n}> is {ctypes.sizeof(b)} bytes with size at {type(b).size.offset}")
    header = os.path.join(os.path.dirname(wp.__file__), "native", "array.h")
    if os.path.exists(header):
        with open(header, encoding="utf-8", errors="replace") as f:
            text = f.read()
        m = re.search(r"template <typename T> struct array_t \{(.*?)\n\};", text, re.S)
        members = re.findall(r"^\s+(T\*|shape_t|int|uint16_t)\s+(\w+)(\[\w+\])?;", m.group(1), re.M) if m else []
        if [(t, n) for t, n, _ in members] != [("T*", "data"), ("T*", "grad"), ("shape_t", "shape"),
                                               ("int", "strides"), ("uint16_t", "ndim"), ("uint16_t", "flags")]:
            problems.append(f"native/array.h declares array_t members {members}")
    for mod, names in ((ctx, ("pack_arg", "_normalize_launch_dim", "_build_launch_bounds_from_tuple",
                              "_validate_kernel_tid_extents", "Module", "Kernel")),
                       (codegen, ("cuda_kernel_forward_name", "cuda_kernel_backward_name", "resolve_grid_stride",
                                  "Struct"))):
        problems += [f"{mod.__name__}.{n} is missing" for n in names if not hasattr(mod, n)]
    for n in ("_compile", "get_module_hash", "resolve_options", "get_module_identifier", "_get_meta_name"):
        if not hasattr(ctx.Module, n):
            problems.append(f"Module.{n} is missing")
    if problems:
        raise Refused("warp_version", f"Warp {wp.__version__} does not have the layouts graphd.warp knows: "
                      + "; ".join(problems), code="FAILED_PRECONDITION")


def warp_modules(init=True):
    """(warp, warp._src.context, warp._src.types), imported and checked
    once, and Warp initialised (unless init is False: install() patches
    names without starting Warp's runtime, which prints its banner and
    looks for devices; Warp starts on first use, as it does alone)."""
    global _checked, _imported
    if _checked is not None:
        return _checked
    if _imported is None:
        try:
            import warp as wp
        except ImportError as e:
            raise Refused("warp_missing", f"Warp is not importable ({e}); install warp-lang",
                          code="FAILED_PRECONDITION") from None
        check_version(getattr(wp, "__version__", "unknown"))
        try:
            from warp._src import codegen, context as ctx, types as types_mod
        except ImportError as e:
            raise Refused("warp_version", f"Warp {wp.__version__} lacks the internals graphd.warp uses ({e})",
                          code="FAILED_PRECONDITION") from None
        check_layouts(wp, ctx, types_mod, codegen)
        _imported = (wp, ctx, types_mod)
    if not init:
        return _imported
    wp, ctx, _ = _imported
    if ctx.runtime is None:
        wp.init()
    _checked = _imported
    return _checked
    try:
        import warp as wp
    except ImportError as e:
        raise Refused("warp_missing", f"Warp is not importable ({e}); install warp-lang",
                      code="FAILED_PRECONDITION") from None
    check_version(getattr(wp, "__version__", "unknown"))
    try:
        from warp._src import codegen, context as ctx, types as types_mod
    except ImportError as e:
        raise Refused("warp_version", f"Warp {wp.__version__} lacks the internals graphd.warp uses ({e})",
                      code="FAILED_PRECONDITION") from None
    check_layouts(wp, ctx, types_mod, codegen)
    if ctx.runtime is None:
        wp.init()
    _checked = (wp, ctx, types_mod)
    return _checked
