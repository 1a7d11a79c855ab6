"""Holding requests for a pool that has no serving worker: bounded decisions (pure) and the FIFO wiring.

A request for a pool without a serving worker (scaled to zero, or its workers still loading) waits here,
at most ``max_held_per_pool`` per pool (one more is refused at once) and at most the pool's
``activationTimeoutSeconds`` or the client's own deadline, whichever is shorter.  When the pool gets a
serving worker the held requests are released by their key's priority (``fairness.Share``: higher first,
so the lowest is held longest), in arrival order within a priority, one at a time: the next goes as soon as
the previous one has been written to its worker (or after ``RELEASE_HEAD_START_S``), so they reach the
workers in the order they arrived without a slow model serialising them; requests that arrive meanwhile
queue behind them.  A request that times out is told why
(``hold_reason``): the budget being full (without its figures, which describe other tenants' pools), a
worker still loading, or the operator not having acted yet; for a shared pool (``spec.host``) first the
host pods that hold its model (loading or waking there, or none reachable).  A pool that can never get a
worker (its replica ceiling is 0, or its spec is invalid: ``hopeless``) is not held at all: the request is
answered 503 at once with that reason.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from modelpool_contract.states import SERVING_STATES, STARTING_STATES
from modelpool_contract.times import rfc3339
from modelpool_gateway.state import Key, Pool, WorkerState

# A shared pool's model in these states on a host is on its way to serving there (``_on_hosts``).
HOST_STARTING = frozenset({"Pending", "Loading", "Waking"})

# A released request lets the next one go as soon as it has been written to its worker; this bounds the
# wait when that takes longer (a slow connect), so a full hold of 100 starts within 5 s at worst.
RELEASE_HEAD_START_S = 0.05


# ---- decisions (pure) ---------------------------------------------------------------------------------


def hold_budget(activation_timeout_s: float, client_timeout_s: float | None) -> float:
    """Seconds a request may be held: the pool's activation timeout, within the client's own deadline."""
    if client_timeout_s is None:
        return activation_timeout_s
    return max(0.0, min(activation_timeout_s, client_timeout_s))


@dataclass(frozen=True)
class HoldReason:
    """Why a pool has no serving worker: a short machine-readable kind and the message for the client."""

    kind: str
    message: str


def _age(since: datetime | None, now: datetime) -> str:
    if since is None:
        return ""
    return f" for {max(0, round((now - since).total_seconds()))} s"


def _starting(worker: WorkerState, now: datetime) -> str:
    text = f"worker {worker.name} has been {worker.state}{_age(worker.since, now)}"
    if worker.load_progress is not None:
        text += f" ({worker.load_progress:.0%} loaded)"
    if worker.reason:
        text += f" ({worker.reason}{': ' + worker.message if worker.message else ''})"
    return text


def _on_hosts(name: str, placed: Sequence[tuple[str, str]]) -> HoldReason | None:
    """Why a shared pool's model cannot take a request on the host pods that hold it (pod, state): it is
    loading or waking there, or none of them can be reached; None: it is placed nowhere."""
    if not placed:
        return None
    ordered = sorted(placed, key=lambda p: (p[1] not in HOST_STARTING, p))
    pod, state = ordered[0]
    more = f" (and {len(placed) - 1} more)" if len(placed) > 1 else ""
    if state in HOST_STARTING:
        kind = "waking" if state == "Waking" else "loading"
        return HoldReason(kind, f"pool {name} is still {kind}: host pod {pod} has it {state}{more}")
    states = ", ".join(f"{p} {s}" for p, s in sorted(placed))
    return HoldReason(
        "not_serving", f"pool {name} has no host that can take a request now: host pods {states}"
    )


def hold_reason(pool: Pool | None, now: datetime, placed: Sequence[tuple[str, str]] = ()) -> HoldReason:
    """Why ``pool`` has no serving worker, from its status as last watched (None: the pool is gone); for a
    shared pool first from the host pods that hold it, ``placed`` as (pod, the model's state there)."""
    if pool is None:
        return HoldReason("pool_deleted", "the pool was deleted while the request waited")
    name = f"{pool.namespace}/{pool.name}"
    if pool.invalid is not None:
        return HoldReason(
            "invalid_spec",
            f"pool {name} has an invalid spec ({pool.invalid}): the operator starts no worker for it",
        )
    if pool.host is not None and (on_hosts := _on_hosts(name, placed)) is not None:
        return on_hosts
    if pool.budget_exceeded:
        # Not the condition's own message: its numbers (memory free and in use across the cluster) tell a
        # caller about other tenants' pools.  The pool's owner reads them with kubectl describe.
        return HoldReason(
            "budget_exceeded",
            f"pool {name} is waiting for memory: the cluster's budget has no room for another worker now",
        )
    starting = sorted(
        (w for w in pool.workers if w.state in STARTING_STATES),
        key=lambda w: (w.state != "Loading", w.since or now),
    )
    if starting:
        more = f" (and {len(starting) - 1} more)" if len(starting) > 1 else ""
        return HoldReason("loading", f"pool {name} is still loading: {_starting(starting[0], now)}{more}")
    if pool.degraded:
        return HoldReason("failed", f"pool {name} has no serving worker: {pool.degraded}")
    others = [w for w in pool.workers if w.state not in STARTING_STATES]
    if others:
        states = ", ".join(f"{w.name} {w.state}" + (f" ({w.reason})" if w.reason else "") for w in others)
        serving = any(w.state in SERVING_STATES for w in others)
        tail = " (not yet marked serving and Ready where the gateway can see it)" if serving else ""
        return HoldReason("not_serving", f"pool {name} has no serving worker: {states}{tail}")
    if not pool.wakes_on_demand:
        return HoldReason(
            "scaled_to_zero",
            f"pool {name} has no worker and the operator starts none for demand (spec.replicas is 0 and "
            "autoscaling is off): scale it up",
        )
    recorded = f"recorded at {rfc3339(pool.demanded_at)}" if pool.demanded_at else "not recorded yet"
    if pool.host is not None:
        return HoldReason(
            "waiting_for_operator",
            f"pool {name} is on no host: waiting for the operator to place it on a host of ModelHost "
            f"{pool.host} for the demand {recorded}",
        )
    return HoldReason(
        "waiting_for_operator",
        f"pool {name} has no worker: waiting for the operator to start one for the demand {recorded}",
    )


# Reasons that no wait can change: the operator starts no worker for the pool (its ceiling is 0, or its
# spec is invalid), so a request is answered at once instead of held for the activation timeout.
NEVER_SERVED = frozenset({"scaled_to_zero", "invalid_spec"})


def hopeless(pool: Pool, now: datetime, placed: Sequence[tuple[str, str]] = ()) -> HoldReason | None:
    """Why holding a request for ``pool`` (no serving worker) cannot end with a worker; None: it can."""
    reason = hold_reason(pool, now, placed)
    return reason if reason.kind in NEVER_SERVED else None


# ---- wiring ----------------------------------------------------------------------------------------


@dataclass(eq=False)
class Baton:
    """Handed to a released request; ``passed()`` (its worker answered, or the head start ran out) lets
    the next held request of the pool go."""

    _pass: Callable[[], None]
    _timer: asyncio.TimerHandle | None = None
    _done: bool = False

    def passed(self) -> None:
        if self._done:
            return
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
        self._pass()


@dataclass(eq=False)
class Waiter:
    """One held request: released by resolving its future with a baton, or with None when the pool is
    gone or the gateway shuts down."""

    future: asyncio.Future[Baton | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    priority: int = 0


def queue_position(priorities: Sequence[int], priority: int) -> int:
    """Where a request of ``priority`` joins a hold whose waiters have ``priorities`` (front first): behind
    every one of the same or a higher priority, ahead of the lower ones."""
    position = len(priorities)
    while position > 0 and priorities[position - 1] < priority:
        position -= 1
    return position


@dataclass
class _PoolHold:
    waiters: deque[Waiter] = field(default_factory=deque)
    releasing: bool = False


class Holds:
    """The held requests of every pool, each pool a FIFO queue of bounded length."""

    def __init__(self, max_per_pool: int, routable: Callable[[Key], bool]) -> None:
        self.max_per_pool = max_per_pool
        self._routable = routable
        self._pools: dict[Key, _PoolHold] = {}

    def held(self, key: Key) -> int:
        hold = self._pools.get(key)
        return len(hold.waiters) if hold else 0

    def total(self) -> int:
        return sum(len(h.waiters) for h in self._pools.values())

    def busy(self, key: Key) -> bool:
        """Requests are held or being released: a new request must queue behind them (arrival order)."""
        hold = self._pools.get(key)
        return bool(hold and (hold.waiters or hold.releasing))

    def enter(self, key: Key, priority: int = 0) -> Waiter | None:
        """Queue a request by its key's ``priority``; None when the pool's hold is full."""
        hold = self._pools.setdefault(key, _PoolHold())
        if len(hold.waiters) >= self.max_per_pool:
            return None
        waiter = Waiter(priority=priority)
        hold.waiters.insert(queue_position([w.priority for w in hold.waiters], priority), waiter)
        # The pool may have become routable between the caller's check and now.
        self.changed(key)
        return waiter

    def leave(self, key: Key, waiter: Waiter) -> None:
        """A waiter gives up (timed out, client gone); a released one has already left."""
        hold = self._pools.get(key)
        if hold is None:
            return
        if waiter in hold.waiters:
            hold.waiters.remove(waiter)
        if not waiter.future.done():
            waiter.future.cancel()
        self._forget_if_idle(key, hold)

    def changed(self, key: Key) -> None:
        """The pool's workers changed: release the first held request if it can be served now."""
        hold = self._pools.get(key)
        if hold is None or hold.releasing or not hold.waiters or not self._routable(key):
            return
        waiter = hold.waiters.popleft()
        hold.releasing = True
        baton = Baton(lambda: self._passed(key))
        baton._timer = asyncio.get_running_loop().call_later(RELEASE_HEAD_START_S, baton.passed)
        waiter.future.set_result(baton)

    def abandon(self, key: Key | None = None) -> None:
        """Wake the held requests of ``key`` (None: of every pool) with no worker to go to."""
        for pool_key in [key] if key is not None else list(self._pools):
            hold = self._pools.pop(pool_key, None)
            for waiter in hold.waiters if hold else ():
                if not waiter.future.done():
                    waiter.future.set_result(None)

    def _passed(self, key: Key) -> None:
        hold = self._pools.get(key)
        if hold is None:
            return
        hold.releasing = False
        self.changed(key)
        self._forget_if_idle(key, hold)

    def _forget_if_idle(self, key: Key, hold: _PoolHold) -> None:
        if not hold.waiters and not hold.releasing:
            self._pools.pop(key, None)
