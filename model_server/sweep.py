"""Batching across requests by length: the batcher's sweeps.

A sweep takes whole requests from the head of the queue, in arrival order, up to ``SWEEP_BATCHES``
batches' worth of items, sorts all their items by length (the task's ``length_hint``: a text's length),
and serves them in batches of up to ``--max-batch-size`` items, longest first (so the one batch that is
not full holds the shortest items: sorted batches then carry the least padding there is).  Items of similar length
from different requests then share a forward pass, so a pass carries less padding and, on a CPU, texts
of one length are fewer passes.  A request is answered when its last item has been computed.

No starvation, bounded waiting: requests enter sweeps in arrival order, and a sweep is done within
``SWEEP_BATCHES`` batches (a request larger than that is a sweep of its own, done in as many batches as
it needs), so no request is passed over for more than that many batches once it reaches the head of
the queue.  Without length hints every item has length 0: a sweep is then one batch, taken in arrival
order, exactly the first-come-first-served batching of a single queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

# How many batches one sweep may span (how long the oldest request may be passed over, in batches).
SWEEP_BATCHES = 4

U = TypeVar("U")


def sweep_capacity(limit: int, hinted: bool) -> int:
    """Pure: how many items a sweep gathers (``limit`` = the max batch size)."""
    return limit * SWEEP_BATCHES if hinted else limit


class Sweep(Generic[U]):
    """The items of the requests one sweep took, sorted by length; ``take`` hands out a batch."""

    def __init__(self) -> None:
        self._pieces: deque[tuple[U, int]] = deque()

    def __len__(self) -> int:
        """Items not yet handed out (including those of requests that have since been dropped)."""
        return len(self._pieces)

    def start(self, units: Sequence[U], lengths: Callable[[U], Sequence[int]]) -> None:
        """Begin a sweep over ``units`` (in arrival order): their items sorted by length, longest first;
        equal lengths keep arrival order, and items of one request their order within it."""
        keyed = [
            (length, age, index, unit)
            for age, unit in enumerate(units)
            for index, length in enumerate(lengths(unit))
        ]
        keyed.sort(key=lambda k: (-k[0], k[1], k[2]))
        self._pieces = deque((unit, index) for _, _, index, unit in keyed)

    def take(self, limit: int, keep: Callable[[U], bool]) -> list[tuple[U, int]]:
        """The next batch: up to ``limit`` (request, item index) pairs, skipping the items of requests
        for which ``keep`` says no (answered, abandoned, past their deadline)."""
        batch: list[tuple[U, int]] = []
        pieces = self._pieces
        while pieces and len(batch) < limit:
            piece = pieces.popleft()
            if keep(piece[0]):
                batch.append(piece)
        return batch

    def units(self) -> list[U]:
        """The requests that still have items in the sweep (each once, in sweep order)."""
        seen: dict[int, U] = {}
        for unit, _ in self._pieces:
            seen.setdefault(id(unit), unit)
        return list(seen.values())

    def clear(self) -> None:
        self._pieces.clear()


__all__ = ["SWEEP_BATCHES", "Sweep", "sweep_capacity"]
