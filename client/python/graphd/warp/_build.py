"""From a recording to a graphd program: CUBINs compiled by Warp's NVRTC
for the target architecture, one slot per array argument, one temp slot
per allocation the steps use, and the steps in the order they ran, loops
and branches (wp.capture_while, wp.capture_if) around the steps their
callbacks recorded."""

from __future__ import annotations

import json
import os
import threading
from typing import Any, Dict, Tuple

from .. import program as _program
from ..errors import GraphdError
from ..program import Program, module_id
from ..records import ModuleKind
from ._steps import count_steps
from ._support import Refused, warp_modules

_compiled: dict = {}
_compile_lock = threading.Lock()


class CompiledModule:
    """One Warp module compiled for one (block size, architecture):
    compile_module's result.

    Attributes
    ----------
    kind : str
        "cubin", or "ptx".
    data : bytes
        The module's bytes.
    id : bytes
        Its 32-byte graphd module id.
    meta : dict
        Warp's metadata of the module.
    path : str
        The file Warp wrote.
    block_dim : int
        The block size it was compiled for.
    arch : int
        The architecture it was compiled for.
    """

    kind: ModuleKind
    data: bytes
    meta: Dict[str, Any]
    path: str
    block_dim: int
    arch: int
    id: bytes

    def __init__(self, kind: ModuleKind, data: bytes, meta: Dict[str, Any], path: str, block_dim: int,
                 arch: int) -> None:
        self.kind, self.data, self.meta, self.path = kind, data, meta, path
        self.block_dim, self.arch = block_dim, arch
        self.id = module_id(kind, data)


def supported_archs():
    _, ctx, _ = warp_modules()
    return sorted(getattr(ctx.runtime, "nvrtc_supported_archs", ()) or ())


def compile_module(module: Any, block_dim: int, arch: int, ptx: bool = False) -> CompiledModule:
    """Compiles a Warp module with Warp's NVRTC, without a GPU, as Warp
    would for a device of an architecture launching with a block size.
    Warp's kernel cache is reused, and the result is kept per process.

    Parameters
    ----------
    module
        The Warp module (a kernel's .module).
    block_dim
        Threads per block.
    arch
        The architecture (90 for sm_90).
    ptx
        True: PTX (for inspection) instead of CUBIN.

    Returns
    -------
    CompiledModule

    Raises
    ------
    Refused
        When Warp's NVRTC cannot compile for arch (reason "arch"), or Warp
        is missing or unsupported.
    """
    wp, _, _ = warp_modules()
    archs = supported_archs()
    if archs and arch not in archs:
        raise Refused("arch", f"Warp's NVRTC cannot compile for sm_{arch}; it knows {archs}")
    with _compile_lock:
        module.get_module_hash(block_dim)
        ident = module.get_module_identifier(block_dim=block_dim)
        kind: ModuleKind = "ptx" if ptx else "cubin"
        key = (ident, block_dim, arch, kind)
        hit = _compiled.get(key)
        if hit is not None:
            return hit
        options = module.resolve_options(wp.config, block_dim=block_dim)
        out_dir = os.path.join(wp.config.kernel_cache_dir, ident)
        name = f"{ident}.sm{arch}.{kind}"
        module._compile(None, out_dir, output_name=name, output_arch=arch, use_ptx=ptx, options=options)
        path = os.path.join(out_dir, name)
        with open(path, "rb") as f:
            data = f.read()
        if ptx:
            data = data.rstrip(b"\0")
        with open(os.path.join(out_dir, module._get_meta_name(block_dim=block_dim)), encoding="utf-8") as f:
            meta = json.load(f)
        c = CompiledModule(kind, data, meta, path, block_dim, arch)
        _compiled[key] = c
        return c


def entry_name(kernel, block_dim, adjoint):
    """The CUDA entry of a kernel in its module's block_dim variant."""
    _, _, _ = warp_modules()
    from warp._src import codegen
    module = kernel.module
    module.get_module_hash(block_dim)
    h = module.hashers[block_dim].kernel_hashes.get(kernel)
    if h is None:
        raise Refused("kernel", f"kernel {kernel.key} is not part of its module's build (was it redefined?)")
    mangled = kernel.get_mangled_name(kernel_hash=h)
    if adjoint:
        return codegen.cuda_kernel_backward_name(kernel, name=mangled)
    return codegen.cuda_kernel_forward_name(kernel, name=mangled)


