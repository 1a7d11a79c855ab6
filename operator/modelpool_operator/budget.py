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

The budget itself (``BudgetLimit``): the named ModelBudget's size; when it exists but cannot be read (a
quantity the CRD's pattern lets through but the parser refuses, e.g. ``1e41``; an old CRD without the
schema), nothing is admitted until it is fixed (``BudgetInvalid``): failing open would let every pool grow
without bound. When it does not exist, the operator's ``missing_budget`` setting decides
(``missing_budget_limit``): ``refuse`` (the chart's default) admits nothing until it exists
(``BudgetMissing``: an upgrade or a deletion never opens the budget), ``admit`` admits everything (still
accounted).

What a worker is charged (``worker_charge``; issue 30): only pods the operator made count at all
(``observe.ownership``: a controller owner reference to the pool, or ModelHost, by uid), and each is
charged from its owner, never from anything on the pod a user may write (its ``modelpool.dev/memory-bytes``
annotation is a note for people and tools, ignored by the ledger):

* a pool's worker: the larger of the pool's ``spec.resources.memory`` now and the charge the operator last
  recorded for that worker in the pool's status (``status.workers[].memory``, written only by the
  operator through the status subresource). A rollout that lowers the memory so never under-charges the
  workers made from the older spec: they keep the larger charge until they are gone;
* a host pod: its ModelHost's ``host_charge`` now;
* only when the owner's spec does not parse and nothing is recorded, the pod's server container's memory
  limit (or request), which the pod cannot change without the resize subresource.

The memory a server measures (``status.workers[].acceleratorMemory``) is reported, never charged: it can
neither lower a charge below the declaration nor raise one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property

from modelpool_contract.api import Condition, MissingBudget, ModelBudgetStatus, PoolShare
from modelpool_contract.quantity import format_quantity
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.pool import PoolKey

WorkerKey = tuple[str, str]  # (namespace, pod name)

#: The BudgetExceeded condition's reason (and the Warning Event's) while nothing is admitted because the
#: ModelBudget is invalid, or missing under ``missing_budget=refuse``.
BUDGET_INVALID = "BudgetInvalid"
BUDGET_MISSING = "BudgetMissing"


def worker_charge(declared: int | None, recorded: int | None) -> int | None:
    """A worker's charge (module doc): the larger of its owner's declaration now and the charge recorded
    for it in its owner's status; None when neither is known (the caller falls back to the container)."""
    known = [value for value in (declared, recorded) if value is not None]
    return max(known) if known else None


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
    nothing is admitted (it does not parse; or it is missing and the operator refuses without one),
    ``invalid`` says why and ``reason`` names the case (``BUDGET_INVALID`` or ``BUDGET_MISSING``)."""

    total: int | None = None
    invalid: str | None = None
    reason: str = BUDGET_INVALID


def missing_budget_limit(name: str, missing: MissingBudget) -> BudgetLimit:
    """What a ModelBudget ``name`` that does not exist allows (pure): everything under ``admit``; nothing
    under ``refuse``, with a message that names the budget and how to end the wait."""
    if missing == "admit":
        return BudgetLimit()
    return BudgetLimit(
        invalid=(
            f"ModelBudget {name} does not exist (the operator's missing_budget setting is refuse): create it "
            f"(kubectl apply a ModelBudget named {name}, or the chart's budget.create)"
        ),
        reason=BUDGET_MISSING,
    )


@dataclass(frozen=True)
class Ledger:
    """Memory in use (``used``: observed workers), promised (``reserved``) and available (``total``).

    ``total`` None means no limit: everything is admitted (and still accounted), unless ``invalid`` is
    set: nothing is admitted, for the ``closed_reason`` (the ModelBudget is invalid, or missing and the
    operator refuses without one).
    """

    total: int | None
    used: int
    reserved: int
    shares: Mapping[PoolKey, int] = field(default_factory=dict)
    # The live reservations by pool.
    by_pool: Mapping[PoolKey, Mapping[WorkerKey, Reservation]] = field(default_factory=dict)
    invalid: str | None = None
    closed_reason: str = BUDGET_INVALID

    @property
    def reservations(self) -> tuple[Reservation, ...]:
        """Every live reservation."""
        return tuple(r for held in self.by_pool.values() for r in held.values())

    def reservations_of(self, pool: PoolKey) -> tuple[Reservation, ...]:
        """The pool's live reservations (its creations in flight)."""
        return tuple(self.by_pool.get(pool, {}).values())

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
    closed_reason: str = BUDGET_INVALID,
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
        total=total,
        used=used,
        reserved=reserved,
        shares=shares,
        by_pool=_by_pool(live),
        invalid=invalid,
        closed_reason=closed_reason,
    )


