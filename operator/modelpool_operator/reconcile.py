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
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from modelpool_contract.api import Condition, ModelPoolStatus, parse_pool_status
from modelpool_contract.demand import Demand
from modelpool_operator.bookkeeping import Bookkeeping, PoolRun
from modelpool_operator.budget import BUDGET_VALID, BudgetLimit, budget_status, budget_validity
from modelpool_operator.effects.kube import describe_error, merge_patch, refused
from modelpool_operator.effects.network_policy import build_network_policy
from modelpool_operator.effects.resources import build_service, build_worker_pod, eviction_patch
from modelpool_operator.observe.observation import (
    LazyOthers,
    PodsByPool,
    StatsByName,
    budget_limit,
    observe_all,
    other_pools,
)
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import CounterSample, Event, LoadSample, Plan, PlannerSettings, plan
from modelpool_operator.planner.draft import Evict
from modelpool_operator.planner.status import condition
from modelpool_operator.policy import Violation, violations
from modelpool_operator.pool import OtherPool, PoolKey, PoolView
from modelpool_operator.services import Services, planner_settings, pod_settings, policy_settings

logger = logging.getLogger(__name__)

PoolsByKey = Mapping[PoolKey, Iterable[OtherPool]]
BudgetsByName = Mapping[str, Iterable[Mapping[str, Any]]]
DemandByPool = Mapping[PoolKey, Iterable[Demand]]


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
    )


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
) -> Plan:
    """Plan the pool over what was observed, and reserve the planned creations: synchronous on purpose
    (see the module doc); it reads only its arguments and writes only the reservations."""
    decided = plan(
        pool,
        workers.get(pool.key, []),
        book.ledger(workers, limit),
        now=now,
        others=LazyOthers(lambda: other_pools(pool.key, pools_by_key, workers)),
        settings=settings,
        load_window=load_window,
        counters=counters,
    )
    book.reserve(pool.key, decided.create, now)
    return decided


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
    services: Services,
    book: Bookkeeping,
    run: PoolRun,
    pool: PoolView,
    body: Mapping[str, Any],
    *,
    decided: Plan,
    now: datetime,
) -> list[ApiFailure]:
    """The plan's effects: evictions, deletions, creations, the Service and the NetworkPolicy, the status
    (with the ApiError condition), the Events. Returns the API requests that failed."""
    kube = services.kube
    if decided.create:
        book.budget_wakeup.set()
    failures: list[ApiFailure | None] = []
    for evict in decided.evict:
        failures.append(
            await _attempt("EvictFailed", f"worker {evict.name}", _evict(services, book, run, evict, now))
        )
    for delete in decided.delete:
        failures.append(
            await _attempt(
                "DeleteFailed", f"worker {delete.name}", kube.delete_pod(pool.namespace, delete.name)
            )
        )
    # Creations run concurrently (a pool scaling to 10 should not take 10 round trips), and before the
    # Service and the NetworkPolicy: neither may keep a worker from starting.
    failures += await asyncio.gather(*(create_worker(services, book, pool, c.name) for c in decided.create))
    failures.append(await ensure_service(services, run, pool))
    failures.append(await ensure_network_policy(services, run, pool))
    failed = [f for f in failures if f is not None]
    status = with_api_condition(decided.status, pool, failed, now)

    wire = status.model_dump(mode="json", by_alias=True)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    patch = merge_patch(previous, wire)
    if patch:
        await kube.patch_pool_status(pool.namespace, pool.name, patch)
    services.metrics.pool_written(run.key, pool.status, status)
    run.last_status, run.last_status_wire = status, wire
    for event in decided.events:
        services.events.post(body, event)
    _tell_failures(services, run, body, failed)
    _note_budget(services, book, run, status)
    return failed


