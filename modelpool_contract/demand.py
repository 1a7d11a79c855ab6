"""Demand for a pool: the ``coordination.k8s.io/v1`` Lease a gateway renews while it holds requests.

A gateway that holds requests for a pool with no serving worker records the moment in one Lease per pool,
in the pool's namespace: named ``demand_lease_name(pool)``, labelled ``demand_lease_labels(pool)``
(``modelpool.dev/pool=<pool>`` and ``modelpool.dev/demand=true``, the operator's watch selects on the
latter), ``spec.renewTime`` the demand instant (a MicroTime: RFC 3339 UTC with microseconds),
``spec.holderIdentity`` the gateway replica that wrote it last, the annotation ``modelpool.dev/held``
(``ANNOTATION_HELD``) the number of requests that replica held for the pool when it wrote, the annotation
``modelpool.dev/refused`` (``ANNOTATION_REFUSED``) the requests that replica refused for the pool (429)
because its hold was full, since its previous write, and an
ownerReference to the ModelPool
(``blockOwnerDeletion`` unset, so the gateway needs no permission on the pool) so the garbage collector
deletes the Lease with its pool.  The operator wakes a pool at zero for a demand newer than the moment the
pool reached zero.  A Lease and not an annotation on the ModelPool: writing an annotation needs ``patch``
on ``modelpools``, which would also let the gateway change a pool's image or env, and the operator rolls
that out to every worker.

**The held count** is written with each demand write and only then, so it costs no write of its own: it is
the count of the replica that wrote last, as of ``renewTime``.  With several gateway replicas each holds
its own requests, and about one of them writes per interval (the others find its write fresh), so the
count is a lower bound of the requests held across replicas.  It is worth something only while the
record is fresh: ``Demand.held_at(now)`` gives it within ``spec.leaseDurationSeconds`` of ``renewTime``
(a replica holding requests renews sooner than that), None afterwards (the holds have ended or the
gateway went away).

**The refused count** rides on the same writes: the hold-full refusals of the writing replica in the
window since its own previous write (about one interval; a refusal happens only while the hold is full,
so a write is due within an interval of it).  Like the held count it is a lower bound across replicas and
is read only while fresh (``Demand.refused_at``).  The operator counts those requests as load: they never
reached a worker, so no worker's ``/stats`` counts them.

``read_demand`` is the one reader (the operator's index; ``demand_from_lease``, its time, for the
gateway's own reads); ``demand_lease`` and ``renew`` the writers' bodies.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from modelpool_contract.labels import LABEL_POOL, PREFIX
from modelpool_contract.times import parse_time

LEASE_GROUP: Final = "coordination.k8s.io"
LEASE_VERSION: Final = "v1"
LEASE_API_VERSION: Final = f"{LEASE_GROUP}/{LEASE_VERSION}"
LEASE_KIND: Final = "Lease"
LEASE_PLURAL: Final = "leases"

#: On a Lease: "true" marks it as a pool's demand (with ``LABEL_POOL`` naming the pool).
LABEL_DEMAND: Final = f"{PREFIX}/demand"
#: The label selector of every demand Lease (the operator's watch).
DEMAND_SELECTOR: Final = f"{LABEL_DEMAND}=true"
#: On a demand Lease: the requests the writing replica held for the pool when it wrote (a decimal count).
ANNOTATION_HELD: Final = f"{PREFIX}/held"
#: On a demand Lease: the requests the writing replica refused for the pool because its hold was full
#: (429), since that replica's previous write (a decimal count).
ANNOTATION_REFUSED: Final = f"{PREFIX}/refused"

_SUFFIX = "-demand"
# Object names are DNS-1123 subdomains of at most 253 characters.
_MAX_NAME = 253


def demand_lease_name(pool: str) -> str:
    """The name of ``pool``'s demand Lease (in the pool's namespace): ``<pool>-demand``, shortened with a
    hash of the pool's name in the rare case that would exceed an object name's 253 characters."""
    name = pool + _SUFFIX
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(pool.encode()).hexdigest()[:10]
    keep = _MAX_NAME - len(_SUFFIX) - len(digest) - 1
    return f"{pool[:keep].rstrip('.-')}-{digest}{_SUFFIX}"


def demand_lease_labels(pool: str) -> dict[str, str]:
    """The labels of ``pool``'s demand Lease."""
    return {LABEL_POOL: pool, LABEL_DEMAND: "true"}


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with exactly six fractional digits."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def demand_pool(lease: Mapping[str, Any]) -> str | None:
    """The pool a demand Lease is for; None for a Lease that is not one (labels missing or different)."""
    labels = (lease.get("metadata") or {}).get("labels") or {}
    pool = labels.get(LABEL_POOL)
    return str(pool) if pool and labels.get(LABEL_DEMAND) == "true" else None


