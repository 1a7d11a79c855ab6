"""Endpoint choice (pure): the least loaded serving worker of a pool.

Load is the gateway's own count of requests it has in flight to each worker (exact, and updated the
moment a request starts or ends); ties are broken by the queue depth the worker last reported (the
operator's ``status.workers[].queueDepth``, which also counts other gateways' requests), then by a turn
number that rotates among equals so that an idle pool is still shared evenly.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from modelpool_gateway.state import Key


@dataclass(frozen=True)
class Candidate:
    """A serving worker and what is known about its load."""

    key: Key
    in_flight: int
    queue_depth: int | None = None


def pick(candidates: Sequence[Candidate], exclude: Collection[Key] = (), turn: int = 0) -> Key | None:
    """The worker to send the next request to, or None when every candidate is excluded."""
    best: list[Candidate] = []
    best_load: tuple[int, int] | None = None
    for c in candidates:
        if c.key in exclude:
            continue
        load = (c.in_flight, c.queue_depth or 0)
        if best_load is None or load < best_load:
            best, best_load = [c], load
        elif load == best_load:
            best.append(c)
    if not best:
        return None
    best.sort(key=lambda c: c.key)
    return best[turn % len(best)].key