def _by_pool(reservations: Iterable[Reservation]) -> dict[PoolKey, dict[WorkerKey, Reservation]]:
    grouped: dict[PoolKey, dict[WorkerKey, Reservation]] = {}
    for r in reservations:
        grouped.setdefault(r.pool_key, {})[r.key] = r
    return grouped


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
    closed_reason: str = BUDGET_INVALID,
    sums: tuple[int, Mapping[PoolKey, int]] | None = None,
) -> Ledger:
    """``build_ledger`` from each pool's ``PoolCharge`` (the sums a pool's workers had when last observed):
    O(pools), not O(workers) nor O(reservations); ``sums``: their total and non-zero shares, when kept
    already (``ChargeCache``). Drops from ``book`` the reservations whose pod is observed (a pod is indexed
    under its own pool, the pool its reservation names)."""
    book.prune_charges(charges)
    if sums is None:
        shares = {key: charge.used for key, charge in charges.items() if charge.used}
        sums = (sum(shares.values()), shares)
    used, shares = sums[0], dict(sums[1])
    return Ledger(
        total=total,
        used=used,
        reserved=book.reserved,
        shares=shares,
        by_pool=book.by_pool(),
        invalid=invalid,
        closed_reason=closed_reason,
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


def budget_status(
    ledger: Ledger, conditions: Iterable[Condition] = (), active_operator: str | None = None
) -> ModelBudgetStatus:
    """The ModelBudget status for this ledger (pools sorted by namespace/name), with ``conditions`` and the
    replica that writes it (``active_operator``)."""
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
        active_operator=active_operator or None,
    )


