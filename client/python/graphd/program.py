"""Programs and modules in pure Python: the builder, the canonical encoding
and the SHA-256 ids.

This mirrors libgraphd's C builder (client/include/graphd/program.h,
client/lib/program.c) and the structural validation of proto/program.c. It
produces byte for byte the canonical encoding that docs/protocol.md
("Canonical encodings") specifies, so a program built here has the same id
as the same program built in C; the daemon recomputes the id and refuses a
mismatch. Nothing here loads libgraphd or talks to the daemon: a program can
be named at trace time with no daemon running.

Steps are launches, memsets and copies, and loops and branches around them
(begin_while, begin_if, else_, end: the conditional steps of docs/protocol.md,
"While body" and "If body").

Errors raise GraphdError with the C library's status name and, where the C
builder has one, its message ("step 0 (launch scale): patch at offset 12 is
not 8-byte aligned"). A refused call changes nothing in the program.

Not thread-safe: use one Program from one thread at a time."""

from __future__ import annotations

import hashlib
import operator
import struct
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union, cast

from .errors import GraphdError, InvalidArgumentType
from .records import Mode, ModuleKind, Role

#: Bytes of an id or a module: bytes, bytearray, memoryview and the like.
BytesLike = Union[bytes, bytearray, memoryview]
#: A grid or a block: an int, or 1 to 3 ints (missing axes are 1).
Dim3 = Union[int, Sequence[int]]
#: A pointer patch: (parameter offset, slot, offset into the slot).
Patch = Tuple[int, int, int]

ID_LEN = 32
PROGRAM_MAGIC = 0x47504447  # "GDPG"
MODULE_MAGIC = 0x444D4447  # "GDMD"
ENCODING_VERSION = 1

# Caps, as in proto/include/graphd/encoding.h.
MAX_SLOTS = 4096
MAX_STEPS = 65536
MAX_PARAM_BYTES = 32764
MAX_PARAMS = 1024
MAX_PATCHES = 1024
MAX_COND_DEPTH = 8
MAX_NAME = 255
MAX_SLOT_BYTES = 1 << 40
MAX_GRID_X = 0x7FFFFFFF
MAX_GRID_YZ = 65535
MAX_BLOCK_THREADS = 1024
MAX_BLOCK_Z = 64
MAX_SHARED_BYTES = 227 << 10
MAX_MODULE_BYTES = 512 << 20
MAX_PROGRAM_BYTES = 64 << 20

#: Each slot role's number (graphd_slot_role; records.Role names them).
ROLES: Dict[str, int] = {"input": 0, "output": 1, "inout": 2, "scratch": 3, "temp": 4}
# Slots the daemon owns (never bound): scratch (state) and temp (temporaries).
OWNED_ROLES = (ROLES["scratch"], ROLES["temp"])


def _role_name(r):
    return next(k for k, v in ROLES.items() if v == r)


#: Each mode's number (graphd_mode; records.Mode names them).
MODES: Dict[str, int] = {"staged": 0, "staged_ex": 1, "direct": 2, "auto": 3}
#: Each module kind's number (graphd_module_kind; records.ModuleKind names them).
MODULE_KINDS: Dict[str, int] = {"ptx": 1, "cubin": 2, "fatbin": 3, "host_elf": 4}

STEP_LAUNCH, STEP_MEMSET, STEP_COPY, STEP_WHILE, STEP_IF = 1, 2, 3, 4, 5
SLOT_STAGED = 1

_INVALID = "INVALID_ARGUMENT"
_EXHAUSTED = "RESOURCE_EXHAUSTED"


def _fits(start, n, limit):
    """start + n <= limit (Python ints do not overflow, but keep C's shape)."""
    return 0 <= start <= limit and n <= limit - start


def _int(v, what, lo=0, hi=(1 << 64) - 1):
    """v as a Python int in [lo, hi], or GraphdError INVALID_ARGUMENT."""
    try:
        v = operator.index(v)
    except TypeError:
        raise InvalidArgumentType("INVALID_ARGUMENT", f"{what} must be an integer, not {type(v).__name__}") from None
    if not lo <= v <= hi:
        raise GraphdError(_INVALID, f"{what} is {v}; it must be {lo} to {hi}")
    return v


def _u32(v, what):
    return _int(v, what, 0, 0xFFFFFFFF)


def _u64(v, what):
    return _int(v, what, 0, (1 << 64) - 1)


def _as_id(v, what="module id"):
    """A 32-byte id from bytes-like or 64 hex digits."""
    if isinstance(v, str):
        try:
            b = bytes.fromhex(v)
        except ValueError:
            raise GraphdError(_INVALID, f"the {what} {v!r} is not 64 hex digits") from None
    else:
        b = bytes(v)
    if len(b) != ID_LEN:
        raise GraphdError(_INVALID, f"the {what} is {len(b)} bytes; it must be {ID_LEN}")
    return b


def _dim3(v, what) -> Tuple[int, ...]:
    """grid/block as 3 ints: an int, or a sequence of 1 to 3 ints (missing
    axes are 1). Range checks are left to the caller's C-shaped messages."""
    if isinstance(v, int):
        v = (v,)
    v = tuple(v)
    if not 1 <= len(v) <= 3:
        raise GraphdError(_INVALID, f"{what} has {len(v)} axes; give 1 to 3")
    v = v + (1,) * (3 - len(v))
    return tuple(_u32(x, f"{what}.{a}") for x, a in zip(v, "xyz"))


def id_hex(id_bytes: BytesLike) -> str:
    """The hex digits of an id (graphd_id_hex).

    Parameters
    ----------
    id_bytes
        An id: 32 bytes (a program's or a module's).

    Returns
    -------
    str
        Its 64 lower-case hex digits (two per byte, whatever the length).
    """
    return bytes(id_bytes).hex()


def module_id(kind: Union[ModuleKind, int], data: BytesLike) -> bytes:
    """The id of a module, as gd_module_id/graphd_module_id compute it.

    SHA-256 of the 20-byte header (magic "GDMD", version, kind, u64
    length) followed by the bytes.

    Parameters
    ----------
    kind
        "ptx", "cubin", "fatbin", "host_elf", or its number (1 to 4).
    data
        The module's bytes (any buffer; 1 byte to 512 MiB).

    Returns
    -------
    bytes
        The 32-byte id.

    Raises
    ------
    InvalidArgument
        For an unknown kind, or a length of 0 or over 512 MiB.
    """
    k = MODULE_KINDS.get(kind, kind) if isinstance(kind, str) else kind
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 4:
        raise GraphdError(_INVALID, f"module kind {kind!r} is not ptx, cubin, fatbin or host_elf")
    data = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
    n = len(data)
    if n == 0 or n > MAX_MODULE_BYTES:
        raise GraphdError(_INVALID, f"a module of {n} bytes: it must be 1 to {MAX_MODULE_BYTES}")
    h = hashlib.sha256(struct.pack("<IIIQ", MODULE_MAGIC, ENCODING_VERSION, k, n))
    h.update(data)
    return h.digest()


