"""Kernel parameters: packed by Warp, pointers found by layout.

A Warp CUDA entry takes the launch bounds and then one parameter per kernel
argument (and, for a backward launch, one per adjoint), each passed by value
at its natural C alignment. Warp's own pack_arg makes the ctypes value of
each; its bytes are what the CUDA launch passes. The pointers inside them
are found from the ctypes layout: an array descriptor's data and grad
fields, the index pointers of an indexed array, and any void pointer,
nested in structs and fixed arrays as deep as they go."""

import ctypes

from ._steps import LaunchRec, Param, resolve_block_dim
from ._support import Refused, warp_modules

_offsets_cache: dict = {}


def pointer_offsets(ct):
    """Offsets of the pointer fields inside a value of ctypes type ct."""
    hit = _offsets_cache.get(ct)
    if hit is not None:
        return hit
    _, _, types_mod = warp_modules()
    name = getattr(ct, "__name__", "")
    out = []
    if ct is types_mod.array_t:
        out = [types_mod.array_t.data.offset, types_mod.array_t.grad.offset]
    elif "fabric" in name or "texture" in name:
        raise Refused("param_type", f"a {name} parameter: its handles are not graphd slots")
    elif isinstance(ct, type) and issubclass(ct, ctypes.Structure):
        for fname, ftype in ct._fields_:
            base = getattr(ct, fname).offset
            out += [base + o for o in pointer_offsets(ftype)]
    elif isinstance(ct, type) and issubclass(ct, ctypes.Array):
        sub = pointer_offsets(ct._type_)
        step = ctypes.sizeof(ct._type_)
        out = [i * step + o for i in range(ct._length_) for o in sub]
    elif ct in (ctypes.c_void_p, ctypes.c_char_p) or (isinstance(ct, type) and issubclass(ct, ctypes._Pointer)):
        out = [0]
    _offsets_cache[ct] = out
    return out


def warp_arrays(obj, depth=0):
    """The Warp arrays a launch argument holds, whose addresses its packed
    value carries: an array and its gradient, an indexed array's source
    and index arrays, and those in a struct's fields, nested."""
    wp, _, types_mod = warp_modules()
    if obj is None or depth > 16:
        return []
    if isinstance(obj, wp.array):
        return [obj] + warp_arrays(getattr(obj, "_grad", None) or None, depth + 1)
    if isinstance(obj, types_mod.indexedarray):
        out = warp_arrays(obj.data, depth + 1)
        for ix in obj.indices or ():
            out += warp_arrays(ix, depth + 1)
        return out
    from warp._src.codegen import StructInstance
    if isinstance(obj, StructInstance):
        out = []
        for name in obj._cls.vars:
            out += warp_arrays(getattr(obj, name, None), depth + 1)
        return out
    return []


# Warp objects whose ids (wp.uint64 kernel arguments) and handles are
# addresses in the calling process's CUDA context, which the daemon's
# context cannot use.
_HANDLE_TYPES = ("Bvh", "Mesh", "Volume", "HashGrid", "MarchingCubes", "Texture")


def _native_ids(recorder):
    """The ids of the live Warp BVHs, meshes, volumes, hash grids and
    textures, found once per recording (only a nonzero wp.uint64 argument
    asks)."""
    ids = getattr(recorder, "native_ids", None)
    if ids is None:
        import gc
        wp, _, _ = warp_modules()
        types = tuple(t for t in (getattr(wp, n, None) for n in _HANDLE_TYPES) if isinstance(t, type))
        ids = {}
        for o in gc.get_objects():
            if isinstance(o, types):
                try:
                    v = int(o.id)
                except Exception:  # noqa: BLE001: an object without a live id
                    continue
                if v:
                    ids[v] = type(o).__name__
        recorder.native_ids = ids
    return ids


def _check_handles(recorder, kernel, label, arg_type, value):
    """Refuses a Warp object id passed as a wp.uint64 argument, and an array
    of textures: their values are addresses and handles in this process's
    CUDA context; the daemon runs the kernels in its own."""
    wp, _, types_mod = warp_modules()
    texture = getattr(wp, "Texture", None)
    if isinstance(value, wp.array) and isinstance(texture, type) and isinstance(value.dtype, type) \
            and issubclass(value.dtype, texture):
        raise Refused("param_type", f"launch of {kernel.key}: parameter {label!r} is an array of Warp textures, "
                      "whose handles belong to this process's CUDA context; the daemon runs the kernels in its own")
    if arg_type is types_mod.uint64 and value is not None and not isinstance(value, wp.array):
        try:
            v = int(value)
        except (TypeError, ValueError):
            return
        what = _native_ids(recorder).get(v) if v else None
        if what is not None:
            raise Refused("param_type", f"launch of {kernel.key}: parameter {label!r} is the id of a Warp {what}, "
                          "an address in this process's CUDA context; the daemon runs the kernels in its own, "
                          "where it means nothing")


