"""The one place a reconciliation pass's effects are applied: ``apply`` takes the plan of a pass and makes it
so, in a fixed order, through the process's services (the API client, the Event sink, the metrics).

* ``apply``: a planned pass: evictions, deletions, creations (concurrently), then the headless Service,
  the NetworkPolicy and the PodDisruptionBudget (none may keep a worker from starting), the status (with
  the ApiError condition: the failed requests in the API server's own words), the Events; a failed
  request never ends the pass.
  The creations' reservations end here when the API refuses them (4xx) and get their check time
  otherwise (``budget``).
* ``refuse``: a pass that touches no worker (the spec is invalid, or the operator's policy forbids it):
  its status patch and its Warning Event.
* ``settle_reservations`` (``settle_soon``: in one task of the process's, never in a pass): the
  reservations still unobserved at their check time end when their pod is known absent.
* ``write_budget_status``, ``tell``: the ModelBudget's status, and an Event outside a pass (a pass that
  raised).

Nothing here decides what to do: the plan (``planner``) and the refusal (``reconcile``) are made before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelpool_contract.api import Condition, ModelPoolStatus
from modelpool_operator.bookkeeping import TAKEN_NAMES_MAX, Bookkeeping, HostRun, PoolRun
from modelpool_operator.budget import Reservation
from modelpool_operator.effects.attempts import NAME_TAKEN, ApiFailure, attempt
from modelpool_operator.effects.disruption_budget import build_host_budget, build_pool_budget
from modelpool_operator.effects.inference_pool import build_inference_pool
from modelpool_operator.effects.kube import NameTakenError, describe_error, merge_patch, refused
from modelpool_operator.effects.network_policy import (
    PolicySettings,
    build_host_network_policy,
    build_network_policy,
)
from modelpool_operator.effects.resources import build_service, build_worker_pod, eviction_patch
from modelpool_operator.host import HostView
from modelpool_operator.planner import Event, Evict, Plan
from modelpool_operator.planner.status import condition
from modelpool_operator.planner.status_pace import (
    creating,
    hold_events,
    pace_events,
    routine,
    status_delay,
)
from modelpool_operator.pool import PoolView
from modelpool_operator.services import Services, pod_settings, policy_settings

logger = logging.getLogger(__name__)

#: The pool condition that reports the API requests of the last pass that failed.
API_ERROR = "ApiError"
#: A pool asks for an InferencePool from an operator that does not make them (no request is made).
INFERENCE_POOLS_DISABLED = ApiFailure(
    "InferencePoolsDisabled",
    "spec.inferencePool: this operator does not make InferencePools (its setting inference_pools_enabled, "
    "the chart's inferencePool.enabled, is off)",
)
#: The reason of a failed InferencePool request (the API missing is ``attempts.INFERENCE_POOL_UNAVAILABLE``).
INFERENCE_POOL_FAILED = "InferencePoolFailed"


async def apply(
    plan: Plan,
    services: Services,
    book: Bookkeeping,
    *,
    run: PoolRun,
    pool: PoolView,
    body: Mapping[str, Any],
    now: datetime,
) -> list[ApiFailure]:
    """Make the pool's ``plan`` so: evictions, deletions, creations, the Service, the NetworkPolicy and the
    PodDisruptionBudget, the status (with the ApiError condition), the Events; then the bookkeeping
    (whether the pool waits for budget, who to wake). Returns the API requests that failed (the pass goes
    on past each)."""
    kube = services.kube
    if plan.create:
        book.budget_wakeup.set()
    failures: list[ApiFailure | None] = []
    for evict in plan.evict:
        failures.append(
            await attempt(
                "EvictFailed", f"worker {evict.name}", start_eviction(services, book, run, evict, now)
            )
        )
    for delete in plan.delete:
        failures.append(
            await attempt(
                "DeleteFailed", f"worker {delete.name}", kube.delete_pod(pool.namespace, delete.name)
            )
        )
    # Creations run concurrently (a pool scaling to 10 should not take 10 round trips), and before the
    # Service and the NetworkPolicy: neither may keep a worker from starting.
    failures += await asyncio.gather(
        *(create_worker(services, book, pool, c.name, run.taken_names) for c in plan.create)
    )
    failures.append(await ensure_service(services, run, pool))
    failures.append(await ensure_network_policy(services, run, pool))
    failures.append(await ensure_disruption_budget(services, run, pool, plan.status.target_replicas or 0))
    failures.append(await ensure_inference_pool(services, run, pool))
    failed = [f for f in failures if f is not None]
    status = with_api_condition(plan.status, pool, failed, now)

    wire = status.model_dump(mode="json", by_alias=True)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    patch = merge_patch(previous, wire)
    is_creating = creating(status)
    await write_status(services, run, pool, patch, wire, creating=is_creating)
    services.metrics.pool_written(run.key, pool.status, status)
    was_creating = run.last_status is not None and creating(run.last_status)
    # The planner's next pass starts from this status, written or held back (``write_status``).
    run.last_status = status
    post_events(services, run, body, plan.events, creating=is_creating, was_creating=was_creating)
    _tell_failures(services, run, body, failed)
    _note_budget(book, run, status)
    return failed


async def write_status(
    services: Services,
    run: PoolRun,
    pool: PoolView,
    patch: Mapping[str, Any],
    wire: dict[str, Any],
    *,
    creating: bool,
) -> None:
    """Write the pool's status ``patch`` now, or hold it back while the pool is being created
    (``planner.status_pace``: gathered for a moment, a routine detail longer): then ``run.status_due``
    asks for a pass when it may be written (``run.status_held_at``: since when a change waits), and the
    next write's patch, against the last written status (``run.last_status_wire``), carries it."""
    now = time.monotonic()
    since = None if run.status_written_at is None else now - run.status_written_at
    held = None if run.status_held_at is None else now - run.status_held_at
    interval = services.config.creating_status_interval_seconds
    delay = status_delay(
        changed=bool(patch),
        creating=creating,
        since_write=since,
        interval=interval,
        routine=routine(run.last_status_wire, wire),
        since_change=held,
    )
    run.status_due = delay or None
    if delay is None:  # unchanged: the status there is this one
        run.last_status_wire = wire
    if delay:
        run.status_held_at = now if run.status_held_at is None else run.status_held_at
        return
    run.status_held_at = None
    if delay is None:
        return
    await services.kube.patch_pool_status(pool.namespace, pool.name, dict(patch))
    run.last_status_wire, run.status_written_at = wire, now


