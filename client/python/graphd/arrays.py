"""Framework arrays as graphd bindings: what an array's protocol says about
its memory, read without importing the framework.

Two protocols are read, in this order:
  - DLPack (`__dlpack__` and `__dlpack_device__`: PyTorch, CuPy, NumPy,
    JAX, Warp): the capsule's DLTensor gives the address (data plus
    byte_offset), shape, strides, dtype and device. `__dlpack__` is given
    the consumer's stream, so that the producer orders its pending work
    before it (the protocol's contract).
  - `__cuda_array_interface__` (CuPy, PyTorch, Numba, Warp): the dict's
    data, shape, strides, typestr and, from version 3, stream.

Only C-contiguous arrays are taken: a slot is one byte range.

Streams are CUstream handles as ints, with the protocols' conventions:
  - in `__cuda_array_interface__`, the `stream` key is None (no
    synchronisation needed), 1 (the legacy default stream), 2 (the
    per-thread default stream) or a stream's handle; 0 is not allowed;
  - `__dlpack__(stream=)` takes the same values, with None for "the
    legacy default stream" and -1 for "do not synchronise";
  - the driver takes 1 and 2 as those same streams (CU_STREAM_LEGACY and
    CU_STREAM_PER_THREAD), and 0 (NULL) as the default stream, which is
    the legacy one in PyTorch and CuPy (`torch.cuda.current_stream()
    .cuda_stream` and `cupy.cuda.get_current_stream().ptr` are 0 there)."""

from __future__ import annotations

import ctypes
import operator
from typing import Any, Optional, Protocol, Tuple, Union, overload

from .errors import GraphdError
from .records import Role

_INVALID = "INVALID_ARGUMENT"

# DLPack device types (dlpack.h).
DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED = 1, 2, 3, 13
_DL_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                    9: "vpi", 10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi"}

# Stream values every protocol shares.
#: The legacy default stream, as the protocols and the driver name it.
LEGACY_STREAM = 1
#: The per-thread default stream, likewise.
PER_THREAD_STREAM = 2


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_DLPACK_FLAG_READ_ONLY = 1

_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]

# DLPack dtype codes and the names they take here.
_DL_CODES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}
# __cuda_array_interface__ typestr kinds.
_TYPESTR_KINDS = {"i": "int", "u": "uint", "f": "float", "c": "complex", "b": "bool"}


@overload
def dtype_name(dtype: None) -> None: ...
@overload
def dtype_name(dtype: object) -> str: ...


def dtype_name(dtype: object) -> Optional[str]:
    """A dtype's canonical name.

    Parameters
    ----------
    dtype
        A name, a NumPy-style type string ("<f4"), or a framework dtype
        (torch.float32, NumPy and CuPy dtypes, anything whose str() or
        .name is one of those); or None.

    Returns
    -------
    str or None
        "float32", "int64", "bfloat16", "bool", ...; None for None. A name
        this does not recognise is returned as it is.

    Raises
    ------
    InvalidArgument
        For a type string of an unknown kind or size.
    """
    if dtype is None:
        return None
    name = getattr(dtype, "name", None)
    s = name if isinstance(name, str) else str(dtype)
    if s.startswith("torch."):
        s = s[len("torch."):]
    aliases = {"float": "float32", "double": "float64", "half": "float16", "int": "int32",
               "long": "int64", "short": "int16", "bool_": "bool", "cfloat": "complex64",
               "cdouble": "complex128"}
    s = aliases.get(s, s)
    if len(s) >= 2 and s[0] in "<>|=" or (len(s) >= 2 and s[0] in _TYPESTR_KINDS and s[1:].isdigit()):
        t = s.lstrip("<>|=")
        kind = _TYPESTR_KINDS.get(t[0])
        if kind is None or not t[1:].isdigit():
            raise GraphdError(_INVALID, f"dtype {dtype!r} is not one graphd knows")
        if kind == "bool":
            return "bool"
        return f"{kind}{8 * int(t[1:])}"
    return s