@dataclass(frozen=True)
class Demand:
    """What a demand Lease records: when, how many requests its writer held then and refused (hold full)
    since its previous write (None: not recorded, an older gateway), and for how long the record stands
    (``spec.leaseDurationSeconds``; None: unset)."""

    at: datetime
    held: int | None = None
    duration_s: int | None = None
    refused: int | None = None

    def fresh(self, now: datetime) -> bool:
        """Within its duration of ``at``, either side (clocks that differ); never without a duration."""
        return self.duration_s is not None and abs((now - self.at).total_seconds()) <= self.duration_s

    def held_at(self, now: datetime) -> int | None:
        """The held count while the record is fresh; None once it is stale or when no count or duration
        was recorded."""
        return self.held if self.fresh(now) else None

    def refused_at(self, now: datetime) -> int | None:
        """The refused (hold full) count while the record is fresh; None once it is stale or when no count
        or duration was recorded."""
        return self.refused if self.fresh(now) else None


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        count = int(value)
    except ValueError:
        return None
    return count if count >= 0 else None


def read_demand(lease: Mapping[str, Any]) -> Demand | None:
    """The demand a Lease records (None: not a demand Lease, or no time); an unreadable count or duration
    is unknown, never an error."""
    at = demand_from_lease(lease)
    if at is None:
        return None
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    duration = _count((lease.get("spec") or {}).get("leaseDurationSeconds"))
    held, refused = _count(annotations.get(ANNOTATION_HELD)), _count(annotations.get(ANNOTATION_REFUSED))
    return Demand(at, held, duration or None, refused)


def demand_from_lease(lease: Mapping[str, Any]) -> datetime | None:
    """When the demand a Lease records was last renewed (None: not a demand Lease, or no time)."""
    if demand_pool(lease) is None:
        return None
    return parse_time((lease.get("spec") or {}).get("renewTime"))


def demand_lease(
    *,
    pool: str,
    pool_uid: str | None,
    moment: datetime,
    holder: str,
    duration_s: int,
    pool_api_version: str,
    pool_kind: str,
    held: int = 0,
    refused: int = 0,
) -> dict[str, Any]:
    """A new demand Lease for ``pool`` recording demand at ``moment`` with ``held`` requests held and
    ``refused`` refused since the writer's previous write (the create body; the namespace is the
    request's).  Owned by the pool when its uid is known, without
    ``blockOwnerDeletion``."""
    metadata: dict[str, Any] = {
        "name": demand_lease_name(pool),
        "labels": demand_lease_labels(pool),
        "annotations": _counts(held, refused),
    }
    if pool_uid:
        metadata["ownerReferences"] = [
            {"apiVersion": pool_api_version, "kind": pool_kind, "name": pool, "uid": pool_uid}
        ]
    return {
        "apiVersion": LEASE_API_VERSION,
        "kind": LEASE_KIND,
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "acquireTime": micro_time(moment),
            "renewTime": micro_time(moment),
        },
    }


def _counts(held: int, refused: int) -> dict[str, str]:
    return {ANNOTATION_HELD: str(max(0, held)), ANNOTATION_REFUSED: str(max(0, refused))}


def renew(
    lease: Mapping[str, Any],
    *,
    moment: datetime,
    holder: str,
    duration_s: int,
    held: int = 0,
    refused: int = 0,
) -> dict[str, Any]:
    """``lease`` as read, renewed at ``moment`` by ``holder`` holding ``held`` requests, having refused
    ``refused`` since its previous write: the update body (its resourceVersion makes a concurrent writer's
    update fail with 409).  Everything else, owner references included, is kept."""
    body = copy.deepcopy(dict(lease))
    metadata = body.setdefault("metadata", {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), **_counts(held, refused)}
    spec = body.setdefault("spec", {})
    if spec.get("holderIdentity") != holder:
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["acquireTime"] = micro_time(moment)
    spec.update(holderIdentity=holder, renewTime=micro_time(moment), leaseDurationSeconds=duration_s)
    return body
