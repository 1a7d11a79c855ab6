"""What one operator process remembers between passes: ``Bookkeeping`` (shared by every pool's daemon) and
``PoolRun`` (one pool's daemon, from pass to pass).

Nothing here is a source of truth about the cluster: it is all rebuilt on restart (level-based). The
bookkeeping holds only what the per-pool daemons of one process must share:

* the reservations (``budget.ReservationBook``): memory promised to pods created but not yet seen in the
  watch; ``reserve`` records a plan's creations, ``ledger`` counts them with the observed workers;
* the wake-ups: one ``asyncio.Event`` per pool (``wakeup``); pod and pool watch events ``poke`` it, so a
  pool reconciles promptly after a change instead of polling in a busy loop; the pools that could not fit
  the budget (``waits_for_budget``) are woken when memory may have been freed (``poke_waiting``), and so is
  the ModelBudget's status writer (``budget_wakeup``);
* each pool's workers as its daemon last observed them (``observed``: other pools' passes read these) and
  their sums for the ledger (``charges``);
* the pass slots (``PassGate``): at most ``MAX_PASSES_IN_FLIGHT`` passes (pools' and ModelHosts') at once,
  so a thousand pools woken together (a scale-up, a restart) queue for a slot holding nothing, instead of a
  thousand passes in flight each holding what it observed while they wait for the API and for the event loop;
* the one task asking the API about due reservations (``settle_task``, ``effects.apply.settle_soon``).

The process's connections and services are apart, immutable, in ``services``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from modelpool_contract.api import ModelPoolStatus
from modelpool_operator.budget import BudgetLimit, Ledger, ReservationBook
from modelpool_operator.effects.attempts import ApiFailure
from modelpool_operator.observe.claims import BusyClaim
from modelpool_operator.observe.drift import fields_digest
from modelpool_operator.observe.observation import ChargeCache, current_ledger
from modelpool_operator.observe.ownership import ForeignPods, Tombstones
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import CounterSample, Create, Event, LoadSample
from modelpool_operator.planner.shared_scale import SharedCount
from modelpool_operator.pool import PoolKey

#: Pool passes in flight at once. A pass is observe + decide (synchronous, milliseconds), then its API
#: requests (a round trip or more each): at 1,000 pools every pool was woken at once and ~1,000 passes
#: were in flight, each holding its observation of every pool (141,000 ``ObservedWorker``s alive for
#: 10,000 pods) while the requests queued behind the client's connections and the pods watch starved.
MAX_PASSES_IN_FLIGHT = 32
#: Resync passes (a pool's pass at ``RESYNC_INTERVAL_SECONDS`` with nothing asking for one) a second, for
#: the whole process: the resync is the level-based safety net, events drive the work. At 1,000 pools a
#: resync every 10 s was 100 passes a second, and the pods watch (Kopf's events, on the same event loop)
#: fell minutes behind: the pools of the pods it had not shown yet could not converge.
RESYNCS_PER_SECOND = 10.0
#: Worker names a pool remembers as someone else's (``PoolRun.taken_names``) before it forgets them all.
TAKEN_NAMES_MAX = 64


class PassGate:
    """At most ``limit`` passes at once (FIFO: a pool waits its turn). A pool's daemon takes a slot for its
    whole pass (``slot``), and clears its wake-up once it has the slot: the pokes that came while it waited
    are answered by the pass about to read the indices, so a pool poked many times while queued gets one
    pass, never two queued (each daemon runs one pass at a time)."""

    def __init__(
        self, limit: int = MAX_PASSES_IN_FLIGHT, resyncs_per_second: float = RESYNCS_PER_SECOND
    ) -> None:
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self._resync_spacing = 1.0 / resyncs_per_second
        self._next_resync = 0.0
        self.in_flight = 0
        self.waiting = 0
        # The most passes seen in flight at once (for tests and the memory summary).
        self.peak = 0

    def resync_wait(self, now: float) -> float:
        """Seconds a resync pass due at ``now`` (monotonic) waits for its turn: the turns are handed out
        ``1 / resyncs_per_second`` apart, first come first served (the turn is taken now)."""
        turn = max(now, self._next_resync)
        self._next_resync = turn + self._resync_spacing
        return turn - now

    @asynccontextmanager
    async def slot(self, wakeup: asyncio.Event | None = None) -> AsyncIterator[None]:
        """Hold one of the slots for a pass; ``wakeup`` (the pool's) is cleared once the slot is held."""
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            if wakeup is not None:
                wakeup.clear()
            yield
        finally:
            self.in_flight -= 1
            self._slots.release()


@dataclass
class Bookkeeping:
    """The mutable per-process state the pools' daemons share (kept in Kopf's memo as ``memo.book``)."""

    reservations: ReservationBook = field(default_factory=ReservationBook)
    # Each pool's workers as its daemon last observed them (other pools' passes read these).
    observed: dict[PoolKey, list[ObservedWorker]] = field(default_factory=dict)
    # Each pool's observed workers summed for the ledger, once per observation (not once per pass).
    charges: ChargeCache = field(default_factory=ChargeCache)
    # Set when the ModelBudget's status may have changed (memory charged, freed or reserved).
    budget_wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    _wakeups: dict[PoolKey, asyncio.Event] = field(default_factory=dict)
    _waiting: set[PoolKey] = field(default_factory=set)
    # The shared pools on each ModelHost (namespace, name): a change of the host or its pods wakes them.
    _on_host: dict[PoolKey, PoolKey] = field(default_factory=dict)
    # Each ModelHost's control key (namespace, name): made by this process, or read once from its Secret.
    control_keys: dict[PoolKey, str] = field(default_factory=dict)
    # Each shared pool's count and retries as its pass last decided them (its ModelHost's pass places by it).
    shared: dict[PoolKey, SharedCount] = field(default_factory=dict)
    # The pools' passes in flight (``PassGate``).
    passes: PassGate = field(default_factory=PassGate)
    # The foreign pods already reported (``observe.ownership``: never counted, reported once each).
    foreign: ForeignPods = field(default_factory=ForeignPods)
    # Deleted pools' and ModelHosts' records while their pods terminate (``observe.ownership``: charged).
    tombstones: Tombstones = field(default_factory=Tombstones)
    # The one task asking the API about due reservations (``effects.apply.settle_soon``), while it runs.
    settle_task: asyncio.Task[None] | None = None
    # The owned objects each running daemon's pool or ModelHost lost since its last pass, by kind: None when
    # deleted, else the object as edited (``owned``); and the digest of each one's fields as last seen.
    _lost: dict[PoolKey, dict[str, Mapping[str, Any] | None]] = field(default_factory=dict)
    _seen: dict[PoolKey, dict[str, int]] = field(default_factory=dict)

    # ---- the ledger -------------------------------------------------------------------------------------

    def ledger(self, workers: Mapping[PoolKey, list[ObservedWorker]], limit: BudgetLimit) -> Ledger:
        """The ledger over ``workers`` plus the live reservations (ending those whose pod is observed)."""
        return current_ledger(workers, self.reservations, limit=limit, charges=self.charges)

    def reserve(self, key: PoolKey, creates: Iterable[Create], now: datetime) -> None:
        """Record a plan's creations before anything is awaited (``reconcile.decide``)."""
        for create in creates:
            self.reservations.reserve(key[0], key[1], create.name, create.memory, now)

    # ---- wake-ups ---------------------------------------------------------------------------------------

    def wakeup(self, key: PoolKey) -> asyncio.Event:
        """The pool's wake-up event (created on first use: its daemon runs in this process)."""
        event = self._wakeups.get(key)
        if event is None:
            event = self._wakeups[key] = asyncio.Event()
        return event

    def poke(self, key: PoolKey) -> None:
        """Ask the pool's daemon for a pass now (a no-op for pools this process does not run)."""
        event = self._wakeups.get(key)
        if event is not None:
            event.set()

    def waits_for_budget(self, key: PoolKey, waiting: bool) -> None:
        """Whether the pool waits for memory (woken by ``poke_waiting``)."""
        if waiting:
            self._waiting.add(key)
        else:
            self._waiting.discard(key)

    def poke_waiting(self) -> None:
        """Memory may have been freed: wake every pool waiting for budget, and the budget writer."""
        for key in list(self._waiting):
            self.poke(key)
        self.budget_wakeup.set()

    def uses_host(self, key: PoolKey, host: str | None) -> None:
        """Whether the pool is shared, on which ModelHost of its namespace (woken by ``poke_host``)."""
        if host:
            self._on_host[key] = (key[0], host)
        else:
            self._on_host.pop(key, None)

    def poke_host(self, host: PoolKey) -> None:
        """A ModelHost or one of its pods changed: wake the shared pools on it."""
        for key, on in list(self._on_host.items()):
            if on == host:
                self.poke(key)

    def lose(self, key: PoolKey, kind: str) -> None:
        """An object of ``kind`` the pool (or ModelHost) of ``key`` owns was deleted: its daemon's next pass,
        asked for now, makes it again (``take_lost``). Only a daemon of this process's is told: a deleted
        pool's objects go with it, and nothing is remembered for them."""
        if key in self._wakeups:
            self._seen.get(key, {}).pop(kind, None)
            self._lost.setdefault(key, {})[kind] = None
            self.poke(key)

    def saw(self, key: PoolKey, kind: str, live: Mapping[str, Any]) -> None:
        """An object of ``kind`` the pool (or ModelHost) of ``key`` owns was listed, made or changed. Its
        daemon is asked for a pass only when the fields the operator writes changed since it was last seen
        (``observe.drift``: a PodDisruptionBudget's status, written at every pod change, does not ask); the
        pass compares them with what it wrote (``owned.forget_owned``) and writes them again if edited."""
        if key not in self._wakeups:
            return
        digests = self._seen.setdefault(key, {})
        digest, before = fields_digest(live), digests.get(kind)
        digests[kind] = digest
        if before is not None and before != digest:
            lost = self._lost.setdefault(key, {})
            if lost.get(kind, live) is not None:  # a deletion told before stands
                lost[kind] = live
            self.poke(key)

    def take_lost(self, key: PoolKey) -> dict[str, Mapping[str, Any] | None]:
        """What the pool (or ModelHost) of ``key`` lost since the last call, by kind: None when deleted
        (``lose``), else the object as last seen changed (``saw``)."""
        return self._lost.pop(key, {})

    def pools(self) -> int:
        """How many pool daemons this process runs."""
        return len(self._wakeups)

    def forget(self, key: PoolKey) -> None:
        """The pool's daemon stopped (pool deleted or operator stopping)."""
        self._wakeups.pop(key, None)
        self._waiting.discard(key)
        self._on_host.pop(key, None)
        self.observed.pop(key, None)
        self.shared.pop(key, None)
        self._lost.pop(key, None)
        self._seen.pop(key, None)


@dataclass
class Run:
    """What a pool's daemon and a ModelHost's carry alike from pass to pass."""

    key: PoolKey  # (namespace, name) of the pool or ModelHost
    last_status_wire: dict[str, Any] | None = None
    # The API failures of the last pass (reason, message): each is told as an Event (and, a pool's,
    # logged) when it is new, not at every pass while it lasts.
    api_failures: set[tuple[str, str]] = field(default_factory=set)
    # The NetworkPolicy this process last wrote (None: none yet, or the last write failed): written again
    # when what it says changes (spec.inferencePool admits the picker).
    network_policy: dict[str, Any] | None = None
    # The PodDisruptionBudget this process last wrote (None: none yet, or the last write failed): written
    # again only when what it says changes (a pool's target or spec.disruption).
    disruption_budget: dict[str, Any] | None = None
    # The generation whose invalid spec was last told, so it is told once.
    invalid_generation: int | None = None
    # The workers (host pods) the last pass saw Ready and serving (``planner.disrupted.budgeted``), and the
    # names held since a drain evicted one of them (name -> since when; ``planner.disrupted.held_names``):
    # no new worker (host pod) takes a held name while the PodDisruptionBudget may still count it as
    # evicted (``planner.disrupted.still_listed``).
    budgeted: frozenset[str] = frozenset()
    disrupted: dict[str, datetime] = field(default_factory=dict)


@dataclass
class HostRun(Run):
    """What one ModelHost's daemon carries from pass to pass (besides a ``Run``'s)."""

    # Its control key Secret holds the ModelHost's key (made, or brought to it, by this process).
    secret_ready: bool = False
    # The Secret's last failure (NameTaken: someone else's Secret has its name), how many in a row, and
    # when (monotonic) it is tried again: until then no request, and no host pod is created.
    secret_failure: ApiFailure | None = None
    secret_failures: int = 0
    secret_retry_at: float = 0.0
    # The policy refusal last told (its host pods are deleted, none is made, until the image is allowed).
    forbidden: str | None = None
    # The budget's shortfall last told (host pods not admitted), so the Event is not repeated every pass.
    short: int = 0
    # The loads in flight, by (host pod, pool): each a task of its own (a load lasts until the model
    # serves); the pass after one ends sees its outcome in the host's /stats.
    loading: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    # The device index each load in flight (or landed) named, by (host pod, pool): its Pending charge goes
    # there until the host's /stats lists the model on it.
    devices: dict[tuple[str, str], int] = field(default_factory=dict)
    # The load settings each model was last loaded with, by (host pod, pool): a pool whose settings
    # changed is unloaded, then loaded again (after a restart only a change of the source or task is
    # seen, in what the host reports).
    loaded: dict[tuple[str, str], str] = field(default_factory=dict)
    # Loads that ended lately (monotonic time), until the host's cached /stats lists the model: held as
    # in flight meanwhile, else a pass between the load's end and the next scrape places it again.
    landed: dict[tuple[str, str], float] = field(default_factory=dict)
    # Control calls that failed, by (host pod, pool): not tried again there before this (monotonic) time.
    backoff: dict[tuple[str, str], float] = field(default_factory=dict)
    # The ``modelpool.dev/models`` value last written on each host pod (by uid), with the pod's
    # resourceVersion the index showed then: not written again until the index shows a newer pod.
    annotated: dict[str, tuple[str, Any]] = field(default_factory=dict)
    # Why no control call can be made (the key is unreadable), as last told.
    no_control: str | None = None
    # The last placing's ``retry_in``: the daemon's next pass comes no later (a model turning old
    # enough to sleep for a pool left short).
    retry_in: float | None = None


@dataclass
class PoolRun(Run):
    """What one pool's daemon carries from pass to pass (besides a ``Run``'s)."""

    last_status: ModelPoolStatus | None = None
    # When this process last wrote the status (monotonic), and in how many seconds a change held back
    # while the pool is being created may be written (``effects.apply.write_status``; None: none held).
    status_written_at: float | None = None
    status_due: float | None = None
    # Since when (monotonic) a change of the status waits unwritten (None: none waits).
    status_held_at: float | None = None
    # The Normal Events held back while the status was, or the pool was being created (posted with a later
    # pass's, ``effects.apply.post_events``), and since when (monotonic; None: none held).
    held_events: list[Event] = field(default_factory=list)
    events_held_at: float | None = None
    # The Service this process last wrote (None: none yet, the last write failed, or it was removed).
    service: dict[str, Any] | None = None
    # The InferencePool this process last wrote, or False once it has removed the pool's (spec.inferencePool
    # unset); None: neither yet, or the last request failed (tried again at the next pass).
    inference_pool: dict[str, Any] | Literal[False] | None = None
    # A shared pool removed what it made as a dedicated one (``shared_pool.remove_dedicated_objects``);
    # reset by a dedicated pass, so a pool switched back and forth removes them again.
    dedicated_removed: bool = False
    charged: int = 0
    # The generation (and the refusal) last reported as a policy violation.
    forbidden: tuple[int, str] | None = None
    # A shared pool's last told wait for placement: (generation, reason, message).
    host_wait: tuple[int, str, str] | None = None
    # The autoscaler's load samples and the serving workers' counters, handed from one plan to the next.
    load_window: tuple[LoadSample, ...] = ()
    counters: Mapping[str, CounterSample] = field(default_factory=dict)
    # Worker names a create found held by someone else's pod (``effects.kube.create_pod``'s NameTakenError):
    # the planner gives them to no worker. Forgotten past ``TAKEN_NAMES_MAX`` (a name freed meanwhile may
    # then be tried again; one still taken is found again).
    taken_names: set[str] = field(default_factory=set)
    # Since when each worker has claimed to be busy, pass after pass (``observe.claims``; re-learned from
    # the last status after a restart).
    claims: Mapping[str, BusyClaim] = field(default_factory=dict)


async def wait_for_wakeup(event: asyncio.Event, seconds: float, stop: Awaitable[Any] | None = None) -> bool:
    """Wait until ``event`` is set, ``stop`` completes (the daemon is asked to exit) or ``seconds`` pass.

    Clears the event; True when woken by it.
    """
    waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(event.wait())]
    if stop is not None:
        waiters.append(asyncio.ensure_future(stop))
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    woken = event.is_set()
    event.clear()
    return woken
