"""Kopf wiring: indices, watch-event pokes, one daemon per ModelPool, and the ModelBudget status writer.

Level-based: the daemons act on what the indices show (pods by pool, pools, budgets), never on an
event's diff, so a missed event or an operator restart loses nothing. Events only *wake* a daemon early
(via ``Bookkeeping.poke``); without them each pool still re-reconciles every few seconds. Each handler
is a few lines: the pass itself lives in ``reconcile``, the decisions in ``planner``/``observe.worker_state``.

The indices are Kopf's typed index parameters (``kopf.Index``), named after their functions: the pods
by pool (slimmed), the other pools parsed once when indexed (``OtherPool``), the budgets' specs, and the
demand the gateways recorded, by pool (their demand Leases' renewTime and held count,
``modelpool_contract.demand``).

Kopf's memo carries the configuration and the process's ``Bookkeeping`` from the start, and the ``Services``
once the startup handler has built them (before any watch starts); the handlers hand both to ``reconcile``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypeVar

import kopf

from modelpool_contract.api import GROUP, MODELBUDGET_PLURAL, MODELHOST_PLURAL, MODELPOOL_PLURAL, VERSION
from modelpool_contract.demand import (
    DEMAND_SELECTOR,
    LABEL_DEMAND,
    LEASE_GROUP,
    LEASE_PLURAL,
    LEASE_VERSION,
    Demand,
    demand_pool,
    read_demand,
)
from modelpool_contract.labels import LABEL_MANAGED_BY, LABEL_POOL
from modelpool_contract.messages import fit_message
from modelpool_contract.placements import LABEL_HOST
from modelpool_operator import heap
from modelpool_operator.bookkeeping import Bookkeeping, HostRun, PoolRun, wait_for_wakeup
from modelpool_operator.daemon_loop import COALESCE_S, idle_on, run_passes
from modelpool_operator.effects.apply import write_budget_status
from modelpool_operator.effects.budget_object import create_budget_until_done
from modelpool_operator.effects.resources import MANAGED_BY
from modelpool_operator.host import host_charge_key
from modelpool_operator.metrics import OperatorMetrics
from modelpool_operator.observe.observation import PodsByPool, slim_pod
from modelpool_operator.observe.ownership import OwnedPods, OwnerRecord, claimed_key, host_record, pool_record
from modelpool_operator.owned import (
    OWNED_SELECTOR,
    OwnedResource,
    forget_owned,
    owned_resources,
    owner_of,
)
from modelpool_operator.pool import OtherPool, PoolKey
from modelpool_operator.reconcile import reconcile_pool
from modelpool_operator.reconcile_budget import budget_status_wire
from modelpool_operator.reconcile_host import reconcile_host, unload_deleted_pool
from modelpool_operator.services import Services, start_services
from modelpool_operator.settings import OperatorConfig, apply_to_kopf

# The startup waits this long for the ModelBudget's create (budget_create) before the watches start.
_BUDGET_CREATE_WAIT_S = 10.0
_POOLS = (GROUP, VERSION, MODELPOOL_PLURAL)
_BUDGETS = (GROUP, VERSION, MODELBUDGET_PLURAL)
_HOSTS = (GROUP, VERSION, MODELHOST_PLURAL)
_LEASES = (LEASE_GROUP, LEASE_VERSION, LEASE_PLURAL)
# Only the demand Leases (the API server filters too: see ``startup``).
_DEMAND = {LABEL_DEMAND: "true"}

PodsIndex = kopf.Index[PoolKey, dict[str, Any]]
PoolsIndex = kopf.Index[PoolKey, OtherPool]
BudgetsIndex = kopf.Index[str, dict[str, Any]]
DemandIndex = kopf.Index[PoolKey, Demand]
HostsIndex = kopf.Index[PoolKey, dict[str, Any]]
OwnersIndex = kopf.Index[PoolKey, OwnerRecord]
_T = TypeVar("_T")


def _index(value: _T | None, name: str) -> _T:
    """Kopf passes every index to every handler, by its function's name; the handlers' parameters default
    to None only because Kopf's handler protocols do not list them."""
    if value is None:
        raise RuntimeError(f"Kopf did not pass the index {name!r}")
    return value


