"""Endpoint choice (pure): the least loaded serving worker of a pool; for a shared pool, its candidates.

Load is the gateway's own count of requests it has in flight to each worker (exact, and updated the
moment a request starts or ends); ties are broken by the queue depth the worker last reported (the
operator's ``status.workers[].queueDepth``, which also counts other gateways' requests), then by a turn
number that rotates among equals so that an idle pool is still shared evenly.

A shared pool (``spec.host``) is served by the pods of its ModelHost that hold its model
(``shared_candidates``): the ones where it is awake if any (the least loaded of them is then picked as
above, the load being the host pod's: every pool's requests to it count), else the ones where it sleeps
(the host wakes it for the request, which waits there, within the gateway's deadlines), else none (it is
loading or waking there, or placed nowhere yet: the request is held like one for a pool at zero).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from modelpool_contract.states import SERVING_STATES
from modelpool_gateway.state import HostPod, Key

#: A model in one of these states on a host answers at once; in ``ASLEEP`` it is woken by the request.
AWAKE: frozenset[str] = frozenset(SERVING_STATES)
ASLEEP: frozenset[str] = frozenset({"Sleeping"})


@dataclass(frozen=True)
class Candidate:
    """A serving worker and what is known about its load."""

    key: Key
    in_flight: int
    queue_depth: int | None = None


def load_bound(total: int, workers: int, load_factor: float) -> int:
    """The most requests in flight a worker may hold once it takes the next one (Mirrokni et al.'s bounded
    load: ``total`` in flight over ``workers``), shared by the prefix ring and the adapter preference."""
    return math.ceil(load_factor * (total + 1) / workers)


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


def pick_adapter(
    candidates: Sequence[Candidate],
    holders: Collection[Key],
    exclude: Collection[Key] = (),
    turn: int = 0,
    *,
    load_factor: float = 1.25,
) -> Key | None:
    """The worker for a request naming a LoRA adapter: the least loaded of those that hold it in memory
    (``holders``, from the pool's status) while that one stays within the bounded-load share
    (``prefix.load_bound``: at most ``ceil(load_factor * (total + 1) / n)`` in flight), so an adapter's
    requests skip a load and the worker stays warm without piling up on it; else the least loaded of all
    (which loads it)."""
    held = [c for c in candidates if c.key in holders and c.key not in exclude]
    chosen = pick(held, exclude, turn)
    open_ = [c for c in candidates if c.key not in exclude]
    if chosen is not None:
        bound = load_bound(sum(c.in_flight for c in open_), len(open_), load_factor)
        if next(c for c in held if c.key == chosen).in_flight + 1 <= bound:
            return chosen
    return pick(candidates, exclude, turn)


def shared_candidates(pool: str, host: str, pods: Iterable[HostPod]) -> list[HostPod]:
    """The pods of ModelHost ``host`` a request for shared pool ``pool`` may go to now: those that can be
    reached (Ready, an address, not deleting) and hold the model awake; when none does, those where it
    sleeps; else none (hold the request)."""
    reachable = [p for p in pods if p.host == host and p.reachable]
    for states in (AWAKE, ASLEEP):
        found = [p for p in reachable if p.models.get(pool) in states]
        if found:
            return found
    return []
