"""The status codes of graphd (docs/design.md, "Status codes") and the
exceptions that carry them.

The names and values are those of proto/include/graphd/status.h, which are
absl's (and XLA FFI's) status codes. Every failure raises a subclass of
:class:`GraphdError`, one per status, each also derived from the builtin
exception a Python caller would catch for that cause::

    GraphdError              the base: .code ("NOT_FOUND"), .status (5), .message
    ├── InvalidArgument      also ValueError
    │   └── InvalidArgumentType  also TypeError: an argument of the wrong type
    ├── DeadlineExceeded     also TimeoutError
    ├── NotFound             also LookupError
    ├── AlreadyExists
    ├── PermissionDenied     also PermissionError
    ├── ResourceExhausted
    ├── FailedPrecondition   also RuntimeError
    │   └── LibraryError     also ImportError: libgraphd missing, or too old
    ├── Aborted
    ├── OutOfRange           also ValueError
    ├── Unimplemented        also NotImplementedError
    ├── Internal
    ├── Unavailable          also ConnectionError: the daemon is not there
    └── DataLoss

``GraphdError(code, message)`` with a status name or number gives an
instance of that status's class, so ``except graphd.NotFound`` and
``except LookupError`` both catch ``GraphdError("NOT_FOUND", ...)``."""

from typing import Any, Dict, Optional, Type, Union

STATUS_CODES: Dict[str, int] = {
    "OK": 0,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
}

STATUS_NAMES: Dict[int, str] = {v: k for k, v in STATUS_CODES.items()}


def status_name(code: int) -> str:
    """The upper-case name of a numeric status.

    Parameters
    ----------
    code
        A status number; negated internal codes are accepted, as in
        graphd_status_name().

    Returns
    -------
    str
        "NOT_FOUND" and the like, or "UNKNOWN".
    """
    return STATUS_NAMES.get(abs(int(code)), "UNKNOWN")


_CLASSES: Dict[str, "Type[GraphdError]"] = {}


class GraphdError(Exception):
    """A graphd failure.

    Parameters
    ----------
    code
        The status: its name ("NOT_FOUND") or number (5).
    message
        The human message from libgraphd, the daemon or the Python layer,
        which names the step, field or slot at fault and the fix.

    Attributes
    ----------
    code : str
        The status name.
    status : int
        Its number (-1 for an unknown name).
    message : str
        The message. ``str(e)`` is ``"graphd: NOT_FOUND: <message>"``.

    Constructed on the base class, it returns an instance of the status's
    own subclass (``GraphdError("NOT_FOUND", m)`` is a :class:`NotFound`).
    """

    code: str
    status: int
    message: str
    #: The status this class stands for (None on the base class).
    STATUS: Optional[str] = None

    def __new__(cls, *args: Any, **kw: Any) -> "GraphdError":
        if cls is GraphdError:
            code = args[0] if args else kw.get("code", "UNKNOWN")
            cls = error_class(code)
        return super().__new__(cls)

    def __init__(self, code: Union[str, int] = "UNKNOWN", message: str = "") -> None:
        if isinstance(code, int):
            code = status_name(code)
        # Exception's args, which pickle uses to make it again (a failure
        # raised in a multiprocessing worker reaches the parent whole).
        Exception.__init__(self, code, message)
        self.code = code
        self.status = STATUS_CODES.get(code, -1)
        self.message = message

    def __reduce__(self):  # type: ignore[no-untyped-def]
        if type(self).__init__ in _PLAIN_INITS:
            return (type(self), (self.code, self.message))
        return super().__reduce__()  # a subclass of its own signature

    def __str__(self) -> str:
        return f"graphd: {self.code}: {self.message}"


class InvalidArgument(GraphdError, ValueError):
    """INVALID_ARGUMENT: a bad argument (a value, type or shape the call
    refuses). Also a :class:`ValueError`."""
    STATUS = "INVALID_ARGUMENT"


class InvalidArgumentType(InvalidArgument, TypeError):
    """INVALID_ARGUMENT for an argument of the wrong type. Also a
    :class:`TypeError` (and a :class:`ValueError`, as every
    :class:`InvalidArgument`)."""
    STATUS = "INVALID_ARGUMENT"