class ArrayInfo:
    """What a binding needs from one array (describe() makes them).

    Attributes
    ----------
    ptr : int
        Its address.
    nbytes : int
        Its size in bytes.
    dtype : str
        Its dtype name (as dtype_name gives).
    shape : tuple of int
        Its shape.
    device : str
        Where it lives: "cuda", "cpu", "cuda_host", ... (DLPack's device
        types).
    stream : int or None
        The stream its producer named (`__cuda_array_interface__` version
        3), or None.
    readonly : bool
        Whether the producer marked it read-only.
    protocol : str
        "DLPack" or "__cuda_array_interface__": how it was read.
    """

    __slots__ = ("ptr", "nbytes", "dtype", "shape", "device", "stream", "readonly", "protocol")

    ptr: int
    nbytes: int
    dtype: str
    shape: Tuple[int, ...]
    device: str
    stream: Optional[int]
    readonly: bool
    protocol: str

    def __init__(self, ptr: int, nbytes: int, dtype: str, shape: Tuple[int, ...], device: str,
                 stream: Optional[int], readonly: bool, protocol: str) -> None:
        self.ptr = ptr
        self.nbytes = nbytes
        self.dtype = dtype
        self.shape = shape
        self.device = device  # "cuda", "cpu", ... (DLPack's device types)
        self.stream = stream
        self.readonly = readonly
        self.protocol = protocol

    def __repr__(self) -> str:
        return (f"ArrayInfo(ptr=0x{self.ptr:x}, nbytes={self.nbytes}, dtype={self.dtype}, "
                f"shape={self.shape}, device={self.device}, protocol={self.protocol})")


