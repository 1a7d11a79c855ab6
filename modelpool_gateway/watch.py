"""Watches that keep the registry current: ModelPools, worker pods and shared hosts' pods, per namespace or
cluster-wide.

Each watch lists once (the registry's scope is replaced by the listing), then watches from the listing's
resourceVersion with bookmarks, resuming from the last version it saw whenever the server ends a watch.
A 410 Gone (the version is too old) relists at once; any other failure retries after a doubling delay
capped at ``watch_backoff_max_seconds``, with a fresh list (a successful list is the one unambiguous sign
that the API server answers again; a resumed watch may stay silent for minutes).  There is no polling loop:
between events nothing is requested.

``WatchHealth`` records each watch's failures and successes; ``stale_watches`` (pure) names the watches
that have been failing longer than ``watch_stale_seconds``, which makes the gateway unready (``routes``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from modelpool_contract.api import GROUP, MODELPOOL_PLURAL, VERSION
from modelpool_contract.labels import LABEL_POOL
from modelpool_contract.placements import LABEL_HOST
from modelpool_gateway.cache import Registry
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.state import HostPod, Worker, host_pod_from_pod, pool_from_object, worker_from_pod

log = logging.getLogger("modelpool.gateway.watch")

JSON = dict[str, Any]
LIST_TIMEOUT_S = 30
# Objects per page of a list.
LIST_PAGE_SIZE = 500
# The first retry after an error; doubled per consecutive failure up to the configured cap.
BACKOFF_INITIAL_S = 0.5


@dataclass
class WatchState:
    """One watch's health: whether it has ever listed, and since when it has been failing (None: it is
    not), with the last error."""

    listed: bool = False
    failing_since: float | None = None
    error: str = ""


class WatchHealth:
    """The health of every watch, by name; times are ``time.monotonic()``."""

    def __init__(self) -> None:
        self.states: dict[str, WatchState] = {}

    def ok(self, name: str, listed: bool = False) -> None:
        """A list (``listed``), an event or a watch the server ended normally: the watch is healthy."""
        state = self.states.setdefault(name, WatchState())
        state.listed = state.listed or listed
        state.failing_since, state.error = None, ""

    def failed(self, name: str, error: str, now: float) -> None:
        """A failure; the watch stays failing (since the first one) until ``ok``."""
        state = self.states.setdefault(name, WatchState())
        if state.failing_since is None:
            state.failing_since = now
        state.error = error


def stale_watches(states: Mapping[str, WatchState], now: float, bound_s: float) -> list[str]:
    """Why each stale watch is stale: failing, with no successful list or watch, for longer than
    ``bound_s``; e.g. ``pods@team-a: no successful list or watch for 41 s: API 503: ...``."""
    stale = []
    for name in sorted(states):
        since = states[name].failing_since
        if since is not None and now - since > bound_s:
            stale.append(f"{name}: no successful list or watch for {now - since:.0f} s: {states[name].error}")
    return stale


@dataclass(frozen=True)
class WatchSpec:
    """One watch: what it lists and how its objects enter the registry."""

    resource: str
    namespace: str | None
    list_call: Callable[..., Awaitable[Any]]
    on_list: Callable[[list[Any]], None]
    on_event: Callable[[str, JSON], None]
    selector: str | None = None
    # What of each listed object ``on_list`` receives, taken page by page (a slim view: a 10,000-pod list
    # is never held whole as JSON); None: the objects themselves.
    slim: Callable[[JSON], Any] | None = None
    # What the watch is called in logs and /readyz when two watch one resource (host pods, worker pods).
    label: str | None = None

    @property
    def name(self) -> str:
        return f"{self.label or self.resource}@{self.namespace or '*'}"


def backoff_delay(failures: int, cap: float) -> float:
    """The wait after ``failures`` consecutive failures: doubling from 0.5 s, jittered, at most ``cap``."""
    base: float = min(cap, BACKOFF_INITIAL_S * 2 ** max(0, failures - 1))
    return float(base * (0.5 + random.random() / 2))


def pool_watch(registry: Registry, custom: client.CustomObjectsApi, namespace: str | None) -> WatchSpec:
    """The ModelPools of ``namespace`` (None: every namespace)."""
    if namespace is None:
        call = partial(custom.list_cluster_custom_object, GROUP, VERSION, MODELPOOL_PLURAL)
    else:
        call = partial(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, MODELPOOL_PLURAL)

    def on_event(kind: str, obj: JSON) -> None:
        pool = pool_from_object(obj)
        if kind == "DELETED":
            registry.delete_pool(pool.key)
        else:
            registry.set_pool(pool)

    return WatchSpec(
        resource=MODELPOOL_PLURAL,
        namespace=namespace,
        list_call=call,
        on_list=lambda pools: registry.replace_pools(namespace, pools),
        on_event=on_event,
        slim=pool_from_object,
    )


_Pod = TypeVar("_Pod", Worker, HostPod)


def _labelled_pods_watch(
    core: client.CoreV1Api,
    namespace: str | None,
    *,
    selector: str,
    slim: Callable[[JSON], _Pod | None],
    put: Callable[[_Pod], None],
    delete: Callable[[_Pod], None],
    replace: Callable[[str | None, list[_Pod]], None],
    label: str | None = None,
) -> WatchSpec:
    """The pods of ``namespace`` (None: every namespace) that carry the label ``selector``, each slimmed
    into the registry's view (a pod that does not fit it is skipped)."""
    call = (
        core.list_pod_for_all_namespaces
        if namespace is None
        else partial(core.list_namespaced_pod, namespace)
    )

    def on_event(kind: str, obj: JSON) -> None:
        item = slim(obj)
        if item is not None:
            (delete if kind == "DELETED" else put)(item)

    def on_list(items: list[_Pod | None]) -> None:
        replace(namespace, [item for item in items if item is not None])

    return WatchSpec(
        resource="pods",
        namespace=namespace,
        list_call=call,
        on_list=on_list,
        on_event=on_event,
        selector=selector,
        slim=slim,
        label=label,
    )