def post_events(
    services: Services,
    run: PoolRun,
    body: Mapping[str, Any],
    events: Sequence[Event],
    *,
    creating: bool,
    was_creating: bool,
) -> None:
    """Post the pass's Events, or hold its Normal ones while its status is held or the pool is being
    created (``planner.status_pace.hold_events``): they go with a later pass's, one per reason."""
    now = time.monotonic()
    held_for = None if run.events_held_at is None else now - run.events_held_at
    hold = hold_events(
        deferred=run.status_due is not None, creating=creating, was_creating=was_creating, held_for=held_for
    )
    post, run.held_events = pace_events(run.held_events, events, hold=hold)
    if not run.held_events:
        run.events_held_at = None
    elif run.events_held_at is None:
        run.events_held_at = now
    for event in post:
        services.events.post(body, event)


async def start_eviction(
    services: Services, book: Bookkeeping, run: PoolRun, evict: Evict, now: datetime
) -> None:
    """Start one eviction (the serving label off, the reason, time and observed state on)."""
    patch = eviction_patch(evict.reason, now, evict.state)
    if await services.kube.patch_pod(evict.namespace, evict.name, patch):
        services.metrics.evicted(evict.reason)
    if (evict.namespace, evict.pool) != run.key:
        book.poke((evict.namespace, evict.pool))  # its daemon deletes it after the drain grace


