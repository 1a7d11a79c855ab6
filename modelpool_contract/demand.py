"""Demand for a pool: the ``coordination.k8s.io/v1`` Lease a gateway renews while it holds requests.

A gateway that holds requests for a pool with no serving worker records the moment in one Lease per pool,
in the pool's namespace: named ``demand_lease_name(pool)``, labelled ``demand_lease_labels(pool)``
(``modelpool.dev/pool=<pool>`` and ``modelpool.dev/demand=true``, the operator's watch selects on the
latter), ``spec.renewTime`` the demand instant (a MicroTime: RFC 3339 UTC with microseconds),
``spec.holderIdentity`` the gateway replica that wrote it last, and an ownerReference to the ModelPool
(``blockOwnerDeletion`` unset, so the gateway needs no permission on the pool) so the garbage collector
deletes the Lease with its pool.  The operator wakes a pool at zero for a demand newer than the moment the
pool reached zero.  A Lease and not an annotation on the ModelPool: writing an annotation needs ``patch``
on ``modelpools``, which would also let the gateway change a pool's image or env, and the operator rolls
that out to every worker.

``demand_from_lease`` is the one reader (the operator's index, the gateway's own reads); ``demand_lease``
and ``renew`` the writers' bodies.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final

from modelpool_contract.labels import LABEL_POOL, PREFIX

LEASE_GROUP: Final = "coordination.k8s.io"
LEASE_VERSION: Final = "v1"
LEASE_API_VERSION: Final = f"{LEASE_GROUP}/{LEASE_VERSION}"
LEASE_KIND: Final = "Lease"
LEASE_PLURAL: Final = "leases"

#: On a Lease: "true" marks it as a pool's demand (with ``LABEL_POOL`` naming the pool).
LABEL_DEMAND: Final = f"{PREFIX}/demand"
#: The label selector of every demand Lease (the operator's watch).
DEMAND_SELECTOR: Final = f"{LABEL_DEMAND}=true"

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


def parse_micro_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (MicroTime or Time) as an aware UTC datetime; None when absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def demand_pool(lease: Mapping[str, Any]) -> str | None:
    """The pool a demand Lease is for; None for a Lease that is not one (labels missing or different)."""
    labels = (lease.get("metadata") or {}).get("labels") or {}
    pool = labels.get(LABEL_POOL)
    return str(pool) if pool and labels.get(LABEL_DEMAND) == "true" else None


def demand_from_lease(lease: Mapping[str, Any]) -> datetime | None:
    """When the demand a Lease records was last renewed (None: not a demand Lease, or no time)."""
    if demand_pool(lease) is None:
        return None
    return parse_micro_time((lease.get("spec") or {}).get("renewTime"))


def demand_lease(
    *,
    pool: str,
    pool_uid: str | None,
    moment: datetime,
    holder: str,
    duration_s: int,
    pool_api_version: str,
    pool_kind: str,
) -> dict[str, Any]:
    """A new demand Lease for ``pool`` recording demand at ``moment`` (the create body; the namespace is the
    request's).  Owned by the pool when its uid is known, without ``blockOwnerDeletion``."""
    metadata: dict[str, Any] = {"name": demand_lease_name(pool), "labels": demand_lease_labels(pool)}
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


def renew(lease: Mapping[str, Any], *, moment: datetime, holder: str, duration_s: int) -> dict[str, Any]:
    """``lease`` as read, renewed at ``moment`` by ``holder``: the update body (its resourceVersion makes a
    concurrent writer's update fail with 409).  Everything else, owner references included, is kept."""
    body = copy.deepcopy(dict(lease))
    spec = body.setdefault("spec", {})
    if spec.get("holderIdentity") != holder:
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["acquireTime"] = micro_time(moment)
    spec.update(holderIdentity=holder, renewTime=micro_time(moment), leaseDurationSeconds=duration_s)
    return body