def _check_time(reservation: Reservation) -> datetime:
    return reservation.check_after or reservation.created  # only answered ones (with a check time) are due


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
        # The same reservations by pool; each pool's dict is replaced, never changed, so that a ledger's
        # ``by_pool`` (a copy of the outer dict) stays as it was when it was made.
        self._by_pool: dict[PoolKey, dict[WorkerKey, Reservation]] = {}
        self._reserved = 0
        # The PoolCharge each pool's reservations were last pruned against (the same one: nothing to do).
        self._pruned: dict[PoolKey, PoolCharge] = {}
        # No check is due before this (None: none is set); kept no later than the earliest check.
        self._next_check: datetime | None = None

    def _put(self, reservation: Reservation) -> None:
        self._drop(reservation.key)
        self._items[reservation.key] = reservation
        pool = reservation.pool_key
        self._by_pool[pool] = {**self._by_pool.get(pool, {}), reservation.key: reservation}
        self._reserved += reservation.memory
        self._pruned.pop(pool, None)  # a new name: look at it at the next prune
        check = reservation.check_after
        if check is not None and (self._next_check is None or check < self._next_check):
            self._next_check = check

    def _drop(self, key: WorkerKey) -> None:
        reservation = self._items.pop(key, None)
        if reservation is None:
            return
        pool = reservation.pool_key
        held = {k: r for k, r in self._by_pool.get(pool, {}).items() if k != key}
        if held:
            self._by_pool[pool] = held
        else:
            self._by_pool.pop(pool, None)
            self._pruned.pop(pool, None)
        self._reserved -= reservation.memory

    def reserve(self, namespace: str, pool: str, worker: str, memory: int, now: datetime) -> Reservation:
        """Promise ``memory`` to a worker about to be created."""
        reservation = Reservation(namespace=namespace, pool=pool, worker=worker, memory=memory, created=now)
        self._put(reservation)
        return reservation

    def release(self, namespace: str, worker: str) -> None:
        """The create was refused (the API answered 4xx): no pod holds the memory; forget the reservation."""
        self._drop((namespace, worker))

    def answered(self, namespace: str, worker: str, now: datetime, check_s: float) -> None:
        """The create answered (made, or a pod of that name existed) or ended without a known outcome: the
        pod may exist, so the reservation stays until it is observed; it is asked about after ``check_s``."""
        reservation = self._items.get((namespace, worker))
        if reservation is not None:
            self._put(replace(reservation, check_after=now + timedelta(seconds=check_s)))

    def prune(self, observed: Iterable[WorkerKey]) -> tuple[Reservation, ...]:
        """Drop the reservations whose pod was observed; return those still live (all the others)."""
        for key in set(observed) & self._items.keys():
            self._drop(key)
        return self.all()

    def prune_charges(self, charges: Mapping[PoolKey, PoolCharge]) -> None:
        """``prune`` against each pool's observed workers: only the pools that hold reservations and whose
        workers were observed anew since they were last looked at."""
        for pool in list(self._by_pool):
            charge = charges.get(pool)
            if charge is None or self._pruned.get(pool) is charge:
                continue
            for key in [k for k in self._by_pool[pool] if k in charge.keys]:
                self._drop(key)
            if pool in self._by_pool:
                self._pruned[pool] = charge

    @property
    def reserved(self) -> int:
        """The memory of every reservation held."""
        return self._reserved

    def by_pool(self) -> dict[PoolKey, dict[WorkerKey, Reservation]]:
        """Every reservation held, by pool (a copy: later changes to the book do not show in it)."""
        return dict(self._by_pool)

    def due(
        self,
        now: datetime,
        check_s: float,
        *,
        limit: int | None = None,
        known: Callable[[Reservation], bool] | None = None,
    ) -> tuple[Reservation, ...]:
        """The answered reservations whose pod is still unobserved at their check time: to be asked about.
        Each is handed out once per ``check_s`` (its next check is set now, so passes running at the same
        time do not ask twice). At most ``limit`` are handed out, the longest due first; the others stay
        due for the next call. One whose pod is ``known`` to exist (the pods index shows it: it ends at its
        pool's next pass) is not handed out and counts for no ``limit``; its next check is set all the
        same."""
        if self._next_check is None or self._next_check > now:
            return ()
        due = [r for r in self._items.values() if r.check_after is not None and r.check_after <= now]
        later = now + timedelta(seconds=check_s)
        asked: list[Reservation] = []
        for reservation in sorted(due, key=_check_time):
            if limit is not None and len(asked) >= limit:
                break
            if known is None or not known(reservation):
                asked.append(reservation)
            self._put(replace(reservation, check_after=later))
        self._next_check = None
        for reservation in self._items.values():
            check = reservation.check_after
            if check is not None and (self._next_check is None or check < self._next_check):
                self._next_check = check
        return tuple(asked)

    def due_by(self, now: datetime) -> bool:
        """Whether a check may be due at ``now`` (cheap: ``due`` says which)."""
        return self._next_check is not None and self._next_check <= now

    def absent(self, reservation: Reservation) -> None:
        """The API said ``reservation``'s pod does not exist (asked after its create's answer): forget it,
        unless it has been replaced by a newer reservation of the same name meanwhile."""
        held = self._items.get(reservation.key)
        if held is not None and held.created == reservation.created:
            self._drop(reservation.key)

    def all(self) -> tuple[Reservation, ...]:
        """Every reservation held."""
        return tuple(self._items.values())

    def __len__(self) -> int:
        return len(self._items)