async def _evict(services: Services, book: Bookkeeping, run: PoolRun, evict: Evict, now: datetime) -> None:
    """Start one eviction (the serving label off, the reason, time and observed state on)."""
    patch = eviction_patch(evict.reason, now, evict.state)
    if await services.kube.patch_pod(evict.namespace, evict.name, patch):
        services.metrics.evicted(evict.reason)
    if (evict.namespace, evict.pool) != run.key:
        book.poke((evict.namespace, evict.pool))  # its daemon deletes it after the drain grace


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
    services: Services, run: PoolRun, body: Mapping[str, Any], failed: list[ApiFailure]
) -> None:
    """A Warning Event and a log line for each failure that is new since the last pass (one that goes on
    failing the same way is not repeated at every pass: the condition shows it)."""
    told = {(f.reason, f.message) for f in failed}
    for reason, message in sorted(told - run.api_failures):
        logger.warning("pool %s/%s: %s: %s", *run.key, reason, message)
        services.events.post(body, Event("Warning", reason, message))
    run.api_failures = told


async def ensure_service(services: Services, run: PoolRun, pool: PoolView) -> ApiFailure | None:
    """Create (or bring up to date) the pool's headless Service once per process; a failure (a quota, ...)
    is returned for the status and retried at the next pass."""
    if run.service_ready:
        return None
    service = build_service(pool, pod_settings(services.config))
    failure = await _attempt(
        "ServiceFailed", f"Service {pool.name}", services.kube.ensure_service(pool.namespace, service)
    )
    run.service_ready = failure is None
    return failure


async def ensure_network_policy(services: Services, run: PoolRun, pool: PoolView) -> ApiFailure | None:
    """Create or update the pool's NetworkPolicy once per process (each start applies the current settings).
    A failure never holds up the workers: it is returned for the status and retried at the next pass."""
    settings = policy_settings(services.config)
    if settings is None or run.network_policy_ready:
        return None
    policy = build_network_policy(pool, settings)
    failure = await _attempt(
        "NetworkPolicyFailed",
        "the workers' NetworkPolicy could not be applied",
        services.kube.ensure_network_policy(pool.namespace, policy),
    )
    run.network_policy_ready = failure is None
    return failure


async def settle_reservations(services: Services, book: Bookkeeping, now: datetime) -> None:
    """Ask the API about the reservations whose pod is still unobserved at their check time (any pool's:
    a deleted pool's too); a pod known absent ends its reservation, anything else keeps it (``budget``)."""
    kube = services.kube
    for reservation in book.reservations.due(now, services.config.reservation_ttl_seconds):
        try:
            exists = await kube.pod_exists(reservation.namespace, reservation.worker)
        except Exception as exc:  # unknown: keep the memory reserved, ask again later
            logger.warning("reservation of %s/%s kept: %s", *reservation.key, describe_error(exc))
            continue
        if not exists:
            logger.info("reservation of %s/%s ended: the pod does not exist", *reservation.key)
            book.reservations.absent(reservation)
            book.budget_wakeup.set()
            book.poke(reservation.pool_key)


def _note_budget(services: Services, book: Bookkeeping, run: PoolRun, status: ModelPoolStatus) -> None:
    """Remember whether the pool waits for memory, and wake the pools that might fit when it freed some."""
    budget = next((c for c in status.conditions if c.type == "BudgetExceeded"), None)
    book.waits_for_budget(run.key, budget is not None and budget.status == "True")
    charged = status.memory.charged_bytes
    if charged < run.charged:
        book.poke_waiting()  # memory freed: pools waiting for budget may fit now
    elif charged != run.charged:
        book.budget_wakeup.set()
    run.charged = charged


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
) -> Plan | None:
    """One pass for the pool ``run.key``: returns the plan it applied (None: the spec is invalid).  Timed
    and counted by outcome in the operator's metrics."""
    with services.metrics.reconcile_pass() as outcome:
        try:
            pool = PoolView.from_body(body, demand=latest_demand(demand or {}, run.key))
        except ValueError as exc:  # the CRD schema should have refused it; say why once per generation
            outcome.result = "invalid"
            await report_invalid_spec(services, run, body, exc)
            return None
        refused = violations(pool.spec, services.config.policy)
        if refused:
            outcome.result = "forbidden"
            await report_policy_violation(services, run, pool, body, refused)
            return None
        if run.last_status is not None:
            # We are the only writer of status; our last write is newer than what the watch may show yet.
            pool = replace(pool, status=run.last_status)
        # From observing to the reservations ``decide`` records nothing is awaited (see the module doc).
        now = datetime.now(UTC)
        workers = observe(services, book, pods_by_pool, own=pool.key, now=now)
        decided = decide(
            pool,
            workers,
            book=book,
            limit=budget_limit(budgets, services.config.budget_name),
            pools_by_key=pools_by_key,
            settings=planner_settings(services.config),
            now=now,
            load_window=run.load_window,
            counters=run.counters,
        )
        run.load_window, run.counters = decided.load_window, decided.counters
        if await apply(services, book, run, pool, body, decided=decided, now=now):
            outcome.result = "error"
        await settle_reservations(services, book, now)
        return decided


