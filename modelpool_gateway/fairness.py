"""Fair shares of a full pool between API keys (issue 34 item 3): a weighted fair queue per pool.

**When.** The gateway counts the requests it has in flight to each pool (``FairQueues.running``) and
knows the pool's capacity: its workers' bounded queue (``spec.queue.capacity``) times its routable workers
(``pool_capacity``).  While that is not reached and nobody waits, a request goes on at once (one counter,
no queueing). Once it is reached, a request waits in the pool's fair queue instead of being sent to a
worker that would answer 429: whoever came first would otherwise take every slot that frees.

**Who goes next.** Each key has a FIFO of its waiting requests and a weight (the key Secret's ``weight``,
default 1: ``Share``). A freed slot goes to the request with the smallest virtual start tag (start-time
fair queuing, Goyal et al. 1996): a request's start is ``max(V, the finish of its key's previous one)``
and its finish ``start + 1 / weight``, where ``V`` is the start of the request served last. So under
backlog any two keys' served counts divided by their weights differ by at most ``1/w_i + 1/w_j``, a key
that sends less than its share is served next (its start is ``V``; a flood's starts are far ahead), and
no waiting key starves (its head's start is fixed, and every other key's grow past it). Ties go to the
earlier arrival. A key whose FIFO empties forgets its finish (memory stays bounded by the waiting
requests).

**Bounds.** At most ``max_per_key`` waiting requests per key and pool and ``max_per_pool`` per pool (one
more is refused at once: 429 with Retry-After, ``QueueRefusal``); each waits at most until its deadline (the
hold's: ``max_hold_seconds`` within the client's ``x-request-timeout``; then 429 ``queue_timeout``). The
gateway's ``max_in_flight`` bounds all pools together.

**Priority** (the key Secret's ``priority``, default 0) orders the hold of a pool at zero (``hold``): a
higher priority is released first when a worker comes, the lowest is held longest.

**Several gateway replicas** each share out the slots of their own traffic: a replica counts only its own
requests against the pool's whole capacity (no shared counter), so with N replicas the workers may fill
with other replicas' requests first; a worker that is full then answers 429, passed on as before. Keys
spread over the replicas by the Service get their weights' shares on each. Shared pools
(``spec.host``: a host pod's capacity is shared by many models) are not queued here.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final, Generic, Literal, TypeVar

from modelpool_gateway.state import Key, Pool

T = TypeVar("T")
Caller = Hashable  # an API key's digest; None with --auth none (one key for everybody)

DEFAULT_WEIGHT: Final = 1
DEFAULT_PRIORITY: Final = 0

QueueRefusal = Literal["key_queue_full", "queue_full"]


@dataclass(frozen=True)
class Share:
    """A key's weight in a full pool's fair queue and its priority in a hold at zero (None: not set)."""

    weight: int | None = None
    priority: int | None = None

    @property
    def effective_weight(self) -> int:
        return DEFAULT_WEIGHT if self.weight is None else self.weight

    @property
    def effective_priority(self) -> int:
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    @property
    def outranks_default(self) -> bool:
        """A weight or priority above the defaults: only the admin namespace's key Secrets may set one."""
        return self.effective_weight > DEFAULT_WEIGHT or self.effective_priority > DEFAULT_PRIORITY

    def strictest(self, other: Share) -> Share:
        """The lower of each set field: a key held by several Secrets gets the least of their weights and
        priorities, so a tenant's own Secret cannot raise what the admin's set."""

        def low(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else min(a, b)

        return Share(low(self.weight, other.weight), low(self.priority, other.priority))


EQUAL_SHARE: Final = Share()


def pool_capacity(pool: Pool | None, routable: int) -> int | None:
    """The requests a pool takes at once from this gateway: its workers' queue capacity times its routable
    workers; None (no fair queue): the pool is gone, shared (``spec.host``) or its capacity unknown."""
    if pool is None or pool.host is not None or pool.queue_capacity is None:
        return None
    return pool.queue_capacity * routable


# ---- the scheduler (pure) -----------------------------------------------------------------------------


@dataclass(eq=False)
class _Entry(Generic[T]):
    item: T
    tag: Fraction
    seq: int


class FairScheduler(Generic[T]):
    """One pool's waiting requests: a FIFO per key, served by the smallest virtual finish tag (module
    docstring), bounded per key and in total; ``_Entry.tag`` is a request's start tag."""

    def __init__(self, max_per_key: int, max_total: int) -> None:
        self.max_per_key = max_per_key
        self.max_total = max_total
        self._queues: dict[Caller, deque[_Entry[T]]] = {}
        self._last: dict[Caller, Fraction] = {}
        self._virtual = Fraction(0)
        self._seq = itertools.count()
        self._total = 0

    def __len__(self) -> int:
        return self._total

    def waiting(self, caller: Caller) -> int:
        queue = self._queues.get(caller)
        return len(queue) if queue else 0

    def push(self, caller: Caller, item: T, weight: int = DEFAULT_WEIGHT) -> QueueRefusal | None:
        """Queue ``item`` for ``caller`` with ``weight`` (at least 1); or why it is refused."""
        if self.waiting(caller) >= self.max_per_key:
            return "key_queue_full"
        if self._total >= self.max_total:
            return "queue_full"
        start = max(self._virtual, self._last.get(caller, self._virtual))
        self._last[caller] = start + Fraction(1, max(1, weight))  # its finish: the key's next start
        self._queues.setdefault(caller, deque()).append(_Entry(item, start, next(self._seq)))
        self._total += 1
        return None

    def pop(self) -> T | None:
        """The next item to serve (None: nothing waits)."""
        best: tuple[Fraction, int, Caller] | None = None
        for caller, queue in self._queues.items():
            head = queue[0]
            if best is None or (head.tag, head.seq) < best[:2]:
                best = (head.tag, head.seq, caller)
        if best is None:
            return None
        caller = best[2]
        entry = self._queues[caller].popleft()
        self._virtual = max(self._virtual, entry.tag)
        self._dropped(caller)
        return entry.item

    def remove(self, caller: Caller, item: T) -> bool:
        """Take a waiting ``item`` out (it gave up); False when it is not waiting."""
        queue = self._queues.get(caller)
        if not queue:
            return False
        for entry in queue:
            if entry.item is item:
                queue.remove(entry)
                self._dropped(caller)
                return True
        return False

    def _dropped(self, caller: Caller) -> None:
        self._total -= 1
        if not self._queues[caller]:
            del self._queues[caller]
            del self._last[caller]  # an idle key starts again from V (bounded memory)


# ---- wiring ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Slot:
    """One waiting request: its future is resolved True with a slot of the pool, or False when it should
    be routed again without one (the pool lost its workers, or is gone). On SIGTERM the waiting requests
    stay: the running ones end within the shutdown grace, and each hands its slot on."""

    caller: Caller
    future: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class _PoolQueue:
    scheduler: FairScheduler[Slot]
    running: int = 0


class FairQueues:
    """Every pool's running count and fair queue; ``capacity(pool)``: its slots now (None: not queued)."""

    def __init__(self, max_per_key: int, max_per_pool: int, capacity: Callable[[Key], int | None]) -> None:
        self.max_per_key = max_per_key
        self.max_per_pool = max_per_pool
        self._capacity = capacity
        self._pools: dict[Key, _PoolQueue] = {}

    def running(self, pool: Key) -> int:
        found = self._pools.get(pool)
        return found.running if found else 0

    def queued(self, pool: Key) -> int:
        found = self._pools.get(pool)
        return len(found.scheduler) if found else 0

    def _pool(self, pool: Key) -> _PoolQueue:
        found = self._pools.get(pool)
        if found is None:
            found = self._pools[pool] = _PoolQueue(FairScheduler(self.max_per_key, self.max_per_pool))
        return found

    def try_start(self, pool: Key) -> bool:
        """Take a slot at once if the pool has one free and nobody waits for it (then ``done`` follows)."""
        capacity = self._capacity(pool)
        found = self._pool(pool)
        if capacity is None or (not found.scheduler and found.running < capacity):
            found.running += 1
            return True
        return False

    def enter(self, pool: Key, caller: Caller, share: Share) -> Slot | QueueRefusal:
        """Wait for a slot of the full pool; or why not (a bound)."""
        slot = Slot(caller)
        refused = self._pool(pool).scheduler.push(caller, slot, share.effective_weight)
        if refused is not None:
            self._forget_if_idle(pool)
            return refused
        self.changed(pool)  # a slot may have freed between the caller's try and now
        return slot

    def leave(self, pool: Key, slot: Slot) -> None:
        """A waiter that will not use a slot (deadline, client gone): out of the queue, or its slot given
        back if it had just got one."""
        found = self._pools.get(pool)
        if found is None:
            return
        if found.scheduler.remove(slot.caller, slot):
            self._forget_if_idle(pool)
        elif slot.future.done() and not slot.future.cancelled() and slot.future.result():
            self.done(pool)

    def done(self, pool: Key) -> None:
        """A request that had a slot ended: the next waiting one gets it."""
        found = self._pools.get(pool)
        if found is None:
            return
        found.running = max(0, found.running - 1)
        self.changed(pool)

    def changed(self, pool: Key) -> None:
        """The pool's capacity may have changed, or a slot freed: hand out what is free."""
        found = self._pools.get(pool)
        if found is None:
            return
        capacity = self._capacity(pool)
        while found.scheduler and (capacity is None or capacity == 0 or found.running < capacity):
            slot = found.scheduler.pop()
            assert slot is not None
            if capacity:  # no capacity: not served here any more, routed again (held, or no queue)
                found.running += 1
            slot.future.set_result(bool(capacity))
        self._forget_if_idle(pool)

    def _forget_if_idle(self, pool: Key) -> None:
        found = self._pools.get(pool)
        if found is not None and not found.scheduler and not found.running:
            del self._pools[pool]
