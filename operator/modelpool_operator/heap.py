"""Giving the C heap's free memory back to the system (glibc ``malloc_trim``), every minute.

Python's objects above 512 bytes (dicts of more than a few keys, lists, watch events' JSON, TLS buffers)
come from the C allocator, which keeps what they free for reuse instead of returning it. A scale-up of
every pool at once (thousands of watch events, creates and status writes in flight) leaves the heap
mostly free and scattered: at 100 pools x 10 KWOK workers glibc held 50 MiB free of a 91 MiB heap after
convergence (``modelpool_operator.memtrace``'s ``mallinfo2``), a quarter of the operator's RSS, kept for
good. ``malloc_trim(0)`` hands every free page back (``madvise``), in a few milliseconds; elsewhere than
glibc (musl, macOS) there is nothing to call and nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from functools import cache

logger = logging.getLogger(__name__)

#: How often the operator trims its heap.
TRIM_INTERVAL_S = 60.0


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        function: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return None
    return function


def trim() -> bool:
    """Return the C heap's free pages to the system; False where the C library cannot."""
    function = _malloc_trim()
    if function is None:
        return False
    function(0)
    return True


async def trim_every(seconds: float = TRIM_INTERVAL_S) -> None:
    """Trim the heap every ``seconds`` until cancelled."""
    if _malloc_trim() is None:
        logger.info("no malloc_trim in this C library: the heap is not trimmed")
        return
    while True:
        await asyncio.sleep(seconds)
        trim()
