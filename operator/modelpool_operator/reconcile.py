"""One reconciliation pass of one ModelPool: observe, plan (pure), then apply the plan's effects.

The order matters for the budget. Everything between reading the pod index and recording the planned
creations as reservations is synchronous (``decide``: no ``await``), so on the operator's single event
loop no other pool can plan in between: two pools reconciling "at once" always see each other's
reservations and can never over-admit. The API calls (evict, delete, create, the Service, status) and the
Events come after (``apply``); a create the API refuses releases its reservation at once, one whose outcome
is unknown keeps it until the pod is observed or known absent (``budget``).

A failed API request never ends a pass: the workers are created whatever becomes of the Service or the
NetworkPolicy (neither is needed to serve: the gateway routes to pod addresses), and every failure reaches
the pool's status as the condition ApiError and a Warning Event, both with the API server's own message
(``exceeded quota: ...``), then is retried at the next pass.

Everything read here is rebuilt from the cluster (Kopf's indices of pods, pools and budgets); the only
in-memory state is the reservation book, the last status this process wrote (we are its one writer,
so that copy is authoritative even before the watch delivers it back) and each pool's load window (the
autoscaler's recent samples, re-learned after a restart).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from modelpool_contract.api import Condition, ModelPoolStatus, parse_pool_status
from modelpool_contract.demand import Demand
from modelpool_operator.budget import BUDGET_VALID, Ledger, budget_status, budget_validity
from modelpool_operator.effects.kube import describe_error, merge_patch, refused
from modelpool_operator.effects.network_policy import PolicySettings, build_network_policy
from modelpool_operator.effects.resources import PodSettings, build_service, build_worker_pod, eviction_patch
from modelpool_operator.observe.observation import (
    LazyOthers,
    PodsByPool,
    StatsByName,
    budget_limit,
    current_ledger,
    observe_all,
    other_pools,
)
from modelpool_operator.observe.worker_state import LifecycleSettings, ObservedWorker
from modelpool_operator.planner import CounterSample, Event, LoadSample, Plan, PlannerSettings, plan
from modelpool_operator.planner.draft import Evict
from modelpool_operator.planner.status import condition
from modelpool_operator.policy import Violation, violations
from modelpool_operator.pool import OtherPool, PoolKey, PoolView
from modelpool_operator.process_state import OperatorState
from modelpool_operator.settings import OperatorConfig

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
    # The pool's NetworkPolicy is in place (made or brought up to date by this process).
    network_policy_ready: bool = False
    charged: int = 0
    # The API failures of the last pass (reason, message): each is told as an Event and logged when it is
    # new, not at every pass while it lasts.
    api_failures: set[tuple[str, str]] = field(default_factory=set)
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
    limit = budget_limit(budgets, state.config.budget_name)
    return current_ledger(workers, state.reservations, limit=limit, charges=state.charges)


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
        others=LazyOthers(lambda: other_pools(pool.key, pools_by_key, workers)),
        settings=planner_settings(state.config),
        load_window=load_window,
        counters=counters,
    )
    for create in decided.create:
        state.reservations.reserve(pool.namespace, pool.name, create.name, create.memory, now)
    return decided, now


#: The pool condition that reports the API requests of the last pass that failed.
API_ERROR = "ApiError"


@dataclass(frozen=True)
class ApiFailure:
    """One API request of a pass that failed: ``reason`` names what failed (the condition's reason and the
    Event's), ``message`` says which object and the API server's own words."""

    reason: str
    message: str


async def _attempt(reason: str, what: str, request: Awaitable[object]) -> ApiFailure | None:
    """Await one effect of the pass; its failure as an ``ApiFailure`` (never raised: the pass goes on)."""
    try:
        await request
    except Exception as exc:  # whatever failed, the other effects and the status still happen
        return ApiFailure(reason, f"{what}: {describe_error(exc)}"[:1000])
    return None


async def apply(
    state: OperatorState,
    run: PoolRun,
    pool: PoolView,
    body: Mapping[str, Any],
    *,
    decided: Plan,
    now: datetime,
) -> list[ApiFailure]:
    """The plan's effects: evictions, deletions, creations, the Service and the NetworkPolicy, the status
    (with the ApiError condition), the Events. Returns the API requests that failed."""
    kube = state.require_kube()
    if decided.create:
        state.budget_wakeup.set()
    failures: list[ApiFailure | None] = []
    for evict in decided.evict:
        failures.append(await _attempt("EvictFailed", f"worker {evict.name}", _evict(state, run, evict, now)))
    for delete in decided.delete:
        failures.append(
            await _attempt(
                "DeleteFailed", f"worker {delete.name}", kube.delete_pod(pool.namespace, delete.name)
            )
        )
    # Creations run concurrently (a pool scaling to 10 should not take 10 round trips), and before the
    # Service and the NetworkPolicy: neither may keep a worker from starting.
    failures += await asyncio.gather(*(create_worker(state, pool, c.name) for c in decided.create))
    failures.append(await ensure_service(state, run, pool))
    failures.append(await ensure_network_policy(state, run, pool))
    failed = [f for f in failures if f is not None]
    status = with_api_condition(decided.status, pool, failed, now)

    wire = status.model_dump(mode="json", by_alias=True)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    patch = merge_patch(previous, wire)
    if patch:
        await kube.patch_pool_status(pool.namespace, pool.name, patch)
    state.metrics.pool_written(run.key, pool.status, status)
    run.last_status, run.last_status_wire = status, wire
    for event in decided.events:
        state.events.post(body, event)
    _tell_failures(state, run, body, failed)
    _note_budget(state, run, status)
    return failed


async def _evict(state: OperatorState, run: PoolRun, evict: Evict, now: datetime) -> None:
    """Start one eviction (the serving label off, the reason, time and observed state on)."""
    patch = eviction_patch(evict.reason, now, evict.state)
    if await state.require_kube().patch_pod(evict.namespace, evict.name, patch):
        state.metrics.evicted(evict.reason)
    if (evict.namespace, evict.pool) != run.key:
        state.poke((evict.namespace, evict.pool))  # its daemon deletes it after the drain grace


def with_api_condition(
    status: ModelPoolStatus, pool: PoolView, failed: list[ApiFailure], now: datetime
) -> ModelPoolStatus:
    """The planned status with the ApiError condition: True with the failed requests' messages (the API
    server's own), False when every request of the pass succeeded."""
    if failed:
        reason, message = failed[0].reason, "; ".join(f.message for f in failed)[:2000]
    else:
        reason, message = "RequestsSucceeded", "every API request of the last pass succeeded"
    api_error = condition(
        pool.status.conditions,
        API_ERROR,
        status="True" if failed else "False",
        reason=reason,
        message=message,
        now=now,
        generation=pool.generation,
    )
    kept: list[Condition] = [c for c in status.conditions if c.type != API_ERROR]
    return status.model_copy(update={"conditions": [*kept, api_error]})


def _tell_failures(
    state: OperatorState, run: PoolRun, body: Mapping[str, Any], failed: list[ApiFailure]
) -> None:
    """A Warning Event and a log line for each failure that is new since the last pass (one that goes on
    failing the same way is not repeated at every pass: the condition shows it)."""
    told = {(f.reason, f.message) for f in failed}
    for reason, message in sorted(told - run.api_failures):
        logger.warning("pool %s/%s: %s: %s", *run.key, reason, message)
        state.events.post(body, Event("Warning", reason, message))
    run.api_failures = told


async def ensure_service(state: OperatorState, run: PoolRun, pool: PoolView) -> ApiFailure | None:
    """Create (or bring up to date) the pool's headless Service once per process; a failure (a quota, ...)
    is returned for the status and retried at the next pass."""
    if run.service_ready:
        return None
    service = build_service(pool, pod_settings(state.config))
    failure = await _attempt(
        "ServiceFailed", f"Service {pool.name}", state.require_kube().ensure_service(pool.namespace, service)
    )
    run.service_ready = failure is None
    return failure


async def ensure_network_policy(state: OperatorState, run: PoolRun, pool: PoolView) -> ApiFailure | None:
    """Create or update the pool's NetworkPolicy once per process (each start applies the current settings).
    A failure never holds up the workers: it is returned for the status and retried at the next pass."""
    settings = policy_settings(state.config)
    if settings is None or run.network_policy_ready:
        return None
    policy = build_network_policy(pool, settings)
    failure = await _attempt(
        "NetworkPolicyFailed",
        "the workers' NetworkPolicy could not be applied",
        state.require_kube().ensure_network_policy(pool.namespace, policy),
    )
    run.network_policy_ready = failure is None
    return failure


async def settle_reservations(state: OperatorState, now: datetime) -> None:
    """Ask the API about the reservations whose pod is still unobserved at their check time (any pool's:
    a deleted pool's too); a pod known absent ends its reservation, anything else keeps it (``budget``)."""
    kube = state.require_kube()
    for reservation in state.reservations.due(now, state.config.reservation_ttl_seconds):
        try:
            exists = await kube.pod_exists(reservation.namespace, reservation.worker)
        except Exception as exc:  # unknown: keep the memory reserved, ask again later
            logger.warning("reservation of %s/%s kept: %s", *reservation.key, describe_error(exc))
            continue
        if not exists:
            logger.info("reservation of %s/%s ended: the pod does not exist", *reservation.key)
            state.reservations.absent(reservation)
            state.budget_wakeup.set()
            state.poke(reservation.pool_key)


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
        if await apply(state, run, pool, body, decided=decided, now=now):
            outcome.result = "error"
        await settle_reservations(state, now)
        return decided


async def report_invalid_spec(
    state: OperatorState, run: PoolRun, body: Mapping[str, Any], exc: Exception
) -> None:
    """An unparseable spec: a Warning Event, phase Failed and condition Ready False (reason InvalidSpec,
    naming the field), once per generation; no workers are touched."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if run.invalid_generation == generation:
        return
    run.invalid_generation = generation
    state.events.post(body, Event("Warning", INVALID_SPEC, f"invalid spec: {exc}"[:1000]))
    previous = parse_pool_status(body.get("status")).conditions
    status = invalid_spec_status(previous, generation, invalid_spec_message(exc), datetime.now(UTC))
    await state.require_kube().patch_pool_status(run.key[0], run.key[1], status)
    run.last_status = run.last_status_wire = None


#: The Event and condition reason of a spec the operator cannot parse.
INVALID_SPEC = "InvalidSpec"


def invalid_spec_message(exc: Exception) -> str:
    """Why a spec does not parse, in one line: each pydantic error's field and reason (the CRD is looser
    than the model in places, e.g. it admits ``resources.memory: 0``)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    reasons = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()))
        reason = str(error.get("msg", "")).removeprefix("Value error, ")
        if reason.startswith("spec.") or not where:
            reasons.append(reason)
        else:  # the model's own messages name the field already ("resources.memory must be ...")
            reasons.append(f"spec.{reason}" if reason.startswith(where) else f"spec.{where}: {reason}")
    return ("invalid spec: " + "; ".join(reasons or [str(exc)]))[:1000]