def _param(recorder, kernel, label, value, arg=None):
    """A Param from a packed ctypes value: pointers resolved to buffers.
    arg: the launch argument packed into it, whose Warp arrays made outside
    the function are fixed buffers (bound at their own address)."""
    ct = type(value)
    size = ctypes.sizeof(ct)
    align = ctypes.alignment(ct)
    data = bytearray(ctypes.string_at(ctypes.addressof(value), size))
    ptrs = []
    offs = pointer_offsets(ct)
    for o in offs:
        v = int.from_bytes(data[o:o + 8], "little")
        if v:
            what = f"launch of {kernel.key}, parameter {label!r}"
            buf, bo = recorder._resolve(v, 1, what, outside=arg)
            ptrs.append((o, buf, bo))
            data[o:o + 8] = bytes(8)
    # An address hidden in a plain integer would replay as a stale pointer.
    taken = set(offs)
    for o in range(0, size - 7, 8):
        if o in taken:
            continue
        v = int.from_bytes(data[o:o + 8], "little")
        if v and recorder.rec.find(v) is not None:
            raise Refused("param_type", f"launch of {kernel.key}: parameter {label!r} holds the address of an "
                          "array as a plain integer (for example arr.ptr in a uint64); pass the array itself")
    return Param(label, bytes(data), align, ptrs)


def pack_launch(recorder, kernel, dim, fwd_args, adj_args, adjoint, max_blocks, block_dim):
    """The LaunchRec of wp.launch(kernel, dim, ...) as CUDA would run it, or
    None for an empty launch (Warp runs nothing for dim 0)."""
    wp, ctx, _ = warp_modules()
    if not isinstance(kernel, ctx.Kernel):
        raise RuntimeError("Error launching kernel, can only launch functions decorated with @wp.kernel.")
    if not kernel.uses_warp_entry_point_abi:
        raise Refused("kernel", f"kernel {kernel.key} uses entry_point_abi="
                      f"{kernel.options.get('entry_point_abi')!r}, which wp.launch cannot launch either")
    block_dim = resolve_block_dim(block_dim)
    dim, total = ctx._normalize_launch_dim(dim)
    if total == 0:
        return None
    if len(fwd_args) != len(kernel.adj.args):
        raise RuntimeError(f"Error launching kernel '{kernel.key}', passed {len(fwd_args)} arguments but kernel "
                           f"requires {len(kernel.adj.args)}.")
    if kernel.is_generic:
        kernel = kernel._add_normalized_overload(kernel.infer_argument_types(fwd_args))
    if hasattr(ctx, "_get_kernel_cluster_dim") and ctx._get_kernel_cluster_dim(kernel) > 1:
        raise Refused("kernel", f"kernel {kernel.key} asks for thread block clusters (cluster_dim > 1), which "
                      "graphd launches do not set")
    det = kernel.module.options.get("deterministic")
    if det is None:
        det = getattr(wp.config, "deterministic", None)
    if det is not None and getattr(det, "name", str(det)) != "NOT_GUARANTEED":
        raise Refused("kernel", f"kernel {kernel.key} runs in Warp's deterministic mode, whose hidden buffers "
                      "graphd does not allocate")
    if adjoint and len(adj_args) != len(kernel.adj.args):
        raise Refused("kernel", f"backward launch of {kernel.key} with {len(adj_args)} adjoint arguments for "
                      f"{len(kernel.adj.args)} kernel arguments")
    # Hashing the module's variant resolves what the launch needs of the
    # kernel (its thread-grid dimension, grid_stride), as loading it would.
    kernel.module.get_module_hash(block_dim)
    ctx._validate_kernel_tid_extents(kernel, dim, total, block_dim)
    bounds = ctx._build_launch_bounds_from_tuple(dim, kernel.adj.kernel_dim)
    params = [_param(recorder, kernel, "dim", bounds)]
    for i, a in enumerate(fwd_args):
        arg = kernel.adj.args[i]
        _check_handles(recorder, kernel, arg.label, arg.type, a)
        params.append(_param(recorder, kernel, arg.label, ctx.pack_arg(kernel, arg.type, arg.label, a, "cpu"), a))
    if adjoint:
        for i, a in enumerate(adj_args):
            arg = kernel.adj.args[i]
            params.append(_param(recorder, kernel, "adj_" + arg.label,
                                 ctx.pack_arg(kernel, arg.type, arg.label, a, "cpu", adjoint=True), a))
    return LaunchRec(kernel, bool(adjoint), tuple(dim), block_dim, int(max_blocks or 0), params)
