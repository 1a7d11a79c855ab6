"""One pass of a shared pool (``spec.host``): its dedicated workers deleted, its count and retries
decided over its replicas on the host pods (``planner.shared_scale``) and handed to its ModelHost's pass
(``reconcile_host``), which places it; its status, or why it waits (``refusals.host_wait_refusal``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from modelpool_contract.api import autoscaling_enabled, parse_host_spec, parse_pool_status
from modelpool_contract.placements import host_model_name
from modelpool_operator.bookkeeping import Bookkeeping, PoolRun
from modelpool_operator.effects.apply import refuse, tell
from modelpool_operator.effects.shared_pool import (
    delete_workers,
    remove_dedicated_objects,
    write_pool_status,
)
from modelpool_operator.host import host_charge_key
from modelpool_operator.indices import HostsByKey
from modelpool_operator.observe.hosts import (
    HostedPool,
    host_reports,
    hosted_workers,
    observe_hosts,
)
from modelpool_operator.observe.observation import PodsByPool
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.shared import HostWait, host_wait, host_wait_event, shared_status
from modelpool_operator.planner.shared_scale import SharedScale, scale_shared
from modelpool_operator.planner.status import coalesce
from modelpool_operator.pool import PoolKey, PoolView
from modelpool_operator.refusals import host_wait_refusal, invalid_spec_message
from modelpool_operator.services import Services, planner_settings


def shared_wait(pool: PoolView, hosts: HostsByKey, pods_by_pool: PodsByPool) -> HostWait:
    """Why the shared pool waits: its ModelHost (from the hosts index) and that host's pods."""
    key = (pool.namespace, pool.spec.host or "")
    specs = list(hosts.get(key, ()))
    if not specs:
        return host_wait(pool, host_found=False, host_error=None, hosts=[])
    try:
        spec = parse_host_spec(dict(specs[0]))
    except ValidationError as exc:
        return host_wait(pool, host_found=True, host_error=invalid_spec_message(exc), hosts=[])
    pods = pods_by_pool.get(host_charge_key(*key), ())
    return host_wait(pool, host_found=True, host_error=None, hosts=observe_hosts(spec, pods))


async def shared_pass(
    services: Services,
    book: Bookkeeping,
    *,
    run: PoolRun,
    pool: PoolView,
    body: Mapping[str, Any],
    hosts: HostsByKey,
    pods_by_pool: PodsByPool,
) -> float | None:
    """A shared pool's pass: its dedicated workers (a pool switched to ``spec.host``) deleted, and the
    objects made for them (``remove_dedicated_objects``); its count and
    retries decided (``planner.shared_scale``, over its replicas' figures on the host pods and its demand)
    and handed to its ModelHost's pass (``Bookkeeping.shared``), which places it; its status: the host pods
    holding its model, or why none does. Returns when to look again (None: at the resync)."""
    await delete_workers(services, pool.namespace, list(pods_by_pool.get(pool.key, ())))
    await remove_dedicated_objects(services, run, pool)
    key = (pool.namespace, pool.spec.host or "")
    try:
        spec = parse_host_spec(dict(next(iter(hosts.get(key, ())))))
    except (StopIteration, ValidationError):  # no such ModelHost, or its spec does not parse
        book.shared.pop(pool.key, None)
        await _tell_wait(services, run, pool, body, shared_wait(pool, hosts, pods_by_pool))
        return None
    host_key = host_charge_key(*key)
    listed = list(pods_by_pool.get(host_key, ()))
    stats = host_reports(services.scraper.refresh(listed, on_change=lambda: _news(book, pool.key, host_key)))
    model = host_model_name(pool.name)
    workers = hosted_workers(pool.namespace, model, pool.spec.resources.memory_bytes, listed, stats)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    pool = replace(pool, status=parse_pool_status(previous))
    now = datetime.now(UTC)
    scale = decide_shared(services, book, run, pool, workers, host_pods=spec.replicas, now=now)
    wait = None
    if len([w for w in workers if w.state not in ("Failed", "Dead")]) < scale.target:
        hosted = {model: HostedPool(pool.name, pool.spec.resources.memory_bytes)}
        wait = host_wait(
            pool, host_found=True, host_error=None, hosts=observe_hosts(spec, listed, stats, hosted)
        )
    status = shared_status(pool, workers, wait, now, scale)
    for event in coalesce(scale.events):
        tell(services, body, event)
    told = (pool.generation, wait.reason, wait.message) if wait is not None else None
    if wait is not None and run.host_wait != told:
        tell(services, body, host_wait_event(wait))
    run.host_wait = told
    await write_pool_status(services, run, previous, status)
    return shared_requeue(services, pool, scale)


def decide_shared(
    services: Services,
    book: Bookkeeping,
    run: PoolRun,
    pool: PoolView,
    workers: list[ObservedWorker],
    *,
    host_pods: int,
    now: datetime,
) -> SharedScale:
    """A shared pool's count and retries (``planner.shared_scale``), handed to its ModelHost's pass
    (``Bookkeeping.shared``; the ModelHost's daemon is poked when they change); the autoscaler's window and
    counters kept for the next pass."""
    scale = scale_shared(
        pool,
        workers,
        host_pods=host_pods,
        now=now,
        settings=planner_settings(services.config),
        load_window=run.load_window,
        counters=run.counters,
    )
    run.load_window, run.counters = scale.load_window, scale.counters
    if book.shared.get(pool.key) != scale.count:
        book.shared[pool.key] = scale.count
        book.poke(host_charge_key(pool.namespace, pool.spec.host or ""))
    return scale


def _news(book: Bookkeeping, pool: PoolKey, host: PoolKey) -> None:
    """News in a host pod's ``/stats``: its shared pool looks again (its load), and so does its ModelHost
    (its placing)."""
    book.poke(pool)
    book.poke(host)


def shared_requeue(services: Services, pool: PoolView, scale: SharedScale) -> float | None:
    """When a shared pool looks again: what its decisions ask (a countdown, a backoff, an idle replica),
    and, while it autoscales under load, every stats interval, as a dedicated pool's busy workers' scrapes
    wake it (its load is on its host pods, scraped by its passes; an idle one looks at the resync, and the
    news its scrape brings wakes it)."""
    planned = scale.requeue_after
    if autoscaling_enabled(pool.spec) and scale.autoscaling.observed_load:
        interval = services.config.stats_interval_seconds
        return interval if planned is None else min(planned, interval)
    return planned


async def _tell_wait(
    services: Services, run: PoolRun, pool: PoolView, body: Mapping[str, Any], wait: HostWait
) -> None:
    refusal = host_wait_refusal(run, pool, body, wait)
    if refusal is not None:
        await refuse(services, run, body, refusal)
