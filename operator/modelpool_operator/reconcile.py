"""One reconciliation pass of one ModelPool: observe, plan (pure), then apply the plan's effects.

The order matters for the budget. Everything between reading the pod index and recording the planned
creations as reservations is synchronous (``decide``: no ``await``), so on the operator's single event
loop no other pool can plan in between: two pools reconciling "at once" always see each other's
reservations and can never over-admit. The API calls (evict, delete, create, status) and the Events come
after (``apply``), and a failed create releases its reservation at once.

Everything read here is rebuilt from the cluster (Kopf's indices of pods, pools and budgets); the only
in-memory state is the reservation book, the last status this process wrote (we are its one writer,
so that copy is authoritative even before the watch delivers it back) and each pool's load window (the
autoscaler's recent samples, re-learned after a restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from modelpool_contract.api import ModelPoolStatus
from modelpool_contract.demand import Demand
from modelpool_operator.budget import Ledger, budget_status
from modelpool_operator.events import Event
from modelpool_operator.kube import describe_error, merge_patch
from modelpool_operator.network_policy import PolicySettings, build_network_policy
from modelpool_operator.observation import (
    PodsByPool,
    StatsByName,
    budget_total,
    current_ledger,
    observe_all,
    other_pools,
)
from modelpool_operator.planner import CounterSample, LoadSample, Plan, PlannerSettings, plan
from modelpool_operator.planner.status import condition
from modelpool_operator.policy import Violation, violations
from modelpool_operator.pool import OtherPool, PoolKey, PoolView
from modelpool_operator.process_state import OperatorState
from modelpool_operator.resources import PodSettings, build_service, build_worker_pod, eviction_patch
from modelpool_operator.settings import OperatorConfig
from modelpool_operator.worker_state import LifecycleSettings, ObservedWorker

logger = logging.getLogger(__name__)

PoolsByKey = Mapping[PoolKey, Iterable[OtherPool]]
BudgetsByName = Mapping[str, Iterable[Mapping[str, Any]]]
DemandByPool = Mapping[PoolKey, Iterable[Demand]]


def latest_demand(demand: DemandByPool, key: PoolKey) -> Demand | None:
    """The latest demand recorded for the pool (one Lease per pool; the latest, should there be more)."""
    return max(demand.get(key, ()), key=lambda d: d.at, default=None)


def lifecycle_settings(config: OperatorConfig) -> LifecycleSettings:
    return LifecycleSettings(unschedulable_timeout_s=config.unschedulable_timeout_seconds)


def planner_settings(config: OperatorConfig) -> PlannerSettings:
    return PlannerSettings(
        backoff_base_s=config.backoff_base_seconds, backoff_cap_s=config.backoff_cap_seconds
    )


def pod_settings(config: OperatorConfig) -> PodSettings:
    return PodSettings(
        default_image=config.server_image,
        port=config.server_port,
        probe_port=config.server_probe_port,
        model_cache=config.model_cache,
    )


def policy_settings(config: OperatorConfig) -> PolicySettings | None:
    """Whom the pools' NetworkPolicies admit; None when the operator makes none."""
    if not config.network_policy_enabled:
        return None
    return PolicySettings(
        namespace=config.network_policy_namespace,
        operator_labels=config.network_policy_operator_labels,
        gateway_labels=config.network_policy_gateway_labels,
        callers=config.network_policy_from,
        metrics_callers=config.network_policy_metrics_from,
    )


@dataclass
class PoolRun:
    """What one pool's daemon carries from pass to pass."""

    key: PoolKey
    last_status: ModelPoolStatus | None = None
    last_status_wire: dict[str, Any] | None = None
    service_ready: bool = False
    # The pool's NetworkPolicy is in place (made or brought up to date by this process), and the last
    # error that kept it from being so (told once as an Event, not at every pass).
    network_policy_ready: bool = False
    network_policy_error: str | None = None
    charged: int = 0
    invalid_generation: int | None = None
    # The generation (and the refusal) last reported as a policy violation.
    forbidden: tuple[int, str] | None = None
    # The autoscaler's load samples and the serving workers' counters, handed from one plan to the next.
    load_window: tuple[LoadSample, ...] = ()
    counters: Mapping[str, CounterSample] = field(default_factory=dict)


def _observe(
    state: OperatorState, pods_by_pool: PodsByPool, own: PoolKey | None, own_stats: StatsByName, now: datetime
) -> dict[PoolKey, list[ObservedWorker]]:
    return observe_all(
        state.require_observations(),
        pods_by_pool,
        observed=state.observed,
        cached_stats=state.require_scraper().cached,
        own=own,
        own_stats=own_stats,
        now=now,
    )


def _ledger(
    state: OperatorState,
    workers: Mapping[PoolKey, list[ObservedWorker]],
    budgets: BudgetsByName,
    now: datetime,
) -> Ledger:
    return current_ledger(
        workers,
        state.reservations,
        total=budget_total(budgets, state.config.budget_name),
        now=now,
        ttl_s=state.config.reservation_ttl_seconds,
    )


