"""One reconciliation pass of one ModelPool: observe, plan (pure), then apply the plan's effects.

The order matters for the budget. Everything between reading the pod index and recording the planned
creations as reservations is synchronous (no ``await``), so on the operator's single event loop no other
pool can plan in between: two pools reconciling "at once" always see each other's reservations and can
never over-admit. The API calls (evict, delete, create, status, events) come after, and a failed create
releases its reservation at once.

Everything read here is rebuilt from the cluster (Kopf's indices of pods, pools and budgets); the only
in-memory state is the reservation book and the last status this process wrote (we are its one writer,
so that copy is authoritative even before the watch delivers it back).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

from modelpool_operator.api import ModelPoolStatus, parse_budget_spec
from modelpool_operator.budget import Ledger, PoolKey, budget_status, build_ledger
from modelpool_operator.kube import merge_patch
from modelpool_operator.lifecycle import LABEL_POOL, LifecycleSettings, ObservedWorker, observe_worker
from modelpool_operator.planner import OtherPool, Plan, PlannerSettings, PoolView, plan
from modelpool_operator.resources import PodSettings, build_service, build_worker_pod, eviction_patch
from modelpool_operator.runtime import OperatorState

logger = logging.getLogger(__name__)

# Another pool's worker observed less than this long ago is reused from the cache (its state only
# changes with a new resourceVersion or new stats; ``now`` only matters for the Unschedulable timeout).
_OBSERVATION_TTL_S = 5.0


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Pod the lifecycle and the scraper read (kept in the index: ~1 KiB per pod)."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return copy.deepcopy(
        {
            "metadata": {
                key: meta[key]
                for key in (
                    "name",
                    "namespace",
                    "uid",
                    "resourceVersion",
                    "labels",
                    "annotations",
                    "creationTimestamp",
                    "deletionTimestamp",
                )
                if key in meta
            },
            "spec": {
                "nodeName": spec.get("nodeName"),
                "containers": [
                    {key: c[key] for key in ("name", "ports", "resources") if key in c}
                    for c in spec.get("containers") or []
                ],
            },
            "status": dict(body.get("status") or {}),
        }
    )


def slim_pool(body: Mapping[str, Any]) -> dict[str, Any]:
    """A ModelPool's identity, spec and status (kept in the pools index, for preemption decisions)."""
    meta = body.get("metadata") or {}
    return copy.deepcopy(
        {
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "generation") if k in meta},
            "spec": dict(body.get("spec") or {}),
            # Only what other pools' planning reads: the memory this pool is blocked on.
            "status": {
                "memory": {
                    "waitingBytes": ((body.get("status") or {}).get("memory") or {}).get("waitingBytes", 0)
                }
            },
        }
    )


@dataclass
class Observer:
    """``observe_worker`` over every indexed pod, cached for other pools' pods (O(pods) per pass)."""

    settings: LifecycleSettings
    _cache: dict[str, tuple[Any, int, float, ObservedWorker]] = field(default_factory=dict)

    def observe(
        self, pod: Mapping[str, Any], stats: Mapping[str, Any] | None, now: datetime, fresh: bool
    ) -> ObservedWorker:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or meta.get("name"))
        version = meta.get("resourceVersion")
        mono = time.monotonic()
        cached = self._cache.get(uid)
        if (
            not fresh
            and cached is not None
            and cached[0] == version
            and cached[1] == id(stats)
            and mono - cached[2] < _OBSERVATION_TTL_S
        ):
            return cached[3]
        worker = observe_worker(pod, stats, now, self.settings)
        self._cache[uid] = (version, id(stats), mono, worker)
        return worker

    def __len__(self) -> int:
        return len(self._cache)

    def prune(self, alive: Iterable[str]) -> None:
        keep = set(alive)
        for uid in [uid for uid in self._cache if uid not in keep]:
            del self._cache[uid]


def budget_total(budgets: Mapping[str, Any], name: str) -> int | None:
    """The budget's total bytes; None (unlimited) when the ModelBudget does not exist or is invalid."""
    for spec in budgets.get(name, ()):
        try:
            return parse_budget_spec(spec).memory_bytes
        except ValueError:
            logger.warning("ModelBudget %s has an invalid spec; treating the budget as unlimited", name)
    return None


