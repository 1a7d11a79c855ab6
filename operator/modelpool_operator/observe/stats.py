"""Scraping the workers' ``GET /stats`` JSON, concurrently, bounded, and never fatally.

One ``StatsScraper`` is shared by the whole operator, and a worker is not trusted to answer well:

* **Size**: an answer is read raw (no content decoding) up to ``STATS_MAX_BYTES`` (a host pod's:
  ``HOST_STATS_MAX_BYTES``); one that declares or sends more is dropped unread as unknown stats.
* **Time**: each request has one deadline for the whole exchange (connect, headers and every byte of the
  body), not only per read: a worker that trickles a byte a second is cut at the deadline.
* **Concurrency**: a semaphore bounds the requests in flight across all pools, and each pool (the
  pods' ``namespace`` and ``modelpool.dev/pool`` label) has at most ``_PER_POOL_CONCURRENCY`` of them (and
  at most half), so a pool whose many workers are slow fills its own slots, never the whole operator's.

Each answer dropped for its size, its deadline or its shape is logged (once per run of failures) and
counted (``on_unreadable``: the operator's ``stats_unreadable_total{reason}``).  A worker whose stats
cannot be fetched simply has *unknown* stats (``None``). That is deliberate: whether a server process is
alive is the kubelet's call (liveness probe), and pods on KWOK nodes have no server behind their IP at
all. Unreachable workers are retried with a doubling delay (capped) so that a thousand silent pods do
not cost a thousand timeouts per pass.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from modelpool_contract.labels import HTTP_PORT_NAME, LABEL_POOL, PROBE_PORT_NAME
from modelpool_contract.placements import LABEL_HOST
from modelpool_contract.stats import HOST_STATS_MAX_BYTES, STATS_MAX_BYTES, STATS_PATH

logger = logging.getLogger(__name__)

#: Forget a pod's scrape state when nobody asked for it for this long (the pod is most likely gone).
_FORGET_AFTER_SECONDS = 600.0
#: Look for such entries at most this often (not at every pool's pass: 10,000 entries each time).
_SWEEP_EVERY_SECONDS = 60.0
#: A pod that refuses connections (nothing listens at its address: a KWOK pod, whose IP has no server, or a
#: container not started yet) backs off up to this long, not to the timeouts' cap: at 300 pools x 10 KWOK
#: workers those refusals took a sixth of the operator's CPU. Any change of the pod (a new resourceVersion:
#: started, ready, restarted) retries it at once, so a real server is reached as soon as it runs.
_REFUSED_BACKOFF_CAP_SECONDS = 300.0
#: At most this many ``/stats`` requests of one pool in flight at once (and never more than half the
#: operator-wide bound): a pool of a thousand workers that each answer at the deadline holds this many of
#: the operator's slots, and every other pool's scrape goes on beside it.
_PER_POOL_CONCURRENCY = 8
#: Why an answer was dropped (the ``reason`` label of ``stats_unreadable_total``): a bounded set.
UNREADABLE_REASONS = ("too_large", "deadline", "invalid")

GroupKey = tuple[str, str]


class UnreadableStatsError(Exception):
    """An answer the scraper refuses to read: over its size bound, or not a JSON object."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class _Entry:
    """What the scraper remembers about one pod (keyed by uid, so a re-created name starts afresh)."""

    stats: dict[str, Any] | None = None
    task: asyncio.Task[None] | None = None
    fetched_at: float = 0.0
    failures: int = 0
    next_attempt: float = 0.0
    last_asked: float = 0.0
    # The pod's resourceVersion when last asked: a change ends a backoff.
    version: Any = None
    # When ``invalidate`` marked its stats as older than a change made to the pod (None: not marked): the
    # next refresh refetches at once, and only a fetch begun after it clears the mark.
    invalidated: float | None = None


def _uid(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name", ""))


def _group(pod: Mapping[str, Any]) -> GroupKey:
    """The pool whose concurrency the pod's scrape counts against: its namespace and pool label (a host
    pod's label names its ModelHost's charge key, so a ModelHost is a group of its own)."""
    meta = pod.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str((meta.get("labels") or {}).get(LABEL_POOL) or ""))