def _c_contiguous(shape, strides, itemsize):
    """Whether strides (in bytes) are the C-contiguous ones for shape;
    axes of length 1 may have any stride."""
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def _product(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class _SlotAdder(Protocol):
    """What slot_like needs of a program: graphd.Program's add_slot (named
    so, since graphd.program imports this module)."""

    def add_slot(self, role: Union[Role, int], nbytes: int, staged: Optional[bool] = None, *,
                 dtype: Any = None) -> int: ...


def slot_like(program: _SlotAdder, role: Union[Role, int], array: Any, staged: Optional[bool] = None) -> int:
    """program.add_slot(role, ...) sized and typed like an array.

    Parameters
    ----------
    program
        The graphd.Program to add the slot to.
    role
        As Program.add_slot: "input", "output", "inout", "scratch",
        "temp", or its number.
    array
        Anything with .nbytes and .dtype: a PyTorch tensor, a CuPy or
        NumPy array.
    staged
        As Program.add_slot (None: staged unless scratch or temp).

    Returns
    -------
    int
        The slot's index.

    Raises
    ------
    GraphdError
        As Program.add_slot and dtype_name.
    AttributeError
        When array has no .nbytes or .dtype.
    """
    return program.add_slot(role, int(array.nbytes), staged, dtype=array.dtype)


def has_protocol(obj: object) -> bool:
    """Whether describe() can read an object.

    Parameters
    ----------
    obj
        Anything.

    Returns
    -------
    bool
        True when it has `__dlpack__` and `__dlpack_device__`, or
        `__cuda_array_interface__`.
    """
    return (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")) or \
        hasattr(obj, "__cuda_array_interface__")


def consumer_stream(stream: Optional[int]) -> int:
    """The value `__dlpack__(stream=)` takes for a consumer's stream.

    Parameters
    ----------
    stream
        A CUstream as an int; None and 0 (the default stream) are the
        legacy one.

    Returns
    -------
    int
        The stream, or LEGACY_STREAM (1) for None and 0.
    """
    return LEGACY_STREAM if not stream else stream


def describe(obj: Any, what: str = "the array", stream: Optional[int] = None, cpu: bool = False) -> ArrayInfo:
    """An array's memory, read through DLPack or `__cuda_array_interface__`.

    Parameters
    ----------
    obj
        The array.
    what
        How messages name it.
    stream
        The consumer's stream (an int; None or 0 is the legacy default
        stream), passed to `__dlpack__` so the producer orders its work
        before it.
    cpu
        Whether the consumer is a host device, whose `__dlpack__` takes no
        stream.

    Returns
    -------
    ArrayInfo

    Raises
    ------
    InvalidArgument
        For an array that is not contiguous, has no protocol, or says
        something malformed (the message names `what`).
    """
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(obj, what, stream, cpu)
    cai = getattr(obj, "__cuda_array_interface__", None) if hasattr(
        obj, "__cuda_array_interface__") else None
    if cai is not None:
        return _from_cai(cai, what)
    raise GraphdError(_INVALID, f"{what} ({type(obj).__name__}) is not an array graphd can bind: "
                      "it has neither __cuda_array_interface__ nor __dlpack__ (pass a PyTorch "
                      "tensor, a CuPy array, or any array with one of those protocols)")


def _from_cai(cai, what):
    try:
        version = int(cai.get("version", 0))
        shape = tuple(operator.index(d) for d in cai["shape"])
        typestr = cai["typestr"]
        ptr, readonly = cai["data"]
    except (KeyError, TypeError, ValueError) as e:
        raise GraphdError(_INVALID, f"{what}: a malformed __cuda_array_interface__ ({e!r})") from None
    dtype = dtype_name(typestr)
    itemsize = int(typestr.lstrip("<>|=")[1:])
    n = _product(shape)
    strides = cai.get("strides")
    if strides is not None and n > 0 and not _c_contiguous(shape, tuple(strides), itemsize):
        raise GraphdError(_INVALID, f"{what} is not contiguous (shape {shape}, strides "
                          f"{tuple(strides)} bytes); a slot is one byte range: pass a contiguous "
                          "array (.contiguous() in PyTorch, cupy.ascontiguousarray in CuPy)")
    if cai.get("mask") is not None:
        raise GraphdError(_INVALID, f"{what} is a masked array; graphd binds plain arrays")
    stream = cai.get("stream") if version >= 3 else None
    if stream is not None:
        stream = operator.index(stream)
        if stream == 0:
            raise GraphdError(_INVALID, f"{what}: its __cuda_array_interface__ names stream 0, "
                              "which the protocol does not allow (1 is the legacy default "
                              "stream, 2 the per-thread one)")
    return ArrayInfo(int(ptr or 0), n * itemsize, dtype, shape, "cuda", stream, bool(readonly),
                     "__cuda_array_interface__")


def _from_dlpack(obj, what, stream, cpu):
    try:
        dev_type, dev_id = obj.__dlpack_device__()
    except Exception as e:  # noqa: BLE001: the producer's refusal, reworded
        raise GraphdError(_INVALID, f"{what}: __dlpack_device__ failed: {e}") from None
    dev_type = int(dev_type)
    on_host = dev_type in (DL_CPU, DL_CUDA_HOST)
    try:
        # CPU arrays take no stream; CUDA ones order their work before ours.
        cap = obj.__dlpack__() if on_host or cpu else obj.__dlpack__(stream=consumer_stream(stream))
    except Exception as e:  # noqa: BLE001: e.g. torch refuses tensors that require grad
        raise GraphdError(_INVALID, f"{what}: its __dlpack__ failed: {e}") from None
    versioned = bool(_capsule_valid(cap, b"dltensor_versioned"))
    if not versioned and not _capsule_valid(cap, b"dltensor"):
        raise GraphdError(_INVALID, f"{what}: __dlpack__ returned {type(cap).__name__}, not a "
                          "DLPack capsule")
    # Reading the capsule does not consume it: dropping it calls the
    # producer's deleter, and the memory stays the array's.
    if versioned:
        m = _DLManagedTensorVersioned.from_address(_capsule_get(cap, b"dltensor_versioned"))
        t, readonly = m.dl_tensor, bool(m.flags & _DLPACK_FLAG_READ_ONLY)
    else:
        t, readonly = _DLManagedTensor.from_address(_capsule_get(cap, b"dltensor")).dl_tensor, False
    shape = tuple(t.shape[i] for i in range(t.ndim))
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    kind = _DL_CODES.get(code)
    if kind is None or lanes != 1:
        raise GraphdError(_INVALID, f"{what}: DLPack dtype (code {code}, {bits} bits, {lanes} "
                          "lanes) is not one graphd knows")
    dtype = "bool" if kind == "bool" else f"{kind}{bits}"
    itemsize = (bits + 7) // 8
    n = _product(shape)
    if t.strides and n > 0:
        strides = tuple(t.strides[i] * itemsize for i in range(t.ndim))
        if not _c_contiguous(shape, strides, itemsize):
            raise GraphdError(_INVALID, f"{what} is not contiguous (shape {shape}, strides "
                              f"{tuple(t.strides[i] for i in range(t.ndim))} elements); a slot "
                              "is one byte range: pass a contiguous array (.contiguous() in "
                              "PyTorch, cupy.ascontiguousarray in CuPy)")
    ptr = (t.data or 0) + t.byte_offset
    device = _DL_DEVICE_NAMES.get(dev_type, f"DLPack device type {dev_type}")
    del t, cap
    return ArrayInfo(ptr, n * itemsize, dtype, shape, device, None, readonly, "DLPack")


__all__ = ["ArrayInfo", "describe", "dtype_name", "slot_like", "has_protocol", "consumer_stream",
           "LEGACY_STREAM", "PER_THREAD_STREAM"]
