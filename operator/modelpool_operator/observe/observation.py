"""Observation: from Kopf's indices (pods, budgets) to observed workers and the memory ledger.

Everything here takes explicit inputs and returns values; nothing holds the operator's shared state or
talks to the API:

* ``slim_pod``: what the pods index keeps of a Pod (the parts the worker-state decision and the stats
  scraper read).
* ``ObservationCache``: ``observe_worker`` with a short cache, for pods of pools no daemon here observes.
* ``observe_all``: every indexed worker by pool; the own pool observed now, the others as their daemons
  last observed them.
* ``budget_limit``, ``current_ledger``: the budget's size (or why it is invalid) and the ledger over all
  workers plus the live reservations; ``ChargeCache`` sums each pool's workers once per observation of
  them, so a ledger costs O(pools), not O(workers).
* ``other_pools``: the other pools (parsed when indexed) with their observed workers, for preemption;
  ``LazyOthers`` builds that list only when the planner reads it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, overload

from pydantic import ValidationError

from modelpool_contract.api import MissingBudget, parse_budget_spec
from modelpool_operator.budget import (
    BudgetLimit,
    Ledger,
    PoolCharge,
    ReservationBook,
    ledger_from_charges,
    missing_budget_limit,
)
from modelpool_operator.observe.ownership import WorkerCharges, slim_owner
from modelpool_operator.observe.worker_state import LifecycleSettings, ObservedWorker, observe_worker
from modelpool_operator.pool import OtherPool, PoolKey

# Another pool's worker observed less than this long ago is reused from the cache (its state only
# changes with a new resourceVersion or new stats; ``now`` only matters for the Unschedulable timeout).
_OBSERVATION_TTL_S = 5.0

# The metadata the pods index keeps.
_POD_METADATA = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "labels",
    "annotations",
    "creationTimestamp",
    "deletionTimestamp",
)
# The status fields, conditions and container status fields the pods index keeps (what
# ``worker_state``, ``observe.hosts`` and the scraper read); the rest (images, IPs but the first, QoS,
# probe times...) is dropped.
_POD_STATUS = ("phase", "reason", "message", "podIP")
_POD_CONDITIONS = frozenset({"Ready", "PodScheduled"})
_CONDITION_FIELDS = ("type", "status", "reason", "message", "lastTransitionTime")
_CONTAINER_STATUS = ("name", "ready", "restartCount", "state", "lastState")
# Strings up to this long are interned in the index (names, states, timestamps; not long messages).
_INTERN_UP_TO = 64

PodsByPool = Mapping[PoolKey, Iterable[Mapping[str, Any]]]
StatsByName = Mapping[str, Mapping[str, Any] | None]


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Pod the worker state, the host view and the scraper read, kept in the pods index for
    every worker of every pool (10,000 at 1,000 pools): ``_POD_STATUS``'s fields of the status, the
    ``_POD_CONDITIONS`` conditions and the containers' ``_CONTAINER_STATUS`` fields only, and every key
    and short string interned (``_compact``): about 2.5 KiB per pod, where a copy of the parts took 8.8."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    kept: dict[str, Any] = {key: status[key] for key in _POD_STATUS if key in status}
    if "conditions" in status:
        kept["conditions"] = [
            {key: c[key] for key in _CONDITION_FIELDS if key in c}
            for c in status.get("conditions") or []
            if c.get("type") in _POD_CONDITIONS
        ]
    if "containerStatuses" in status:
        kept["containerStatuses"] = [
            {key: c[key] for key in _CONTAINER_STATUS if key in c}
            for c in status.get("containerStatuses") or []
        ]
    slim = {
        "metadata": {
            **{key: meta[key] for key in _POD_METADATA if key in meta},
            # The controller reference (the ledger counts only owned pods: ``ownership``).
            **({"ownerReferences": owners} if (owners := slim_owner(meta)) else {}),
        },
        "spec": {
            "nodeName": spec.get("nodeName"),
            "containers": [
                {
                    **{key: c[key] for key in ("name", "resources") if key in c},
                    "ports": [
                        {key: p[key] for key in ("name", "containerPort") if key in p}
                        for p in c.get("ports") or []
                    ],
                }
                for c in spec.get("containers") or []
            ],
        },
        "status": kept,
    }
    compact: dict[str, Any] = _compact(slim)
    return compact


def _compact(value: Any) -> Any:
    """A deep copy of JSON ``value`` whose keys and short strings are interned: a watch event's body is a
    new JSON document, so each pod's index value would otherwise hold its own copy of every key
    (``lastTransitionTime``...) and of every repeated value (``True``, ``Running``, the label values)."""
    if isinstance(value, dict):  # an empty mapping reads as a missing one (``or {}``): not kept
        return {sys.intern(str(k)): _compact(v) for k, v in value.items() if v != {}}
    if isinstance(value, list):
        return [_compact(v) for v in value]
    if isinstance(value, str) and len(value) <= _INTERN_UP_TO:
        return sys.intern(value)
    return value


def pod_indexed(pods_by_pool: PodsByPool, pool: PoolKey, name: str) -> bool:
    """Whether the pods index holds the pod ``name`` of ``pool`` (the watch has seen it)."""
    return any((pod.get("metadata") or {}).get("name") == name for pod in pods_by_pool.get(pool, ()))


@dataclass
class ObservationCache:
    """``observe_worker`` over indexed pods, cached by pod uid (reused while the pod's resourceVersion and
    stats are unchanged and the entry is young), so observing other pools' pods costs O(changes)."""

    settings: LifecycleSettings
    _cache: dict[str, tuple[Any, int, float, int | None, ObservedWorker]] = field(default_factory=dict)

    def observe(
        self,
        pod: Mapping[str, Any],
        stats: Mapping[str, Any] | None,
        now: datetime,
        fresh: bool,
        charge: int | None = None,
    ) -> ObservedWorker:
        """The worker behind ``pod``, charged ``charge`` (``observe_worker``); ``fresh`` skips the cache (the
        own pool: observed every pass)."""
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
            and cached[3] == charge
        ):
            return cached[4]
        worker = observe_worker(pod, stats, now, self.settings, charge)
        self._cache[uid] = (version, id(stats), mono, charge, worker)
        return worker

    def __len__(self) -> int:
        return len(self._cache)

    def prune(self, alive: Iterable[str]) -> None:
        keep = set(alive)
        for uid in [uid for uid in self._cache if uid not in keep]:
            del self._cache[uid]


