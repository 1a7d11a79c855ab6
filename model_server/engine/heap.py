"""Give freed heap memory back to the operating system, now and then, from the inference thread.

A forward pass over a large CPU batch allocates tens of MiB of activations.  glibc keeps freed blocks in
its heap (its mmap threshold grows with every large free), so a worker's RSS creeps up to its largest
batch ever and stays there; under a long overload that reads as a leak and counts against the pool's
memory budget.  ``malloc_trim(0)`` returns the free pages.  It walks the heap (milliseconds), so it runs
at most every ``interval_s`` seconds, after a batch has been answered (not before: the request would wait
for it), on the thread that did the allocating; and once
more when traffic stops (the worker calls ``trim()`` after a quiet second), so an idle worker holds what
it needs and not what its last burst left free.  Where there is no glibc (musl, macOS) it does nothing.

(Cheaper-looking alternatives were measured and rejected: a fixed glibc mmap or trim threshold returns
activations to the kernel on every free and costs 15-25 % of CPU throughput in page faults.)
"""

from __future__ import annotations

import ctypes
import time

from model_server.libc import libc_function

DEFAULT_INTERVAL_S = 5.0


def due(now: float, last: float, interval_s: float) -> bool:
    """Pure: is a trim due?"""
    return now - last >= interval_s


class HeapTrimmer:
    """``maybe_trim()`` after each batch; trims when ``interval_s`` has passed since the last trim.
    ``dirty``: a batch ran since the last trim (an idle trim is worth doing)."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._trim = libc_function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
        self._last = time.monotonic()
        self.trims = 0
        self.dirty = False

    @property
    def available(self) -> bool:
        return self._trim is not None

    def maybe_trim(self) -> bool:
        return self.trim() if self.after_batch() else False

    def after_batch(self) -> bool:
        """A batch ran: its freed blocks are in the heap; True when a trim is due (the caller runs
        ``trim`` on the inference thread once the batch's answers are on their way)."""
        self.dirty = True
        return self._trim is not None and due(time.monotonic(), self._last, self.interval_s)

    def trim(self) -> bool:
        """Trim now (False where there is no glibc)."""
        self.dirty = False
        if self._trim is None:
            return False
        self._last = time.monotonic()
        self._trim(0)
        self.trims += 1
        return True


__all__ = ["DEFAULT_INTERVAL_S", "HeapTrimmer", "due"]