# --- launch arguments -------------------------------------------------------


class Arg:
    """One kernel parameter for Program.launch_args: its bytes, its C
    alignment, and the pointer patches inside it (offsets relative to the
    parameter's start).

    Attributes
    ----------
    size : int
        Its bytes.
    align : int
        Its C alignment in bytes.
    """

    size: int = 0
    align: int = 1

    def encode(self) -> bytes:
        """The parameter's bytes.

        Returns
        -------
        bytes
            `size` bytes, little-endian; zero where a pointer goes.
        """
        raise NotImplementedError

    def patches(self) -> List[Patch]:
        """The pointers inside the parameter.

        Returns
        -------
        list of (int, int, int)
            (offset from the parameter's start, slot, offset into the
            slot) for each pointer; empty when there is none.
        """
        return []


class Slot(Arg):
    """A pointer parameter to slot `index` plus `offset` bytes: 8 zero bytes
    that the daemon patches with the slot's address.

    Parameters
    ----------
    index
        The slot (0 to 2^32-1).
    offset
        Bytes into the slot (0 to 2^64-1).

    Raises
    ------
    InvalidArgumentType
        When index or offset is not an integer.
    InvalidArgument
        When one is out of range.
    """

    size = 8
    align = 8

    def __init__(self, index: int, offset: int = 0) -> None:
        self.index = _u32(index, "slot index")
        self.offset = _u64(offset, "slot offset")

    def encode(self) -> bytes:
        """8 zero bytes (the daemon writes the address).

        Returns
        -------
        bytes
        """
        return bytes(8)

    def patches(self) -> List[Patch]:
        """The one pointer: (0, index, offset).

        Returns
        -------
        list of (int, int, int)
        """
        return [(0, self.index, self.offset)]

    def __repr__(self) -> str:
        return f"Slot({self.index}, {self.offset})" if self.offset else f"Slot({self.index})"


class Scalar(Arg):
    """A scalar of a C type, packed little-endian. The helpers i8() to
    f64() make them.

    Parameters
    ----------
    ctype
        The type's name in messages and repr ("u32").
    fmt
        Its struct format character ("I"; "e", "f", "d" are floats).
    value
        The value: an integer in the type's range, or a number for a float.

    Raises
    ------
    InvalidArgumentType
        When an integer type is given a value that is not an integer.
    InvalidArgument
        When the value is out of the type's range or does not fit.
    """

    _RANGES = {
        "b": (-(1 << 7), (1 << 7) - 1), "B": (0, (1 << 8) - 1),
        "h": (-(1 << 15), (1 << 15) - 1), "H": (0, (1 << 16) - 1),
        "i": (-(1 << 31), (1 << 31) - 1), "I": (0, (1 << 32) - 1),
        "q": (-(1 << 63), (1 << 63) - 1), "Q": (0, (1 << 64) - 1),
    }

    def __init__(self, ctype: str, fmt: str, value: Union[int, float]) -> None:
        self.ctype = ctype
        self.fmt = fmt
        self.size = struct.calcsize("<" + fmt)
        self.align = self.size
        if fmt in self._RANGES:
            lo, hi = self._RANGES[fmt]
            self.value: Union[int, float] = _int(value, f"{ctype} value", lo, hi)
        else:
            self.value = float(value)
        try:
            self._bytes = struct.pack("<" + fmt, self.value)
        except (struct.error, OverflowError) as e:
            raise GraphdError(_INVALID, f"{ctype} value {value!r} does not fit: {e}") from None

    def encode(self) -> bytes:
        """The packed value.

        Returns
        -------
        bytes
        """
        return self._bytes

    def __repr__(self) -> str:
        return f"{self.ctype}({self.value!r})"


def i8(v: int) -> Scalar:
    """A kernel parameter of C type i8: a signed 8-bit integer.

    Parameters
    ----------
    v
        An integer, -2^7 to 2^7-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("i8", "b", v)


def u8(v: int) -> Scalar:
    """A kernel parameter of C type u8: an unsigned 8-bit integer.

    Parameters
    ----------
    v
        An integer, 0 to 2^8-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("u8", "B", v)


def i16(v: int) -> Scalar:
    """A kernel parameter of C type i16: a signed 16-bit integer.

    Parameters
    ----------
    v
        An integer, -2^15 to 2^15-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("i16", "h", v)


def u16(v: int) -> Scalar:
    """A kernel parameter of C type u16: an unsigned 16-bit integer.

    Parameters
    ----------
    v
        An integer, 0 to 2^16-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("u16", "H", v)


def i32(v: int) -> Scalar:
    """A kernel parameter of C type i32: a signed 32-bit integer.

    Parameters
    ----------
    v
        An integer, -2^31 to 2^31-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("i32", "i", v)


def u32(v: int) -> Scalar:
    """A kernel parameter of C type u32: an unsigned 32-bit integer.

    Parameters
    ----------
    v
        An integer, 0 to 2^32-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("u32", "I", v)


