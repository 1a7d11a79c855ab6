"""Demand for a pool: the ``coordination.k8s.io/v1`` Lease gateway replicas renew while they hold requests.

A gateway that holds requests for a pool with no serving worker records the moment in one Lease per pool,
in the pool's namespace: named ``demand_lease_name(pool)``, labelled ``demand_lease_labels(pool)``
(``modelpool.dev/pool=<pool>`` and ``modelpool.dev/demand=true``, the operator's watch selects on the
latter), ``spec.renewTime`` the latest demand instant (a MicroTime: RFC 3339 UTC with microseconds),
``spec.holderIdentity`` the gateway replica that wrote it last, ``spec.leaseDurationSeconds`` how long a
record stands, and an ownerReference to the ModelPool (``blockOwnerDeletion`` unset, so the gateway needs
no permission on the pool) so the garbage collector deletes the Lease with its pool.  The operator wakes a
pool at zero for a demand newer than the moment the pool reached zero.  A Lease and not an annotation on
the ModelPool: writing an annotation needs ``patch`` on ``modelpools``, which would also let the gateway
change a pool's image or env, and the operator rolls that out to every worker.

**Each replica's share** is one annotation of its own, ``modelpool.dev/demand.<replica>``
(``share_annotation(holder)``; ``<replica>`` the first 12 hex digits of the SHA-256 of the replica's
holderIdentity, which may be longer than an annotation name allows), valued
``held=<n>,refused=<n>,at=<MicroTime>``: the requests that replica held for the pool when it wrote, the
requests it refused for the pool (429, its hold full) since its own previous write, and the moment of that
write.  A replica writes only its own entry (an update carrying the read's resourceVersion: a concurrent
writer's 409 makes it read again and re-apply its entry), once per demand interval while it holds
requests, so the counts cost no write of their own.  The reader sums the shares that are live, within
``spec.leaseDurationSeconds`` of their own ``at`` either side (clocks that differ): ``Demand.held_at(now)``
and ``Demand.refused_at(now)``; a replica whose holds ended (or that went away) stops writing and its share
drops out within the lease duration.  Writers prune the entries that are no longer live when they write
(``renew``), so the Lease stays as small as the set of replicas holding requests.  One object per pool,
not per (pool, replica): the gateway's RBAC, its Lease admission policy and the operator's index stay as
they were, and writes stay at one per interval per replica holding requests.

**An older gateway's Lease** (this release reads it, the next may not) carries one count pair,
``modelpool.dev/held`` and ``modelpool.dev/refused`` (``ANNOTATION_HELD``, ``ANNOTATION_REFUSED``), the
last writer's: read as the share of ``spec.holderIdentity`` at ``spec.renewTime``, and turned into that
entry by the next ``renew`` (so an older replica's count keeps its own time while both versions run).

``read_demand`` is the one reader (the operator's index; ``demand_from_lease``, its time, for the
gateway's own reads); ``demand_lease`` and ``renew`` the writers' bodies; ``live_shares`` and
``prune_shares`` the pure rules both apply.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
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
#: On a demand Lease, followed by a replica's id: that replica's share (``held=<n>,refused=<n>,at=<time>``).
SHARE_PREFIX: Final = f"{PREFIX}/demand."
#: On a demand Lease written by an older gateway: the requests its last writer held (a decimal count).
ANNOTATION_HELD: Final = f"{PREFIX}/held"
#: On a demand Lease written by an older gateway: the requests its last writer refused (hold full) since
#: that replica's previous write (a decimal count).
ANNOTATION_REFUSED: Final = f"{PREFIX}/refused"

_SUFFIX = "-demand"
# Object names are DNS-1123 subdomains of at most 253 characters.
_MAX_NAME = 253
# Hex digits of a replica's id: 48 bits, no collision among a gateway's replicas in practice.
_REPLICA_DIGITS = 12


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


def replica_id(holder: str) -> str:
    """A gateway replica's id in annotation names: a hash of its holderIdentity (any length, any text)."""
    return hashlib.sha256(holder.encode()).hexdigest()[:_REPLICA_DIGITS]


def share_annotation(holder: str) -> str:
    """The annotation that carries ``holder``'s share of a pool's demand."""
    return SHARE_PREFIX + replica_id(holder)