def decide(
    state: OperatorState,
    pool: PoolView,
    *,
    pods_by_pool: PodsByPool,
    pools_by_key: PoolsByKey,
    budgets: BudgetsByName,
    load_window: tuple[LoadSample, ...] = (),
    counters: Mapping[str, CounterSample] | None = None,
) -> tuple[Plan, datetime]:
    """Observe, plan and reserve the planned creations: synchronous on purpose (see the module doc)."""
    own_pods = list(pods_by_pool.get(pool.key, ()))
    # Stats come from the scraper's cache; stale ones are refetched in the background and wake us.
    own_stats = state.require_scraper().refresh(own_pods, on_change=lambda: state.poke(pool.key))
    now = datetime.now(UTC)
    workers = _observe(state, pods_by_pool, pool.key, own_stats, now)
    decided = plan(
        pool,
        workers.get(pool.key, []),
        _ledger(state, workers, budgets, now),
        now=now,
        others=other_pools(pool.key, pools_by_key, workers),
        settings=planner_settings(state.config),
        load_window=load_window,
        counters=counters,
    )
    for create in decided.create:
        state.reservations.reserve(pool.namespace, pool.name, create.name, create.memory, now)
    return decided, now


async def apply(
    state: OperatorState,
    run: PoolRun,
    pool: PoolView,
    body: Mapping[str, Any],
    *,
    decided: Plan,
    now: datetime,
) -> None:
    """The plan's effects: evictions, deletions, the Service and the NetworkPolicy, creations, the status, the
    Events."""
    kube = state.require_kube()
    if decided.create:
        state.budget_wakeup.set()
    for evict in decided.evict:
        if await kube.patch_pod(evict.namespace, evict.name, eviction_patch(evict.reason, now)):
            state.metrics.evicted(evict.reason)
        if (evict.namespace, evict.pool) != run.key:
            state.poke((evict.namespace, evict.pool))  # its daemon deletes it after the drain grace
    for delete in decided.delete:
        await kube.delete_pod(pool.namespace, delete.name)
    if not run.service_ready:
        await kube.ensure_service(pool.namespace, build_service(pool, pod_settings(state.config)))
        run.service_ready = True
    await ensure_network_policy(state, run, pool, body)
    # Creations run concurrently (a pool scaling to 10 should not take 10 round trips); each failed one
    # releases its reservation at once, and the first error fails the pass (retried shortly).
    outcomes = await asyncio.gather(
        *(create_worker(state, pool, body, c.name) for c in decided.create), return_exceptions=True
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise errors[0]

    wire = decided.status.model_dump(mode="json", by_alias=True)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    patch = merge_patch(previous, wire)
    if patch:
        await kube.patch_pool_status(pool.namespace, pool.name, patch)
    state.metrics.pool_written(run.key, pool.status, decided.status)
    run.last_status, run.last_status_wire = decided.status, wire
    for event in decided.events:
        state.events.post(body, event)
    _note_budget(state, run, decided.status)


async def ensure_network_policy(
    state: OperatorState, run: PoolRun, pool: PoolView, body: Mapping[str, Any]
) -> None:
    """Create or update the pool's NetworkPolicy once per process (each start applies the current settings).
    A failure never holds up the workers: it is told once as a Warning Event and retried at the next pass."""
    settings = policy_settings(state.config)
    if settings is None or run.network_policy_ready:
        return
    try:
        await state.require_kube().ensure_network_policy(pool.namespace, build_network_policy(pool, settings))
    except Exception as exc:  # any failure: the workers go on, the next pass retries
        message = f"the workers' NetworkPolicy could not be applied: {describe_error(exc)}"[:1000]
        logger.warning("pool %s/%s: %s", pool.namespace, pool.name, message)
        if message != run.network_policy_error:
            state.events.post(body, Event("Warning", "NetworkPolicyFailed", message))
        run.network_policy_error = message
        return
    run.network_policy_ready, run.network_policy_error = True, None


def _note_budget(state: OperatorState, run: PoolRun, status: ModelPoolStatus) -> None:
    """Remember whether the pool waits for memory, and wake the pools that might fit when it freed some."""
    budget = next((c for c in status.conditions if c.type == "BudgetExceeded"), None)
    if budget is not None and budget.status == "True":
        state.waiting.add(run.key)
    else:
        state.waiting.discard(run.key)
    charged = status.memory.charged_bytes
    if charged < run.charged:
        state.poke_waiting()  # memory freed: pools waiting for budget may fit now
    elif charged != run.charged:
        state.budget_wakeup.set()
    run.charged = charged


async def reconcile_pool(
    state: OperatorState,
    *,
    run: PoolRun,
    body: Mapping[str, Any],
    pods_by_pool: PodsByPool,
    pools_by_key: PoolsByKey,
    budgets: BudgetsByName,
    demand: DemandByPool | None = None,
) -> Plan | None:
    """One pass for the pool ``run.key``: returns the plan it applied (None: the spec is invalid).  Timed
    and counted by outcome in the operator's metrics."""
    with state.metrics.reconcile_pass() as outcome:
        try:
            pool = PoolView.from_body(body, demand=latest_demand(demand or {}, run.key))
        except ValueError as exc:  # the CRD schema should have refused it; say why once per generation
            outcome.result = "invalid"
            await report_invalid_spec(state, run, body, exc)
            return None
        refused = violations(pool.spec, state.config.policy)
        if refused:
            outcome.result = "forbidden"
            await report_policy_violation(state, run, pool, body, refused)
            return None
        if run.last_status is not None:
            # We are the only writer of status; our last write is newer than what the watch may show yet.
            pool = replace(pool, status=run.last_status)
        decided, now = decide(
            state,
            pool,
            pods_by_pool=pods_by_pool,
            pools_by_key=pools_by_key,
            budgets=budgets,
            load_window=run.load_window,
            counters=run.counters,
        )
        run.load_window, run.counters = decided.load_window, decided.counters
        await apply(state, run, pool, body, decided=decided, now=now)
        return decided


async def report_invalid_spec(
    state: OperatorState, run: PoolRun, body: Mapping[str, Any], exc: Exception
) -> None:
    """An unparseable spec: a Warning Event and phase Failed, once per generation; no workers are touched."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if run.invalid_generation == generation:
        return
    run.invalid_generation = generation
    state.events.post(body, Event("Warning", "InvalidSpec", f"invalid spec: {exc}"[:1000]))
    status = {"phase": "Failed", "observedGeneration": generation}
    await state.require_kube().patch_pool_status(run.key[0], run.key[1], status)
    run.last_status = run.last_status_wire = None


#: The condition type and Event reason of a pool the operator's policy refuses.
POLICY_VIOLATION = "PolicyViolation"


async def report_policy_violation(
    state: OperatorState, run: PoolRun, pool: PoolView, body: Mapping[str, Any], refused: list[Violation]
) -> None:
    """A spec the operator's policy refuses: condition PolicyViolation (naming each field), phase Failed
    and a Warning Event, once per generation; no worker is created, deleted or evicted. Workers that
    already exist (an allowed spec before, or the policy narrowed since) are left as they are."""
    message = policy_message(refused)
    if run.forbidden == (pool.generation, message):
        return
    run.forbidden = (pool.generation, message)
    state.events.post(body, Event("Warning", POLICY_VIOLATION, message[:1000]))
    status = policy_status(pool, message, datetime.now(UTC))
    await state.require_kube().patch_pool_status(pool.namespace, pool.name, status)
    # What the status is now, so that the pass after the spec is allowed again removes the condition even
    # before the watch shows this write.
    run.last_status, run.last_status_wire = None, {**(body.get("status") or {}), **status}


def policy_message(refused: list[Violation]) -> str:
    """The refusal in one message: every field's reason, then what the operator does about it."""
    reasons = "; ".join(v.message for v in refused)
    return f"{reasons}; no worker is created or changed until the spec is allowed"


def policy_status(pool: PoolView, message: str, now: datetime) -> dict[str, Any]:
    """The status patch of a refused pool: phase Failed and the PolicyViolation condition, the pool's
    other conditions kept (they describe its existing workers, which are left alone)."""
    kept = [c for c in pool.status.conditions if c.type != POLICY_VIOLATION]
    violation = condition(
        pool.status.conditions,
        POLICY_VIOLATION,
        status="True",
        reason="Forbidden",
        message=message,
        now=now,
        generation=pool.generation,
    )
    conditions = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in [*kept, violation]]
    return {"phase": "Failed", "observedGeneration": pool.generation, "conditions": conditions}


async def create_worker(state: OperatorState, pool: PoolView, body: Mapping[str, Any], name: str) -> None:
    """Create one worker pod; its reservation ends at once when the call fails or the pod already exists."""
    pod = build_worker_pod(pool, name, pod_settings(state.config))
    try:
        created = await state.require_kube().create_pod(pool.namespace, pod)
    except Exception as exc:
        state.reservations.release(pool.namespace, name)
        state.budget_wakeup.set()
        state.events.post(body, Event("Warning", "CreateFailed", f"worker {name}: {exc}"))
        raise
    if not created:  # it already exists (an earlier pass or process): the watch shows its charge
        state.reservations.release(pool.namespace, name)


def budget_status_wire(
    state: OperatorState, pods_by_pool: PodsByPool, budgets: BudgetsByName
) -> dict[str, Any]:
    """The ModelBudget status (wire form) as of now, derived from every indexed worker; the budget's
    metrics follow it."""
    now = datetime.now(UTC)
    workers = _observe(state, pods_by_pool, None, {}, now)
    ledger = _ledger(state, workers, budgets, now)
    state.metrics.budget_written(ledger.total, ledger.used, ledger.reserved)
    return budget_status(ledger).model_dump(mode="json", by_alias=True)
