"""The operator process's shared in-memory state: connections, wake-up signals and budget reservations.

Nothing here is a source of truth about the cluster: it is all rebuilt on restart (level-based). It
holds only what must be shared between the per-pool daemons of one process:

* ``wakeups``: one ``asyncio.Event`` per pool; pod and pool watch events set it, so a pool reconciles
  promptly after a change instead of polling in a busy loop.
* ``waiting``: pools that could not fit the budget; any pod going away wakes them (memory freed).
* ``reservations``: memory promised to pods created but not yet seen in the watch (``budget``).
* ``observed``: each pool's workers as its daemon last observed them (other pools' passes read these),
  and ``charges``: their sums for the memory ledger.

It also carries the process's connections and services: the API client, the stats scraper, the
observation cache, the sink that posts Events and the Prometheus metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

from modelpool_operator.budget import ReservationBook
from modelpool_operator.effects.events import EventSink, KopfEventSink
from modelpool_operator.effects.kube import Kube
from modelpool_operator.metrics import OperatorMetrics
from modelpool_operator.observe.observation import ChargeCache, ObservationCache
from modelpool_operator.observe.stats import StatsScraper
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.pool import PoolKey
from modelpool_operator.settings import OperatorConfig


@dataclass
class OperatorState:
    """Everything the handlers of one operator process share (kept in Kopf's memo)."""

    config: OperatorConfig
    kube: Kube | None = None
    scraper: StatsScraper | None = None
    observations: ObservationCache | None = None
    events: EventSink = field(default_factory=KopfEventSink)
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    reservations: ReservationBook = field(default_factory=ReservationBook)
    wakeups: dict[PoolKey, asyncio.Event] = field(default_factory=dict)
    waiting: set[PoolKey] = field(default_factory=set)
    # Each pool's workers as its daemon last observed them (other pools' passes read these).
    observed: dict[PoolKey, list[ObservedWorker]] = field(default_factory=dict)
    # Each pool's observed workers summed for the ledger, once per observation (not once per pass).
    charges: ChargeCache = field(default_factory=ChargeCache)
    budget_wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def wakeup(self, key: PoolKey) -> asyncio.Event:
        """The pool's wake-up event (created on first use)."""
        event = self.wakeups.get(key)
        if event is None:
            event = self.wakeups[key] = asyncio.Event()
        return event

    def poke(self, key: PoolKey) -> None:
        """Ask the pool's daemon for a pass now (a no-op for pools this process does not run)."""
        event = self.wakeups.get(key)
        if event is not None:
            event.set()

    def poke_waiting(self) -> None:
        """Memory may have been freed: wake every pool waiting for budget, and the budget writer."""
        for key in list(self.waiting):
            self.poke(key)
        self.budget_wakeup.set()

    def forget(self, key: PoolKey) -> None:
        """The pool's daemon stopped (pool deleted or operator stopping)."""
        self.wakeups.pop(key, None)
        self.waiting.discard(key)
        self.observed.pop(key, None)
        self.metrics.pool_gone(key)

    def require_kube(self) -> Kube:
        if self.kube is None:
            raise RuntimeError("the API connection is not set up (the startup handler has not run)")
        return self.kube

    def require_observations(self) -> ObservationCache:
        if self.observations is None:
            raise RuntimeError("the observation cache is not set up (the startup handler has not run)")
        return self.observations

    def require_scraper(self) -> StatsScraper:
        if self.scraper is None:
            raise RuntimeError("the stats scraper is not set up (the startup handler has not run)")
        return self.scraper


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