def api_condition(
    previous: Iterable[Condition], failed: list[ApiFailure], now: datetime, generation: int
) -> Condition:
    """The ApiError condition of a pool or a ModelHost: True with the failed requests' messages (the API
    server's own; the first one's reason), False when every request of the pass succeeded."""
    if failed:
        reason, message = failed[0].reason, "; ".join(f.message for f in failed)
    else:
        reason, message = "RequestsSucceeded", "every API request of the last pass succeeded"
    return condition(
        previous,
        API_ERROR,
        status="True" if failed else "False",
        reason=reason,
        message=message,
        now=now,
        generation=generation,
    )


def with_api_condition(
    status: ModelPoolStatus, pool: PoolView, failed: list[ApiFailure], now: datetime
) -> ModelPoolStatus:
    """The planned status with the ApiError condition (``api_condition``)."""
    api_error = api_condition(pool.status.conditions, failed, now, pool.generation)
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
    """Create (or bring up to date) the pool's headless Service once per process and again whenever what it
    would write changes (or ``owned`` found it deleted or edited); a failure (a quota, ...) is returned for
    the status and retried at the next pass."""
    service = build_service(pool, pod_settings(services.config))
    if run.service == service:
        return None
    failure = await attempt(
        "ServiceFailed", f"Service {pool.name}", services.kube.ensure_service(pool.namespace, service)
    )
    run.service = service if failure is None else None
    return failure


async def ensure_network_policy(services: Services, run: PoolRun, pool: PoolView) -> ApiFailure | None:
    """Create or update the pool's NetworkPolicy once per process (each start applies the current settings)
    and again when what it says changes (``spec.inferencePool`` admits the picker).
    A failure never holds up the workers: it is returned for the status and retried at the next pass."""
    return await _ensure_policy(
        services, run, pool.namespace, "the workers'", lambda settings: build_network_policy(pool, settings)
    )


async def ensure_host_network_policy(services: Services, run: HostRun, host: HostView) -> ApiFailure | None:
    """The same for a ModelHost's host pods (``build_host_network_policy``): once per process, a failure
    returned for the Events and retried at the next pass, never holding up a host pod."""
    return await _ensure_policy(
        services,
        run,
        host.namespace,
        "the host pods'",
        lambda settings: build_host_network_policy(host, settings),
    )


async def _ensure_policy(
    services: Services,
    run: PoolRun | HostRun,
    namespace: str,
    whose: str,
    build: Callable[[PolicySettings], dict[str, Any]],
) -> ApiFailure | None:
    settings = policy_settings(services.config)
    if settings is None:
        return None
    body = build(settings)
    if run.network_policy == body:
        return None
    failure = await attempt(
        "NetworkPolicyFailed",
        f"{whose} NetworkPolicy could not be applied",
        services.kube.ensure_network_policy(namespace, body),
    )
    run.network_policy = body if failure is None else None
    return failure


async def ensure_inference_pool(services: Services, run: PoolRun, pool: PoolView) -> ApiFailure | None:
    """The pool's InferencePool as ``spec.inferencePool`` asks (with ``inference_pools_enabled``; without
    it no request, and a pool that asks is told ``INFERENCE_POOLS_DISABLED``): made or brought up to date
    when it is set (again only when what it says changes), removed once per process when it is not (one the
    pool owns; nothing to do where the InferencePool API is not installed). A failure, the API missing
    included (``InferencePoolUnavailable``: the CRD is not installed), never holds up the workers: it is
    returned for the status's ApiError condition and a Warning Event, and tried again at the next pass."""
    spec = pool.spec.inference_pool
    if not services.config.inference_pools_enabled:
        return None if spec is None else INFERENCE_POOLS_DISABLED
    if spec is None:
        if run.inference_pool is False:
            return None
        failure = await attempt(
            INFERENCE_POOL_FAILED,
            f"InferencePool {pool.name} could not be removed",
            services.kube.delete_inference_pool(pool.namespace, pool.name, pool.uid),
        )
        run.inference_pool = False if failure is None else None
        return failure
    body = build_inference_pool(pool, spec, pod_settings(services.config).port)
    if run.inference_pool == body:
        return None
    failure = await attempt(
        INFERENCE_POOL_FAILED,
        f"InferencePool {pool.name} could not be applied",
        services.kube.ensure_inference_pool(pool.namespace, body),
    )
    run.inference_pool = body if failure is None else None
    return failure