def demand_pool(lease: Mapping[str, Any]) -> str | None:
    """The pool a demand Lease is for; None for a Lease that is not one (labels missing or different)."""
    labels = (lease.get("metadata") or {}).get("labels") or {}
    pool = labels.get(LABEL_POOL)
    return str(pool) if pool and labels.get(LABEL_DEMAND) == "true" else None


@dataclass(frozen=True)
class Share:
    """One gateway replica's part of a pool's demand: when it wrote, the requests it held then and those
    it refused (hold full) since its previous write (None: unreadable or not recorded)."""

    replica: str
    at: datetime
    held: int | None = None
    refused: int | None = None

    def live(self, now: datetime, duration_s: int | None) -> bool:
        """Within ``duration_s`` of its write, either side (clocks that differ); never without one."""
        return duration_s is not None and abs((now - self.at).total_seconds()) <= duration_s

    def value(self) -> str:
        """The annotation's value."""
        return f"held={self.held or 0},refused={self.refused or 0},at={micro_time(self.at)}"


def latest_shares(shares: Iterable[Share]) -> list[Share]:
    """Each replica's latest share (an older gateway's pair and that replica's entry may both be there)."""
    latest: dict[str, Share] = {}
    for share in shares:
        if share.replica not in latest or latest[share.replica].at < share.at:
            latest[share.replica] = share
    return list(latest.values())


def live_shares(shares: Iterable[Share], now: datetime, duration_s: int | None) -> list[Share]:
    """The shares that count at ``now``: each replica's latest, if within ``duration_s`` of its write."""
    return [s for s in latest_shares(shares) if s.live(now, duration_s)]


def _total(counts: Iterable[int | None]) -> int | None:
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


@dataclass(frozen=True)
class Demand:
    """What a demand Lease records: its latest demand instant (``renewTime``), how long a record stands
    (``spec.leaseDurationSeconds``; None: unset, then nothing counts) and each replica's share."""

    at: datetime
    duration_s: int | None = None
    shares: tuple[Share, ...] = ()

    @classmethod
    def one(
        cls,
        at: datetime,
        duration_s: int | None = None,
        *,
        held: int | None = None,
        refused: int | None = None,
    ) -> Demand:
        """A demand with one replica's share written at ``at`` (a Lease one gateway replica wrote)."""
        return cls(at, duration_s, (Share(replica_id(""), at, held, refused),))

    def fresh(self, now: datetime) -> bool:
        """The latest demand is within its duration of ``now``, either side; never without a duration."""
        return self.duration_s is not None and abs((now - self.at).total_seconds()) <= self.duration_s

    def live(self, now: datetime) -> list[Share]:
        """The replicas' shares that count at ``now``."""
        return live_shares(self.shares, now, self.duration_s)

    def held_at(self, now: datetime) -> int | None:
        """The requests held across the replicas whose shares are live; None when none is (the holds ended,
        the gateways went away) or none recorded a count."""
        return _total(s.held for s in self.live(now))

    def refused_at(self, now: datetime) -> int | None:
        """The hold-full refusals across the live shares, each since its replica's previous write; None when
        no live share recorded one."""
        return _total(s.refused for s in self.live(now))

    @property
    def held(self) -> int | None:
        """Each replica's latest held count, live or not, summed (for messages and tests; decisions use
        ``held_at``)."""
        return _total(s.held for s in latest_shares(self.shares))

    @property
    def refused(self) -> int | None:
        """Each replica's latest refused count, live or not, summed."""
        return _total(s.refused for s in latest_shares(self.shares))


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        count = int(value)
    except ValueError:
        return None
    return count if count >= 0 else None


def parse_share(replica: str, value: Any) -> Share | None:
    """A share annotation's value (``held=<n>,refused=<n>,at=<time>``; fields in any order, unknown ones
    ignored); None without a readable ``at`` (its staleness could not be judged).  An unreadable count is
    unknown, never an error."""
    if not isinstance(value, str):
        return None
    fields = dict(part.partition("=")[::2] for part in value.split(",") if "=" in part)
    at = parse_time(fields.get("at"))
    if at is None:
        return None
    return Share(replica, at, _count(fields.get("held")), _count(fields.get("refused")))