def observe_all(
    cache: ObservationCache,
    pods_by_pool: PodsByPool,
    *,
    observed: MutableMapping[PoolKey, list[ObservedWorker]],
    cached_stats: Callable[[list[Mapping[str, Any]]], StatsByName],
    own: PoolKey | None,
    own_stats: StatsByName,
    now: datetime,
    charges: WorkerCharges | None = None,
) -> dict[PoolKey, list[ObservedWorker]]:
    """Every indexed worker, by pool: the own pool's observed now, with ``own_stats``; every other pool's as
    its own daemon last observed them (``observed``, which this updates for the own pool), so a pass costs
    O(own pods), not O(all pods).

    That view of the others can lag by one of their passes, always on the safe side for the budget: a pod
    they have not observed yet is still covered by its reservation (reservations are only dropped for
    observed pods), and a pod gone since is still charged until its pool's next pass, which its deletion
    event triggers at once. Pods of pools no daemon here observes (e.g. a pool being deleted) are observed
    directly, through the cache, with the stats ``cached_stats`` knows for them. Each worker is charged
    what ``charges`` says (its owner's record: ``budget.worker_charge``), else its container's memory.
    """
    # The other daemons' observations are copied whole and the pools to observe found with set operations
    # (C loops: a Python loop over a thousand pools per pass was a tenth of the operator's time at 1,000
    # pools); then the indexed pools without an observation, and the own, are observed.
    indexed = set(pods_by_pool)
    result = dict(observed)
    for gone in result.keys() - indexed:
        del result[gone]
    fresh = indexed - result.keys()
    if own is not None and own in indexed:
        fresh.add(own)
    for key in fresh:
        pods = list(pods_by_pool.get(key, ()))
        stats = own_stats if key == own else cached_stats(pods)
        result[key] = [
            cache.observe(
                pod,
                stats.get(name := pod["metadata"]["name"]),
                now,
                fresh=key == own,
                charge=charges(key, name) if charges is not None else None,
            )
            for pod in pods
        ]
    if own is not None:
        if own not in indexed:
            result.pop(own, None)
        observed[own] = result.get(own, [])
    if len(cache) > 2 * sum(map(len, result.values())) + 100:
        cache.prune(w.uid or w.name for ws in result.values() for w in ws)
    return result


def budget_limit(
    budgets: Mapping[str, Iterable[Mapping[str, Any]]], name: str, *, missing: MissingBudget
) -> BudgetLimit:
    """What the ModelBudget ``name`` allows: its size; when its spec does not parse, why (and then nothing
    is admitted: ``budget`` module doc); when it does not exist, what ``missing`` (the operator's
    ``missing_budget`` setting) says: no limit, or nothing admitted until it exists
    (``budget.missing_budget_limit``; docs/operator-api.md)."""
    for spec in budgets.get(name, ()):
        try:
            return BudgetLimit(total=parse_budget_spec(spec).memory_bytes)
        except ValueError as exc:
            return BudgetLimit(invalid=invalid_budget_message(name, exc))
    return missing_budget_limit(name, missing)


