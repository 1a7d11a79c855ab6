"""The memory ledger: derived from the workers that exist, plus reservations.

Derive, don't count: every pass rebuilds the ledger from the observed workers of ALL pools (Failed and
Dead workers are charged 0 by ``worker_state``), so nothing can leak.  The one piece of state is the set of
*reservations*: memory promised to pods the operator is creating but has not yet seen in its watch.

A reservation ends only when the memory is known to be counted elsewhere or held by nothing:

* its pod is observed (its charge then comes from the pod);
* its create was refused (the API answered 4xx: ``release``);
* its pod is known absent: asked (``due``, then ``absent``) no earlier than ``check_s`` after the
  create's answer, or after a create whose outcome is unknown (a timeout, a 5xx) ended, and found
  missing (made and deleted before the watch showed it, or never made).

Never by age alone: a slow API server or a lagging watch can keep a pod unobserved for longer than any
timeout, and a reservation dropped then would leave its memory counted nowhere (over-admission).  Two
pools planning one after the other therefore see each other's reservations and can never over-admit.

The wiring must compute the ledger, plan, and ``reserve`` the planned creations without an ``await`` in
between (asyncio makes that block atomic), then create the pods.

The budget itself (``BudgetLimit``): the named ModelBudget's size; no limit when it does not exist; and
when it exists but cannot be read (a quantity the CRD's pattern lets through but the parser refuses,
e.g. ``1e41``; an old CRD without the schema), nothing is admitted until it is fixed: failing open would
let every pool grow without bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property

from modelpool_contract.api import Condition, ModelBudgetStatus, PoolShare
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
    # When to ask the API whether the pod exists, should it still be unobserved; None while its create has
    # not answered (the pod may appear at any moment: never asked about).
    check_after: datetime | None = None

    # Cached: with thousands of pods still unobserved (a scale-up of every pool at once), each pass looks
    # at every reservation.
    @cached_property
    def key(self) -> WorkerKey:
        return (self.namespace, self.worker)

    @cached_property
    def pool_key(self) -> PoolKey:
        return (self.namespace, self.pool)


@dataclass(frozen=True)
class BudgetLimit:
    """What the operator's ModelBudget allows: ``total`` bytes (None: no ModelBudget, no limit), or, when
    it exists but does not parse, ``invalid`` says why and nothing is admitted."""

    total: int | None = None
    invalid: str | None = None


@dataclass(frozen=True)
class Ledger:
    """Memory in use (``used``: observed workers), promised (``reserved``) and available (``total``).

    ``total`` None means no ModelBudget exists: everything is admitted (and still accounted), unless
    ``invalid`` is set: the ModelBudget exists but is invalid, and nothing is admitted.
    """

    total: int | None
    used: int
    reserved: int
    shares: Mapping[PoolKey, int] = field(default_factory=dict)
    reservations: tuple[Reservation, ...] = ()
    invalid: str | None = None

    @property
    def free(self) -> int | None:
        """What is left to admit (None: unlimited); negative when over-committed; 0 when invalid."""
        if self.invalid is not None:
            return 0
        return None if self.total is None else self.total - self.used - self.reserved

    def with_reserved(self, extra: int) -> Ledger:
        """This ledger with ``extra`` more bytes reserved (the planner's running view of its own creates)."""
        return replace(self, reserved=self.reserved + extra)


def live_reservations(
    reservations: Iterable[Reservation], observed: Iterable[WorkerKey]
) -> tuple[Reservation, ...]:
    """Reservations still in force: their pod not yet observed (however long ago they were made)."""
    seen = set(observed)
    return tuple(r for r in reservations if r.key not in seen)


def build_ledger(
    total: int | None,
    workers: Iterable[ObservedWorker],
    reservations: Iterable[Reservation] = (),
    *,
    invalid: str | None = None,
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
    return Ledger(
        total=total, used=used, reserved=reserved, shares=shares, reservations=live, invalid=invalid
    )


@dataclass(frozen=True)
class PoolCharge:
    """One pool's observed workers summed once: the memory they are charged and their keys (a reservation
    whose pod is among them is over)."""

    used: int
    keys: frozenset[WorkerKey]

    @classmethod
    def of(cls, workers: Iterable[ObservedWorker]) -> PoolCharge:
        workers = list(workers)
        return cls(used=sum(w.memory for w in workers), keys=frozenset(w.key for w in workers))


def ledger_from_charges(
    total: int | None,
    charges: Mapping[PoolKey, PoolCharge],
    book: ReservationBook,
    *,
    invalid: str | None = None,
) -> Ledger:
    """``build_ledger`` from each pool's ``PoolCharge`` (the sums a pool's workers had when last observed):
    O(pools + reservations), not O(workers). Drops from ``book`` the reservations whose pod is observed
    (a pod is indexed under its own pool, the pool its reservation names)."""

    def observed(reservation: Reservation) -> bool:
        charge = charges.get(reservation.pool_key)
        return charge is not None and reservation.key in charge.keys

    live = book.prune_where(observed)
    shares = {key: charge.used for key, charge in charges.items() if charge.used}
    return Ledger(
        total=total,
        used=sum(shares.values()),
        reserved=sum(r.memory for r in live),
        shares=shares,
        reservations=live,
        invalid=invalid,
    )


def admits(ledger: Ledger, memory: int) -> bool:
    """True when one more worker of ``memory`` bytes fits: used + reserved + memory <= total; never while
    the budget is invalid (fail closed)."""
    if ledger.invalid is not None:
        return False
    return ledger.total is None or ledger.used + ledger.reserved + memory <= ledger.total


#: The ModelBudget's condition: whether the operator can read its spec (False: nothing is admitted).
BUDGET_VALID = "Valid"


def budget_validity(ledger: Ledger) -> tuple[bool, str, str]:
    """The ModelBudget's Valid condition for this ledger: (status, reason, message)."""
    if ledger.invalid is not None:
        return False, "InvalidSpec", f"{ledger.invalid}; no worker is admitted until it is fixed"
    total = "no limit" if ledger.total is None else format_quantity(ledger.total)
    return True, "SpecValid", f"workers are admitted within {total}"


def budget_status(ledger: Ledger, conditions: Iterable[Condition] = ()) -> ModelBudgetStatus:
    """The ModelBudget status for this ledger (pools sorted by namespace/name), with ``conditions``."""
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
        conditions=list(conditions),
    )


class ReservationBook:
    """The operator's in-memory set of reservations (the only budget state that is not derived).

    Not thread-safe by design: it lives on the operator's event loop, and callers reserve in the same
    synchronous block in which they planned.  Losing it (operator restart) is safe: the restarted operator
    lists every pod before its first pass (Kopf's indices), so a pod created before the restart is observed,
    and one whose create never landed holds nothing.

    The life of a reservation: ``reserve`` (planned) → the create answers: ``release`` (refused: 4xx) or
    ``answered`` (made, already there, or the outcome is unknown: the pod may exist) → ``prune`` drops it
    once its pod is observed; until then, every ``check_s`` after the answer, ``due`` hands it out to be
    asked about, and ``absent`` ends it when the API says the pod does not exist.
    """

    def __init__(self) -> None:
        self._items: dict[WorkerKey, Reservation] = {}

    def reserve(self, namespace: str, pool: str, worker: str, memory: int, now: datetime) -> Reservation:
        """Promise ``memory`` to a worker about to be created."""
        reservation = Reservation(namespace=namespace, pool=pool, worker=worker, memory=memory, created=now)
        self._items[reservation.key] = reservation
        return reservation

    def release(self, namespace: str, worker: str) -> None:
        """The create was refused (the API answered 4xx): no pod holds the memory; forget the reservation."""
        self._items.pop((namespace, worker), None)

    def answered(self, namespace: str, worker: str, now: datetime, check_s: float) -> None:
        """The create answered (made, or a pod of that name existed) or ended without a known outcome: the
        pod may exist, so the reservation stays until it is observed; it is asked about after ``check_s``."""
        reservation = self._items.get((namespace, worker))
        if reservation is not None:
            self._items[reservation.key] = replace(reservation, check_after=now + timedelta(seconds=check_s))

    def prune(self, observed: Iterable[WorkerKey]) -> tuple[Reservation, ...]:
        """Drop the reservations whose pod was observed; return those still live (all the others)."""
        live = live_reservations(self._items.values(), observed)
        self._items = {r.key: r for r in live}
        return live

    def prune_where(self, observed: Callable[[Reservation], bool]) -> tuple[Reservation, ...]:
        """``prune`` with a test of whether a reservation's pod is observed (no set of every worker)."""
        live = tuple(r for r in self._items.values() if not observed(r))
        if len(live) != len(self._items):
            self._items = {r.key: r for r in live}
        return live

    def due(self, now: datetime, check_s: float) -> tuple[Reservation, ...]:
        """The answered reservations whose pod is still unobserved at their check time: to be asked about.
        Each is handed out once per ``check_s`` (its next check is set now, so passes running at the same
        time do not ask twice)."""
        due = tuple(r for r in self._items.values() if r.check_after is not None and r.check_after <= now)
        later = now + timedelta(seconds=check_s)
        for reservation in due:
            self._items[reservation.key] = replace(reservation, check_after=later)
        return due

    def absent(self, reservation: Reservation) -> None:
        """The API said ``reservation``'s pod does not exist (asked after its create's answer): forget it,
        unless it has been replaced by a newer reservation of the same name meanwhile."""
        held = self._items.get(reservation.key)
        if held is not None and held.created == reservation.created:
            del self._items[reservation.key]

    def all(self) -> tuple[Reservation, ...]:
        """Every reservation held."""
        return tuple(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