async def ensure_disruption_budget(
    services: Services, run: PoolRun, pool: PoolView, target: int
) -> ApiFailure | None:
    """Create or update the pool's PodDisruptionBudget (``build_pool_budget``: its minAvailable follows the
    ``target``) once per process and again whenever what it would write changes; a failure never holds up
    the workers: it is returned for the status and retried at the next pass."""
    return await _ensure_budget(services, run, pool.namespace, build_pool_budget(pool, target))


async def ensure_host_disruption_budget(
    services: Services, run: HostRun, host: HostView
) -> ApiFailure | None:
    """The same for a ModelHost's host pods (``build_host_budget``)."""
    return await _ensure_budget(services, run, host.namespace, build_host_budget(host))


async def _ensure_budget(
    services: Services, run: PoolRun | HostRun, namespace: str, body: dict[str, Any]
) -> ApiFailure | None:
    if run.disruption_budget == body:
        return None
    name = body["metadata"]["name"]
    failure = await attempt(
        "DisruptionBudgetFailed",
        f"PodDisruptionBudget {name} could not be applied",
        services.kube.ensure_disruption_budget(namespace, body),
    )
    run.disruption_budget = body if failure is None else None
    return failure


#: Due reservations asked about per settle, and how many questions are in flight at once: a lagging pods
#: watch at 1,000 pools left thousands of reservations due at once, and each pass asked about its share.
SETTLE_BATCH = 100
SETTLE_CONCURRENCY = 4


def settle_soon(services: Services, book: Bookkeeping, *, indexed: Callable[[Reservation], bool]) -> None:
    """Start the process's one settle task (``settle_reservations``) unless it runs: a pass never waits for
    those questions (nor holds its pass slot meanwhile), and however many passes end at once, the API is
    asked about each due reservation once, ``SETTLE_CONCURRENCY`` at a time."""
    running = book.settle_task
    if running is not None and not running.done():
        return
    now = datetime.now(UTC)
    if not book.reservations.due_by(now):
        return
    book.settle_task = asyncio.get_running_loop().create_task(
        _settle_logged(services, book, now, indexed), name="reservation checks"
    )


async def _settle_logged(
    services: Services, book: Bookkeeping, now: datetime, indexed: Callable[[Reservation], bool]
) -> None:
    try:
        await settle_reservations(services, book, now, indexed=indexed)
    except Exception:  # a bug, not an API failure (those keep the reservation): the next pass starts anew
        logger.exception("checking the due reservations failed")


async def settle_reservations(
    services: Services,
    book: Bookkeeping,
    now: datetime,
    *,
    indexed: Callable[[Reservation], bool] = lambda _: False,
    limit: int = SETTLE_BATCH,
) -> None:
    """Ask the API about the reservations whose pod is still unobserved at their check time (any pool's:
    a deleted pool's too), at most ``limit`` of them (the rest stay due); a pod known absent ends its
    reservation, anything else keeps it (``budget``). One the pods index already shows (``indexed``) is not
    asked about: its pod exists, and the reservation ends at its pool's next pass, which charges the pod
    itself (at 1,000 pools passes come late, and these questions were a fifth of the operator's time)."""
    due = book.reservations.due(now, services.config.reservation_ttl_seconds, limit=limit, known=indexed)
    slots = asyncio.Semaphore(SETTLE_CONCURRENCY)
    await asyncio.gather(*(_settle_one(services, book, reservation, slots) for reservation in due))


