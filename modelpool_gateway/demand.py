"""Recording demand on a pool that holds requests and has no serving worker (the operator acts on it).

The gateway writes the annotation ``modelpool.dev/demanded-at`` (RFC 3339, UTC, milliseconds) on the
ModelPool with a JSON merge patch on ``metadata.annotations``, as soon as a request is held and again
every ``interval`` while requests stay held.  ``next_write_at`` (pure) decides when: not before
``interval`` after this gateway's own last write, and not before ``interval * (1 + jitter)`` after the
last write any gateway made (the annotation as the watch shows it).  The jitter (up to ``JITTER``) is
drawn again after each of this gateway's writes, so of several replicas holding requests for the same pool
the one with the smallest jitter refreshes the demand and the others, seeing its write first, do not come
due: about one write per interval whatever the number of replicas.  Two replicas write in the same round
only when their jitters fall within the watch's delay of each other, and since both draw again, that does
not repeat.  Writes run in one background task per pool, never in a request's path.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from modelpool_gateway.contract_names import ANNOTATION_DEMANDED_AT, GROUP, MODELPOOL_PLURAL, VERSION
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.state import Key, Pool

log = logging.getLogger("modelpool.gateway.demand")

# Up to this fraction of the interval longer before another replica's write counts as old.
JITTER = 0.2


def demand_time(moment: datetime) -> str:
    """RFC 3339 in UTC with milliseconds: replicas compare each other's writes to well under a second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def next_write_at(
    written_by_us: datetime | None,
    seen_on_pool: datetime | None,
    interval: timedelta,
    jitter: float = 0.0,
) -> datetime | None:
    """When this gateway should (re)write the demand; None: at once (no write is known)."""
    due = [t + interval for t in (written_by_us,) if t is not None]
    # A future timestamp (another node's clock ahead) counts as fresh until it is interval old.
    due += [t + interval * (1 + jitter) for t in (seen_on_pool,) if t is not None]
    return max(due) if due else None


def demand_patch(now: datetime) -> dict[str, Any]:
    """The JSON merge patch that records demand at ``now``."""
    return {"metadata": {"annotations": {ANNOTATION_DEMANDED_AT: demand_time(now)}}}


class DemandRecorder:
    """Keeps the demand of every pool with held requests fresh, through the API server."""

    def __init__(
        self,
        api: Any,
        *,
        pools: Callable[[Key], Pool | None],
        wanted: Callable[[Key], bool],
        metrics: Metrics,
        interval_s: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api  # kubernetes_asyncio CustomObjectsApi
        self._pools = pools
        self._wanted = wanted
        self._metrics = metrics
        self._interval = timedelta(seconds=interval_s)
        self._clock = clock
        self._jitter: dict[Key, float] = {}
        self._written: dict[Key, datetime] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}

    def note(self, key: Key) -> None:
        """A request for ``key`` is held: keep its demand recorded while any is (never blocks)."""
        if key not in self._tasks:
            task = asyncio.create_task(self._refresh(key))
            self._tasks[key] = task
            task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _refresh(self, key: Key) -> None:
        while self._wanted(key):
            pool = self._pools(key)
            if pool is None:
                return
            now = self._clock()
            jitter = self._jitter.setdefault(key, random.uniform(0, JITTER))
            due = next_write_at(self._written.get(key), pool.demanded_at, self._interval, jitter)
            if due is not None and now < due:
                # Woken early is harmless: the due time is recomputed from what the watch saw since.
                await asyncio.sleep(min((due - now).total_seconds(), self._interval.total_seconds()))
                continue
            await self._write(key, now)  # a failed write is tried again an interval later
            self._jitter[key] = random.uniform(0, JITTER)

    async def _write(self, key: Key, now: datetime) -> None:
        namespace, name = key
        label = f"{namespace}/{name}"
        self._written[key] = now
        try:
            await self._api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                MODELPOOL_PLURAL,
                name,
                demand_patch(now),
                _content_type="application/merge-patch+json",
            )
        except Exception as exc:
            status = getattr(exc, "status", None)
            self._metrics.of(self._metrics.demand_writes, label, "error").inc()
            log.warning("recording demand on %s failed (%s): %s", label, status, str(exc)[:300])
            return
        self._metrics.of(self._metrics.demand_writes, label, "ok").inc()
        log.info("recorded demand on %s at %s", label, demand_time(now))

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def forget(self, key: Key) -> None:
        """The pool was deleted."""
        self._written.pop(key, None)
        self._jitter.pop(key, None)
