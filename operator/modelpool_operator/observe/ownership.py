"""Which pods the ledger counts: only the pods the operator made (issue 30, "the ledger counts only what
the operator made").

The label ``modelpool.dev/pool`` is a server-side watch filter, nothing more: anyone who may create a Pod
may write it. A pod is a pool's worker (observed, charged, scraped, evicted) only when its controller
owner reference names that pool, by kind, name and uid; a host pod likewise names its ModelHost. Two
checks, each at the one place every reader goes through:

* ``claimed_key`` (when the pods index takes a pod, pure): the pod has a controller owner reference of
  ours (``modelpool.dev`` ModelPool or ModelHost) and its pool label is that owner's (a ModelPool's name,
  or ``host_<ModelHost name>``). A pod without one is never indexed: it costs the operator nothing.
* ``OwnedPods`` (the view of the pods index every daemon reads): the owner reference's uid is the uid of
  the pool (or ModelHost) of that name now, so a made-up reference to a real name, or a pod left from an
  earlier pool of the same name, is not counted either.

A counted pod is charged from its owner's object (``OwnerRecord``: the spec now and the charges the
operator recorded in the status; ``budget.worker_charge``), never from anything on the pod.

A deleted pool's (or ModelHost's) pods still hold their memory while they terminate (their grace period,
a finalizer, a node that does not answer): ``Tombstones`` keeps the deleted owner's record, taken from its
last object on the watch's DELETED event, for as long as a pod it owned by uid is indexed, so those pods
stay charged until they are gone, and a new pool is never admitted into memory that is not free yet. The
tombstones live in the operator's memory: a restart while a deleted pool's pods terminate forgets them
(they are then uncharged for the rest of their grace period). A pod orphaned on purpose (``kubectl delete
--cascade=orphan``) loses its owner reference and is foreign from then on: the administrator's act.

A foreign pod is ignored, never deleted by the operator (it is not the operator's to delete; the
garbage collector removes a pod whose owner uid does not exist), and reported once per pod
(``ForeignPods``: a log line and ``modelpool_operator_foreign_pods_total``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from modelpool_contract.api import (
    parse_host_spec,
    parse_pool_spec,
    parse_pool_status,
)
from modelpool_contract.quantity import QuantityError, parse_quantity
from modelpool_operator.budget import worker_charge
from modelpool_operator.owners import controller_owner, owner_pool_label
from modelpool_operator.placement.charge import host_charge
from modelpool_operator.pool import PoolKey

# The owner reference fields the pods index keeps (the controller reference only).
OWNER_FIELDS = ("apiVersion", "kind", "name", "uid")
# ``ForeignPods`` forgets what it reported past this many pods (a flood must not grow the operator).
_REPORTED_MAX = 10_000
# ``Tombstones`` keeps at most this many deleted owners (the oldest forgotten first): deletions are made by
# pool authors, so their number must not grow the operator either.
_TOMBSTONES_MAX = 10_000


def claimed_key(namespace: str, meta: Mapping[str, Any], pool_label: str) -> PoolKey | None:
    """The pods index key of a pod labelled ``pool_label`` (pure): ``(namespace, pool_label)`` when its
    controller owner is ours and is the pool (or ModelHost) that label names; None for a foreign pod."""
    owner = controller_owner(meta)
    if owner is None or owner_pool_label(owner) != pool_label:
        return None
    return (namespace, pool_label)


def slim_owner(meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the pods index keeps of the owner references: the controller one of ours, its identity only."""
    owner = controller_owner(meta)
    if owner is None:
        return []
    ref = next(r for r in meta["ownerReferences"] if isinstance(r, Mapping) and r.get("controller") is True)
    return [{**{key: ref[key] for key in OWNER_FIELDS}, "controller": True}]


def owned_by(pod: Mapping[str, Any], key: PoolKey, uid: str | None) -> bool:
    """Whether ``pod`` (indexed under ``key``) belongs to the pool (or ModelHost) whose uid is ``uid`` now
    (pure): its controller owner is ours, names the pool of ``key`` and carries that uid."""
    if not uid:
        return False
    owner = controller_owner(pod.get("metadata") or {})
    return owner is not None and owner.uid == uid and owner_pool_label(owner) == key[1]


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    """What the ledger takes from a pool (or ModelHost) object, never from its pods: its uid, what each of
    its pods is declared by its spec now (None: the spec does not parse), and what the operator last
    charged each worker (its status, which only the operator writes: ``budget.worker_charge``)."""

    uid: str
    declared: int | None = None
    recorded: Mapping[str, int] = field(default_factory=dict)


def pool_record(body: Mapping[str, Any]) -> OwnerRecord | None:
    """A ModelPool's record (pure): its uid, ``spec.resources.memory`` and ``status.workers[].memory``."""
    uid = (body.get("metadata") or {}).get("uid")
    if not uid:
        return None
    try:
        declared: int | None = parse_pool_spec(body.get("spec") or {}).resources.memory_bytes
    except ValueError:
        declared = None
    recorded: dict[str, int] = {}
    for worker in parse_pool_status(body.get("status")).workers:
        try:
            recorded[worker.name] = parse_quantity(worker.memory)
        except QuantityError:
            continue
    return OwnerRecord(uid=str(uid), declared=declared, recorded=recorded)