def grid_for(total: int, block_dim: int, grid_stride: bool, max_blocks: int) -> Tuple[int, int, int]:
    """The grid Warp's CUDA launcher uses for a number of threads.

    Parameters
    ----------
    total
        The threads of the launch.
    block_dim
        Threads per block.
    grid_stride
        Whether the kernel loops grid-stride (then one axis, capped at
        max_blocks).
    max_blocks
        The cap on blocks of a grid-stride launch (0 or less: none).

    Returns
    -------
    (int, int, int)
        Blocks along x, y and z.
    """
    blocks = (total + block_dim - 1) // block_dim
    if grid_stride:
        cap = max_blocks if max_blocks > 0 else 0x7FFFFFFF
        return (max(min(blocks, cap), 1), 1, 1)
    gx = max(min(blocks, (1 << 24) // block_dim), 1)
    rest = (blocks + gx - 1) // gx
    gy = max(min(rest, 65535), 1)
    gz = max(min((rest + gy - 1) // gy, 65535), 1)
    return (gx, gy, gz)


def _grid_stride(kernel, block_dim):
    wp, _, _ = warp_modules()
    from warp._src import codegen
    kernel.module.get_module_hash(block_dim)
    if kernel.grid_stride is not None:
        return bool(kernel.grid_stride)
    opts = kernel.module.resolve_options(wp.config, block_dim=block_dim)
    return codegen.resolve_grid_stride(kernel.options, opts.get("default_grid_stride", wp.config.default_grid_stride))


class SlotInfo:
    def __init__(self, index, role, nbytes, staged, name):
        self.index, self.role, self.nbytes, self.staged, self.name = index, role, nbytes, staged, name

    def __repr__(self):
        st = " staged" if self.staged else ""
        return f"slot {self.index}: {self.role}{st} {self.nbytes} bytes ({self.name})"


class LaunchInfo:
    """What the tests and describe() need of a launch step."""

    def __init__(self, step, kernel, entry, module, grid, block_dim, shared, params, dim=None):
        self.step, self.kernel, self.entry, self.module = step, kernel, entry, module
        self.dim = dim  # the launch dims, as wp.launch got them
        self.grid, self.block_dim, self.shared = grid, block_dim, shared
        self.params = params  # [(name, offset, size, align, [(offset in param, slot, slot offset)])]


class CondInfo:
    """A loop (kind "while") or a branch ("if") of the program: its step,
    the slot and offset of the int32 it reads, and how many steps its body
    (the then-steps) and its else hold."""

    def __init__(self, step, kind, slot, offset, body, orelse):
        self.step, self.kind, self.slot, self.offset = step, kind, slot, offset
        self.body, self.orelse = body, orelse


class FixedBinding:
    """A slot bound at every call to memory of Warp arrays made outside the
    function: its address and size, and the arrays (kept alive while the
    program is: freeing them would leave the program a stale address, as
    it would a Warp graph)."""

    def __init__(self, slot, address, nbytes, arrays):
        self.slot, self.address, self.nbytes, self.arrays = slot, address, nbytes, arrays

    def __repr__(self):
        return f"slot {self.slot}: {self.nbytes} bytes at 0x{self.address:x}"


def check_fixed(built, name):
    """Refuses a program bound to host memory a GPU cannot read: a Warp
    array made outside the function on the CPU device, not pinned."""
    for f in built.fixed:
        for arr in f.arrays:
            if arr.device.is_cpu and not arr.pinned:
                raise Refused("cpu_device", f"{name}: a launch passes a Warp array made outside the function that "
                              f"is on the CPU and not pinned ({f.nbytes} bytes at 0x{f.address:x}): a GPU kernel "
                              "cannot read it; make it on the CUDA device (or in pinned memory), or pass it as an "
                              "argument", code="INVALID_ARGUMENT")


class Built:
    """A Warp function's program for one signature."""

    def __init__(self, program, slots, arg_slots, modules, launches, nsteps, conds=(), fixed=()):
        self.program = program
        self.encoding, self.id = program.finish()
        self.id_hex = self.id.hex()
        self.slots = slots
        self.arg_slots = arg_slots  # {argument index: slot, or None for an empty array}
        self.modules = modules  # [CompiledModule]
        self.launches = launches
        self.conds = list(conds)
        self.fixed = list(fixed)  # [FixedBinding]
        self.nsteps = nsteps

    def spec_modules(self):
        return [(m.kind, m.data) for m in self.modules]

    def describe(self):
        lines = [f"program {self.id_hex}: {len(self.slots)} slots, {self.nsteps} steps, "
                 f"{len(self.modules)} modules"]
        lines += [f"  {s!r}" for s in self.slots]
        launches = {l.step: l for l in self.launches}
        conds = {c.step: c for c in self.conds}
        for i, st in enumerate(self.program._steps):
            if i in launches:
                l = launches[i]
                lines.append(f"  step {i}: {l.entry} grid {l.grid} block {l.block_dim} shared {l.shared} "
                             f"({len(l.params)} params, {sum(len(p[4]) for p in l.params)} patches)")
            elif i in conds:
                c = conds[i]
                sides = f"body {c.body}" + (f", else {c.orelse}" if c.kind == "if" else "")
                lines.append(f"  step {i}: {c.kind} slot {c.slot} offset {c.offset} ({sides})")
            elif st.kind == _program.STEP_MEMSET:
                lines.append(f"  step {i}: memset slot {st.slot} offset {st.offset} {st.nbytes} bytes "
                             f"of 0x{st.value:x} ({st.element_size}-byte elements)")
            else:
                lines.append(f"  step {i}: copy {st.nbytes} bytes from slot {st.src_slot} offset {st.src_offset} "
                             f"to slot {st.dst_slot} offset {st.dst_offset}")
        return "\n".join(lines)


def _align_up(v, a):
    return (v + a - 1) // a * a


def assemble(rec, args, mode, arch, name):
    """The program of Recording `rec`. args: one (index, role, staged,
    nbytes, name) per array argument, in order."""
    try:
        return _assemble(rec, args, mode, arch, name)
    except Refused:
        raise
    except GraphdError as e:
        if e.code == "RESOURCE_EXHAUSTED":
            raise Refused("limits", f"{name}: the program is over the daemon's limits (graphd/encoding.h): "
                          f"{e.message}", code="RESOURCE_EXHAUSTED") from None
        raise


def _assemble(rec, args, mode, arch, name):
    p = Program(mode)
    slots, arg_slots, by_buffer = [], {}, {}
    for index, role, staged, nbytes, aname in args:
        if not nbytes:
            arg_slots[index] = None  # empty: nothing to bind
            continue
        s = p.add_slot(role, nbytes, staged=staged)
        slots.append(SlotInfo(s, role, nbytes, staged, aname))
        arg_slots[index] = s
    for b in rec.buffers:
        if b.arg is not None:
            by_buffer[id(b)] = arg_slots[b.arg]
    scratch = [b for b in rec.buffers if b.alloc is not None and b.used]
    if len(slots) + len(scratch) > _program.MAX_SLOTS:
        raise Refused("limits", f"{name}: {len(slots) + len(scratch)} slots ({len(slots)} arguments and "
                      f"{len(scratch)} arrays allocated inside the function) are over the daemon's limit of "
                      f"{_program.MAX_SLOTS}", code="RESOURCE_EXHAUSTED")
    for b in scratch:
        # Temporaries: Warp keeps nothing in what a function allocates from
        # one call to the next, so sessions replaying it at once may each
        # run on an instance of their own.
        s = p.add_slot("temp", b.size)
        slots.append(SlotInfo(s, "temp", b.size, False, f"allocation {b.alloc}"))
        by_buffer[id(b)] = s
    # Warp arrays made outside the function: one inout slot per range of
    # overlapping arrays (views of one allocation share it), bound at every
    # call to its address, as Warp's graphs bake it in.
    shift, fixed = {}, []
    for group in _overlapping([b for b in rec.buffers if b.fixed is not None and b.used]):
        lo, hi = min(b.base for b in group), max(b.base + b.size for b in group)
        if len(slots) >= _program.MAX_SLOTS:
            raise Refused("limits", f"{name}: the Warp arrays made outside the function take slots over the "
                          f"daemon's limit of {_program.MAX_SLOTS}", code="RESOURCE_EXHAUSTED")
        s = p.add_slot("inout", hi - lo, staged=True)
        arrays = [b.fixed for b in group]
        slots.append(SlotInfo(s, "fixed", hi - lo, True, f"Warp array at 0x{lo:x} ({arrays[0].device})"))
        fixed.append(FixedBinding(s, lo, hi - lo, arrays))
        for b in group:
            by_buffer[id(b)], shift[id(b)] = s, b.base - lo
    if not rec.steps:
        raise Refused("empty", f"{name} launches nothing, sets and copies nothing: there is no program to run")
    nsteps = count_steps(rec.steps)
    if nsteps > _program.MAX_STEPS:
        raise Refused("limits", f"{name}: {nsteps} steps are over the daemon's limit of "
                      f"{_program.MAX_STEPS}", code="RESOURCE_EXHAUSTED")
    modules, launches, conds = [], [], []

    def add(steps):
        for st in steps:
            if st.kind == "memset":
                p.add_memset(*at(st.buf, st.offset), st.nbytes, st.element_size, st.value)
            elif st.kind == "copy":
                p.add_copy(*at(st.dst, st.dst_offset), *at(st.src, st.src_offset), st.nbytes)
            elif st.kind in ("while", "if"):
                slot, offset = at(st.buf, st.offset)
                i = p.begin_while(slot, offset) if st.kind == "while" else p.begin_if(slot, offset)
                conds.append(CondInfo(i, st.kind, slot, offset, count_steps(st.body), count_steps(st.orelse)))
                add(st.body)
                if st.orelse:
                    p.else_(i)
                    add(st.orelse)
                p.end(i)
            else:
                add_launch(st)

    def at(buf, offset):
        """(slot, offset in it) of an offset into a recorded buffer."""
        return by_buffer[id(buf)], offset + shift.get(id(buf), 0)

    def add_launch(st):
        k = st.kernel
        cm = compile_module(k.module, st.block_dim, arch)
        if cm not in modules:
            modules.append(cm)
        entry = entry_name(k, st.block_dim, st.adjoint)
        shared = cm.meta.get(entry + "_smem_bytes")
        if shared is None:
            raise Refused("kernel", f"the compiled module {os.path.basename(cm.path)} has no entry {entry}")
        total = 1
        for d in st.dim:
            total *= d
        grid = grid_for(total, st.block_dim, _grid_stride(k, st.block_dim), st.max_blocks)
        i = p.add_launch(cm.id, entry, grid, (st.block_dim, 1, 1), int(shared))
        off, plist = 0, []
        for prm in st.params:
            off = _align_up(off, prm.align)
            p.param(i, off, prm.data)
            pl = []
            for o, buf, bo in prm.pointers:
                slot, bo = at(buf, bo)
                p.patch(i, off + o, slot, bo)
                pl.append((o, slot, bo))
            plist.append((prm.name, off, len(prm.data), prm.align, pl))
            off += len(prm.data)
        launches.append(LaunchInfo(i, k, entry, cm, grid, st.block_dim, int(shared), plist, tuple(st.dim)))

    add(rec.steps)
    return Built(p, slots, arg_slots, modules, launches, nsteps, conds, fixed)


def _overlapping(buffers):
    """buffers grouped by overlapping byte ranges, in address order."""
    groups, end = [], None
    for b in sorted(buffers, key=lambda b: b.base):
        if groups and b.base < end:
            groups[-1].append(b)
            end = max(end, b.base + b.size)
        else:
            groups.append([b])
            end = b.base + b.size
    return groups