def make_memo(
    config: OperatorConfig, metrics: OperatorMetrics | None = None, identity: str = ""
) -> kopf.Memo:
    """The memo every handler shares (Kopf copies it shallowly per object, after the startup handlers ran:
    the services and the bookkeeping are shared): the configuration and the bookkeeping now, the services
    once ``startup`` has built them; ``metrics``, when the process serves them already (from before the
    leader election), and this replica's ``identity``."""
    return kopf.Memo(config=config, book=Bookkeeping(), metrics=metrics, identity=identity)


def _config(memo: Any) -> OperatorConfig:
    config: OperatorConfig = memo.config
    return config


def _book(memo: Any) -> Bookkeeping:
    book: Bookkeeping = memo.book
    return book


def _services(memo: Any) -> Services:
    """The process's services (``startup`` built them before any watch started)."""
    services: Services = memo.services
    return services


# ---- process lifecycle -------------------------------------------------------------------------------


def _owned_id(owned: OwnedResource) -> str:
    """The id of ``owned_changed`` on one kind of owned object (``watch_owned``)."""
    return f"owned_{owned.plural}"


class QuietWatchHandlers(logging.Filter):
    """Drops Kopf's "Handler 'pod_changed' succeeded." (and the other index and watch-event handlers'): one
    log line per watch event, formatted and written at INFO, tens of thousands in a 1,000-pool scale-up, that
    say nothing (the handlers only index and poke). A failure is still logged, and every other handler's
    and daemon's lines are kept. The same for ``owned_changed`` on each kind it watches."""

    QUIET = (
        frozenset(
            f"Handler '{name}' succeeded."
            for name in ("pod_changed", "pool_changed", "demand_changed", "host_changed", "budget_changed")
        )
        | frozenset(
            f"Indexer '{name}' succeeded."
            for name in ("pods_by_pool", "pools_by_key", "budgets_by_name", "hosts_by_key", "demand_by_pool")
        )
        | frozenset(
            f"Handler '{_owned_id(owned)}' succeeded."
            for owned in owned_resources(network_policies=True, inference_pools=True)
        )
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.msg in self.QUIET)


def quiet_watch_handlers() -> None:
    """Install ``QuietWatchHandlers`` on Kopf's per-object logger (once)."""
    objects = logging.getLogger("kopf.objects")
    if not any(isinstance(f, QuietWatchHandlers) for f in objects.filters):
        objects.addFilter(QuietWatchHandlers())


@kopf.on.startup()
async def startup(*, settings: kopf.OperatorSettings, memo: Any, logger: kopf.Logger, **_: Any) -> None:
    config = _config(memo)
    apply_to_kopf(config, settings)
    quiet_watch_handlers()
    # Watch only the demand Leases (a cluster's nodes renew a Lease each every few seconds).
    settings.watching.label_selectors[LEASE_GROUP, LEASE_PLURAL] = DEMAND_SELECTOR
    # Watch only the objects the operator owns (``owned``: the cluster's other Services stay unsent).
    for owned in _owned_kinds(config):
        settings.watching.label_selectors[owned.group, owned.version, owned.plural] = OWNED_SELECTOR
    memo.services = await start_services(config, memo.get("metrics"), memo.get("identity") or "")
    memo.services.metrics.leader.set(1)  # this process acts (elected, or without an election)
    memo.heap_trimmer = asyncio.create_task(heap.trim_every(), name="heap trimmer")
    if config.budget_create:
        # Create only (effects.budget_object): an existing budget is the user's and is left alone. Waited
        # for a moment, so that a fresh install's pools find it at their first pass; retried meanwhile.
        creating = asyncio.create_task(
            create_budget_until_done(memo.services.kube, config.budget_name, config.budget_memory.strip()),
            name="budget create",
        )
        memo.budget_creator = creating
        await asyncio.wait({creating}, timeout=_BUDGET_CREATE_WAIT_S)
    logger.info("modelpool-operator started: %s", config.model_dump_json())


@kopf.on.cleanup()
async def cleanup(*, memo: Any, **_: Any) -> None:
    trimmer: asyncio.Task[None] | None = getattr(memo, "heap_trimmer", None)
    if trimmer is not None:
        trimmer.cancel()
    creator: asyncio.Task[bool] | None = getattr(memo, "budget_creator", None)
    if creator is not None:
        creator.cancel()
    settling = _book(memo).settle_task
    if settling is not None:
        settling.cancel()
    services: Services | None = getattr(memo, "services", None)  # None: the startup failed
    if services is not None:
        await services.aclose()


