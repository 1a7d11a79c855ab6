"""Recording demand for a pool that holds requests and has no serving worker (the operator acts on it).

The gateway renews the pool's demand Lease (``modelpool_contract.demand``: one ``coordination.k8s.io/v1``
Lease per pool, in its namespace, ``spec.renewTime`` the latest demand instant with microseconds,
``spec.holderIdentity`` the last writer, and one annotation per replica, ``modelpool.dev/demand.<replica>``:
the requests this replica holds for the pool, the requests it refused for the pool (429) because the hold
was full since its own previous write, and the moment), as soon as a request is held and again every
``interval`` while requests stay held.  A refusal happens only while the hold is full, so a write comes
within an interval and carries it; a refused count is taken off only once a write that carried it
succeeded.  It needs get, create and update on leases, nothing on the ModelPool.  The counts ride on the
demand writes (no write of their own): the operator sums the replicas' shares that are live (written within
``leaseDurationSeconds``, two intervals: a replica holding requests renews its share every interval plus
a read), so it sees every request held across the replicas, and a replica's share drops out within the
lease duration once its holds end (it stops writing; the next writer prunes it).  The refused counts are
summed too and count as load (those requests reached no worker, so no worker's ``/stats`` counts them).

Each round reads the Lease first (a GET), then decides with ``next_write_at`` (pure): at once when this
replica has not written yet, else an interval after its own last write, whatever the others wrote: one
write per interval per replica that holds requests, one GET before each, nothing while none is held.
Reading before writing (rather than watching Leases) needs no list/watch permission, and the update needs
the read's resourceVersion anyway: two replicas that write at once race on it, and the loser's 409 (a
create that finds the Lease created, an update whose resourceVersion is stale) makes it read again at once
and re-apply its own share on the winner's write (``renew`` keeps the other replicas' shares).  Writes run
in one background task per pool, never in a request's path.

A pool's task leaves ``_tasks`` itself, in the same step of the event loop in which it last found no
request held (``_refresh``'s ``finally``): a request held after that step starts a new task, one held
before it is seen by the loop's check.  (A done-callback would run a step later, and a request held in
between would find the finished task still registered and start none: its demand would be lost.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from modelpool_contract.api import API_VERSION, MODELPOOL_KIND
from modelpool_contract.demand import (
    demand_from_lease,
    demand_lease,
    demand_lease_name,
    demand_pool,
    micro_time,
    renew,
)
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.state import Key, Pool

log = logging.getLogger("modelpool.gateway.demand")

REQUEST_TIMEOUT_S = 10
# Conflicts in a row after which a round waits an interval instead of reading again at once.
MAX_CONFLICTS = 3

JSON = dict[str, Any]
Outcome = Literal["written", "conflict", "error"]


def next_write_at(written_by_us: datetime | None, interval: timedelta) -> datetime | None:
    """When this replica should (re)write its share of the demand; None: at once (it has not written).
    Another replica's write postpones nothing: its share is its own, and the operator sums them."""
    return None if written_by_us is None else written_by_us + interval


@dataclass(frozen=True)
class Answer:
    """An API server's answer: the status code and the JSON document (None when not JSON)."""

    status: int
    doc: JSON | None


class LeaseClient:
    """The three Lease calls the recorder makes, answering plain status codes and JSON (no exceptions for
    4xx: a 404 or a 409 is an expected answer here)."""

    def __init__(self, coordination: Any) -> None:
        self._api = coordination  # kubernetes_asyncio CoordinationV1Api

    async def _call(self, method: Callable[..., Any], *args: Any) -> Answer:
        response = await method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
        try:
            raw = await response.read()
        finally:
            response.release()
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        return Answer(response.status, doc if isinstance(doc, dict) else None)

    async def read(self, namespace: str, name: str) -> Answer:
        return await self._call(self._api.read_namespaced_lease, name, namespace)

    async def create(self, namespace: str, body: JSON) -> Answer:
        return await self._call(self._api.create_namespaced_lease, namespace, body)

    async def replace(self, namespace: str, name: str, body: JSON) -> Answer:
        return await self._call(self._api.replace_namespaced_lease, name, namespace, body)


def _message(answer: Answer) -> str:
    return str((answer.doc or {}).get("message") or answer.status)[:300]


