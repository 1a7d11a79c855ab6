"""One pass of one ModelHost, in three steps: observe its host pods once (``observe_host``: their pods,
their ``/stats``, the budget's ledger, the shared pools on it, this process's calls in flight), decide the
whole pass (``planner.host_pass.plan_host_pass``, pure: the host pods to make and delete, and the shared
pools' models to load, unload and put to sleep on them), then apply it (``effects.hosts``,
``effects.host_models``); and a deleted shared pool's model unloaded before the pool goes. The shared
pools' own passes (``reconcile_shared``) decide how many host pods should hold each model; this pass
decides where, in one place per ModelHost, so no two pools race on one host. Before the observation, the
names of host pods a drain evicted are held while the ModelHost's PodDisruptionBudget still records them
(``hold_disrupted``, ``planner.disrupted``): a replacement of such a name would count for nothing there.

As in ``reconcile``, everything between reading the indices and recording the reservations is synchronous:
no pool or host plans in between, so the budget is never over-admitted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from modelpool_contract.placements import ANNOTATION_MODELS, host_model_name
from modelpool_contract.stats import STATS_PATH
from modelpool_operator.bookkeeping import Bookkeeping, HostRun
from modelpool_operator.effects.apply import settle_soon, tell
from modelpool_operator.effects.host_models import (
    HostModels,
    apply_models,
    derived_control_key,
    unload_everywhere,
)
from modelpool_operator.effects.hosts import apply_host, disrupted_pods
from modelpool_operator.effects.resources import host_pod_template_hash
from modelpool_operator.host import HostView, host_charge_key, host_pod_name
from modelpool_operator.indices import BudgetsByName, PoolsByKey
from modelpool_operator.observe.hosts import (
    HostedPool,
    HostReports,
    host_reports,
    hosted_workers,
    observe_hosts,
    pod_name,
    reported_models,
)
from modelpool_operator.observe.observation import PodsByPool, budget_limit
from modelpool_operator.observe.ownership import owned_by
from modelpool_operator.observe.stats import stats_url
from modelpool_operator.placement.charge import host_charge
from modelpool_operator.planner import Event
from modelpool_operator.planner.disrupted import budgeted, held_names, still_listed
from modelpool_operator.planner.host_models import SharedPool
from modelpool_operator.planner.host_pass import HostObservation, HostPassPlan, plan_host_pass
from modelpool_operator.planner.shared_scale import SharedCount
from modelpool_operator.policy import host_violations
from modelpool_operator.pool import OtherPool, PoolKey
from modelpool_operator.reconcile import in_index, observe
from modelpool_operator.refusals import INVALID_SPEC, POLICY_VIOLATION, invalid_spec_message, policy_message
from modelpool_operator.services import Services, pod_settings

logger = logging.getLogger(__name__)

#: How long a load that ended is held in flight while the host pod's /stats does not list the model yet.
LANDED_S = 60.0
#: While a drained host pod's name is held (``hold_disrupted``), the next pass comes no later than this:
#: the disruption controller drops the name as soon as it sees the old pod gone (seconds).
HELD_RETRY_S = 1.0


def observe_host(
    services: Services,
    book: Bookkeeping,
    run: HostRun,
    host: HostView,
    *,
    pods_by_pool: PodsByPool,
    pools_by_key: PoolsByKey,
    budgets: BudgetsByName,
    owned: list[Mapping[str, Any]],
    now: datetime,
) -> HostObservation:
    """The pass's one observation: the host pods (indexed and charged in the ledger under
    ``host.charge_key``, as a pool's workers are; their ``/stats`` from the scraper's cache, refreshed in
    the background; ``owned``: those the ModelHost owns by uid), the budget's ledger, the shared pools on
    the host and this process's calls (the loads and backoffs that ended are forgotten here)."""
    listed = list(pods_by_pool.get(host.charge_key, ()))
    stats = host_reports(services.scraper.refresh(listed, on_change=lambda: book.poke(host.charge_key)))
    # Observed as pods (their /stats is a host's, not a worker's); other passes reuse this observation.
    # Charged from the ModelHost's spec, never from the pod (``budget.worker_charge``).
    charge = host_charge(host.spec)
    book.observed[host.charge_key] = [
        services.observations.observe(pod, None, now, fresh=True, charge=charge) for pod in listed
    ]
    workers = observe(services, book, pods_by_pool, own=None, now=now)
    limit = budget_limit(budgets, services.config.budget_name, missing=services.config.missing_budget)
    pools = shared_pools(host, pools_by_key, book.shared)
    forget_ended(run, stats)
    return HostObservation(
        host=host,
        pods=book.observed[host.charge_key],
        hosts=observe_hosts(host.spec, listed, stats, hosted_pools(pools)),
        ledger=book.ledger(workers, limit),
        pools=pools,
        owned=frozenset(pod_name(p) for p in owned),
        known=frozenset(name for name, report in stats.items() if report is not None),
        annotations={
            pod_name(p): ((p.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_MODELS)
            for p in owned
        },
        reported=reported_models(owned, stats),
        loading=frozenset(run.loading) | frozenset(run.landed),
        devices=dict(run.devices),
        loaded=dict(run.loaded),
        backoff=frozenset(run.backoff),
        held=frozenset(run.disrupted),
        now=time.time(),
        # A host pod a call has just changed has its /stats being refetched (StatsScraper.invalidate).
        refetching=any(services.scraper.pending(p) for p in owned),
    )


async def hold_disrupted(
    services: Services, run: HostRun, host: HostView, listed: Iterable[Mapping[str, Any]], now: datetime
) -> None:
    """The host pod names a drain's eviction still holds (``planner.disrupted``): those seen Ready at the
    last pass and now gone or being deleted, kept only while the ModelHost's PodDisruptionBudget, read now
    (before the pass's observation: from there to the reservations nothing is awaited), records them. Read
    only while a name is held (a drain under way); a failed read keeps them held, up to the timeout."""
    present = {pod_name(p): bool((p.get("metadata") or {}).get("deletionTimestamp")) for p in listed}
    held = held_names(run.budgeted, present, run.disrupted, now)
    recorded = await disrupted_pods(services, host) if held else None
    run.disrupted = held if recorded is None else still_listed(held, recorded, now)


def forget_ended(run: HostRun, stats: HostReports) -> None:
    """Forget the backoffs that ran out, and the loads that ended once a scrape lists their model (the
    cache is as old as the last pass that asked; ``LANDED_S`` bounds the wait for a host pod that lost
    the model meanwhile)."""
    clock = time.monotonic()
    run.backoff = {slot: until for slot, until in run.backoff.items() if until > clock}
    listed_now = {(pod, m) for pod, report in stats.items() for m in (report.models if report else {})}
    run.landed = {s: at for s, at in run.landed.items() if clock - at < LANDED_S and s not in listed_now}
    run.devices = {s: d for s, d in run.devices.items() if s in run.loading or s in run.landed}


def owned_pods(host: HostView, pods_by_pool: PodsByPool) -> list[Mapping[str, Any]]:
    """The host pods the ModelHost owns by uid: only they are called (and so sent its control key), a pod
    merely labelled as one is not (``ownership``)."""
    return [p for p in pods_by_pool.get(host.charge_key, ()) if owned_by(p, host.charge_key, host.uid)]


async def reconcile_host(
    services: Services,
    book: Bookkeeping,
    *,
    run: HostRun,
    body: Mapping[str, Any],
    pods_by_pool: PodsByPool,
    pools_by_key: PoolsByKey,
    budgets: BudgetsByName,
) -> HostPassPlan | None:
    """One pass of a ModelHost (None: its spec does not parse; the CRD should have refused it: a Warning
    Event says why, once per generation, and nothing is touched)."""
    try:
        host = HostView.from_body(body)
    except ValueError as exc:
        generation = int((body.get("metadata") or {}).get("generation") or 0)
        if run.invalid_generation != generation:
            run.invalid_generation = generation
            logger.warning("ModelHost %s/%s: %s", *run.key, invalid_spec_message(exc))
            tell(services, body, Event("Warning", INVALID_SPEC, invalid_spec_message(exc)))
        return None
    # Its pods' hash covers what this operator adds to them (a new default image or flag rolls them).
    host = replace(host, template_hash=host_pod_template_hash(host, pod_settings(services.config)))
    refused = host_violations(host.spec, services.config.policy, host.namespace)
    if refused:
        # No host pod runs an image the operator does not allow (the chart's admission policy refuses
        # the ModelHost at kubectl apply; this covers an operator without it, or a narrowed policy).
        host = replace(host, spec=host.spec.model_copy(update={"replicas": 0}))
        if run.forbidden != policy_message(refused):
            run.forbidden = policy_message(refused)
            tell(services, body, Event("Warning", POLICY_VIOLATION, run.forbidden))
    now = datetime.now(UTC)
    owned = owned_pods(host, pods_by_pool)
    await hold_disrupted(services, run, host, pods_by_pool.get(host.charge_key, ()), now)
    observed = observe_host(
        services,
        book,
        run,
        host,
        pods_by_pool=pods_by_pool,
        pools_by_key=pools_by_key,
        budgets=budgets,
        owned=owned,
        now=now,
    )
    # Synchronous from the observation to the reservations, as a pool's ``decide``: no pool or host plans
    # in between, so the budget is never over-admitted.
    planned = plan_host_pass(observed)
    # What this pass deletes is not a drain's eviction (``planner.disrupted``).
    run.budgeted = budgeted(observed.pods, labelled=False) - set(planned.pods.delete)
    for index in planned.pods.create:
        book.reservations.reserve(
            host.namespace, host.charge_key[1], host_pod_name(host, index), host_charge(host.spec), now
        )
    await apply_host(planned.pods, services, book, run=run, host=host, body=body, now=now)
    await apply_models(
        planned, models_of(services, book, run, host, body=body, pools_by_key=pools_by_key, owned=owned)
    )
    if run.secret_failure is not None:  # the control key Secret's next try: the next pass comes no later
        wait = max(run.secret_retry_at - time.monotonic(), 0.0)
        run.retry_in = wait if run.retry_in is None else min(run.retry_in, wait)
    if run.disrupted:  # a drained host pod's replacement waits for its budget: asked again soon
        run.retry_in = HELD_RETRY_S if run.retry_in is None else min(run.retry_in, HELD_RETRY_S)
    settle_soon(services, book, indexed=in_index(pods_by_pool))
    return planned


def models_of(
    services: Services,
    book: Bookkeeping,
    run: HostRun,
    host: HostView,
    *,
    body: Mapping[str, Any],
    pools_by_key: PoolsByKey,
    owned: list[Mapping[str, Any]],
) -> HostModels:
    """What the pass's models effects act on (``effects.host_models``): the host pods it owns, their
    control API bases and the shared pools on the host (their objects, where failures are told)."""
    references = {pool.name: pool.reference() for _, pool in pools_on(host, pools_by_key)}
    urls = control_urls(services, owned)
    return HostModels(services, book, run, host, body, pods=owned, urls=urls, pools=references)


def shared_pools(
    host: HostView, pools_by_key: PoolsByKey, counts: Mapping[PoolKey, SharedCount] | None = None
) -> list[SharedPool]:
    """The shared pools on ``host`` as its pass needs them: each one's count and retries as its own pass
    last decided them (``counts``), else the count its status records, else ``spec.replicas`` (at most
    the host pods)."""
    pools = []
    for key, pool in pools_on(host, pools_by_key):
        count = (counts or {}).get(key)
        recorded = min(pool.target if pool.target is not None else pool.replicas, host.spec.replicas)
        pools.append(
            SharedPool(
                pool.name,
                count.target if count is not None else recorded,
                pool.load or "{}",
                pool.declared,
                pool.priority,
                pool.deleting,
                retry=count.retry if count is not None else frozenset(),
            )
        )
    return pools


def pools_on(host: HostView, pools_by_key: PoolsByKey) -> Iterator[tuple[PoolKey, OtherPool]]:
    """The shared pools on ``host`` (its namespace's, their ``spec.host`` naming it), as indexed."""
    for key, indexed in pools_by_key.items():
        for pool in list(indexed)[:1]:
            if key[0] == host.namespace and pool.host == host.name:
                yield key, pool


def hosted_pools(pools: Iterable[SharedPool]) -> dict[str, HostedPool]:
    """The shared pools on a ModelHost as its ledger needs them, by the name their model has on its host
    pods (``host_model_name``)."""
    return {host_model_name(p.name): HostedPool(p.name, p.declared, p.priority) for p in pools}


def control_urls(services: Services, pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Each host pod's control API base, by name (its probe port's: where its ``/stats`` is too)."""
    port = services.config.server_probe_port
    return {
        pod_name(p): url.removesuffix(STATS_PATH) for p in pods if (url := stats_url(p, port)) is not None
    }


async def unload_deleted_pool(
    services: Services, book: Bookkeeping, *, pool: PoolKey, host: str, pods_by_pool: PodsByPool
) -> list[str]:
    """A shared pool is being deleted (its finalizer holds it): unload its model from every host pod whose
    ``/stats`` lists it. Returns why some host refused (the caller retries); the ModelHost's daemon is
    poked to rewrite the host pods' annotations."""
    namespace, name = pool
    host_key = (namespace, host)
    listed = list(pods_by_pool.get(host_charge_key(*host_key), ()))
    stats = host_reports(services.scraper.cached(listed))
    model = host_model_name(name)
    holding = {w.name for w in hosted_workers(namespace, model, 0, listed, stats)}
    urls = control_urls(services, (p for p in listed if pod_name(p) in holding))
    key = book.control_keys.get(host_key) or derived_control_key(services, namespace, host, listed)
    if not urls or key is None:
        return []
    refused = await unload_everywhere(services, key=key, model=model, urls=urls)
    book.poke(host_charge_key(*host_key))
    return refused
