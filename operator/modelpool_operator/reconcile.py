"""One reconciliation pass of one ModelPool: observe (``observe``), plan (``decide``: pure but for the
reservations it records), then apply (``effects.apply``); or, for a spec that is invalid or forbidden, the
refusal (``effects.apply.refuse``). This module decides; it makes no API request and posts no Event itself.

The order matters for the budget. Everything between reading the pod index and recording the planned
creations as reservations is synchronous (``observe`` and ``decide``: no ``await``), so on the operator's
single event loop no other pool can plan in between: two pools reconciling "at once" always see each
other's reservations and can never over-admit. The API calls (evict, delete, create, the Service, status)
and the Events come after (``effects.apply.apply``); a create the API refuses releases its reservation at
once, one whose outcome is unknown keeps it until the pod is observed or known absent (``budget``). A
failed API request never ends a pass (``effects.apply``).

Everything read here is rebuilt from the cluster (Kopf's indices of pods, pools and budgets); the only
in-memory state is the reservation book, the last status this process wrote (we are its one writer,
so that copy is authoritative even before the watch delivers it back) and each pool's load window (the
autoscaler's recent samples, re-learned after a restart).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from modelpool_contract.api import Condition, autoscaling_enabled, parse_host_spec, parse_pool_status
from modelpool_contract.demand import Demand
from modelpool_contract.placements import host_model_name
from modelpool_operator.bookkeeping import Bookkeeping, PoolRun
from modelpool_operator.budget import BUDGET_VALID, BudgetLimit, Reservation, budget_status, budget_validity
from modelpool_operator.effects.apply import Refusal, apply, refuse, settle_soon, tell
from modelpool_operator.effects.placing import (
    delete_workers,
    write_pool_status,
)
from modelpool_operator.effects.resources import worker_template_hash
from modelpool_operator.host import host_charge_key
from modelpool_operator.observe.claims import believe
from modelpool_operator.observe.hosts import (
    HostedPool,
    host_reports,
    hosted_replicas,
    hosted_workers,
    observe_hosts,
)
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
from modelpool_operator.planner import CounterSample, Event, LoadSample, Plan, PlannerSettings, plan
from modelpool_operator.planner.shared import (
    HostWait,
    host_wait,
    host_wait_event,
    host_wait_status,
    shared_status,
)
from modelpool_operator.planner.shared_scale import SharedScale, scale_shared
from modelpool_operator.planner.status import coalesce, condition
from modelpool_operator.policy import Violation, violations
from modelpool_operator.pool import OtherPool, PoolKey, PoolView
from modelpool_operator.services import Services, planner_settings, pod_settings

logger = logging.getLogger(__name__)

PoolsByKey = Mapping[PoolKey, Iterable[OtherPool]]
BudgetsByName = Mapping[str, Iterable[Mapping[str, Any]]]
DemandByPool = Mapping[PoolKey, Iterable[Demand]]
#: The ModelHosts' specs (raw), by (namespace, ModelHost name).
HostsByKey = Mapping[PoolKey, Iterable[Mapping[str, Any]]]


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
) -> None:
    """The own pool's workers as the operator believes them (``observe.claims``: load counted at most the
    queue's capacity, a busy claim believed for a bounded time), for this plan and for the other pools'
    (``book.observed``: their preemption reads it); the busy claims kept for the next pass."""
    if pool.key not in workers:
        return
    believed, run.claims = believe(
        workers[pool.key], spec=pool.spec, claims=run.claims, previous=pool.status.workers, now=now
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
        if run.last_status is not None:
            # We are the only writer of status; our last write is newer than what the watch may show yet.
            pool = replace(pool, status=run.last_status)
        # From observing to the reservations ``decide`` records nothing is awaited (see the module doc).
        now = datetime.now(UTC)
        workers = observe(services, book, pods_by_pool, own=pool.key, now=now)
        believe_own(book, run, workers, pool, now)
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
            taken=frozenset(run.taken_names),
        )
        run.load_window, run.counters = decided.load_window, decided.counters
        # Not held while the requests are in flight: every pool's observed workers, per pass.
        del workers
        if await apply(decided, services, book, run=run, pool=pool, body=body, now=now):
            outcome.result = "error"
        settle_soon(services, book, indexed=in_index(pods_by_pool))
        return decided


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
    """A shared pool's pass: its dedicated workers (a pool switched to ``spec.host``) deleted; its count and
    retries decided (``planner.shared_scale``, over its replicas' figures on the host pods and its demand)
    and handed to its ModelHost's pass (``Bookkeeping.shared``), which places it; its status: the host pods
    holding its model, or why none does. Returns when to look again (None: at the resync)."""
    await delete_workers(services, pool.namespace, list(pods_by_pool.get(pool.key, ())))
    key = (pool.namespace, pool.spec.host or "")
    if not list(hosts.get(key, ())):
        book.shared.pop(pool.key, None)
        await _tell_wait(services, run, pool, body, shared_wait(pool, hosts, pods_by_pool))
        return None
    try:
        spec = parse_host_spec(dict(next(iter(hosts[key]))))
    except ValidationError:
        book.shared.pop(pool.key, None)
        await _tell_wait(services, run, pool, body, shared_wait(pool, hosts, pods_by_pool))
        return None
    host_key = host_charge_key(*key)
    listed = list(pods_by_pool.get(host_key, ()))
    stats = host_reports(services.scraper.refresh(listed, on_change=lambda: _news(book, pool.key, host_key)))
    model = host_model_name(pool.name)
    replicas = hosted_replicas(model, pool.spec.resources.memory_bytes, listed, stats)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    pool = replace(pool, status=parse_pool_status(previous))
    now = datetime.now(UTC)
    workers = hosted_workers(pool.namespace, model, replicas, stats)
    scale = decide_shared(services, book, run, pool, workers, host_pods=spec.replicas, now=now)
    wait = None
    if len([r for r in replicas if r.state not in ("Failed", "Dead")]) < scale.target:
        hosted = {model: HostedPool(pool.name, pool.spec.resources.memory_bytes)}
        wait = host_wait(
            pool, host_found=True, host_error=None, hosts=observe_hosts(spec, listed, stats, hosted)
        )
    status = shared_status(pool, replicas, wait, now, scale)
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


def host_wait_refusal(
    run: PoolRun, pool: PoolView, body: Mapping[str, Any], wait: HostWait
) -> Refusal | None:
    """The status and Event of a shared pool that waits for placement, when the reason is new for this
    generation (None: told already; the pool's loop looks again at its host's next change)."""
    told = (pool.generation, wait.reason, wait.message)
    if run.host_wait == told:
        return None
    run.host_wait = told
    status = host_wait_status(pool, wait, datetime.now(UTC))
    written = {**(body.get("status") or {}), **status}
    return Refusal(status=status, event=host_wait_event(wait), written=written)


def invalid_spec_refusal(run: PoolRun, body: Mapping[str, Any], exc: Exception) -> Refusal | None:
    """An unparseable spec: a Warning Event, phase Failed and condition Ready False (reason InvalidSpec,
    naming the field), once per generation (None: told already); no workers are touched."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if run.invalid_generation == generation:
        return None
    run.invalid_generation = generation
    previous = parse_pool_status(body.get("status")).conditions
    return Refusal(
        status=invalid_spec_status(previous, generation, invalid_spec_message(exc), datetime.now(UTC)),
        event=Event("Warning", INVALID_SPEC, f"invalid spec: {exc}"[:1000]),
    )


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


def policy_refusal(
    run: PoolRun, pool: PoolView, body: Mapping[str, Any], refused: list[Violation]
) -> Refusal | None:
    """A spec the operator's policy refuses: condition PolicyViolation (naming each field), phase Failed
    and a Warning Event, once per generation (None: told already); no worker is created, deleted or
    evicted. Workers that already exist (an allowed spec before, or the policy narrowed since) are left as
    they are."""
    message = policy_message(refused)
    if run.forbidden == (pool.generation, message):
        return None
    run.forbidden = (pool.generation, message)
    status = policy_status(pool, message, datetime.now(UTC))
    # What the status is then, so that the pass after the spec is allowed again removes the condition even
    # before the watch shows this write.
    written = {**(body.get("status") or {}), **status}
    return Refusal(status=status, event=Event("Warning", POLICY_VIOLATION, message[:1000]), written=written)


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
    ledger = book.ledger(
        workers, budget_limit(budgets, services.config.budget_name, missing=services.config.missing_budget)
    )
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
    status = budget_status(ledger, [validity], services.identity)
    # Without an identity no activeOperator key at all (a null would be patched at every write).
    return status.model_dump(
        mode="json", by_alias=True, exclude={"active_operator"} if not services.identity else None
    )
