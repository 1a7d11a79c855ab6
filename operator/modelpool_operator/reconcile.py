"""One reconciliation pass of one ModelPool: observe (``observe``), plan (``decide``: pure but for the
reservations it records), then apply (``effects.apply``); or, for a spec that is invalid or forbidden, the
refusal (``refusals``, written by ``effects.apply.refuse``); a shared pool's pass is ``reconcile_shared``'s.
This module decides; it makes no API request and posts no Event itself.

The order matters for the budget. Everything between reading the pod index and recording the planned
creations as reservations is synchronous (``observe`` and ``decide``: no ``await``), so on the operator's
single event loop no other pool can plan in between: two pools reconciling "at once" always see each
other's reservations and can never over-admit. The API calls (evict, delete, create, the Service, status)
and the Events come after (``effects.apply.apply``); a create the API refuses releases its reservation at
once, one whose outcome is unknown keeps it until the pod is observed or known absent (``budget``). A
failed API request never ends a pass (``effects.apply``).

Everything read here is rebuilt from the cluster (Kopf's indices of pods, pools and budgets); the only
in-memory state is the reservation book, the last status this process wrote (we are its one writer,
so that copy is authoritative even before the watch delivers it back), each pool's load window (the
autoscaler's recent samples, re-learned after a restart) and the worker names a drain's eviction still
holds in the pool's PodDisruptionBudget (``planner.disrupted``: forgotten at a restart, when a replacement
may wait for the budget as it did before).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from modelpool_contract.demand import Demand
from modelpool_operator.bookkeeping import Bookkeeping, PoolRun
from modelpool_operator.budget import BudgetLimit, Reservation
from modelpool_operator.effects.apply import apply, refuse, settle_soon
from modelpool_operator.effects.resources import worker_template_hash
from modelpool_operator.indices import BudgetsByName, DemandByPool, HostsByKey, PoolsByKey
from modelpool_operator.observe.claims import believe
from modelpool_operator.observe.observation import (
    LazyOthers,
    PodsByPool,
    StatsByName,
    budget_limit,
    observe_all,
    other_pools,
    pod_indexed,
)
from modelpool_operator.observe.ownership import worker_charges
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import CounterSample, LoadSample, Plan, PlannerSettings, plan
from modelpool_operator.planner.disrupted import budgeted, held_names
from modelpool_operator.policy import violations
from modelpool_operator.pool import PoolKey, PoolView
from modelpool_operator.reconcile_shared import shared_pass
from modelpool_operator.refusals import invalid_spec_refusal, policy_refusal
from modelpool_operator.services import Services, planner_settings, pod_settings

logger = logging.getLogger(__name__)


def in_index(pods_by_pool: PodsByPool) -> Callable[[Reservation], bool]:
    """Whether a reservation's pod is in the pods index already (no need to ask the API about it)."""
    return lambda reservation: pod_indexed(pods_by_pool, reservation.pool_key, reservation.worker)


def latest_demand(demand: DemandByPool, key: PoolKey) -> Demand | None:
    """The latest demand recorded for the pool (one Lease per pool; the latest, should there be more)."""
    return max(demand.get(key, ()), key=lambda d: d.at, default=None)


def observe(
    services: Services, book: Bookkeeping, pods_by_pool: PodsByPool, *, own: PoolKey | None, now: datetime
) -> dict[PoolKey, list[ObservedWorker]]:
    """Every indexed worker by pool (``observe_all``): the own pool's observed now, with its stats from the
    scraper's cache (stale ones are refetched in the background, and their arrival pokes the pool)."""
    own_stats: StatsByName = {}
    if own is not None:
        own_key = own
        own_stats = services.scraper.refresh(
            list(pods_by_pool.get(own, ())), on_change=lambda: book.poke(own_key)
        )
    return observe_all(
        services.observations,
        pods_by_pool,
        observed=book.observed,
        cached_stats=services.scraper.cached,
        own=own,
        own_stats=own_stats,
        now=now,
        charges=worker_charges(pods_by_pool),
    )


def believe_own(
    book: Bookkeeping,
    run: PoolRun,
    workers: dict[PoolKey, list[ObservedWorker]],
    pool: PoolView,
    now: datetime,
    *,
    grace_s: float,
) -> None:
    """The own pool's workers as the operator believes them (``observe.claims``: load counted at most the
    queue's capacity, a busy claim believed for a bounded time), for this plan and for the other pools'
    (``book.observed``: their preemption reads it); the busy claims kept for the next pass."""
    if pool.key not in workers:
        return
    believed, run.claims = believe(
        workers[pool.key],
        spec=pool.spec,
        claims=run.claims,
        previous=pool.status.workers,
        now=now,
        grace_s=grace_s,
    )
    workers[pool.key] = book.observed[pool.key] = believed