def pod_watch(registry: Registry, core: client.CoreV1Api, namespace: str | None) -> WatchSpec:
    """The worker pods (those labelled with a pool) of ``namespace`` (None: every namespace)."""
    return _labelled_pods_watch(
        core,
        namespace,
        selector=LABEL_POOL,
        slim=worker_from_pod,
        put=registry.set_worker,
        delete=lambda worker: registry.delete_worker(worker.key),
        replace=registry.replace_workers,
    )


def host_pod_watch(registry: Registry, core: client.CoreV1Api, namespace: str | None) -> WatchSpec:
    """The shared hosts' pods (those labelled ``modelpool.dev/host``) of ``namespace`` (None: every
    namespace), with the pools placed on each (``modelpool_contract.placements``)."""
    return _labelled_pods_watch(
        core,
        namespace,
        selector=LABEL_HOST,
        slim=host_pod_from_pod,
        put=registry.set_host_pod,
        delete=lambda pod: registry.delete_host_pod(pod.key),
        replace=registry.replace_host_pods,
        label="host-pods",
    )


async def list_all(spec: WatchSpec, page_size: int = LIST_PAGE_SIZE) -> tuple[list[Any], str]:
    """Every object (as ``spec.slim`` makes it), in pages of ``page_size``: one page of a 10,000-pod
    cluster's JSON at a time, never the whole list (the gateway's peak memory); and the list's
    resourceVersion (the last page's: the server serves every page from the first one's snapshot)."""
    kwargs: dict[str, Any] = {
        "_preload_content": False,
        "_request_timeout": LIST_TIMEOUT_S,
        "limit": page_size,
    }
    if spec.selector:
        kwargs["label_selector"] = spec.selector
    items: list[Any] = []
    while True:
        response = await spec.list_call(**kwargs)
        try:
            if response.status != 200:
                raise ApiException(status=response.status, reason=(await response.text())[:300])
            doc = json.loads(await response.read())
        finally:
            response.release()
        page = doc.get("items") or []
        items.extend(page if spec.slim is None else map(spec.slim, page))
        token = (doc.get("metadata") or {}).get("continue")
        if not token:
            return items, str(doc["metadata"]["resourceVersion"])
        kwargs["_continue"] = token


async def _stream(spec: WatchSpec, version: str, timeout_s: int, health: WatchHealth) -> str:
    """Apply events from ``version`` until the server ends the watch; return the last version seen."""
    kwargs: dict[str, Any] = {
        "resource_version": version,
        "timeout_seconds": timeout_s,
        "allow_watch_bookmarks": True,
        # A connection that stays silent well past the server's own timeout is dead.
        "_request_timeout": (LIST_TIMEOUT_S, timeout_s + LIST_TIMEOUT_S),
    }
    if spec.selector:
        kwargs["label_selector"] = spec.selector
    async with watch.Watch(return_type="object").stream(spec.list_call, **kwargs) as events:
        async for event in events:
            obj = event["raw_object"]
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            health.ok(spec.name)
            if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                spec.on_event(event["type"], obj)
    health.ok(spec.name)
    return version


async def run_watch(
    spec: WatchSpec,
    registry: Registry,
    metrics: Metrics,
    timeout_s: int,
    cap: float,
    *,
    health: WatchHealth | None = None,
) -> None:
    """List, then watch, forever (until cancelled)."""
    health = health if health is not None else WatchHealth()
    version: str | None = None
    failures = 0
    while True:
        try:
            if version is None:
                items, version = await list_all(spec)
                spec.on_list(items)
                if spec.name not in registry.synced or failures:
                    log.info("%s: listed %d", spec.name, len(items))
                registry.synced.add(spec.name)
                health.ok(spec.name, listed=True)
            version = await _stream(spec, version, timeout_s, health)
            failures = 0
            continue
        except asyncio.CancelledError:
            raise
        except ApiException as exc:
            if exc.status == 410:  # our version is too old: start again from a fresh list
                version = None
                metrics.watch_restarts.labels(spec.resource, "expired").inc()
                continue
            reason = f"API {exc.status}: {str(exc.reason)[:200]}"
        except Exception as exc:
            reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        failures += 1
        version = None  # relist: the sign that the API server answers again (module docstring)
        health.failed(spec.name, reason, time.monotonic())
        metrics.watch_restarts.labels(spec.resource, "error").inc()
        delay = backoff_delay(failures, cap)
        log.warning("%s: %s; retrying in %.1fs", spec.name, reason, delay)
        await asyncio.sleep(delay)