def invalid_budget_message(name: str, exc: ValueError) -> str:
    """Why the ModelBudget does not parse, in one line: pydantic's first error (the field and the reason)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if errors:
        first = errors[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        reason = str(first.get("msg", "")).removeprefix("Value error, ")
        if where and not reason.startswith("spec."):
            reason = f"spec.{where}: {reason}"
    else:
        reason = str(exc)
    return f"ModelBudget {name} is invalid: {reason}"


@dataclass
class ChargeCache:
    """Each pool's ``PoolCharge``, summed again only when its list of observed workers is a new one, and
    their total and per-pool shares kept as they change.

    ``observe_all`` hands out the very list a pool's daemon last observed until that daemon observes the
    pool again, so with a thousand pools a pass sums its own pool's workers and reuses every other pool's
    sums (the cache holds each list it summed: its identity cannot be reused while it is cached). The
    total and the shares are updated per pool that changed, not rebuilt per pass: at 1,000 pools the
    ledger's sums over every pool were a tenth of the operator's time during a scale-up."""

    _entries: dict[PoolKey, tuple[list[ObservedWorker], PoolCharge]] = field(default_factory=dict)
    # Each cached pool's charge (the same as in ``_entries``), their total and the non-zero ones.
    _charges: dict[PoolKey, PoolCharge] = field(default_factory=dict)
    used: int = 0
    shares: dict[PoolKey, int] = field(default_factory=dict)

    def charges(self, workers: Mapping[PoolKey, list[ObservedWorker]]) -> Mapping[PoolKey, PoolCharge]:
        """Each pool of ``workers``' charge (a view kept up to date: read it before the next call); the pools
        of earlier calls that ``workers`` no longer holds are forgotten."""
        entries = self._entries
        for key, listed in workers.items():
            cached = entries.get(key)
            if cached is None or cached[0] is not listed:
                self._set(key, listed)
        if len(entries) > len(workers):  # every key of ``workers`` is cached now: the others are gone
            for key in [k for k in entries if k not in workers]:
                self._drop(key)
        return self._charges

    def _set(self, key: PoolKey, listed: list[ObservedWorker]) -> None:
        self._drop(key)
        charge = PoolCharge.of(listed)
        self._entries[key] = (listed, charge)
        self._charges[key] = charge
        self.used += charge.used
        if charge.used:
            self.shares[key] = charge.used

    def _drop(self, key: PoolKey) -> None:
        cached = self._entries.pop(key, None)
        if cached is not None:
            del self._charges[key]
            self.used -= cached[1].used
            self.shares.pop(key, None)


def current_ledger(
    workers: Mapping[PoolKey, list[ObservedWorker]],
    reservations: ReservationBook,
    *,
    limit: BudgetLimit,
    charges: ChargeCache | None = None,
) -> Ledger:
    """The ledger over every observed worker plus the live reservations (dropping from the book those whose
    pod is observed); ``charges`` keeps each pool's sums from one ledger to the next."""
    cache = charges if charges is not None else ChargeCache()
    summed = cache.charges(workers)
    return ledger_from_charges(
        limit.total,
        summed,
        reservations,
        invalid=limit.invalid,
        closed_reason=limit.reason,
        sums=(cache.used, cache.shares),
    )


class LazyOthers(Sequence[OtherPool]):
    """``other_pools``, computed on first use: the planner reads the other pools only when the pool has
    workers to admit (a pass at its target, the common case, never builds the list of a thousand)."""

    def __init__(self, make: Callable[[], Iterable[OtherPool]]) -> None:
        self._make: Callable[[], Iterable[OtherPool]] | None = make
        self._items: tuple[OtherPool, ...] = ()

    def _all(self) -> tuple[OtherPool, ...]:
        if self._make is not None:
            self._items, self._make = tuple(self._make()), None
        return self._items

    @property
    def built(self) -> bool:
        return self._make is None

    @overload
    def __getitem__(self, index: int) -> OtherPool: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[OtherPool]: ...
    def __getitem__(self, index: int | slice) -> OtherPool | Sequence[OtherPool]:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[OtherPool]:
        return iter(self._all())


def other_pools(
    own: PoolKey,
    pools_by_key: Mapping[PoolKey, Iterable[OtherPool]],
    workers: Mapping[PoolKey, list[ObservedWorker]],
) -> list[OtherPool]:
    """The other pools (as the pools index parsed them) with their observed workers."""
    return [
        replace(pool, workers=tuple(workers.get(key, [])))
        for key, indexed in pools_by_key.items()
        if key != own
        for pool in list(indexed)[:1]
    ]