def invalid_spec_status(
    previous: Iterable[Condition], generation: int, message: str, now: datetime
) -> dict[str, Any]:
    """The status patch of a pool whose spec does not parse: phase Failed and condition Ready False with
    reason InvalidSpec and the message (other conditions are replaced: they described a spec that is
    gone)."""
    ready = condition(
        previous,
        "Ready",
        status="False",
        reason=INVALID_SPEC,
        message=message,
        now=now,
        generation=generation,
    )
    return {
        "phase": "Failed",
        "observedGeneration": generation,
        "conditions": [ready.model_dump(mode="json", by_alias=True, exclude_none=True)],
    }


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


async def create_worker(state: OperatorState, pool: PoolView, name: str) -> ApiFailure | None:
    """Create one worker pod. Its reservation ends at once only when the API refused the create (4xx);
    made, already there, or an unknown outcome (a timeout, a 5xx: the pod may exist), it stays until the
    pod is observed or known absent (``settle_reservations``)."""
    pod = build_worker_pod(pool, name, pod_settings(state.config))
    failure = await _attempt("CreateFailed", f"worker {name}", _create(state, pool.namespace, name, pod))
    if failure is not None:
        state.budget_wakeup.set()
    return failure


async def _create(state: OperatorState, namespace: str, name: str, pod: Mapping[str, Any]) -> None:
    book, check_s = state.reservations, state.config.reservation_ttl_seconds
    try:
        await state.require_kube().create_pod(namespace, pod)
    except Exception as exc:
        if refused(exc):
            book.release(namespace, name)
        else:
            book.answered(namespace, name, datetime.now(UTC), check_s)
        raise
    book.answered(namespace, name, datetime.now(UTC), check_s)


def budget_status_wire(
    state: OperatorState,
    pods_by_pool: PodsByPool,
    budgets: BudgetsByName,
    previous: Mapping[str, Any] | None = None,
    generation: int = 0,
) -> dict[str, Any]:
    """The ModelBudget status (wire form) as of now, derived from every indexed worker, with its Valid
    condition (``previous``: the status as last written, for the condition's transition time); the
    budget's metrics follow it."""
    now = datetime.now(UTC)
    workers = _observe(state, pods_by_pool, None, {}, now)
    ledger = _ledger(state, workers, budgets, now)
    state.metrics.budget_written(ledger.total, ledger.used, ledger.reserved)
    valid, reason, message = budget_validity(ledger)
    before = parse_pool_status({"conditions": (previous or {}).get("conditions") or []}).conditions
    validity = condition(
        before,
        BUDGET_VALID,
        status="True" if valid else "False",
        reason=reason,
        message=message,
        now=now,
        generation=generation,
    )
    return budget_status(ledger, [validity]).model_dump(mode="json", by_alias=True)
