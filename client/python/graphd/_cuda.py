"""The few CUDA driver calls the array path needs, through ctypes:
a device's UUID (to pick its data session) and one stream waiting for
another (when an array's `__cuda_array_interface__` names a stream other
than the replay's). libcuda is loaded on first use; nothing here runs
without a GPU."""

import ctypes
import threading

from .errors import GraphdError

_cu = None
_lock = threading.Lock()
_EVENT_DISABLE_TIMING = 2


def _driver():
    global _cu
    with _lock:
        if _cu is None:
            try:
                cu = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise GraphdError("FAILED_PRECONDITION", f"the CUDA driver cannot be loaded: {e}") from None
            for name in ("cuInit", "cuDeviceGet", "cuDeviceGetUuid", "cuEventCreate", "cuEventRecord",
                         "cuStreamWaitEvent", "cuEventDestroy"):
                getattr(cu, name).restype = ctypes.c_int
            cu.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            cu.cuStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
            cu.cuEventDestroy.argtypes = [ctypes.c_void_p]
            _cu = cu
        return _cu


def _check(r, what):
    if r:
        raise GraphdError("FAILED_PRECONDITION", f"{what} failed with CUresult {r}")


def device_uuid(ordinal):
    """The 16-byte UUID of CUDA device `ordinal` (as the process numbers
    them: CUDA_VISIBLE_DEVICES applies)."""
    cu = _driver()
    _check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    _check(cu.cuDeviceGet(ctypes.byref(dev), int(ordinal)), f"cuDeviceGet({ordinal})")
    out = (ctypes.c_ubyte * 16)()
    # _v2, as the daemon resolves it (a MIG instance's own UUID).
    get = getattr(cu, "cuDeviceGetUuid_v2", None) or cu.cuDeviceGetUuid
    get.restype = ctypes.c_int
    _check(get(out, dev), "cuDeviceGetUuid")
    return bytes(out)


def stream_wait(consumer, producer):
    """Makes `consumer` wait for the work queued on `producer` so far
    (both CUstream ints; 0 is the default stream). Needs the device's
    context current, as the framework that made the streams leaves it."""
    cu = _driver()
    ev = ctypes.c_void_p()
    _check(cu.cuEventCreate(ctypes.byref(ev), _EVENT_DISABLE_TIMING), "cuEventCreate")
    try:
        _check(cu.cuEventRecord(ev, ctypes.c_void_p(producer or None)), "cuEventRecord")
        _check(cu.cuStreamWaitEvent(ctypes.c_void_p(consumer or None), ev, 0), "cuStreamWaitEvent")
    finally:
        # Destroying a recorded event is allowed: the wait still holds.
        cu.cuEventDestroy(ev)