def decide(
    pool: PoolView,
    workers: Mapping[PoolKey, list[ObservedWorker]],
    *,
    book: Bookkeeping,
    limit: BudgetLimit,
    pools_by_key: PoolsByKey,
    settings: PlannerSettings,
    now: datetime,
    load_window: tuple[LoadSample, ...] = (),
    counters: Mapping[str, CounterSample] | None = None,
    taken: frozenset[str] = frozenset(),
) -> Plan:
    """Plan the pool over what was observed, and reserve the planned creations: synchronous on purpose
    (see the module doc). It reads only its arguments and writes only the bookkeeping's ledger state (the
    reservations it records, those of observed pods it ends, the charge sums it caches)."""
    decided = plan(
        pool,
        workers.get(pool.key, []),
        book.ledger(workers, limit),
        now=now,
        others=LazyOthers(lambda: other_pools(pool.key, pools_by_key, workers)),
        settings=settings,
        load_window=load_window,
        counters=counters,
        taken=taken,
    )
    book.reserve(pool.key, decided.create, now)
    return decided


async def reconcile_pool(
    services: Services,
    book: Bookkeeping,
    *,
    run: PoolRun,
    body: Mapping[str, Any],
    pods_by_pool: PodsByPool,
    pools_by_key: PoolsByKey,
    budgets: BudgetsByName,
    demand: DemandByPool | None = None,
    hosts: HostsByKey | None = None,
) -> Plan | None:
    """One pass for the pool ``run.key``: returns the plan it applied (None: the spec is invalid, or the
    pool is shared and nothing asks for a pass before the resync; a shared pool's plan holds only when to
    look again).  Timed and counted by outcome in the operator's metrics."""
    with services.metrics.reconcile_pass() as outcome:
        try:
            pool = PoolView.from_body(body, demand=latest_demand(demand or {}, run.key))
        except ValueError as exc:  # the CRD schema should have refused it; say why once per generation
            outcome.result = "invalid"
            refusal = invalid_spec_refusal(run, body, exc)
            if refusal is not None:
                await refuse(services, run, body, refusal)
            return None
        # The workers' hash covers what this operator adds (a new default image or flag rolls them).
        pool = replace(pool, template_hash=worker_template_hash(pool, pod_settings(services.config)))
        refused = violations(pool.spec, services.config.policy, pool.namespace)
        if refused:
            outcome.result = "forbidden"
            refusal = policy_refusal(run, pool, body, refused)
            if refusal is not None:
                await refuse(services, run, body, refusal)
            return None
        if pool.spec.host is not None:
            outcome.result = "shared"
            requeue = await shared_pass(
                services, book, run=run, pool=pool, body=body, hosts=hosts or {}, pods_by_pool=pods_by_pool
            )
            return None if requeue is None else Plan(template_hash=pool.template_hash, requeue_after=requeue)
        run.dedicated_removed = False  # a switch to spec.host removes its Service, PDB and policy again
        if run.last_status is not None:
            # We are the only writer of status; our last write is newer than what the watch may show yet.
            pool = replace(pool, status=run.last_status)
        # From observing to the reservations ``decide`` records nothing is awaited (see the module doc).
        now = datetime.now(UTC)
        workers = observe(services, book, pods_by_pool, own=pool.key, now=now)
        believe_own(book, run, workers, pool, now, grace_s=services.config.processing_grace_seconds)
        own = workers.get(pool.key, [])
        run.disrupted = held_names(run.budgeted, {w.name: w.deleting for w in own}, run.disrupted, now)
        decided = decide(
            pool,
            workers,
            book=book,
            limit=budget_limit(budgets, services.config.budget_name, missing=services.config.missing_budget),
            pools_by_key=pools_by_key,
            settings=planner_settings(services.config),
            now=now,
            load_window=run.load_window,
            counters=run.counters,
            # A name a drain's eviction still holds in the pool's budget is no more free than a taken one.
            taken=frozenset({*run.taken_names, *run.disrupted}),
        )
        run.load_window, run.counters = decided.load_window, decided.counters
        # What this pass removes leaves the budget's selector first (or never served): not a drain's.
        removed = {e.name for e in decided.evict} | {d.name for d in decided.delete}
        run.budgeted = budgeted(own) - removed
        # Not held while the requests are in flight: every pool's observed workers, per pass.
        del workers, own
        if await apply(decided, services, book, run=run, pool=pool, body=body, now=now):
            outcome.result = "error"
        settle_soon(services, book, indexed=in_index(pods_by_pool))
        return decided
