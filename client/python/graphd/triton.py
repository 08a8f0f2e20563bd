"""Launching Triton kernels from a graphd program.

Triton compiles a @triton.jit function into a CUBIN whose entry takes the
kernel's runtime arguments (constexpr ones are compiled in) and then hidden
trailing pointer parameters of its own: scratch buffers, which may be null
when the kernel needs none. A launch must declare every parameter, so
graphd needs to know how many there are. Kernel reads that from the
compiled kernel's PTX and launch() declares the hidden ones as null
pointers after the arguments you give.

    k = my_kernel[grid](x, y, n, BLOCK=1024)     # any Triton launch compiles
    tk = graphd.triton.Kernel(k)                 # cubin, name, block, params
    p.launch(...)  ->  tk.launch(p, grid, [Slot(xs), Slot(ys), u32(n)])
    Spec(..., modules=[tk.module])

Nothing here imports triton: Kernel only reads the compiled kernel's
`asm` ("cubin", "ptx") and `metadata` (name, num_warps, shared, num_ctas).
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Tuple

from .errors import GraphdError
from .program import Arg, Dim3, Program, module_id
from .records import ModuleKind

_INVALID = "INVALID_ARGUMENT"


def entry_params(ptx: str, name: str) -> int:
    """The number of parameters of a PTX entry.

    Parameters
    ----------
    ptx
        The PTX text.
    name
        The entry's name.

    Returns
    -------
    int
        How many .param the entry declares.

    Raises
    ------
    InvalidArgument
        When the PTX has no such entry.
    """
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise GraphdError(_INVALID, f"no .entry {name} in the kernel's PTX")
    return len(re.findall(r"\.param\b", m.group(1)))


def _field(md, key):
    if isinstance(md, dict):
        return md.get(key)
    return getattr(md, key, None)


class Kernel:
    """A compiled Triton kernel, ready to launch from a graphd.Program.

    Parameters
    ----------
    compiled
        The compiled kernel (what a Triton launch returns): its `asm`
        ("cubin", "ptx") and `metadata` (name, num_warps, shared,
        num_ctas) are read.

    Attributes
    ----------
    module : (str, bytes)
        ("cubin", bytes): put it in the Spec's modules (or register it
        with Client.register_module).
    module_id : bytes
        Its 32-byte id.
    name : str
        The entry's name.
    block : int
        Threads per block: 32 * num_warps.
    shared : int
        Dynamic shared memory bytes the kernel needs.
    params : int
        Every parameter of the entry, hidden ones included.

    Raises
    ------
    InvalidArgument
        When `compiled` is not a compiled Triton kernel, lacks a name,
        num_warps, cubin or ptx, or uses num_ctas other than 1.
    """

    name: str
    block: int
    shared: int
    params: int
    module: Tuple[ModuleKind, bytes]
    module_id: bytes

    def __init__(self, compiled: Any) -> None:
        asm = getattr(compiled, "asm", None)
        md = getattr(compiled, "metadata", None)
        if asm is None or md is None:
            raise GraphdError(_INVALID, f"{type(compiled).__name__} is not a compiled Triton kernel "
                              "(it has no asm and metadata)")
        self.name = _field(md, "name")
        warps = _field(md, "num_warps")
        if not self.name or not warps:
            raise GraphdError(_INVALID, "the compiled kernel's metadata has no name or num_warps")
        ctas = _field(md, "num_ctas") or 1
        if ctas != 1:
            raise GraphdError(_INVALID, f"kernel {self.name}: num_ctas={ctas} (thread block clusters) "
                              "is not supported; compile with num_ctas=1")
        cubin, ptx = asm.get("cubin"), asm.get("ptx")
        if not cubin or not ptx:
            raise GraphdError(_INVALID, f"kernel {self.name}: the compiled kernel has no cubin or ptx")
        self.block = 32 * int(warps)
        self.shared = int(_field(md, "shared") or 0)
        self.params = entry_params(ptx, self.name)
        self.module = ("cubin", bytes(cubin))
        self.module_id = module_id("cubin", self.module[1])

    def hidden(self, nargs: int) -> int:
        """How many hidden parameters follow the runtime arguments.

        Parameters
        ----------
        nargs
            How many runtime (non-constexpr) arguments are given.

        Returns
        -------
        int
            params - nargs.

        Raises
        ------
        InvalidArgument
            When nargs is more than the entry's parameters.
        """
        h = self.params - nargs
        if h < 0:
            raise GraphdError(_INVALID, f"kernel {self.name}: {nargs} arguments given but the entry takes "
                              f"{self.params} parameters in all (constexpr arguments are compiled in "
                              "and are not passed; nor are integer arguments Triton specialised to 1)")
        return h

    def launch(self, program: Program, grid: Dim3, args: Iterable[Arg]) -> int:
        """Adds a launch of this kernel to a program, with null hidden
        parameters.

        Parameters
        ----------
        program
            The program.
        grid
            The number of blocks (an int or up to three).
        args
            The runtime arguments (Slot, u32(...), f32(...)): one per
            non-constexpr parameter, in order.

        Returns
        -------
        int
            The step's index.

        Raises
        ------
        GraphdError
            As hidden() and Program.launch.
        InvalidArgumentType
            As Program.launch.
        """
        args = list(args)
        return program.launch(self.module_id, self.name, grid, self.block, args,
                              shared_bytes=self.shared, hidden=self.hidden(len(args)))


__all__ = ["Kernel", "entry_params"]
