"""The C library's own functions, looked up in the running process (no ``find_library`` subprocess).

``ctypes.CDLL(None)`` is the process's global symbol table, where glibc's ``dlopen`` and
``malloc_trim`` live.  Calls through it release the GIL for their duration.  Where a symbol is missing
(musl, macOS for ``malloc_trim``), callers get ``None`` and skip what they wanted to do.
"""

from __future__ import annotations

import ctypes
from typing import Any


def libc_function(name: str, argtypes: list[Any], restype: Any) -> Any | None:
    """The C function ``name`` with its signature set, or None where this platform has none."""
    try:
        function = getattr(ctypes.CDLL(None), name)
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = argtypes
    function.restype = restype
    return function


__all__ = ["libc_function"]
