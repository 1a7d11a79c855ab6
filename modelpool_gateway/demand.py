"""Recording demand on a pool that has a request waiting and no serving worker (the operator acts on it).

The gateway writes the annotation ``modelpool.dev/demanded-at`` (an RFC 3339 UTC time) on the ModelPool
with a JSON merge patch on ``metadata.annotations``.  ``should_record`` (pure) rate-limits it: at most once
per ``interval`` per pool by this gateway, and not at all while the annotation the watch last showed is
younger than ``interval`` (another replica wrote it), so any number of gateway replicas write about once
per interval between them.  The write itself is a background task, never awaited by a request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from modelpool_gateway.contract_names import ANNOTATION_DEMANDED_AT, GROUP, MODELPOOL_PLURAL, VERSION
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.state import Key, Pool, rfc3339

log = logging.getLogger("modelpool.gateway.demand")


def should_record(
    now: datetime, written_by_us: datetime | None, seen_on_pool: datetime | None, interval: timedelta
) -> bool:
    """Whether to write the demand annotation now."""
    if written_by_us is not None and now - written_by_us < interval:
        return False
    # A future timestamp (another node's clock ahead) counts as fresh until it is interval old.
    return not (seen_on_pool is not None and now - seen_on_pool < interval)


def demand_patch(now: datetime) -> dict[str, Any]:
    """The JSON merge patch that records demand at ``now``."""
    return {"metadata": {"annotations": {ANNOTATION_DEMANDED_AT: rfc3339(now)}}}


class DemandRecorder:
    """Writes demand on pools through the API server, rate-limited, one write in flight per pool."""

    def __init__(
        self,
        api: Any,
        pools: Callable[[Key], Pool | None],
        metrics: Metrics,
        interval_s: float,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._api = api  # kubernetes_asyncio CustomObjectsApi
        self._pools = pools
        self._metrics = metrics
        self._interval = timedelta(seconds=interval_s)
        self._clock = clock
        self._written: dict[Key, datetime] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}

    def note(self, key: Key) -> None:
        """A request for ``key`` is waiting: record it if the rate limit allows (never blocks)."""
        pool = self._pools(key)
        if pool is None or key in self._tasks:
            return
        now = self._clock()
        if not should_record(now, self._written.get(key), pool.demanded_at, self._interval):
            return
        self._written[key] = now
        task = asyncio.create_task(self._write(key, now))
        self._tasks[key] = task
        task.add_done_callback(lambda _: self._tasks.pop(key, None))

    async def _write(self, key: Key, now: datetime) -> None:
        namespace, name = key
        label = f"{namespace}/{name}"
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
        except Exception as exc:  # the next held request tries again after the interval
            status = getattr(exc, "status", None)
            self._metrics.demand_writes.labels(label, "error").inc()
            log.warning("recording demand on %s failed (%s): %s", label, status, str(exc)[:300])
            return
        self._metrics.demand_writes.labels(label, "ok").inc()
        log.info("recorded demand on %s at %s", label, rfc3339(now))

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def forget(self, key: Key) -> None:
        """The pool was deleted."""
        self._written.pop(key, None)