def stats_size_bound(pod: Mapping[str, Any]) -> int:
    """The most bytes of the pod's ``/stats`` answer read: a host pod's document holds one per model."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return HOST_STATS_MAX_BYTES if LABEL_HOST in labels else STATS_MAX_BYTES


async def read_bounded(client: httpx.AsyncClient, url: str, max_bytes: int) -> Any:
    """GET ``url`` and parse its JSON body, reading at most ``max_bytes`` of it: a declared
    ``Content-Length`` over the bound is refused before the body is read, a body that runs past it is cut
    off after the chunk that crossed it (a chunk is at most one socket read, 64 KiB), and an encoded body
    (gzip...) is refused: its decoded size is not bounded by what arrives.  No deadline here: the caller
    bounds the whole exchange."""
    headers = {"Accept-Encoding": "identity"}
    async with client.stream("GET", url, headers=headers) as response:
        response.raise_for_status()
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise UnreadableStatsError("invalid", f"the /stats answer is encoded ({encoding})")
        declared = response.headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            raise UnreadableStatsError("too_large", f"the /stats answer declares {declared} bytes")
        body = bytearray()
        # Identity only (refused above otherwise), so these are the bytes as they arrive, undecoded.
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                raise UnreadableStatsError("too_large", f"the /stats answer runs past {max_bytes} bytes")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise UnreadableStatsError("invalid", f"the /stats answer is not JSON ({exc})") from None


# The /stats fields whose change is worth a reconciliation pass (not counters such as requests_total);
# names of ``modelpool_contract.stats.WorkerStats`` fields.
_NEWS_FIELDS = (
    "state",
    "queue_depth",
    "in_flight",
    "last_request_time",
    "load_error",
    "load_progress",
    "download",
    # A generation pool's tokens in flight (its autoscaling load under metric tokens or kvCache).
    "generation",
)


def _news(stats: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
    """What of a ``/stats`` answer is worth a pass: a worker's news fields; a shared host's (``{"host",
    "models"}``) the news fields of each of its models, so its ModelHost's pass follows a load, a sleep or
    an unload there."""
    if stats is None:
        return None
    models = stats.get("models")
    hosted = (
        tuple(sorted((str(k), _news(v)) for k, v in models.items() if isinstance(v, Mapping)))
        if isinstance(models, Mapping)
        else None
    )
    return (*(stats.get(key) for key in _NEWS_FIELDS), hosted)


def stats_url(pod: Mapping[str, Any], default_port: int) -> str | None:
    """The pod's ``/stats`` URL, or None when it has no IP yet or is not running.

    The port is the container port named ``probes`` (``PROBE_PORT_NAME``: the supervisor answers there
    however busy the traffic is) when the pod declares one (the pod builder does), else the one named
    ``http`` (workers made before the probe port), else the configured default.
    """
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or status.get("phase") != "Running":
        return None
    declared = {
        str(entry.get("name")): int(entry["containerPort"])
        for container in (pod.get("spec") or {}).get("containers") or []
        for entry in container.get("ports") or []
        if entry.get("containerPort")
    }
    port = declared.get(PROBE_PORT_NAME) or declared.get(HTTP_PORT_NAME) or default_port
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}{STATS_PATH}"


class StatsScraper:
    """Fetch ``/stats`` of many pods at once; results are dicts, or None when unknown."""

    def __init__(
        self,
        *,
        interval: float,
        timeout: float,
        concurrency: int,
        backoff_cap: float,
        default_port: int,
        client: httpx.AsyncClient | None = None,
        per_pool: int = _PER_POOL_CONCURRENCY,
        on_unreadable: Callable[[str], None] | None = None,
    ) -> None:
        self._interval = interval
        self._timeout = timeout
        self._backoff_cap = backoff_cap
        self._default_port = default_port
        self._semaphore = asyncio.Semaphore(concurrency)
        # A pool never holds more than half the operator's slots (one of them when there are two).
        self._per_pool = max(1, min(per_pool, concurrency // 2))
        # Each pool's semaphore, with the fetches holding or awaiting it (dropped when none does).
        self._groups: dict[GroupKey, tuple[asyncio.Semaphore, list[int]]] = {}
        self._on_unreadable = on_unreadable
        # No proxies from the environment: worker pod IPs are always reached directly.  The client's own
        # timeout bounds each read; ``_fetch_once`` bounds the whole exchange.
        self._client = client or httpx.AsyncClient(timeout=httpx.Timeout(timeout), trust_env=False)
        self._entries: dict[str, _Entry] = {}
        self._next_sweep = 0.0

    async def aclose(self) -> None:
        await self._client.aclose()

    def refresh(
        self, pods: Iterable[Mapping[str, Any]], on_change: Callable[[], None] | None = None
    ) -> dict[str, dict[str, Any] | None]:
        """The latest known stats of each pod (keyed by pod name), without waiting for the network.

        Pods whose stats are stale get a fetch started in the background; when one brings news (a new
        state, queue depth, last request...), ``on_change`` is called so the pool's loop runs again. A
        reconciliation pass therefore never waits on a slow or silent worker.
        """
        now = time.monotonic()
        wanted: list[tuple[str, _Entry]] = []
        for pod in pods:
            name = str((pod.get("metadata") or {}).get("name", ""))
            entry = self._entries.setdefault(_uid(pod), _Entry())
            entry.last_asked = now
            wanted.append((name, entry))
            version = (pod.get("metadata") or {}).get("resourceVersion")
            if version != entry.version:
                entry.version, entry.next_attempt = version, 0.0  # the pod changed: try it again now
            url = stats_url(pod, self._default_port)
            if url is None:
                entry.stats = None
                continue
            fresh = entry.stats is not None and now - entry.fetched_at < self._interval
            if not fresh and now >= entry.next_attempt and (entry.task is None or entry.task.done()):
                entry.task = asyncio.create_task(
                    self._fetch(entry, url, on_change, _group(pod), stats_size_bound(pod))
                )
        self._forget_stale(now)
        return {name: entry.stats for name, entry in wanted}

    def invalidate(self, pod: Mapping[str, Any]) -> None:
        """The pod was just changed (a control call on a host pod: a load, a sleep, an unload): its cached
        stats are older than the change, so the next ``refresh`` refetches them at once, fresh or not, and
        their arrival calls its ``on_change`` even with no news (a fetch begun before this call does not
        count: its answer may predate the change).  Unknown pods are ignored."""
        entry = self._entries.get(_uid(pod))
        if entry is not None:
            entry.invalidated = time.monotonic()
            entry.fetched_at = float("-inf")
            entry.next_attempt = 0.0

    def pending(self, pod: Mapping[str, Any]) -> bool:
        """Whether the pod's cached stats predate a change ``invalidate`` was told of (and the refetch has
        not come back yet, for at most one interval: a silent pod is not waited on for longer)."""
        entry = self._entries.get(_uid(pod))
        return (
            entry is not None
            and entry.invalidated is not None
            and time.monotonic() - entry.invalidated < self._interval
        )

    async def scrape(self, pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any] | None]:
        """Like ``refresh``, but waits for the fetches it started (or found running) to finish."""
        pods = list(pods)
        self.refresh(pods)
        tasks = [
            entry.task
            for entry in (self._entries.get(_uid(pod)) for pod in pods)
            if entry is not None and entry.task is not None and not entry.task.done()
        ]
        if tasks:
            await asyncio.gather(*tasks)
        return self.cached(pods)

    def cached(self, pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any] | None]:
        """The last stats of each pod without fetching anything (another pool's daemon keeps them fresh)."""
        results: dict[str, dict[str, Any] | None] = {}
        for pod in pods:
            entry = self._entries.get(_uid(pod))
            results[str((pod.get("metadata") or {}).get("name", ""))] = entry.stats if entry else None
        return results

    async def _fetch(
        self,
        entry: _Entry,
        url: str,
        on_change: Callable[[], None] | None,
        group: GroupKey,
        max_bytes: int,
    ) -> None:
        semaphore, users = self._groups.setdefault(group, (asyncio.Semaphore(self._per_pool), [0]))
        users[0] += 1
        try:
            # The pool's own slot first: a pool's waiting fetches never queue on the operator's slots.
            async with semaphore, self._semaphore:
                await self._fetch_once(entry, url, on_change, max_bytes)
        finally:
            users[0] -= 1
            if not users[0]:
                self._groups.pop(group, None)
            # A finished task is not kept (with its coroutine, context and anyio's state for it): for
            # 10,000 pods, most of them backing off, that was 10,000 dead tasks held for minutes.
            entry.task = None

    async def _fetch_once(
        self, entry: _Entry, url: str, on_change: Callable[[], None] | None, max_bytes: int
    ) -> None:
        before = _news(entry.stats)
        started = time.monotonic()
        try:
            # One deadline for the whole exchange: httpx's read timeout is per chunk, so a worker sending
            # a byte a second would otherwise hold the slot (and grow the body) for as long as it likes.
            async with asyncio.timeout(self._timeout):
                body = await read_bounded(self._client, url, max_bytes)
            if not isinstance(body, dict):
                raise UnreadableStatsError("invalid", "the /stats body is not a JSON object")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure means "unknown", never a failed worker
            self._failed(entry, url, exc)
            body = None
        marked = entry.invalidated is not None
        if body is not None:
            entry.stats = body
            entry.failures = 0
            entry.next_attempt = 0.0
            if entry.invalidated is None or started >= entry.invalidated:
                entry.fetched_at, entry.invalidated = time.monotonic(), None
        # A marked pod's pass is waiting for this answer (news or not); a fetch begun before the mark
        # leaves it marked and stale, so that pass refetches.
        if on_change is not None and (marked or _news(entry.stats) != before):
            on_change()

    def _failed(self, entry: _Entry, url: str, exc: Exception) -> None:
        """The stats are unknown, the pod backs off; an answer refused for its size, deadline or shape is
        counted and logged (a warning for the first of a run of failures)."""
        entry.stats = None
        entry.failures += 1
        delay = self._backoff(entry.failures, refused=isinstance(exc, httpx.ConnectError))
        entry.next_attempt = time.monotonic() + delay
        reason = (
            exc.reason
            if isinstance(exc, UnreadableStatsError)
            else "deadline"
            if isinstance(exc, TimeoutError | httpx.TimeoutException)
            else None
        )
        if reason is None:
            logger.debug("stats of %s unavailable (%s); next try in %.1fs", url, exc, delay)
            return
        if self._on_unreadable is not None:
            self._on_unreadable(reason)
        detail = str(exc) if reason != "deadline" else f"no whole answer within {self._timeout:g}s"
        level = logging.WARNING if entry.failures == 1 else logging.DEBUG
        logger.log(level, "stats of %s dropped (%s); next try in %.1fs", url, detail, delay)

    def _backoff(self, failures: int, *, refused: bool) -> float:
        """The wait after ``failures`` failed fetches in a row: doubling up to the configured cap; for a
        refused connection quadrupling up to ``_REFUSED_BACKOFF_CAP_SECONDS`` (a change of the pod retries
        it at once anyway, so a real server that starts listening is not kept waiting by it)."""
        if refused:
            cap = max(self._backoff_cap, _REFUSED_BACKOFF_CAP_SECONDS)
            return float(min(self._interval * 4 ** (failures - 1), cap))
        return float(min(self._interval * 2 ** (failures - 1), self._backoff_cap))

    def _forget_stale(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_EVERY_SECONDS
        stale = [uid for uid, e in self._entries.items() if now - e.last_asked > _FORGET_AFTER_SECONDS]
        for uid in stale:
            del self._entries[uid]