def lease_shares(lease: Mapping[str, Any]) -> list[Share]:
    """Every share a Lease records (live or not): the replicas' entries, and an older gateway's count pair
    as the share of ``spec.holderIdentity`` at ``spec.renewTime``."""
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    shares = [
        share
        for name, value in annotations.items()
        if name.startswith(SHARE_PREFIX)
        and (share := parse_share(name.removeprefix(SHARE_PREFIX), value)) is not None
    ]
    legacy = _legacy_share(lease, annotations)
    return shares if legacy is None else [*shares, legacy]


def _legacy_share(lease: Mapping[str, Any], annotations: Mapping[str, Any]) -> Share | None:
    if ANNOTATION_HELD not in annotations and ANNOTATION_REFUSED not in annotations:
        return None
    spec = lease.get("spec") or {}
    at = parse_time(spec.get("renewTime"))
    if at is None:
        return None
    holder = replica_id(str(spec.get("holderIdentity") or ""))
    return Share(
        holder, at, _count(annotations.get(ANNOTATION_HELD)), _count(annotations.get(ANNOTATION_REFUSED))
    )


def read_demand(lease: Mapping[str, Any]) -> Demand | None:
    """The demand a Lease records (None: not a demand Lease, or no time); an unreadable share, count or
    duration is left out or unknown, never an error."""
    at = demand_from_lease(lease)
    if at is None:
        return None
    duration = _count((lease.get("spec") or {}).get("leaseDurationSeconds"))
    shares = sorted(lease_shares(lease), key=lambda s: (s.replica, s.at))
    return Demand(at, duration or None, tuple(shares))


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
    """A new demand Lease for ``pool`` recording demand at ``moment``, with ``holder``'s share: ``held``
    requests held and ``refused`` refused since its previous write (the create body; the namespace is the
    request's).  Owned by the pool when its uid is known, without ``blockOwnerDeletion``."""
    share = Share(replica_id(holder), moment, max(0, held), max(0, refused))
    metadata: dict[str, Any] = {
        "name": demand_lease_name(pool),
        "labels": demand_lease_labels(pool),
        "annotations": {share_annotation(holder): share.value()},
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


def prune_shares(
    annotations: Mapping[str, Any], legacy: Share | None, moment: datetime, duration_s: int
) -> dict[str, str]:
    """``annotations`` as a writer leaves them at ``moment``: share entries that are no longer live (or
    unreadable) dropped, an older gateway's count pair (``legacy``, as read) turned into its replica's
    entry while live and newer than that replica's own; every other annotation kept."""
    kept: dict[str, str] = {}
    for name, value in annotations.items():
        if name in (ANNOTATION_HELD, ANNOTATION_REFUSED):
            continue
        if name.startswith(SHARE_PREFIX):
            share = parse_share(name.removeprefix(SHARE_PREFIX), value)
            if share is None or not share.live(moment, duration_s):
                continue
        kept[name] = str(value)
    if legacy is not None and legacy.live(moment, duration_s):
        name = SHARE_PREFIX + legacy.replica
        own = parse_share(legacy.replica, kept.get(name))
        if own is None or own.at < legacy.at:
            kept[name] = replace(legacy, held=legacy.held or 0, refused=legacy.refused or 0).value()
    return kept


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
    update fail with 409).  Only ``holder``'s share is written; the other replicas' live shares are kept,
    the stale ones pruned (``prune_shares``).  Everything else, owner references included, is kept."""
    body = copy.deepcopy(dict(lease))
    metadata = body.setdefault("metadata", {})
    annotations = metadata.get("annotations") or {}
    kept = prune_shares(annotations, _legacy_share(lease, annotations), moment, duration_s)
    share = Share(replica_id(holder), moment, max(0, held), max(0, refused))
    metadata["annotations"] = {**kept, share_annotation(holder): share.value()}
    spec = body.setdefault("spec", {})
    if spec.get("holderIdentity") != holder:
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["acquireTime"] = micro_time(moment)
    spec.update(holderIdentity=holder, renewTime=micro_time(moment), leaseDurationSeconds=duration_s)
    return body
