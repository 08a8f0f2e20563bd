"""The status codes of graphd (docs/design.md, "Status codes") and the exception
that carries them.

The names and values are those of proto/include/graphd/status.h, which are
absl's (and XLA FFI's) status codes."""

STATUS_CODES = {
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

STATUS_NAMES = {v: k for k, v in STATUS_CODES.items()}


def status_name(code):
    """The upper-case name of a numeric status ("NOT_FOUND"), or "UNKNOWN".
    Negated internal codes are accepted, as in graphd_status_name()."""
    return STATUS_NAMES.get(abs(int(code)), "UNKNOWN")


class GraphdError(Exception):
    """A graphd failure: `code` is the status name ("NOT_FOUND"), `status`
    its numeric value, and `message` the human message from libgraphd, the
    daemon or the Python builder, which names the step, field or slot.

    str(e) is "graphd: NOT_FOUND: <message>"."""

    def __init__(self, code, message):
        if isinstance(code, int):
            code = status_name(code)
        super().__init__(code, message)
        self.code = code
        self.status = STATUS_CODES.get(code, -1)
        self.message = message

    def __str__(self):
        return f"graphd: {self.code}: {self.message}"
