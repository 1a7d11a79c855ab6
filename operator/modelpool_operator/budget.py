"""The memory ledger: derived from the workers that exist, plus short-lived reservations.

Derive, don't count: every pass rebuilds the ledger from the observed workers of ALL pools (Failed and
Dead workers are charged 0 by ``worker_state``), so nothing can leak.  The one piece of state is the set of
*reservations*: memory promised to pods the operator is creating but has not yet seen in its watch.
A reservation ends when its pod is observed (its charge then comes from the pod), when its creation
fails (``release``), or after a TTL (a create that vanished).  Two pools planning one after the other
therefore see each other's reservations and can never over-admit.

The wiring must compute the ledger, plan, and ``reserve`` the planned creations without an ``await`` in
between (asyncio makes that block atomic), then create the pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from modelpool_contract.api import ModelBudgetStatus, PoolShare
from modelpool_contract.quantity import format_quantity
from modelpool_operator.pool import PoolKey
from modelpool_operator.worker_state import ObservedWorker

WorkerKey = tuple[str, str]  # (namespace, pod name)


@dataclass(frozen=True)
class Reservation:
    """Memory promised to a worker pod whose creation has been decided but not yet observed."""

    namespace: str
    pool: str
    worker: str
    memory: int
    created: datetime

    @property
    def key(self) -> WorkerKey:
        return (self.namespace, self.worker)

    @property
    def pool_key(self) -> PoolKey:
        return (self.namespace, self.pool)


@dataclass(frozen=True)
class Ledger:
    """Memory in use (``used``: observed workers), promised (``reserved``) and available (``total``).

    ``total`` None means no ModelBudget exists: everything is admitted (and still accounted).
    """

    total: int | None
    used: int
    reserved: int
    shares: Mapping[PoolKey, int] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()

    @property
    def free(self) -> int | None:
        """What is left to admit (None: unlimited); negative when over-committed."""
        return None if self.total is None else self.total - self.used - self.reserved

    def with_reserved(self, extra: int) -> Ledger:
        """This ledger with ``extra`` more bytes reserved (the planner's running view of its own creates)."""
        return replace(self, reserved=self.reserved + extra)


def live_reservations(
    reservations: Iterable[Reservation],
    observed: Iterable[WorkerKey],
    now: datetime,
    ttl_s: float,
) -> tuple[Reservation, ...]:
    """Reservations still in force: their pod not yet observed and younger than the TTL."""
    seen = set(observed)
    limit = timedelta(seconds=ttl_s)
    return tuple(r for r in reservations if r.key not in seen and now - r.created < limit)


def build_ledger(
    total: int | None, workers: Iterable[ObservedWorker], reservations: Iterable[Reservation] = ()
) -> Ledger:
    """The ledger from every pool's observed workers and the live reservations.

    A reservation whose pod is among ``workers`` is dropped (the pod's own charge counts instead), so a
    worker is never charged twice.
    """
    workers = list(workers)
    shares: dict[PoolKey, int] = {}
    used = 0
    for worker in workers:
        used += worker.memory
        if worker.memory:
            shares[worker.pool_key] = shares.get(worker.pool_key, 0) + worker.memory
    observed = {w.key for w in workers}
    live = tuple(r for r in reservations if r.key not in observed)
    reserved = sum(r.memory for r in live)
    return Ledger(total=total, used=used, reserved=reserved, shares=shares, reservations=live)


def admits(ledger: Ledger, memory: int) -> bool:
    """True when one more worker of ``memory`` bytes fits: used + reserved + memory <= total."""
    return ledger.total is None or ledger.used + ledger.reserved + memory <= ledger.total


def budget_status(ledger: Ledger) -> ModelBudgetStatus:
    """The ModelBudget status for this ledger (pools sorted by namespace/name)."""
    pools = [
        PoolShare(namespace=ns, name=name, memory=format_quantity(mem), memory_bytes=mem)
        for (ns, name), mem in sorted(ledger.shares.items())
    ]
    return ModelBudgetStatus(
        used=format_quantity(ledger.used),
        used_bytes=ledger.used,
        reserved=format_quantity(ledger.reserved),
        reserved_bytes=ledger.reserved,
        pools=pools,
    )


class ReservationBook:
    """The operator's in-memory set of reservations (the only budget state that is not derived).

    Not thread-safe by design: it lives on the operator's event loop, and callers reserve in the same
    synchronous block in which they planned.  Losing it (operator restart) is safe: reservations only
    cover the moment between a create call and its watch event, and the restarted operator lists pods.
    """

    def __init__(self) -> None:
        self._items: dict[WorkerKey, Reservation] = {}

    def reserve(self, namespace: str, pool: str, worker: str, memory: int, now: datetime) -> Reservation:
        """Promise ``memory`` to a worker about to be created."""
        reservation = Reservation(namespace=namespace, pool=pool, worker=worker, memory=memory, created=now)
        self._items[reservation.key] = reservation
        return reservation

    def release(self, namespace: str, worker: str) -> None:
        """The creation failed (or the pod was seen): forget the reservation."""
        self._items.pop((namespace, worker), None)

    def prune(self, observed: Iterable[WorkerKey], now: datetime, ttl_s: float) -> tuple[Reservation, ...]:
        """Drop reservations whose pod was observed or that expired; return those still live."""
        live = live_reservations(self._items.values(), observed, now, ttl_s)
        self._items = {r.key: r for r in live}
        return live

    def all(self) -> tuple[Reservation, ...]:
        """Every reservation held (live or not yet pruned)."""
        return tuple(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