def host_record(body: Mapping[str, Any]) -> OwnerRecord | None:
    """A ModelHost's record (pure): its uid and what each host pod is charged (``host_charge``)."""
    uid = (body.get("metadata") or {}).get("uid")
    if not uid:
        return None
    try:
        declared: int | None = host_charge(parse_host_spec(body.get("spec") or {}))
    except ValueError:
        declared = None
    return OwnerRecord(uid=str(uid), declared=declared)


RecordOf = Callable[[PoolKey], OwnerRecord | None]


@dataclass
class Tombstones:
    """The records of deleted pools and ModelHosts whose pods may still be terminating, by key.

    ``bury`` keeps a deleted owner's record (from its last object: the watch's DELETED event); ``get``
    gives it to ``OwnedPods``, which counts the pods still owned by its uid and calls ``settle`` with
    the pods it kept: once none is the deleted owner's, the tombstone goes. At most ``_TOMBSTONES_MAX``
    are kept, the oldest forgotten first."""

    _records: dict[PoolKey, OwnerRecord] = field(default_factory=dict)

    def bury(self, key: PoolKey, record: OwnerRecord | None) -> None:
        if record is None:
            return
        self._records.pop(key, None)
        while len(self._records) >= _TOMBSTONES_MAX:
            del self._records[next(iter(self._records))]
        self._records[key] = record

    def get(self, key: PoolKey) -> OwnerRecord | None:
        return self._records.get(key)

    def settle(self, key: PoolKey, kept: Iterable[Mapping[str, Any]]) -> None:
        """Forget ``key``'s tombstone once none of ``kept`` (its counted pods) is the deleted owner's."""
        record = self._records.get(key)
        if record is not None and not any(owned_by(pod, key, record.uid) for pod in kept):
            del self._records[key]

    def prune(self, indexed: Iterable[PoolKey]) -> None:
        """Forget the tombstones of keys with no pod indexed at all (their pods are gone)."""
        if self._records:
            alive = set(indexed)
            for key in [key for key in self._records if key not in alive]:
                del self._records[key]

    def __len__(self) -> int:
        return len(self._records)


OnForeign = Callable[[Mapping[str, Any]], None]


class OwnedPods(Mapping[PoolKey, list[Mapping[str, Any]]]):
    """The pods index as every daemon reads it: each key's pods that ``owned_by`` the pool (or ModelHost)
    of that key, whose record ``record_of`` tells (None: no such pool now, so none of its pods counts);
    ``charge`` is what such a pod is charged, from that record (``budget.worker_charge``).

    The keys are the index's keys of a known pool (a set operation over the index, O(pools)); ``get``
    filters one key's pods (O(its pods)), which its readers iterate anyway. A pod dropped here is passed
    to ``on_foreign``."""

    def __init__(
        self,
        pods: Mapping[PoolKey, Iterable[Mapping[str, Any]]],
        record_of: RecordOf,
        on_foreign: OnForeign | None = None,
        tombstones: Tombstones | None = None,
    ) -> None:
        self._pods = pods
        self._record_of = record_of
        self._on_foreign = on_foreign
        self._tombstones = tombstones if tombstones is not None else Tombstones()

    def _records(self, key: PoolKey) -> list[OwnerRecord]:
        """The owner records whose pods count under ``key``: the pool (or ModelHost) of that name now, and
        a deleted one of that name whose pods are still terminating."""
        return [r for r in (self._record_of(key), self._tombstones.get(key)) if r is not None]

    def charge(self, key: PoolKey, name: str) -> int | None:
        """What the pod ``name`` of ``key`` is charged by its owner's record (None: the record says
        nothing, its spec does not parse and no charge is recorded: the pod's container then). With a
        live and a deleted owner of one name, the larger of their charges: never below either."""
        charges = [worker_charge(r.declared, r.recorded.get(name)) for r in self._records(key)]
        known = [charge for charge in charges if charge is not None]
        return max(known) if known else None

    def __getitem__(self, key: PoolKey) -> list[Mapping[str, Any]]:
        indexed = self._pods.get(key)
        if indexed is None:
            self._tombstones.settle(key, ())
            raise KeyError(key)
        uids = {record.uid for record in self._records(key)}
        if not uids:  # no such pool now: none of its pods counts (the garbage collector removes them)
            raise KeyError(key)
        kept: list[Mapping[str, Any]] = []
        for pod in indexed:
            if any(owned_by(pod, key, uid) for uid in uids):
                kept.append(pod)
            elif self._on_foreign is not None:
                self._on_foreign(pod)
        self._tombstones.settle(key, kept)
        return kept

    def __iter__(self) -> Iterator[PoolKey]:
        keys = list(self._pods)
        self._tombstones.prune(keys)
        return (key for key in keys if self._records(key))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return key in self._pods and bool(self._records(key))  # type: ignore[arg-type]


WorkerCharges = Callable[[PoolKey, str], int | None]


def worker_charges(pods: Mapping[PoolKey, Iterable[Mapping[str, Any]]]) -> WorkerCharges | None:
    """Where each worker's charge comes from: its owner's record when ``pods`` is the ``OwnedPods`` view
    (the operator's); None for a bare index (the pods' own containers: tests of the ledger alone)."""
    return pods.charge if isinstance(pods, OwnedPods) else None


@dataclass
class ForeignPods:
    """Reports each foreign pod once (by uid, else namespace/name): ``first_sight`` is True the first time."""

    _reported: set[str] = field(default_factory=set)

    def first_sight(self, meta: Mapping[str, Any]) -> bool:
        ident = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        if ident in self._reported:
            return False
        if len(self._reported) >= _REPORTED_MAX:
            self._reported.clear()
        self._reported.add(ident)
        return True