def observe_all(
    state: OperatorState,
    *,
    observer: Observer,
    pods_by_pool: Mapping[PoolKey, Iterable[Mapping[str, Any]]],
    own: PoolKey | None,
    own_stats: Mapping[str, Mapping[str, Any] | None],
    now: datetime,
) -> dict[PoolKey, list[ObservedWorker]]:
    """Every indexed worker, by pool: the own pool's observed now, with fresh stats; every other pool's as
    its own daemon last observed them (``state.observed``), so a pass costs O(own pods), not O(all pods).

    That view of the others can lag by one of their passes, always on the safe side for the budget: a pod
    they have not observed yet is still covered by its reservation (reservations are only dropped for
    observed pods), and a pod gone since is still charged until its pool's next pass, which its deletion
    event triggers at once. Pods of pools no daemon here observes (e.g. a pool being deleted) are observed
    directly, through the observation cache.
    """
    result: dict[PoolKey, list[ObservedWorker]] = {}
    for key, store in pods_by_pool.items():
        if key != own and key in state.observed:
            result[key] = state.observed[key]
            continue
        pods = list(store)
        stats = own_stats if key == own else state.require_scraper().cached(pods)
        result[key] = [
            observer.observe(pod, stats.get(pod["metadata"]["name"]), now, fresh=key == own) for pod in pods
        ]
    if own is not None:
        state.observed[own] = result.get(own, [])
    if len(observer) > 2 * sum(len(ws) for ws in result.values()) + 100:
        observer.prune(w.uid or w.name for ws in result.values() for w in ws)
    return result


def current_ledger(
    state: OperatorState, workers: Mapping[PoolKey, list[ObservedWorker]], total: int | None, now: datetime
) -> Ledger:
    """The ledger over every observed worker plus the live reservations (pruning the rest)."""
    everyone = [w for ws in workers.values() for w in ws]
    live = state.reservations.prune((w.key for w in everyone), now, state.config.reservation_ttl_seconds)
    return build_ledger(total, everyone, live)


def lifecycle_settings(state: OperatorState) -> LifecycleSettings:
    return LifecycleSettings(unschedulable_timeout_s=state.config.unschedulable_timeout_seconds)


def planner_settings(state: OperatorState) -> PlannerSettings:
    return PlannerSettings(
        backoff_base_s=state.config.backoff_base_seconds, backoff_cap_s=state.config.backoff_cap_seconds
    )


def pod_settings(state: OperatorState) -> PodSettings:
    return PodSettings(default_image=state.config.server_image, port=state.config.server_port)


@dataclass
class PoolRun:
    """What one pool's daemon carries from pass to pass."""

    key: PoolKey
    last_status: ModelPoolStatus | None = None
    last_status_wire: dict[str, Any] | None = None
    service_ready: bool = False
    charged: int = 0
    invalid_generation: int | None = None


async def reconcile_pool(
    state: OperatorState,
    *,
    observer: Observer,
    run: PoolRun,
    body: Mapping[str, Any],
    pods_by_pool: Mapping[PoolKey, Iterable[Mapping[str, Any]]],
    pools_by_key: Mapping[PoolKey, Iterable[Mapping[str, Any]]],
    budgets: Mapping[str, Any],
) -> Plan | None:
    """One pass for the pool ``run.key``: returns the plan it applied (None: the spec is invalid)."""
    import kopf

    kube = state.require_kube()
    namespace, name = run.key
    try:
        view = PoolView.from_body(body)
    except ValueError as exc:  # the CRD schema should have refused it; say why once per generation
        await report_invalid_spec(state, run, body, exc)
        return None
    if run.last_status is not None:
        # We are the only writer of status; our last write is newer than what the watch may show yet.
        view = replace(view, status=run.last_status)

    own_pods = list(pods_by_pool.get(run.key, ()))
    # ---- no await from here until the reservations are recorded -------------------------------------
    # Stats come from the scraper's cache; stale ones are refetched in the background and wake us.
    own_stats = state.require_scraper().refresh(own_pods, on_change=lambda: state.poke(run.key))
    now = datetime.now(UTC)
    workers = observe_all(
        state, observer=observer, pods_by_pool=pods_by_pool, own=run.key, own_stats=own_stats, now=now
    )
    ledger = current_ledger(state, workers, budget_total(budgets, state.config.budget_name), now)
    others = [
        other_pool(key, specs, workers.get(key, [])) for key, specs in pools_by_key.items() if key != run.key
    ]
    decided = plan(
        view,
        workers.get(run.key, []),
        ledger,
        now=now,
        others=[o for o in others if o is not None],
        settings=planner_settings(state),
    )
    for create in decided.create:
        state.reservations.reserve(namespace, name, create.name, create.memory, now)
    # ---- effects ----------------------------------------------------------------------------------------

    if decided.create:
        state.budget_wakeup.set()
    for evict in decided.evict:
        await kube.patch_pod(evict.namespace, evict.name, eviction_patch(evict.reason, now))
        if (evict.namespace, evict.pool) != run.key:
            state.poke((evict.namespace, evict.pool))  # its daemon deletes it after the drain grace
    for delete in decided.delete:
        await kube.delete_pod(namespace, delete.name)
    if not run.service_ready:
        await kube.ensure_service(namespace, build_service(body, pod_settings(state)))
        run.service_ready = True
    # Creations run concurrently (a pool scaling to 10 should not take 10 round trips); each failed one
    # releases its reservation at once, and the first error fails the pass (retried shortly).
    outcomes = await asyncio.gather(
        *(
            create_worker(state, body, namespace=namespace, name=c.name, thash=decided.template_hash, now=now)
            for c in decided.create
        ),
        return_exceptions=True,
    )
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    if errors:
        raise errors[0]

    wire = decided.status.model_dump(mode="json", by_alias=True)
    previous = run.last_status_wire if run.last_status_wire is not None else dict(body.get("status") or {})
    patch = merge_patch(previous, wire)
    if patch:
        await kube.patch_pool_status(namespace, name, patch)
    run.last_status, run.last_status_wire = decided.status, wire

    for event in decided.events:
        kopf.event(cast(Any, body), type=event.type, reason=event.reason, message=event.message)

    budget = next((c for c in decided.status.conditions if c.type == "BudgetExceeded"), None)
    if budget is not None and budget.status == "True":
        state.waiting.add(run.key)
    else:
        state.waiting.discard(run.key)
    charged = decided.status.memory.charged_bytes
    if charged < run.charged:
        state.poke_waiting()  # memory freed: pools waiting for budget may fit now
    elif charged != run.charged:
        state.budget_wakeup.set()
    run.charged = charged
    return decided


