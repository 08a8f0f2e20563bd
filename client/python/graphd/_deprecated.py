"""Old spellings of the package's names: each still works and warns once
per call site with a DeprecationWarning naming the new one."""

import warnings
from typing import Any, Dict, Optional


def warn(old: str, new: str, stacklevel: int = 3) -> None:
    """Warns that `old` is deprecated in favour of `new`.

    Parameters
    ----------
    old, new
        The old and the new spelling, as a caller writes them.
    stacklevel
        Whose line the warning names (3: the caller of the function that
        calls this).
    """
    warnings.warn(f"graphd: {old} is deprecated; use {new}", DeprecationWarning,
                  stacklevel=stacklevel)


def renamed_kw(kw: Dict[str, Any], old: str, new: str, value: Optional[Any], where: str,
               stacklevel: int = 4) -> Optional[Any]:
    """Takes a renamed keyword argument out of **kw.

    Parameters
    ----------
    kw
        The call's extra keyword arguments; `old` is removed from it.
    old, new
        The keyword's old and new name.
    value
        What the caller gave under the new name (None: nothing).
    where
        The function, for the messages ("graphd.torch.connect").
    stacklevel
        As for warn().

    Returns
    -------
    The value to use: the new name's, else the old name's (with a
    DeprecationWarning).

    Raises
    ------
    InvalidArgument
        When both names are given.
    """
    if old not in kw:
        return value
    from .errors import InvalidArgument
    old_value = kw.pop(old)
    if value is not None:
        raise InvalidArgument("INVALID_ARGUMENT", f"{where}: give {new}= only ({old}= is its old name)")
    warn(f"{where}({old}=...)", f"{where}({new}=...)", stacklevel=stacklevel)
    return old_value