def i64(v: int) -> Scalar:
    """A kernel parameter of C type i64: a signed 64-bit integer.

    Parameters
    ----------
    v
        An integer, -2^63 to 2^63-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("i64", "q", v)


def u64(v: int) -> Scalar:
    """A kernel parameter of C type u64: an unsigned 64-bit integer.

    Parameters
    ----------
    v
        An integer, 0 to 2^64-1.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgumentType
        When v is not an integer.
    InvalidArgument
        When v is out of range.
    """
    return Scalar("u64", "Q", v)


def f16(v: float) -> Scalar:
    """A kernel parameter of C type f16: a 16-bit IEEE float.

    Parameters
    ----------
    v
        A number; it is rounded to the type.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgument
        When it does not fit (out of the f16 range).
    """
    return Scalar("f16", "e", v)


def f32(v: float) -> Scalar:
    """A kernel parameter of C type f32: a 32-bit IEEE float.

    Parameters
    ----------
    v
        A number; it is rounded to the type.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgument
        When it does not fit (out of the f32 range).
    """
    return Scalar("f32", "f", v)


def f64(v: float) -> Scalar:
    """A kernel parameter of C type f64: a 64-bit IEEE float.

    Parameters
    ----------
    v
        A number; it is rounded to the type.

    Returns
    -------
    Scalar

    Raises
    ------
    InvalidArgument
        When it does not fit (out of the f64 range).
    """
    return Scalar("f64", "d", v)


class Raw(Arg):
    """Bytes passed as they are, with a given alignment (for types the
    helpers do not cover).

    Parameters
    ----------
    data
        The parameter's bytes.
    align
        Its C alignment in bytes (1 to 4096).

    Raises
    ------
    InvalidArgumentType
        When align is not an integer.
    InvalidArgument
        When align is out of range.
    """

    def __init__(self, data: BytesLike, align: int = 1) -> None:
        self.data = bytes(data)
        self.size = len(self.data)
        self.align = _int(align, "alignment", 1, 4096)

    def encode(self) -> bytes:
        """The bytes as given.

        Returns
        -------
        bytes
        """
        return self.data


def _align_up(v, a):
    return (v + a - 1) // a * a


class Struct(Arg):
    """A struct passed by value, possibly with pointer fields (Slot). Fields
    are laid out at natural C alignment unless `offsets` gives each field's
    offset; the struct's alignment is its largest field's (or `align`), and
    its size is rounded up to it (or is `size`).

    Parameters
    ----------
    *fields
        The fields in order: Slot for a pointer, scalars, nested Struct or
        Raw.
    offsets
        Each field's byte offset (None: natural C alignment in order).
    size
        The struct's bytes, at least the end of its last field (None: that
        end rounded up to the alignment).
    align
        The struct's alignment (None: its largest field's).

    Raises
    ------
    InvalidArgumentType
        When a field is not an Arg.
    InvalidArgument
        When offsets does not give one offset per field, or size is smaller
        than the fields.
    """

    def __init__(self, *fields: Arg, offsets: Optional[Sequence[int]] = None, size: Optional[int] = None,
                 align: Optional[int] = None) -> None:
        for f in fields:
            if not isinstance(f, Arg):
                raise InvalidArgumentType("INVALID_ARGUMENT", f"a struct field must be a graphd Arg (Slot, f32(...), ...), not {f!r}")
        self.fields = list(fields)
        self.align = align or max([f.align for f in fields] or [1])
        self.offsets = _layout(self.fields, offsets, "struct field")
        end = max([o + f.size for o, f in zip(self.offsets, self.fields)] or [0])
        self.size = _align_up(end, self.align) if size is None else _int(size, "struct size", end, MAX_PARAM_BYTES)

    def encode(self) -> bytes:
        """The fields at their offsets, zero between them.

        Returns
        -------
        bytes
            `size` bytes.
        """
        b = bytearray(self.size)
        for o, f in zip(self.offsets, self.fields):
            b[o:o + f.size] = f.encode()
        return bytes(b)

    def patches(self) -> List[Patch]:
        """The pointers of its fields, at their offsets in the struct.

        Returns
        -------
        list of (int, int, int)
        """
        return [(o + r, s, so) for o, f in zip(self.offsets, self.fields) for r, s, so in f.patches()]


def _layout(args, offsets, what):
    """Offsets for args: the given ones, or natural C alignment in order."""
    if offsets is not None:
        offsets = [_u32(o, f"{what} offset") for o in offsets]
        if len(offsets) != len(args):
            raise GraphdError(_INVALID, f"{len(offsets)} offsets for {len(args)} {what}s")
        return offsets
    out, at = [], 0
    for a in args:
        at = _align_up(at, a.align)
        out.append(at)
        at += a.size
    return out


# --- the program builder ----------------------------------------------------


class _Launch:
    kind = STEP_LAUNCH

    def __init__(self, module, name, grid, block, shared):
        self.module = module
        self.name = name  # bytes
        self.grid = grid
        self.block = block
        self.shared = shared
        self.params = []  # (offset, size), in call order until finish
        self.data = bytearray()
        self.patches = []  # (offset, slot, slot_offset)

    def label(self):
        return "launch " + self.name.decode("ascii")


class _Memset:
    kind = STEP_MEMSET

    def __init__(self, slot, element_size, value, offset, nbytes):
        self.slot, self.element_size, self.value = slot, element_size, value
        self.offset, self.nbytes = offset, nbytes

    def label(self):
        return "memset"


class _Copy:
    kind = STEP_COPY

    def __init__(self, dst_slot, src_slot, dst_offset, src_offset, nbytes):
        self.dst_slot, self.src_slot = dst_slot, src_slot
        self.dst_offset, self.src_offset, self.nbytes = dst_offset, src_offset, nbytes

    def label(self):
        return "copy"


class _Cond:
    """A loop (STEP_WHILE) or a branch (STEP_IF) over the 4-byte word at
    `offset` of `slot`. body and orelse count the steps after it; None
    while the builder has not fixed them (an if's body is fixed by else_(),
    the rest by end())."""

    def __init__(self, kind, slot, offset):
        self.kind, self.slot, self.offset = kind, slot, offset
        self.body = None
        self.orelse = None

    def label(self):
        return "while" if self.kind == STEP_WHILE else "if"


def _is_cond(s):
    return s.kind in (STEP_WHILE, STEP_IF)


class Program:
    """A builder for one program, the mirror of graphd_program.

    Add slots, then steps (launches, memsets, copies, and loops and
    branches around them) that refer to them, then call finish(), which
    validates the program, lays it out in its canonical encoding and
    computes its id. For
    scale(const float *x, float *y, float a, uint32_t n):

        p = Program("staged")
        x = p.add_slot("input", 4 * n)
        y = p.add_slot("output", 4 * n)
        p.launch(mod, "scale", grid=n // 256, block=256,
                 args=[Slot(x), Slot(y), f32(2.0), u32(n)])
        encoding, pid = p.finish()

    Parameters
    ----------
    mode
        How replays move data: "staged", "staged_ex", "direct", "auto", or
        its number (0 to 3).

    Raises
    ------
    InvalidArgument
        For an unknown mode.
    """

    def __init__(self, mode: Union[Mode, int] = "staged") -> None:
        m = MODES.get(mode, mode) if isinstance(mode, str) else mode
        if not isinstance(m, int) or m not in MODES.values():
            raise GraphdError(_INVALID, f"mode {mode!r} is not staged (0), staged_ex (1), "
                                        "direct (2) or auto (3)")
        self.mode: int = m
        self._slots: List[Tuple[int, int, int]] = []  # (role, flags, size)
        self._dtypes: List[Optional[str]] = []  # per slot: a dtype name, or None (not encoded)
        self._steps: List[Any] = []
        self._encoding: Optional[bytes] = None
        self._id: Optional[bytes] = None

    # --- state ----------------------------------------------------------

    @property
    def finished(self) -> bool:
        """Whether finish() has succeeded (the program can no longer change)."""
        return self._encoding is not None

    @property
    def encoding(self) -> bytes:
        """The canonical encoding.

        Raises
        ------
        FailedPrecondition
            Before finish().
        """
        if self._encoding is None:
            raise GraphdError("FAILED_PRECONDITION",
                              "the program has no encoding until finish() succeeds")
        return self._encoding

    @property
    def id(self) -> bytes:
        """The program id (32 bytes).

        Raises
        ------
        FailedPrecondition
            Before finish().
        """
        self.encoding
        assert self._id is not None
        return self._id

    @property
    def id_hex(self) -> str:
        """The program id as 64 hex digits.

        Raises
        ------
        FailedPrecondition
            Before finish().
        """
        return self.id.hex()

    @property
    def nslots(self) -> int:
        """How many slots the program has."""
        return len(self._slots)

    @property
    def nsteps(self) -> int:
        """How many steps the program has."""
        return len(self._steps)

    def slot(self, index: int) -> Tuple[Role, bool, int]:
        """A slot's declaration.

        Parameters
        ----------
        index
            The slot (add_slot's return).

        Returns
        -------
        (str, bool, int)
            Its role name, whether it is staged, and its size in bytes.

        Raises
        ------
        IndexError
            When there is no such slot.
        """
        role, flags, size = self._slots[index]
        return (cast(Role, {v: k for k, v in ROLES.items()}[role]), bool(flags & SLOT_STAGED), size)

    def slot_dtype(self, index: int) -> Optional[str]:
        """The dtype a slot was declared with: what Client.replay checks an
        array bound to it against.

        Parameters
        ----------
        index
            The slot (add_slot's return).

        Returns
        -------
        str or None
            The dtype name add_slot was given ("float32"), or None.

        Raises
        ------
        IndexError
            When there is no such slot.
        """
        return self._dtypes[index]

    def _check_open(self):
        if self._encoding is not None:
            raise GraphdError("FAILED_PRECONDITION", "the program is finished and can no longer change")

    def _launch(self, step):
        """The launch at index step, and its label "step 2 (launch scale2)"."""
        self._check_open()
        step = _u32(step, "step")
        if step >= len(self._steps):
            raise GraphdError(_INVALID, f"step {step} does not exist; there are {len(self._steps)} steps")
        s = self._steps[step]
        lbl = f"step {step} ({s.label()})"
        if s.kind != STEP_LAUNCH:
            raise GraphdError(_INVALID, f"{lbl}: only a launch has parameters")
        return s, lbl

    # --- slots ----------------------------------------------------------

    def add_slot(self, role: Union[Role, int], nbytes: int, staged: Optional[bool] = None, *,
                 dtype: Any = None) -> int:
        """Adds a slot.

        The daemon owns scratch and temp slots: scratch is state, which a
        session's next replay reads as its last left it (each session has
        its own); temp holds temporaries, undefined when a replay starts.

        Parameters
        ----------
        role
            "input", "output", "inout", "scratch", "temp", or its number
            (0 to 4).
        nbytes
            The slot's size in bytes (1 to 2^40).
        staged
            Whether replays stage it (None: True, except for scratch and
            temp, which cannot be staged).
        dtype
            A dtype name such as "float32", or a PyTorch, NumPy or CuPy
            dtype (None: none). Kept here only, not in the encoding or the
            id: Client.replay refuses an array of another dtype for the
            slot.

        Returns
        -------
        int
            The slot's index.

        Raises
        ------
        InvalidArgument
            For an unknown role, a staged scratch or temp slot, a size of 0
            or a dtype with no name.
        ResourceExhausted
            Past 4096 slots or 2^40 bytes.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When nbytes is not an integer.
        """
        self._check_open()
        s = len(self._slots)
        if s >= MAX_SLOTS:
            raise GraphdError(_EXHAUSTED, f"slot {s}: over the limit of {MAX_SLOTS} slots")
        r = ROLES.get(role, role) if isinstance(role, str) else role
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r <= 4:
            shown = role if isinstance(role, int) and not isinstance(role, bool) else repr(role)
            raise GraphdError(_INVALID,
                              f"slot {s}: role {shown} is not input, output, inout, scratch or temp")
        if staged is None:
            staged = r not in OWNED_ROLES
        if r in OWNED_ROLES and staged:
            raise GraphdError(_INVALID, f"slot {s}: a {_role_name(r)} slot belongs to graphd and cannot be staged")
        nbytes = _u64(nbytes, f"slot {s}: the size")
        if nbytes == 0:
            raise GraphdError(_INVALID, f"slot {s}: size 0 is invalid")
        if nbytes > MAX_SLOT_BYTES:
            raise GraphdError(_EXHAUSTED, f"slot {s}: {nbytes} bytes is over the limit of {MAX_SLOT_BYTES}")
        if dtype is not None:
            from .arrays import dtype_name
            dtype = dtype_name(dtype)
        self._slots.append((r, SLOT_STAGED if staged else 0, nbytes))
        self._dtypes.append(dtype)
        return s

    # --- steps ----------------------------------------------------------

    def _new_step(self, what):
        self._check_open()
        if len(self._steps) >= MAX_STEPS:
            raise GraphdError(_EXHAUSTED, f"step {len(self._steps)} ({what}): over the limit of {MAX_STEPS} steps")

    def add_launch(self, module_id: Union[BytesLike, str], function: Union[str, bytes], grid: Dim3,
                   block: Dim3, shared_bytes: int = 0) -> int:
        """Adds a launch; declare its parameters with param(),
        param_slot(), patch() or launch_args().

        Parameters
        ----------
        module_id
            The module's id: 32 bytes, or 64 hex digits.
        function
            The entry's name: 1 to 255 printable ASCII bytes.
        grid
            Blocks: an int, or 1 to 3 ints (missing axes are 1).
        block
            Threads per block, the same way (at most 1024 in all).
        shared_bytes
            Dynamic shared memory in bytes (at most 227 KiB).

        Returns
        -------
        int
            The step's index.

        Raises
        ------
        InvalidArgument
            For a malformed id or name, or a grid or block out of range.
        ResourceExhausted
            For a name, shared memory or step count over its cap.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When a dimension or shared_bytes is not an integer.
        """
        self._check_open()
        i = len(self._steps)
        mod = _as_id(module_id)
        name = function.encode("utf-8") if isinstance(function, str) else bytes(function)
        if len(name) == 0:
            raise GraphdError(_INVALID, f"step {i} (launch): the function name is empty")
        if len(name) > MAX_NAME:
            raise GraphdError(_EXHAUSTED, f"step {i} (launch): the function name is longer than {MAX_NAME} bytes")
        for c in name:
            if c < 0x21 or c > 0x7E:
                raise GraphdError(_INVALID, f"step {i} (launch): the function name has a byte 0x{c:02x} "
                                  "that is not printable ASCII")
        lbl = f"step {i} (launch {name.decode('ascii')})"
        grid = _dim3(grid, f"{lbl}: grid")
        block = _dim3(block, f"{lbl}: block")
        for a, axis in enumerate("xyz"):
            gmax = MAX_GRID_X if a == 0 else MAX_GRID_YZ
            if grid[a] == 0 or grid[a] > gmax:
                raise GraphdError(_INVALID, f"{lbl}: grid.{axis} is {grid[a]}; it must be 1 to {gmax}")
            bmax = MAX_BLOCK_Z if a == 2 else MAX_BLOCK_THREADS
            if block[a] == 0 or block[a] > bmax:
                raise GraphdError(_INVALID, f"{lbl}: block.{axis} is {block[a]}; it must be 1 to {bmax}")
        threads = block[0] * block[1] * block[2]
        if threads > MAX_BLOCK_THREADS:
            raise GraphdError(_INVALID, f"{lbl}: block has {threads} threads; the limit is {MAX_BLOCK_THREADS}")
        shared_bytes = _u32(shared_bytes, f"{lbl}: shared_bytes")
        if shared_bytes > MAX_SHARED_BYTES:
            raise GraphdError(_EXHAUSTED, f"{lbl}: {shared_bytes} bytes of dynamic shared memory is over "
                              f"the limit of {MAX_SHARED_BYTES}")
        self._new_step("launch")
        self._steps.append(_Launch(mod, name, grid, block, shared_bytes))
        return i

    def _add_param(self, l, lbl, offset, data, size):
        if size == 0:
            raise GraphdError(_INVALID, f"{lbl}: parameter at offset {offset} has size 0")
        if not _fits(offset, size, MAX_PARAM_BYTES):
            raise GraphdError(_EXHAUSTED, f"{lbl}: parameter at offset {offset} (size {size}) ends past the "
                              f"limit of {MAX_PARAM_BYTES} parameter bytes")
        for o, n in l.params:
            if offset < o + n and o < offset + size:
                raise GraphdError(_INVALID, f"{lbl}: parameter at offset {offset} (size {size}) overlaps "
                                  f"the parameter at offset {o} (size {n})")
        if len(l.params) >= MAX_PARAMS:
            raise GraphdError(_EXHAUSTED, f"{lbl}: parameter at offset {offset} is over the limit of "
                              f"{MAX_PARAMS} parameters")
        end = offset + size
        if end > len(l.data):
            l.data.extend(bytes(end - len(l.data)))
        l.data[offset:end] = data if data is not None else bytes(size)
        l.params.append((offset, size))

    def param(self, step: int, offset: int, data: BytesLike) -> None:
        """Declares a parameter of a launch: bytes at a parameter byte
        offset. Parameters may be declared in any order but must not
        overlap; gaps between them are zero.

        Parameters
        ----------
        step
            The launch (add_launch's return).
        offset
            The parameter's byte offset in the kernel's parameters.
        data
            Its bytes (at least one).

        Raises
        ------
        InvalidArgument
            When step is not a launch, or the parameter is empty or overlaps
            another.
        ResourceExhausted
            Past the caps on parameter bytes or parameters.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When step or offset is not an integer.
        """
        l, lbl = self._launch(step)
        offset = _u32(offset, f"{lbl}: parameter offset")
        data = bytes(data)
        self._add_param(l, lbl, offset, data, len(data))

    def _prepare_patch(self, l, lbl, offset, slot, slot_offset):
        if offset % 8:
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {offset} is not 8-byte aligned")
        if any(o == offset for o, _, _ in l.patches):
            raise GraphdError(_INVALID, f"{lbl}: there is already a patch at offset {offset}")
        if slot >= len(self._slots):
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {offset} names slot {slot}; there are "
                              f"{len(self._slots)} slots")
        size = self._slots[slot][2]
        if slot_offset >= size:
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {offset} points {slot_offset} bytes into "
                              f"slot {slot}, which has {size}")
        if len(l.patches) >= MAX_PATCHES:
            raise GraphdError(_EXHAUSTED, f"{lbl}: patch at offset {offset} is over the limit of "
                              f"{MAX_PATCHES} patches")

    def param_slot(self, step: int, offset: int, slot: int, slot_offset: int = 0) -> None:
        """Declares an 8-byte pointer parameter whose value the daemon sets
        to a slot's address.

        Parameters
        ----------
        step
            The launch (add_launch's return).
        offset
            The parameter's byte offset (a multiple of 8).
        slot
            The slot it points to.
        slot_offset
            Bytes into the slot (less than its size).

        Raises
        ------
        InvalidArgument
            For a misaligned or repeated offset, an unknown slot, an offset
            past the slot's end or an overlap.
        ResourceExhausted
            Past a cap.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When an argument is not an integer.
        """
        l, lbl = self._launch(step)
        offset = _u32(offset, f"{lbl}: parameter offset")
        slot = _u32(slot, f"{lbl}: slot")
        slot_offset = _u64(slot_offset, f"{lbl}: slot offset")
        # Everything that can fail happens before the parameter is added.
        self._prepare_patch(l, lbl, offset, slot, slot_offset)
        self._add_param(l, lbl, offset, None, 8)
        l.patches.append((offset, slot, slot_offset))

    def patch(self, step: int, offset: int, slot: int, slot_offset: int = 0) -> None:
        """Makes 8 bytes inside a declared parameter (typically a struct
        passed by value) a pointer to a slot; the builder zeroes them.

        Parameters
        ----------
        step
            The launch (add_launch's return).
        offset
            The pointer's byte offset from the start of the parameter
            buffer (a multiple of 8), inside one declared parameter.
        slot
            The slot it points to.
        slot_offset
            Bytes into the slot (less than its size).

        Raises
        ------
        InvalidArgument
            For a misaligned or repeated offset, one outside every declared
            parameter, an unknown slot or an offset past the slot's end.
        ResourceExhausted
            Past the cap on patches.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When an argument is not an integer.
        """
        l, lbl = self._launch(step)
        offset = _u32(offset, f"{lbl}: patch offset")
        slot = _u32(slot, f"{lbl}: slot")
        slot_offset = _u64(slot_offset, f"{lbl}: slot offset")
        if offset % 8:
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {offset} is not 8-byte aligned")
        if not any(offset >= o and _fits(offset, 8, o + n) for o, n in l.params):
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {offset} does not lie inside one declared "
                              "parameter; declare the parameter that holds it first")
        self._prepare_patch(l, lbl, offset, slot, slot_offset)
        l.data[offset:offset + 8] = bytes(8)
        l.patches.append((offset, slot, slot_offset))

    def launch_args(self, step: int, args: Iterable[Arg], offsets: Optional[Sequence[int]] = None,
                    hidden: int = 0) -> List[int]:
        """Declares the parameters of a launch from typed arguments. A
        refused call declares none of them.

        Parameters
        ----------
        step
            The launch (add_launch's return).
        args
            Slot(i[, offset]) for a pointer to a slot, scalars such as
            f32(2.0) or u32(n), Struct(...) for a struct by value (with
            Slot fields for pointers inside it), Raw(bytes, align) for
            anything else.
        offsets
            Each argument's byte offset (None: in order at natural C
            alignment, which is what a plain C/CUDA signature gives; real
            kernels should pass the offsets from the kernel's signature,
            cuFuncGetParamInfo, when in doubt).
        hidden
            How many trailing 8-byte zero parameters to add after the last
            argument, at 8-byte aligned offsets: Triton appends hidden
            pointer parameters (scratch buffers) that may be null.

        Returns
        -------
        list of int
            The offsets used, hidden parameters included.

        Raises
        ------
        InvalidArgumentType
            When an argument is not an Arg, or hidden not an integer.
        InvalidArgument
            When offsets does not give one offset per argument.
        GraphdError
            As param() and param_slot().
        """
        l, lbl = self._launch(step)
        args = list(args)
        for a in args:
            if not isinstance(a, Arg):
                raise InvalidArgumentType("INVALID_ARGUMENT", f"{lbl}: argument {a!r} must be a graphd Arg (Slot, f32(...), u32(...), "
                                "Struct, Raw); plain Python numbers have no C type")
        hidden = _int(hidden, f"{lbl}: hidden", 0, MAX_PARAMS)
        offs = _layout(args, offsets, "argument")
        # Checked as a whole first, so a refused call changes nothing.
        saved = (list(l.params), bytearray(l.data), list(l.patches))
        try:
            for o, a in zip(offs, args):
                if isinstance(a, Slot):
                    self.param_slot(step, o, a.index, a.offset)
                    continue
                self._add_param(l, lbl, o, a.encode(), a.size)
                for r, s, so in a.patches():
                    self.patch(step, o + r, s, so)
            end = max([o + a.size for o, a in zip(offs, args)] or [0])
            for _ in range(hidden):
                end = _align_up(end, 8)
                self._add_param(l, lbl, end, None, 8)
                offs.append(end)
                end += 8
        except BaseException:
            l.params, l.data, l.patches = saved
            raise
        return offs

    def launch(self, module_id: Union[BytesLike, str], function: Union[str, bytes], grid: Dim3,
               block: Dim3, args: Iterable[Arg] = (), shared_bytes: int = 0,
               offsets: Optional[Sequence[int]] = None, hidden: int = 0) -> int:
        """add_launch() and launch_args() in one call. A refused call adds
        no step.

        Parameters
        ----------
        module_id, function, grid, block, shared_bytes
            As add_launch().
        args, offsets, hidden
            As launch_args().

        Returns
        -------
        int
            The step's index.

        Raises
        ------
        InvalidArgumentType
            When an argument is not an Arg.
        GraphdError
            As add_launch() and launch_args().
        """
        self._check_open()
        # Validate the arguments' types before the step exists.
        for a in args:
            if not isinstance(a, Arg):
                raise InvalidArgumentType("INVALID_ARGUMENT", f"argument {a!r} must be a graphd Arg (Slot, f32(...), u32(...), Struct, Raw)")
        i = self.add_launch(module_id, function, grid, block, shared_bytes)
        try:
            self.launch_args(i, args, offsets=offsets, hidden=hidden)
        except BaseException:
            self._steps.pop()
            raise
        return i

    def _check_range(self, i, what, slot, off, nbytes):
        if slot >= len(self._slots):
            raise GraphdError(_INVALID, f"step {i} ({what}): slot {slot} does not exist; there are "
                              f"{len(self._slots)} slots")
        size = self._slots[slot][2]
        if not _fits(off, nbytes, size):
            raise GraphdError(_INVALID, f"step {i} ({what}): {nbytes} bytes at offset {off} are outside "
                              f"slot {slot}, which has {size}")

    def add_memset(self, slot: int, offset: int, nbytes: int, element_size: int, value: int) -> int:
        """Adds a memset of a slot's bytes.

        Parameters
        ----------
        slot
            The slot to set.
        offset
            The first byte (a multiple of element_size).
        nbytes
            How many bytes (a non-zero multiple of element_size).
        element_size
            1, 2 or 4.
        value
            Each element's value (it must fit in element_size bytes).

        Returns
        -------
        int
            The step's index.

        Raises
        ------
        InvalidArgument
            For a bad element size, alignment or value, or a range outside
            the slot.
        ResourceExhausted
            Past the cap on steps.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When an argument is not an integer.
        """
        self._check_open()
        i = len(self._steps)
        slot = _u32(slot, f"step {i} (memset): slot")
        offset = _u64(offset, f"step {i} (memset): offset")
        nbytes = _u64(nbytes, f"step {i} (memset): bytes")
        es = _u32(element_size, f"step {i} (memset): element_size")
        value = _u32(value, f"step {i} (memset): value")
        if es not in (1, 2, 4):
            raise GraphdError(_INVALID, f"step {i} (memset): element_size {es} is not 1, 2 or 4")
        if nbytes == 0 or nbytes % es or offset % es:
            raise GraphdError(_INVALID, f"step {i} (memset): offset {offset} and bytes {nbytes} must be "
                              f"multiples of the element size {es}, and bytes non-zero")
        if es < 4 and value >> (8 * es):
            raise GraphdError(_INVALID, f"step {i} (memset): value 0x{value:x} does not fit in {es} byte(s)")
        self._check_range(i, "memset", slot, offset, nbytes)
        self._new_step("memset")
        self._steps.append(_Memset(slot, es, value, offset, nbytes))
        return i

    def add_copy(self, dst_slot: int, dst_offset: int, src_slot: int, src_offset: int, nbytes: int) -> int:
        """Adds a copy between slots (or within one, without overlap).

        Parameters
        ----------
        dst_slot, dst_offset
            Where the bytes go.
        src_slot, src_offset
            Where they come from.
        nbytes
            How many bytes (1 or more).

        Returns
        -------
        int
            The step's index.

        Raises
        ------
        InvalidArgument
            For 0 bytes, a range outside a slot or overlapping ranges.
        ResourceExhausted
            Past the cap on steps.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When an argument is not an integer.
        """
        self._check_open()
        i = len(self._steps)
        dst_slot = _u32(dst_slot, f"step {i} (copy): dst_slot")
        src_slot = _u32(src_slot, f"step {i} (copy): src_slot")
        dst_offset = _u64(dst_offset, f"step {i} (copy): dst_offset")
        src_offset = _u64(src_offset, f"step {i} (copy): src_offset")
        nbytes = _u64(nbytes, f"step {i} (copy): bytes")
        if nbytes == 0:
            raise GraphdError(_INVALID, f"step {i} (copy): bytes is 0")
        self._check_range(i, "copy", dst_slot, dst_offset, nbytes)
        self._check_range(i, "copy", src_slot, src_offset, nbytes)
        if dst_slot == src_slot and dst_offset < src_offset + nbytes and src_offset < dst_offset + nbytes:
            raise GraphdError(_INVALID, f"step {i} (copy): source and destination overlap in slot {dst_slot}")
        self._new_step("copy")
        self._steps.append(_Copy(dst_slot, src_slot, dst_offset, src_offset, nbytes))
        return i

    # --- loops and branches ---------------------------------------------

    def _begin_cond(self, kind, slot, offset):
        self._check_open()
        i = len(self._steps)
        what = "while" if kind == STEP_WHILE else "if"
        slot = _u32(slot, f"step {i} ({what}): slot")
        offset = _u64(offset, f"step {i} ({what}): offset")
        if offset % 4:
            raise GraphdError(_INVALID, f"step {i} ({what}): the condition word at offset {offset} is not "
                              "4-byte aligned")
        self._check_range(i, what, slot, offset, 4)
        self._new_step(what)
        self._steps.append(_Cond(kind, slot, offset))
        return i

    def begin_while(self, slot: int, offset: int = 0) -> int:
        """Begins a loop over a 4-byte word of a slot, read on the device
        before each pass: the steps added until end(step) run while it is
        non-zero, so they must change it (a body that never does never
        ends).

        Parameters
        ----------
        slot
            The slot holding the word.
        offset
            The word's byte offset (a multiple of 4).

        Returns
        -------
        int
            The step's index, for end().

        Raises
        ------
        InvalidArgument
            For a misaligned offset or a word outside the slot.
        ResourceExhausted
            Past the cap on steps.
        FailedPrecondition
            Once the program is finished.
        InvalidArgumentType
            When an argument is not an integer.
        """
        return self._begin_cond(STEP_WHILE, slot, offset)

    def begin_if(self, slot: int, offset: int = 0) -> int:
        """Begins a branch over a 4-byte word of a slot: the steps added
        until else_(step) (or end(step) when there is no else) run when it
        is non-zero, those added after else_() until end() when it is zero.

        Parameters
        ----------
        slot
            The slot holding the word.
        offset
            The word's byte offset (a multiple of 4).

        Returns
        -------
        int
            The step's index, for else_() and end().

        Raises
        ------
        GraphdError
            As begin_while().
        InvalidArgumentType
            When an argument is not an integer.
        """
        return self._begin_cond(STEP_IF, slot, offset)

    def _open_cond(self, step, call):
        """The open loop or branch at index `step`, checked to be the
        innermost open one."""
        self._check_open()
        step = _u32(step, f"{call}: step")
        n = len(self._steps)
        if step >= n or not _is_cond(self._steps[step]):
            raise GraphdError(_INVALID, f"{call}: step {step} is not a loop or a branch")
        c = self._steps[step]
        if c.orelse is not None:
            raise GraphdError("FAILED_PRECONDITION", f"{call}: step {step} is ended already")
        for k in range(step + 1, n):
            s = self._steps[k]
            if _is_cond(s) and s.orelse is None:
                raise GraphdError("FAILED_PRECONDITION", f"{call}: step {step} is inside step {k}, which is "
                                  "not ended yet")
        return step, c

    def else_(self, step: int) -> None:
        """Ends the then-steps of a branch: the steps added from here until
        end(step) run when its word is zero. Loops and branches are ended
        innermost first.

        Parameters
        ----------
        step
            The branch (begin_if's index).

        Raises
        ------
        InvalidArgument
            When step is not a loop or a branch.
        FailedPrecondition
            When it is a loop, has its else already, is ended, or encloses
            one not yet ended, or once the program is finished.
        """
        step, c = self._open_cond(step, "else")
        if c.kind != STEP_IF or c.body is not None:
            raise GraphdError("FAILED_PRECONDITION", f"else: step {step} is not a branch before its else")
        c.body = len(self._steps) - step - 1

    def end(self, step: int) -> None:
        """Ends a loop or a branch. Loops and branches nest (at most 8 deep)
        and are ended innermost first.

        Parameters
        ----------
        step
            The index begin_while or begin_if returned.

        Raises
        ------
        InvalidArgument
            When step is not a loop or a branch.
        FailedPrecondition
            When it is ended already or encloses one not yet ended, or once
            the program is finished.
        """
        step, c = self._open_cond(step, "end")
        after = len(self._steps) - step - 1
        if c.body is None:
            c.body, c.orelse = after, 0
        else:
            c.orelse = after - c.body

    # --- finish ---------------------------------------------------------

    def finish(self) -> Tuple[bytes, bytes]:
        """Completes the program: sorts parameters and patches by offset,
        runs the structural validation the daemon runs at registration,
        encodes it and computes its id. After success the program can no
        longer change; finishing again returns the same.

        Returns
        -------
        (bytes, bytes)
            The canonical encoding and the 32-byte id.

        Raises
        ------
        InvalidArgument
            For a program the daemon would refuse (a loop or branch not
            ended, no steps, ...).
        ResourceExhausted
            For a program over a cap (slots, steps, bytes).
        """
        if self._encoding is not None:
            assert self._id is not None
            return self._encoding, self._id
        for k, s in enumerate(self._steps):
            if _is_cond(s) and s.orelse is None:
                raise GraphdError(_INVALID, f"step {k} ({s.label()}) is not ended")
        for s in self._steps:
            if s.kind == STEP_LAUNCH:
                s.params.sort()
                s.patches.sort()
        validate(self.mode, self._slots, self._steps)
        enc = _encode(self.mode, self._slots, self._steps)
        if len(enc) > MAX_PROGRAM_BYTES:
            raise GraphdError(_EXHAUSTED, f"the program encodes to {len(enc)} bytes, over the limit of "
                              f"{MAX_PROGRAM_BYTES}")
        self._encoding = enc
        self._id = hashlib.sha256(enc).digest()
        return self._encoding, self._id

    def modules(self) -> List[bytes]:
        """The modules the program's launches use.

        Returns
        -------
        list of bytes
            Every distinct module id, in first-use order.
        """
        out: List[bytes] = []
        for s in self._steps:
            if s.kind == STEP_LAUNCH and s.module not in out:
                out.append(s.module)
        return out


def _encode(mode, slots, steps):
    w = [struct.pack("<IIIII", PROGRAM_MAGIC, ENCODING_VERSION, mode, len(slots), len(steps))]
    for role, flags, size in slots:
        w.append(struct.pack("<IIQ", role, flags, size))
    for s in steps:
        w.append(struct.pack("<I", s.kind))
        if s.kind == STEP_LAUNCH:
            w.append(s.module)
            w.append(struct.pack("<I", len(s.name)) + s.name)
            w.append(struct.pack("<7I", *s.grid, *s.block, s.shared))
            w.append(struct.pack("<I", len(s.params)))
            w.extend(struct.pack("<II", o, n) for o, n in s.params)
            w.append(struct.pack("<I", len(s.data)) + bytes(s.data))
            w.append(struct.pack("<I", len(s.patches)))
            w.extend(struct.pack("<IIQ", o, sl, so) for o, sl, so in s.patches)
        elif s.kind == STEP_MEMSET:
            w.append(struct.pack("<IIIQQ", s.slot, s.element_size, s.value, s.offset, s.nbytes))
        elif s.kind == STEP_COPY:
            w.append(struct.pack("<IIQQQ", s.dst_slot, s.src_slot, s.dst_offset, s.src_offset, s.nbytes))
        elif s.kind == STEP_WHILE:
            w.append(struct.pack("<IQI", s.slot, s.offset, s.body))
        else:
            w.append(struct.pack("<IQII", s.slot, s.offset, s.body, s.orelse))
    return b"".join(w)


def _validate_launch(slots, i, l):
    """validate_launch() of proto/program.c, on a launch whose params and
    patches are sorted."""
    lbl = f"step {i} (launch {l.name.decode('ascii')})"
    if len(l.params) > MAX_PARAMS:
        raise GraphdError(_EXHAUSTED, f"{lbl}: {len(l.params)} parameters is over the limit of {MAX_PARAMS}")
    if len(l.data) > MAX_PARAM_BYTES:
        raise GraphdError(_EXHAUSTED, f"{lbl}: {len(l.data)} parameter bytes is over the limit of "
                          f"{MAX_PARAM_BYTES}")
    end = 0
    for k, (o, n) in enumerate(l.params):
        if n == 0:
            raise GraphdError(_INVALID, f"{lbl}: parameter {k} has size 0")
        if o < end:
            raise GraphdError(_INVALID, f"{lbl}: parameter {k} at offset {o} overlaps the one before or is "
                              "out of order")
        end = o + n
    if end != len(l.data):
        raise GraphdError(_INVALID, f"{lbl}: {len(l.data)} parameter bytes, but the parameters end at byte {end}")
    at = 0
    for o, n in l.params + [(len(l.data), 0)]:
        for b in range(at, o):
            if l.data[b]:
                raise GraphdError(_INVALID, f"{lbl}: padding byte {b} between parameters must be zero")
        at = o + n
    if len(l.patches) > MAX_PATCHES:
        raise GraphdError(_EXHAUSTED, f"{lbl}: {len(l.patches)} pointer patches is over the limit of "
                          f"{MAX_PATCHES}")
    prev = None
    for o, s, so in l.patches:
        if o % 8:
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {o} is not 8-byte aligned")
        if prev is not None and o <= prev:
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {o} repeats or is out of order")
        prev = o
        if not any(o >= po and _fits(o, 8, po + pn) for po, pn in l.params):
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {o} does not lie inside one parameter")
        if s >= len(slots):
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {o} names slot {s}; there are {len(slots)} slots")
        if so >= slots[s][2]:
            raise GraphdError(_INVALID, f"{lbl}: patch at offset {o} points {so} bytes into slot {s}, which "
                              f"has {slots[s][2]}")
        if any(l.data[o:o + 8]):
            raise GraphdError(_INVALID, f"{lbl}: the 8 parameter bytes under the patch at offset {o} must be zero")


def _check_step_range(slots, i, what, slot, off, nbytes):
    if slot >= len(slots):
        raise GraphdError(_INVALID, f"step {i} ({what}): slot {slot} does not exist; there are {len(slots)} slots")
    if not _fits(off, nbytes, slots[slot][2]):
        raise GraphdError(_INVALID, f"step {i} ({what}): bytes {off}..{off + nbytes} are outside slot {slot}, "
                          f"which has {slots[slot][2]}")


def validate(mode: int, slots: Sequence[Tuple[int, int, int]], steps: Sequence[Any]) -> None:
    """The structural stage of proto/program.c (gd_program_validate), with
    its messages. The builder's calls already refuse most of this; this is
    the backstop that finish() runs.

    Parameters
    ----------
    mode
        The mode's number.
    slots
        (role, flags, size) of each slot.
    steps
        The builder's steps.

    Raises
    ------
    InvalidArgument
        For a program the daemon refuses, with its message.
    ResourceExhausted
        For a program over one of the daemon's caps, with its message.
    """
    if mode not in MODES.values():
        raise GraphdError(_INVALID, f"mode {mode} is not staged (0), staged_ex (1), direct (2) "
                                    "or auto (3)")
    if len(slots) > MAX_SLOTS:
        raise GraphdError(_EXHAUSTED, f"{len(slots)} slots is over the limit of {MAX_SLOTS}")
    if not steps:
        raise GraphdError(_INVALID, "the program has no steps")
    if len(steps) > MAX_STEPS:
        raise GraphdError(_EXHAUSTED, f"{len(steps)} steps is over the limit of {MAX_STEPS}")
    for s, (role, flags, size) in enumerate(slots):
        if role > 4:
            raise GraphdError(_INVALID, f"slot {s}: role {role} is not input, output, inout, scratch or temp")
        if flags & ~SLOT_STAGED:
            raise GraphdError(_INVALID, f"slot {s}: unknown flags 0x{flags:x}")
        if role in OWNED_ROLES and flags:
            raise GraphdError(_INVALID, f"slot {s}: a {_role_name(role)} slot belongs to graphd and cannot be staged")
        if size == 0:
            raise GraphdError(_INVALID, f"slot {s}: size 0 is invalid")
        if size > MAX_SLOT_BYTES:
            raise GraphdError(_EXHAUSTED, f"slot {s}: {size} bytes is over the limit of {MAX_SLOT_BYTES}")
    for i, st in enumerate(steps):
        if st.kind == STEP_LAUNCH:
            _validate_launch(slots, i, st)
        elif st.kind == STEP_MEMSET:
            es = st.element_size
            if es not in (1, 2, 4):
                raise GraphdError(_INVALID, f"step {i} (memset): element_size {es} is not 1, 2 or 4")
            if st.nbytes == 0 or st.nbytes % es or st.offset % es:
                raise GraphdError(_INVALID, f"step {i} (memset): offset {st.offset} and bytes {st.nbytes} must "
                                  f"be non-zero multiples of the element size {es}")
            if es < 4 and st.value >> (8 * es):
                raise GraphdError(_INVALID, f"step {i} (memset): value 0x{st.value:x} does not fit in {es} byte(s)")
            _check_step_range(slots, i, "memset", st.slot, st.offset, st.nbytes)
        elif st.kind == STEP_COPY:
            if st.nbytes == 0:
                raise GraphdError(_INVALID, f"step {i} (copy): bytes is 0")
            _check_step_range(slots, i, "copy", st.dst_slot, st.dst_offset, st.nbytes)
            _check_step_range(slots, i, "copy", st.src_slot, st.src_offset, st.nbytes)
            if (st.dst_slot == st.src_slot and st.dst_offset < st.src_offset + st.nbytes
                    and st.src_offset < st.dst_offset + st.nbytes):
                raise GraphdError(_INVALID, f"step {i} (copy): source and destination overlap in slot {st.dst_slot}")
        elif _is_cond(st):
            what = st.label()
            if st.offset % 4:
                raise GraphdError(_INVALID, f"step {i} ({what}): the condition word at offset {st.offset} is not "
                                  "4-byte aligned")
            _check_step_range(slots, i, what, st.slot, st.offset, 4)
            if st.kind == STEP_WHILE and (st.body == 0 or st.orelse):
                raise GraphdError(_INVALID, f"step {i} (while): the body must have at least one step and there "
                                  "is no else")
            if st.kind == STEP_IF and st.body + st.orelse == 0:
                raise GraphdError(_INVALID, f"step {i} (if): both branches are empty")
        else:
            raise GraphdError(_INVALID, f"step {i}: kind {st.kind} is not launch, memset, copy, while or if")
    _check_nesting(steps, 0, len(steps), 0)


def _check_nesting(steps, first, count, depth):
    """check_nesting() of proto/program.c: every loop's and branch's steps
    lie inside the block around it (the program or the enclosing branch),
    nested at most MAX_COND_DEPTH deep."""
    end = first + count
    i = first
    while i < end:
        st = steps[i]
        if not _is_cond(st):
            i += 1
            continue
        span = st.body + st.orelse
        if i + 1 + span > end:
            raise GraphdError(_INVALID, f"step {i} ({st.label()}): its {span} steps run past the end of the "
                              f"{'enclosing branch' if depth else 'program'}")
        if depth + 1 > MAX_COND_DEPTH:
            raise GraphdError(_EXHAUSTED, f"step {i}: conditional steps nest more than {MAX_COND_DEPTH} deep")
        _check_nesting(steps, i + 1, st.body, depth + 1)
        _check_nesting(steps, i + 1 + st.body, st.orelse, depth + 1)
        i += 1 + span