class DeadlineExceeded(GraphdError, TimeoutError):
    """DEADLINE_EXCEEDED: the daemon did not answer within the timeout.
    Also a :class:`TimeoutError`."""
    STATUS = "DEADLINE_EXCEEDED"


class NotFound(GraphdError, LookupError):
    """NOT_FOUND: no such program, module, region or device. Also a
    :class:`LookupError`."""
    STATUS = "NOT_FOUND"


class AlreadyExists(GraphdError):
    """ALREADY_EXISTS."""
    STATUS = "ALREADY_EXISTS"


class PermissionDenied(GraphdError, PermissionError):
    """PERMISSION_DENIED: the socket, or an admin's right (evicting another
    user's captures). Also a :class:`PermissionError`."""
    STATUS = "PERMISSION_DENIED"


class ResourceExhausted(GraphdError):
    """RESOURCE_EXHAUSTED: a quota, cap or the device's memory."""
    STATUS = "RESOURCE_EXHAUSTED"


class FailedPrecondition(GraphdError, RuntimeError):
    """FAILED_PRECONDITION: the call does not fit the state it found (a
    closed client, a freed buffer, memory graphd cannot share, a handle
    inherited through fork). Also a :class:`RuntimeError`."""
    STATUS = "FAILED_PRECONDITION"


class LibraryError(FailedPrecondition, ImportError):
    """libgraphd (or libgraphd_xla) cannot be loaded, or is older than this
    package needs. Not :class:`Unavailable`: waiting does not fix it, so a
    retry loop on a stopped daemon does not spin on it. Also an
    :class:`ImportError`; ``code`` is FAILED_PRECONDITION."""
    STATUS = "FAILED_PRECONDITION"

    def __init__(self, code: Union[str, int] = "FAILED_PRECONDITION", message: str = "") -> None:
        FailedPrecondition.__init__(self, code, message)


class Aborted(GraphdError):
    """ABORTED."""
    STATUS = "ABORTED"


class OutOfRange(GraphdError, ValueError):
    """OUT_OF_RANGE. Also a :class:`ValueError`."""
    STATUS = "OUT_OF_RANGE"


class Unimplemented(GraphdError, NotImplementedError):
    """UNIMPLEMENTED: the daemon does not know the request (an older
    daemon), or graphd cannot do it. Also a :class:`NotImplementedError`."""
    STATUS = "UNIMPLEMENTED"


class Internal(GraphdError):
    """INTERNAL: a fault in graphd or the driver."""
    STATUS = "INTERNAL"


class Unavailable(GraphdError, ConnectionError):
    """UNAVAILABLE: no daemon on the socket, or it went away (the outputs of
    the replays in flight are then undefined). Retrying later may succeed.
    Also a :class:`ConnectionError`."""
    STATUS = "UNAVAILABLE"


class DataLoss(GraphdError):
    """DATA_LOSS: a malformed reply."""
    STATUS = "DATA_LOSS"


for _cls in (InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists, PermissionDenied,
             ResourceExhausted, FailedPrecondition, Aborted, OutOfRange, Unimplemented, Internal,
             Unavailable, DataLoss):
    _CLASSES[_cls.STATUS] = _cls  # type: ignore[index]


_PLAIN_INITS = (GraphdError.__init__, LibraryError.__init__)


def error_class(code: Union[str, int]) -> "Type[GraphdError]":
    """The exception class of a status.

    Parameters
    ----------
    code
        A status name or number.

    Returns
    -------
    type
        Its :class:`GraphdError` subclass (the base for an unknown one).
    """
    name = status_name(code) if isinstance(code, int) else str(code)
    return _CLASSES.get(name, GraphdError)


__all__ = ["GraphdError", "STATUS_CODES", "STATUS_NAMES", "status_name", "error_class",
           "InvalidArgument", "InvalidArgumentType", "DeadlineExceeded", "NotFound", "AlreadyExists", "PermissionDenied",
           "ResourceExhausted", "FailedPrecondition", "LibraryError", "Aborted", "OutOfRange",
           "Unimplemented", "Internal", "Unavailable", "DataLoss"]
