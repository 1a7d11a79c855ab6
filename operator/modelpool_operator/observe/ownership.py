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

A foreign pod is ignored, never deleted by the operator (it is not the operator's to delete; the
garbage collector removes a pod whose owner uid does not exist), and reported once per pod
(``ForeignPods``: a log line and ``modelpool_operator_foreign_pods_total``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from modelpool_contract.api import MODELHOST_KIND, MODELPOOL_KIND
from modelpool_contract.labels import GROUP
from modelpool_operator.host import host_pool_label
from modelpool_operator.pool import PoolKey

# The owner reference fields the pods index keeps (the controller reference only).
OWNER_FIELDS = ("apiVersion", "kind", "name", "uid")
# ``ForeignPods`` forgets what it reported past this many pods (a flood must not grow the operator).
_REPORTED_MAX = 10_000


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod's controller owner reference to one of our kinds."""

    kind: str
    name: str
    uid: str


def controller_owner(meta: Mapping[str, Any]) -> Owner | None:
    """The pod's controller owner reference when it is a ``modelpool.dev`` ModelPool or ModelHost with a
    name and a uid; None otherwise (no owner, another controller, another group, a partial reference)."""
    for ref in meta.get("ownerReferences") or ():
        if not isinstance(ref, Mapping) or ref.get("controller") is not True:
            continue
        group = str(ref.get("apiVersion") or "").partition("/")[0]
        kind, name, uid = ref.get("kind"), ref.get("name"), ref.get("uid")
        if group != GROUP or kind not in (MODELPOOL_KIND, MODELHOST_KIND) or not name or not uid:
            return None
        return Owner(kind=str(kind), name=str(name), uid=str(uid))
    return None


def owner_pool_label(owner: Owner) -> str:
    """The ``modelpool.dev/pool`` value the pods of ``owner`` carry (``host.host_pool_label`` for a host)."""
    return host_pool_label(owner.name) if owner.kind == MODELHOST_KIND else owner.name


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


UidOf = Callable[[PoolKey], str | None]
OnForeign = Callable[[Mapping[str, Any]], None]


class OwnedPods(Mapping[PoolKey, list[Mapping[str, Any]]]):
    """The pods index as every daemon reads it: each key's pods that ``owned_by`` the pool (or ModelHost)
    of that key, whose uid ``uid_of`` tells (None: no such pool now, so none of its pods counts).

    The keys are the index's keys of a known pool (a set operation over the index, O(pools)); ``get``
    filters one key's pods (O(its pods)), which its readers iterate anyway. A pod dropped here is passed
    to ``on_foreign``."""

    def __init__(
        self,
        pods: Mapping[PoolKey, Iterable[Mapping[str, Any]]],
        uid_of: UidOf,
        on_foreign: OnForeign | None = None,
    ) -> None:
        self._pods = pods
        self._uid_of = uid_of
        self._on_foreign = on_foreign

    def __getitem__(self, key: PoolKey) -> list[Mapping[str, Any]]:
        indexed = self._pods[key]
        uid = self._uid_of(key)
        if not uid:  # no such pool now: none of its pods counts (the garbage collector removes them)
            raise KeyError(key)
        kept: list[Mapping[str, Any]] = []
        for pod in indexed:
            if owned_by(pod, key, uid):
                kept.append(pod)
            elif self._on_foreign is not None:
                self._on_foreign(pod)
        return kept

    def __iter__(self) -> Iterator[PoolKey]:
        return (key for key in list(self._pods) if self._uid_of(key))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, key: object) -> bool:
        return key in self._pods and bool(self._uid_of(key))  # type: ignore[arg-type]


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