@kopf.on.probe(id="pools")
async def probe_pools(*, memo: Any, **_: Any) -> int:
    """Reported on the liveness endpoint: how many pool daemons this process runs."""
    return _book(memo).pools()


# ---- indices (rebuilt from the cluster by Kopf on every start) ----------------------------------------
# Every handler below is a coroutine though none awaits: Kopf runs a plain function in its thread pool, a
# thread hop (and a wait for the GIL) per watch event, which held the operator to a few hundred pod events
# a minute at 300 pools; and the pokes set asyncio Events, which only the event loop's own thread may do.


@kopf.index("pods", labels={LABEL_POOL: kopf.PRESENT})
async def pods_by_pool(
    *, namespace: str | None, labels: kopf.Labels, meta: kopf.Meta, body: kopf.Body, memo: Any, **_: Any
) -> dict[PoolKey, dict[str, Any]]:
    """Only pods whose controller owner is the pool (or ModelHost) their label names (``ownership``)."""
    key = claimed_key(namespace or "", meta, labels[LABEL_POOL])
    if key is None:
        _foreign(memo, meta)
        return {}
    return {key: slim_pod(body)}


@kopf.index(*_POOLS)
async def pool_owners(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[PoolKey, OwnerRecord]:
    """Each ModelPool's uid and charges (every pool, its spec valid or not: ``ownership.pool_record``): its
    pods' owner references must carry that uid, and they are charged from it."""
    record = pool_record(body)
    return {(namespace or "", name): record} if record is not None else {}


@kopf.index(*_HOSTS)
async def host_owners(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[PoolKey, OwnerRecord]:
    """Each ModelHost's record, under the key its host pods are indexed by (``host_charge_key``)."""
    record = host_record(body)
    return {host_charge_key(namespace or "", name): record} if record is not None else {}


def _foreign(memo: Any, meta: Mapping[str, Any]) -> None:
    """A pod labelled as ours that the operator did not make: logged once, counted, never touched."""
    services: Services | None = getattr(memo, "services", None)
    if _book(memo).foreign.first_sight(meta):
        logging.getLogger(__name__).warning(
            "ignoring pod %s/%s: labelled %s but not owned by its pool or ModelHost (not counted)",
            meta.get("namespace"),
            meta.get("name"),
            LABEL_POOL,
        )
        if services is not None:
            services.metrics.foreign_pods.inc()


def _owned(
    memo: Any, pods: PodsIndex | None, pools: OwnersIndex | None, hosts: OwnersIndex | None
) -> OwnedPods:
    """The pods index as every daemon reads it: each pool's (or ModelHost's) pods it owns by uid."""
    pool_index, host_index = _index(pools, "pool_owners"), _index(hosts, "host_owners")

    def record_of(key: PoolKey) -> OwnerRecord | None:
        for store in (pool_index.get(key), host_index.get(key)):
            for record in store or ():
                return record
        return None

    return OwnedPods(
        _index(pods, "pods_by_pool"),
        record_of,
        lambda pod: _foreign(memo, pod.get("metadata") or {}),
        _book(memo).tombstones,
    )


@kopf.index(*_POOLS)
async def pools_by_key(
    *, namespace: str | None, name: str, body: kopf.Body, **_: Any
) -> dict[PoolKey, OtherPool]:
    """Each pool parsed once per watch event, as other pools' planning needs it; a pool whose spec does not
    parse is left out (an empty result also drops what an earlier event indexed for it)."""
    other = OtherPool.from_body(body)
    return (
        {}
        if other is None
        else {(namespace or "", name): replace(other, namespace=namespace or "", name=name)}
    )


@kopf.index(*_BUDGETS)
async def budgets_by_name(*, name: str, spec: kopf.Spec, **_: Any) -> dict[str, dict[str, Any]]:
    return {name: dict(spec)}


@kopf.index(*_HOSTS)
async def hosts_by_key(
    *, namespace: str | None, name: str, spec: kopf.Spec, **_: Any
) -> dict[PoolKey, dict[str, Any]]:
    """Each ModelHost's spec (raw: a pass parses it, and says so when it does not parse)."""
    return {(namespace or "", name): dict(spec)}


@kopf.index(*_LEASES, labels=_DEMAND)
async def demand_by_pool(*, namespace: str | None, body: kopf.Body, **_: Any) -> dict[PoolKey, Demand]:
    """The demand the gateways recorded for each pool: its demand Lease's renewTime, the Lease's duration
    and each gateway replica's share (``modelpool.dev/demand.<replica>``: held and refused counts, and when
    it wrote); the planner sums the live shares (``Demand.held_at``, ``Demand.refused_at``)."""
    pool, demand = demand_pool(body), read_demand(body)
    return {} if pool is None or demand is None else {(namespace or "", pool): demand}


# ---- watch events only wake the daemons ---------------------------------------------------------------


@kopf.on.event("pods", labels={LABEL_POOL: kopf.PRESENT})
async def pod_changed(
    *,
    type: str,
    namespace: str | None,
    labels: kopf.Labels,
    meta: kopf.Meta,
    status: kopf.Status,
    memo: Any,
    **_: Any,
) -> None:
    book = _book(memo)
    pool = labels.get(LABEL_POOL)
    if pool is None or claimed_key(namespace or "", meta, pool) is None:
        return  # a foreign pod wakes nothing (``pods_by_pool`` reports it)
    if pool:
        book.poke((namespace or "", pool))  # a host pod's: its ModelHost's daemon (``host_charge_key``)
    host = labels.get(LABEL_HOST)
    if host:
        book.poke_host((namespace or "", host))  # the shared pools on its ModelHost
    if type == "DELETED" or status.get("phase") in ("Failed", "Succeeded"):
        book.poke_waiting()  # its memory is free (or about to be): pools short of budget may fit now


def spec_changed(event_type: str | None, meta: Mapping[str, Any], seen: tuple[Any, ...] | None) -> bool:
    """Whether a pool's watch event can change what its pass decides (pure): its first sight, its
    deletion, or a new ``metadata.generation`` (the spec) or ``deletionTimestamp``. Not a status write:
    the pass reads the status it wrote itself (``PoolRun.last_status``), so the echo of each of its own
    status patches would otherwise cost the pool one more pass."""
    return event_type in (None, "ADDED", "DELETED") or seen != _spec_mark(meta)


def _spec_mark(meta: Mapping[str, Any]) -> tuple[Any, ...]:
    return meta.get("generation"), meta.get("deletionTimestamp")


@kopf.on.event(*_POOLS)
async def pool_changed(
    *,
    type: str | None,
    namespace: str | None,
    name: str,
    meta: kopf.Meta,
    body: kopf.Body,
    memo: Any,
    **_: Any,
) -> None:
    if type == "DELETED":  # its pods stay charged while they terminate (``ownership.Tombstones``)
        _book(memo).tombstones.bury((namespace or "", name), pool_record(body))
    # ``memo`` is this pool's own (Kopf copies the operator's memo per object): what it last saw of the pool.
    seen: tuple[Any, ...] | None = getattr(memo, "pool_spec_mark", None)
    memo.pool_spec_mark = _spec_mark(meta)
    if spec_changed(type, meta, seen):
        _book(memo).poke((namespace or "", name))


@kopf.on.event(*_LEASES, labels=_DEMAND)
async def demand_changed(*, namespace: str | None, body: kopf.Body, memo: Any, **_: Any) -> None:
    """A gateway recorded demand: the pool's loop looks at once (a pool at zero wakes in this pass)."""
    pool = demand_pool(body)
    if pool:
        _book(memo).poke((namespace or "", pool))


@kopf.on.event(*_HOSTS)
async def host_changed(
    *, type: str | None, namespace: str | None, name: str, body: kopf.Body, memo: Any, **_: Any
) -> None:
    """A ModelHost came, went or changed: its daemon and the shared pools on it look at once."""
    book = _book(memo)
    if type == "DELETED":  # its host pods stay charged while they terminate
        book.tombstones.bury(host_charge_key(namespace or "", name), host_record(body))
    book.poke(host_charge_key(namespace or "", name))
    book.poke_host((namespace or "", name))


@kopf.on.event(*_BUDGETS)
async def budget_changed(*, memo: Any, **_: Any) -> None:
    _book(memo).poke_waiting()


# ---- the objects the pools own: one deleted is made again --------------------------------------------


def _owned_kinds(config: OperatorConfig) -> tuple[OwnedResource, ...]:
    return owned_resources(
        network_policies=config.network_policy_enabled, inference_pools=config.inference_pools_enabled
    )


def watch_owned(config: OperatorConfig, registry: kopf.OperatorRegistry | None = None) -> None:
    """Register ``owned_changed`` on the kinds of object the operator makes under ``config`` (``owned``):
    registered by ``main`` before Kopf starts, as which kinds depends on the configuration (RBAC grants the
    watch of a NetworkPolicy or an InferencePool only where the operator makes them)."""
    for owned in _owned_kinds(config):
        kopf.on.event(
            owned.group,
            owned.version,
            owned.plural,
            id=_owned_id(owned),
            labels={LABEL_MANAGED_BY: MANAGED_BY},
            registry=registry,
        )(owned_changed)


async def owned_changed(
    *,
    type: str | None,
    namespace: str | None,
    meta: kopf.Meta,
    labels: kopf.Labels,
    body: kopf.Body,
    memo: Any,
    **_: Any,
) -> None:
    """One of the pools' (or ModelHosts') objects deleted or edited: its owner makes it again as it wrote it
    (``owned``)."""
    key = owner_of(namespace or "", meta, labels)
    if key is None:
        return
    kind = str(body.get("kind", ""))
    if type == "DELETED":
        _book(memo).lose(key, kind)
    else:
        _book(memo).saw(key, kind, body)


# ---- a shared pool's deletion: its model leaves the host pods before the pool goes -------------------


@kopf.on.delete(*_POOLS, when=lambda spec, **_: bool(spec.get("host")), retries=10, backoff=2.0)
async def shared_pool_deleted(
    *,
    namespace: str | None,
    name: str,
    spec: kopf.Spec,
    memo: Any,
    pods_by_pool: PodsIndex | None = None,
    pool_owners: OwnersIndex | None = None,
    host_owners: OwnersIndex | None = None,
    **_: Any,
) -> None:
    """The operator's finalizer holds a deleted shared pool until its model is unloaded from every host pod
    that answers (retried; after ``retries`` the pool goes anyway, and its ModelHost's pass unloads what
    is left, its pool being gone)."""
    pods = _owned(memo, pods_by_pool, pool_owners, host_owners)
    refused = await unload_deleted_pool(
        _services(memo),
        _book(memo),
        pool=(namespace or "", name),
        host=str(spec.get("host")),
        pods_by_pool=pods,
    )
    if refused:
        raise kopf.TemporaryError(fit_message("; ".join(refused)), delay=2.0)


# ---- the per-pool daemon --------------------------------------------------------------------------------


@kopf.daemon(*_POOLS, cancellation_timeout=5.0)
async def pool_daemon(
    *,
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: Any,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    pods_by_pool: PodsIndex | None = None,
    pools_by_key: PoolsIndex | None = None,
    budgets_by_name: BudgetsIndex | None = None,
    demand_by_pool: DemandIndex | None = None,
    hosts_by_key: HostsIndex | None = None,
    pool_owners: OwnersIndex | None = None,
    host_owners: OwnersIndex | None = None,
    **_: Any,
) -> None:
    """Keeps the pool (``reconcile_pool``), woken by its and its pods' events (``daemon_loop``); between
    passes its workers' stats are refreshed (``idle_until_pass``)."""
    pods = _owned(memo, pods_by_pool, pool_owners, host_owners)
    pools = _index(pools_by_key, "pools_by_key")
    budgets = _index(budgets_by_name, "budgets_by_name")
    demand = _index(demand_by_pool, "demand_by_pool")
    hosts = _index(hosts_by_key, "hosts_by_key")
    services, book = _services(memo), _book(memo)
    run = PoolRun(key=(namespace or "", name))

    async def one_pass() -> float | None:
        forget_owned(run, book.take_lost(run.key))
        plan = await reconcile_pool(
            services,
            book,
            run=run,
            body=body,
            pods_by_pool=pods,
            pools_by_key=pools,
            budgets=budgets,
            demand=demand,
            hosts=hosts,
        )
        book.uses_host(run.key, body.get("spec", {}).get("host"))
        if plan is None or plan.requeue_after is None:
            return None
        return max(plan.requeue_after, 0.2)

    async def idle(seconds: float) -> bool:
        return await idle_until_pass(services, book, run.key, pods, seconds=seconds, stopped=stopped)

    try:
        await run_passes(
            services,
            book,
            one_pass=one_pass,
            idle=idle,
            wakeup=book.wakeup(run.key),
            body=body,
            logger=logger,
            stopped=stopped,
        )
    finally:
        book.forget(run.key)
        services.metrics.pool_gone(run.key)


async def idle_until_pass(
    services: Services,
    book: Bookkeeping,
    key: PoolKey,
    pods: PodsByPool,
    *,
    seconds: float,
    stopped: kopf.DaemonStopped,
) -> bool:
    """Wait until the pool is woken (True) or ``seconds`` pass (False). Meanwhile its workers' stats are
    refreshed every stats interval, which costs O(its pods), not a pass: news (a state, a queue, a request)
    wakes the pool. A pass every stats interval per pool was 30 passes a second at 150 pools, most of them
    deciding nothing, and 200 a second at 1,000."""
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    interval, wakeup = services.config.stats_interval_seconds, book.wakeup(key)
    while not stopped:
        remaining = until - loop.time()
        if remaining <= 0:
            return False
        if await wait_for_wakeup(wakeup, min(remaining, interval), stopped.wait()):
            return True
        if remaining > interval:
            services.scraper.refresh(list(pods.get(key, ())), on_change=lambda: book.poke(key))
    return False


# ---- the per-ModelHost daemon -----------------------------------------------------------------------------


@kopf.daemon(*_HOSTS, cancellation_timeout=5.0)
async def host_daemon(
    *,
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: Any,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    pods_by_pool: PodsIndex | None = None,
    pools_by_key: PoolsIndex | None = None,
    budgets_by_name: BudgetsIndex | None = None,
    pool_owners: OwnersIndex | None = None,
    host_owners: OwnersIndex | None = None,
    **_: Any,
) -> None:
    """Keeps the ModelHost's host pods (``reconcile_host``), woken by its and its pods' events, in the loop a
    pool's daemon runs (``daemon_loop``: each pass in one of the process's pass slots, a failed one told
    once per distinct error); the next pass comes sooner when a model may make room (``run.retry_in``)."""
    pods = _owned(memo, pods_by_pool, pool_owners, host_owners)
    pools = _index(pools_by_key, "pools_by_key")
    budgets = _index(budgets_by_name, "budgets_by_name")
    services, book = _services(memo), _book(memo)
    run = HostRun(key=(namespace or "", name))
    charge_key = host_charge_key(*run.key)
    wakeup = book.wakeup(charge_key)

    async def one_pass() -> float | None:
        forget_owned(run, book.take_lost(charge_key))
        await reconcile_host(
            services, book, run=run, body=body, pods_by_pool=pods, pools_by_key=pools, budgets=budgets
        )
        # A model may make room sooner than a resync.
        return None if run.retry_in is None else max(run.retry_in, COALESCE_S)

    try:
        await run_passes(
            services,
            book,
            one_pass=one_pass,
            idle=idle_on(wakeup, stopped),
            wakeup=wakeup,
            body=body,
            logger=logger,
            stopped=stopped,
        )
    finally:
        for load in run.loading.values():  # a load in flight: the host finishes it, its next pass sees it
            load.cancel()
        book.forget(charge_key)
        services.metrics.host_gone(*run.key)
        book.poke_waiting()  # its pods' memory is (about to be) free


# ---- the ModelBudget status writer ---------------------------------------------------------------------


@kopf.daemon(
    *_BUDGETS, cancellation_timeout=5.0, when=lambda name, memo, **_: name == _config(memo).budget_name
)
async def budget_daemon(
    *,
    name: str,
    status: kopf.Status,
    meta: kopf.Meta,
    memo: Any,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    pods_by_pool: PodsIndex | None = None,
    budgets_by_name: BudgetsIndex | None = None,
    pool_owners: OwnersIndex | None = None,
    host_owners: OwnersIndex | None = None,
    **_: Any,
) -> None:
    pods = _owned(memo, pods_by_pool, pool_owners, host_owners)
    budgets = _index(budgets_by_name, "budgets_by_name")
    services, book = _services(memo), _book(memo)
    written: dict[str, Any] | None = None
    while not stopped:
        try:
            last = written if written is not None else dict(status)
            generation = int(meta.get("generation") or 0)
            wire = budget_status_wire(services, book, pods, budgets, previous=last, generation=generation)
            await write_budget_status(services, name, last, wire)
            written = wire
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("writing the ModelBudget status failed; retrying")
        await wait_for_wakeup(book.budget_wakeup, services.config.resync_interval_seconds, stopped.wait())
        # Coalesce bursts (a scale-up of many pods) into one write.
        await asyncio.sleep(0.5)