async def report_invalid_spec(
    state: OperatorState, run: PoolRun, body: Mapping[str, Any], exc: Exception
) -> None:
    """An unparseable spec: a Warning Event and phase Failed, once per generation; no workers are touched."""
    import kopf

    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if run.invalid_generation == generation:
        return
    run.invalid_generation = generation
    message = f"invalid spec: {exc}"[:1000]
    kopf.event(cast(Any, body), type="Warning", reason="InvalidSpec", message=message)
    status = {"phase": "Failed", "observedGeneration": generation}
    await state.require_kube().patch_pool_status(run.key[0], run.key[1], status)
    run.last_status = run.last_status_wire = None


async def create_worker(
    state: OperatorState, body: Mapping[str, Any], *, namespace: str, name: str, thash: str, now: datetime
) -> None:
    """Create one worker pod; its reservation ends at once when the call fails or the pod already exists."""
    import kopf

    pod = build_worker_pod(body, name, thash, pod_settings(state), now)
    try:
        created = await state.require_kube().create_pod(namespace, pod)
    except Exception as exc:
        state.reservations.release(namespace, name)
        state.budget_wakeup.set()
        kopf.event(cast(Any, body), type="Warning", reason="CreateFailed", message=f"worker {name}: {exc}")
        raise
    if not created:  # it already exists (an earlier pass or process): the watch shows its charge
        state.reservations.release(namespace, name)


def other_pool(
    key: PoolKey, bodies: Iterable[Mapping[str, Any]], workers: list[ObservedWorker]
) -> OtherPool | None:
    """Another pool's priority, minimum and waiting memory (None when its spec does not parse)."""
    for body in bodies:
        return OtherPool.from_body(
            {**body, "metadata": {**(body.get("metadata") or {}), "namespace": key[0], "name": key[1]}},
            workers,
        )
    return None


def budget_status_wire(
    state: OperatorState,
    observer: Observer,
    pods_by_pool: Mapping[PoolKey, Iterable[Mapping[str, Any]]],
    budgets: Mapping[str, Any],
) -> dict[str, Any]:
    """The ModelBudget status (wire form) as of now, derived from every indexed worker."""
    now = datetime.now(UTC)
    workers = observe_all(
        state, observer=observer, pods_by_pool=pods_by_pool, own=None, own_stats={}, now=now
    )
    ledger = current_ledger(state, workers, budget_total(budgets, state.config.budget_name), now)
    return budget_status(ledger).model_dump(mode="json", by_alias=True)


def pool_of(labels: Mapping[str, str], namespace: str | None) -> PoolKey | None:
    """The (namespace, pool) a worker pod belongs to, from its label."""
    pool = labels.get(LABEL_POOL)
    return (namespace or "", pool) if pool else None
