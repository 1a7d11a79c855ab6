"""The operator's memory outside its own objects: the C heap's free memory given back to the system
(glibc ``malloc_trim``) every minute, and smaller TLS read buffers.

Python's objects above 512 bytes (dicts of more than a few keys, lists, watch events' JSON, TLS buffers)
come from the C allocator, which keeps what they free for reuse instead of returning it. A scale-up of
every pool at once (thousands of watch events, creates and status writes in flight) leaves the heap
mostly free and scattered: at 100 pools x 10 KWOK workers glibc held 50 MiB free of a 91 MiB heap after
convergence (``modelpool_operator.memtrace``'s ``mallinfo2``), a quarter of the operator's RSS, kept for
good. ``malloc_trim(0)`` hands every free page back (``madvise``), in a few milliseconds; elsewhere than
glibc (musl, macOS) there is nothing to call and nothing is done.

Every TLS connection to the API server holds asyncio's read buffer, 256 KiB (``SSLProtocol.max_size``),
318 KiB in all with OpenSSL's: the API client keeps up to 100 connections and Kopf's session has no limit,
130 of them at 300 and 1,000 pools (40 MiB). A TLS record is at most 16 KiB, so a 64 KiB buffer still
reads four at a time; a connection then holds 127 KiB (``shrink_tls_buffers``, before any connection).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import ctypes
import ctypes.util
import logging
from collections.abc import Callable
from functools import cache

logger = logging.getLogger(__name__)

#: How often the operator trims its heap.
TRIM_INTERVAL_S = 60.0
#: asyncio's read buffer of each TLS connection (its default: 256 KiB).
TLS_READ_BUFFER = 64 * 1024


def shrink_tls_buffers() -> None:
    """Give every TLS connection opened from now on a ``TLS_READ_BUFFER`` read buffer."""
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


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
