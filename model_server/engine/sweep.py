"""Batching across requests by length: the batcher's sweeps.

A sweep takes whole requests from the head of the queue, in arrival order, up to ``SWEEP_BATCHES``
batches' worth of items, sorts all their items by length (the task's ``length_hint``: a text's length),
and serves them in batches of up to ``--max-batch-size`` items cut from that order (the one batch that is
not full placed where it pads least: ``batch_bounds``).  Items of similar length
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


def batch_bounds(lengths: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """Pure: split items already sorted by length (ascending) into batches of ``limit``, the one that is
    not full placed where it costs least; returns the (start, end) of each batch.

    A batch costs its size times its longest item (the padded tokens).  Contiguous runs of the sorted
    order are the cheapest batches for given sizes; which run the short batch takes still matters
    ([1, 1, 2] in twos: [1, 1] and [2] cost 4, [1] and [1, 2] cost 5), so every place is tried."""
    n = len(lengths)
    full, rest = divmod(n, limit)
    if not rest:
        return [(k, k + limit) for k in range(0, n, limit)]
    best: list[tuple[int, int]] = []
    best_cost = -1
    for slot in range(full + 1):
        sizes = [limit] * slot + [rest] + [limit] * (full - slot)
        bounds, start = [], 0
        for size in sizes:
            bounds.append((start, start + size))
            start += size
        cost = sum((end - begin) * lengths[end - 1] for begin, end in bounds)
        if best_cost < 0 or cost < best_cost:
            best, best_cost = bounds, cost
    return best


class Sweep(Generic[U]):
    """The items of the requests one sweep took, sorted by length and cut into batches; ``take`` hands
    out the next one."""

    def __init__(self) -> None:
        self._batches: deque[list[tuple[U, int]]] = deque()

    def __len__(self) -> int:
        """Items not yet handed out (including those of requests that have since been dropped)."""
        return sum(len(batch) for batch in self._batches)

    def start(self, units: Sequence[U], lengths: Callable[[U], Sequence[int]], limit: int) -> None:
        """Begin a sweep over ``units`` (in arrival order): their items sorted by length (equal lengths
        keep arrival order, and items of one request their order within it), cut into batches of up to
        ``limit`` items (``batch_bounds``)."""
        keyed = [
            (length, age, index, unit)
            for age, unit in enumerate(units)
            for index, length in enumerate(lengths(unit))
        ]
        keyed.sort(key=lambda k: (k[0], k[1], k[2]))
        pieces = [(unit, index) for _, _, index, unit in keyed]
        bounds = batch_bounds([k[0] for k in keyed], limit)
        self._batches = deque(pieces[begin:end] for begin, end in bounds)

    def take(self, keep: Callable[[U], bool]) -> list[tuple[U, int]]:
        """The next batch of (request, item index) pairs, without the items of requests for which
        ``keep`` says no (answered, abandoned, past their deadline); [] when the sweep is done."""
        while self._batches:
            batch = [piece for piece in self._batches.popleft() if keep(piece[0])]
            if batch:
                return batch
        return []

    def units(self) -> list[U]:
        """The requests that still have items in the sweep (each once, in sweep order)."""
        seen: dict[int, U] = {}
        for batch in self._batches:
            for unit, _ in batch:
                seen.setdefault(id(unit), unit)
        return list(seen.values())

    def clear(self) -> None:
        self._batches.clear()


__all__ = ["SWEEP_BATCHES", "Sweep", "batch_bounds", "sweep_capacity"]