class DemandRecorder:
    """Keeps the demand of every pool with held requests fresh, through the API server."""

    def __init__(
        self,
        leases: LeaseClient,
        *,
        pools: Callable[[Key], Pool | None],
        held: Callable[[Key], int],
        metrics: Metrics,
        interval_s: float,
        holder: str,
        seen: Callable[[Key, datetime], None] = lambda key, at: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._leases = leases
        self._pools = pools
        self._held = held  # requests this replica holds for the pool now (demand is wanted while > 0)
        self._metrics = metrics
        self._interval = timedelta(seconds=interval_s)
        self._holder = holder
        self._seen = seen  # told the demand time each read finds (for held requests' messages)
        self._clock = clock
        # Two intervals: a replica that holds requests renews its share every interval plus a read, so the
        # share (which the operator counts as load) stays live while any is held, and drops out within two
        # intervals of its holds ending.
        self._duration_s = max(1, math.ceil(2 * interval_s))
        self._written: dict[Key, datetime] = {}
        self._conflicts: dict[Key, int] = {}
        self._tasks: dict[Key, asyncio.Task[None]] = {}
        # Hold-full refusals since this replica's last successful write, by pool (the next write's count).
        self._refused: dict[Key, int] = {}

    def refused(self, key: Key) -> None:
        """A request for ``key`` was refused because the hold was full: the next write reports it."""
        self._refused[key] = self._refused.get(key, 0) + 1
        self.note(key)

    def refused_pending(self, key: Key) -> int:
        """Refusals for ``key`` no successful write has carried yet."""
        return self._refused.get(key, 0)

    def note(self, key: Key) -> None:
        """A request for ``key`` is held: keep its demand recorded while any is (never blocks)."""
        if key not in self._tasks:
            self._tasks[key] = asyncio.create_task(self._refresh(key))

    def recording(self, key: Key) -> bool:
        """A task keeps ``key``'s demand recorded."""
        return key in self._tasks

    async def _refresh(self, key: Key) -> None:
        try:
            # Refusals not yet reported keep it going too (the hold may have emptied since).
            while self._held(key) > 0 or self._refused.get(key):
                wait = await self.round(key)
                if wait is None:
                    return
                if wait > 0:
                    # Woken early is harmless: the next round reads the Lease again.
                    await asyncio.sleep(wait)
        finally:
            # In the step that last checked (no await in between): see the module's docstring.
            if self._tasks.get(key) is asyncio.current_task():
                del self._tasks[key]

    async def round(self, key: Key) -> float | None:
        """Read the pool's Lease, write it when due; seconds until the next round (None: the pool is gone
        or has an invalid spec, the operator starts no worker for it)."""
        pool = self._pools(key)
        if pool is None or pool.invalid is not None:
            return None
        lease = await self._read(key)
        now = self._clock()
        if lease is False:  # unreadable: counted; tried again an interval later
            self._written[key] = now
            return self._interval.total_seconds()
        seen = demand_from_lease(lease) if lease is not None else None
        if seen is not None:
            self._seen(key, seen)
        due = next_write_at(self._written.get(key), self._interval)
        if due is not None and now < due:
            return min((due - now).total_seconds(), self._interval.total_seconds())
        outcome = await self.attempt(pool, lease, now)
        if outcome == "error" and not self._held(key):
            self._refused.pop(key, None)  # nothing held any more: do not retry for old refusals alone
        if outcome == "conflict":
            self._conflicts[key] = self._conflicts.get(key, 0) + 1
            if self._conflicts[key] < MAX_CONFLICTS:
                return 0.0  # another replica wrote first: read again at once, and add ours to its write
            self._written[key] = now  # conflicts each time: not a race, give it an interval
            self._failed(key, "write", f"{MAX_CONFLICTS} conflicts in a row")
        self._conflicts.pop(key, None)
        return self._interval.total_seconds()

    async def _read(self, key: Key) -> JSON | Literal[False] | None:
        """The pool's Lease (None: there is none yet; False: the read failed, counted and logged)."""
        namespace, name = key
        try:
            answer = await self._leases.read(namespace, demand_lease_name(name))
        except Exception as exc:
            return self._failed(key, "read", str(exc))
        if answer.status == 404:
            return None
        if answer.status != 200 or answer.doc is None:
            return self._failed(key, "read", f"{answer.status}: {_message(answer)}")
        if demand_pool(answer.doc) != name:
            reason = f"{demand_lease_name(name)} exists and is not this pool's demand Lease (its labels)"
            return self._failed(key, "read", reason)
        return answer.doc

    async def attempt(self, pool: Pool, lease: JSON | None, now: datetime) -> Outcome:
        """Record demand at ``now``: create the Lease when ``lease`` (as last read) is None, else update it
        from that read.  ``conflict``: another writer got there first (409)."""
        namespace, name = pool.key
        refused = self._refused.get(pool.key, 0)
        try:
            if lease is None:
                body = demand_lease(
                    pool=name,
                    pool_uid=pool.uid,
                    moment=now,
                    holder=self._holder,
                    duration_s=self._duration_s,
                    pool_api_version=API_VERSION,
                    pool_kind=MODELPOOL_KIND,
                    held=self._held(pool.key),
                    refused=refused,
                )
                answer = await self._leases.create(namespace, body)
            else:
                held = self._held(pool.key)
                body = renew(
                    lease,
                    moment=now,
                    holder=self._holder,
                    duration_s=self._duration_s,
                    held=held,
                    refused=refused,
                )
                answer = await self._leases.replace(namespace, demand_lease_name(name), body)
        except Exception as exc:
            self._written[pool.key] = now
            self._failed(pool.key, "write", str(exc))
            return "error"
        if answer.status == 409:
            log.debug("demand on %s/%s: another writer first (%s)", namespace, name, _message(answer))
            return "conflict"
        self._written[pool.key] = now
        if answer.status not in (200, 201):
            self._failed(pool.key, "write", f"{answer.status}: {_message(answer)}")
            return "error"
        self._metrics.of(self._metrics.demand_writes, f"{namespace}/{name}", "ok").inc()
        self._carried(pool.key, refused)
        self._seen(pool.key, now)
        log.info("recorded demand on %s/%s at %s", namespace, name, micro_time(now))
        return "written"

    def _carried(self, key: Key, refused: int) -> None:
        """A write reported ``refused`` refusals: only those later ones remain for the next write."""
        left = self._refused.get(key, 0) - refused
        if left > 0:
            self._refused[key] = left
        else:
            self._refused.pop(key, None)

    def _failed(self, key: Key, what: str, reason: str) -> Literal[False]:
        label = f"{key[0]}/{key[1]}"
        self._metrics.of(self._metrics.demand_writes, label, "error").inc()
        log.warning("recording demand on %s failed (%s): %s", label, what, reason[:300])
        return False

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def forget(self, key: Key) -> None:
        """The pool was deleted."""
        self._written.pop(key, None)
        self._conflicts.pop(key, None)
        self._refused.pop(key, None)