async def report_invalid_spec(
    services: Services, run: PoolRun, body: Mapping[str, Any], exc: Exception
) -> None:
    """An unparseable spec: a Warning Event, phase Failed and condition Ready False (reason InvalidSpec,
    naming the field), once per generation; no workers are touched."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if run.invalid_generation == generation:
        return
    run.invalid_generation = generation
    services.events.post(body, Event("Warning", INVALID_SPEC, f"invalid spec: {exc}"[:1000]))
    previous = parse_pool_status(body.get("status")).conditions
    status = invalid_spec_status(previous, generation, invalid_spec_message(exc), datetime.now(UTC))
    await services.kube.patch_pool_status(run.key[0], run.key[1], status)
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
    services: Services,
    run: PoolRun,
    pool: PoolView,
    body: Mapping[str, Any],
    refused: list[Violation],
) -> None:
    """A spec the operator's policy refuses: condition PolicyViolation (naming each field), phase Failed
    and a Warning Event, once per generation; no worker is created, deleted or evicted. Workers that
    already exist (an allowed spec before, or the policy narrowed since) are left as they are."""
    message = policy_message(refused)
    if run.forbidden == (pool.generation, message):
        return
    run.forbidden = (pool.generation, message)
    services.events.post(body, Event("Warning", POLICY_VIOLATION, message[:1000]))
    status = policy_status(pool, message, datetime.now(UTC))
    await services.kube.patch_pool_status(pool.namespace, pool.name, status)
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


async def create_worker(
    services: Services, book: Bookkeeping, pool: PoolView, name: str
) -> ApiFailure | None:
    """Create one worker pod. Its reservation ends at once only when the API refused the create (4xx);
    made, already there, or an unknown outcome (a timeout, a 5xx: the pod may exist), it stays until the
    pod is observed or known absent (``settle_reservations``)."""
    pod = build_worker_pod(pool, name, pod_settings(services.config))
    failure = await _attempt(
        "CreateFailed", f"worker {name}", _create(services, book, pool.namespace, name, pod)
    )
    if failure is not None:
        book.budget_wakeup.set()
    return failure


async def _create(
    services: Services, book: Bookkeeping, namespace: str, name: str, pod: Mapping[str, Any]
) -> None:
    reservations, check_s = book.reservations, services.config.reservation_ttl_seconds
    try:
        await services.kube.create_pod(namespace, pod)
    except Exception as exc:
        if refused(exc):
            reservations.release(namespace, name)
        else:
            reservations.answered(namespace, name, datetime.now(UTC), check_s)
        raise
    reservations.answered(namespace, name, datetime.now(UTC), check_s)


def budget_status_wire(
    services: Services,
    book: Bookkeeping,
    pods_by_pool: PodsByPool,
    budgets: BudgetsByName,
    *,
    previous: Mapping[str, Any] | None = None,
    generation: int = 0,
) -> dict[str, Any]:
    """The ModelBudget status (wire form) as of now, derived from every indexed worker, with its Valid
    condition (``previous``: the status as last written, for the condition's transition time); the
    budget's metrics follow it."""
    now = datetime.now(UTC)
    workers = observe(services, book, pods_by_pool, own=None, now=now)
    ledger = book.ledger(workers, budget_limit(budgets, services.config.budget_name))
    services.metrics.budget_written(ledger.total, ledger.used, ledger.reserved)
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