async def _settle_one(
    services: Services, book: Bookkeeping, reservation: Reservation, slots: asyncio.Semaphore
) -> None:
    async with slots:
        try:
            exists = await services.kube.pod_exists(reservation.namespace, reservation.worker)
        except Exception as exc:  # unknown: keep the memory reserved, ask again later
            logger.warning("reservation of %s/%s kept: %s", *reservation.key, describe_error(exc))
            return
    if not exists:
        logger.info("reservation of %s/%s ended: the pod does not exist", *reservation.key)
        book.reservations.absent(reservation)
        book.budget_wakeup.set()
        book.poke(reservation.pool_key)


def _note_budget(book: Bookkeeping, run: PoolRun, status: ModelPoolStatus) -> None:
    """Remember whether the pool waits for memory, and wake the pools that might fit when it freed some."""
    budget = next((c for c in status.conditions if c.type == "BudgetExceeded"), None)
    book.waits_for_budget(run.key, budget is not None and budget.status == "True")
    charged = status.memory.charged_bytes
    if charged < run.charged:
        book.poke_waiting()  # memory freed: pools waiting for budget may fit now
    elif charged != run.charged:
        book.budget_wakeup.set()
    run.charged = charged


async def create_worker(
    services: Services, book: Bookkeeping, pool: PoolView, name: str, taken: set[str] | None = None
) -> ApiFailure | None:
    """Create one worker pod. Its reservation ends at once only when the API refused the create (4xx) or
    the name is someone else's pod (NameTaken: the name joins ``taken``, so the next pass makes the worker
    under another); made, already the pool's, or an unknown outcome (a timeout, a 5xx: the pod may
    exist), it stays until the pod is observed or known absent (``settle_reservations``)."""
    pod = build_worker_pod(pool, name, pod_settings(services.config))
    failure = await attempt(
        "CreateFailed", f"worker {name}", create_reserved(services, book, pool.namespace, name, pod)
    )
    if failure is not None:
        book.budget_wakeup.set()
        if failure.reason == NAME_TAKEN and taken is not None:
            if len(taken) >= TAKEN_NAMES_MAX:
                taken.clear()
            taken.add(name)
    return failure


async def create_reserved(
    services: Services, book: Bookkeeping, namespace: str, name: str, pod: Mapping[str, Any]
) -> None:
    reservations, check_s = book.reservations, services.config.reservation_ttl_seconds
    try:
        await services.kube.create_pod(namespace, pod)
    except Exception as exc:
        if refused(exc) or isinstance(exc, NameTakenError):  # no pod of ours is coming
            reservations.release(namespace, name)
        else:
            reservations.answered(namespace, name, datetime.now(UTC), check_s)
        raise
    reservations.answered(namespace, name, datetime.now(UTC), check_s)


@dataclass(frozen=True)
class Refusal:
    """A pass that touches no worker: the status patch to write, the Warning Event to post, and the status
    to remember as written (None: unknown until the watch shows it)."""

    status: dict[str, Any]
    event: Event
    written: dict[str, Any] | None = None


async def refuse(services: Services, run: PoolRun, body: Mapping[str, Any], refusal: Refusal) -> None:
    """Post the refusal's Event and write its status; no worker is created, deleted or evicted."""
    services.events.post(body, refusal.event)
    await services.kube.patch_pool_status(run.key[0], run.key[1], refusal.status)
    run.last_status, run.last_status_wire = None, refusal.written


async def write_budget_status(
    services: Services, name: str, previous: Mapping[str, Any] | None, wire: Mapping[str, Any]
) -> None:
    """Bring the ModelBudget's status from ``previous`` (as last written) to ``wire`` (nothing when equal)."""
    patch = merge_patch(previous, wire)
    if patch:
        await services.kube.patch_budget_status(name, patch)


def tell(services: Services, body: Mapping[str, Any], event: Event) -> None:
    """Post an Event on the pool outside a planned pass (a pass that raised)."""
    services.events.post(body, event)
