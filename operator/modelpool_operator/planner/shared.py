"""A shared pool's pass (``spec.host``) while the operator does not place its replicas on host pods yet:
it never gets dedicated workers (they would own GPUs the ModelHost owns); its status says that it waits
for placement on its host, and why (pure).

Why, in order: the ModelHost does not exist (``HostNotFound``) or its spec does not parse
(``HostInvalid``); else what ``placement.place`` answers over the host pods (``NoHost``: none is ready,
``LargerThanDevice``, ``NoRoom``, ``EveryHostHoldsIt``); else ``PlacementPending``: a host pod could take
the model, but this operator version does not load models on hosts yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from modelpool_operator.placement.decide import PlacementRequest, Unplaced, place
from modelpool_operator.placement.ledger import Host
from modelpool_operator.planner.draft import Event
from modelpool_operator.planner.status import condition
from modelpool_operator.pool import PoolView

#: The condition that says whether a shared pool's replicas are placed on its hosts.
PLACED = "Placed"
HOST_NOT_FOUND = "HostNotFound"
HOST_INVALID = "HostInvalid"
PLACEMENT_PENDING = "PlacementPending"


@dataclass(frozen=True)
class HostWait:
    """Why a shared pool has no replica: a CamelCase reason (the Unplaced reasons included) and a message."""

    reason: str
    message: str


def host_wait(pool: PoolView, *, host_found: bool, host_error: str | None, hosts: Sequence[Host]) -> HostWait:
    """Why the shared pool ``pool`` waits (``hosts``: its ModelHost's pods as the ledger sees them)."""
    name = pool.spec.host
    prefix = f"waiting for placement on ModelHost {name}"
    if not host_found:
        return HostWait(HOST_NOT_FOUND, f"{prefix}: it does not exist in namespace {pool.namespace}")
    if host_error is not None:
        return HostWait(HOST_INVALID, f"{prefix}: its spec is invalid: {host_error}"[:1000])
    request = PlacementRequest(pool.key, pool.spec.resources.memory_bytes, pool.spec.priority)
    decided = place(request, hosts)
    if isinstance(decided, Unplaced):
        return HostWait(decided.reason, f"{prefix}: {decided.message}")
    return HostWait(
        PLACEMENT_PENDING,
        f"{prefix}: host pod {decided.host} has room, but this operator version does not load models on "
        "shared hosts yet; no dedicated worker is created for a pool with spec.host",
    )


def host_wait_status(pool: PoolView, wait: HostWait, now: datetime) -> dict[str, Any]:
    """The status patch (wire form) of a waiting shared pool: phase Pending, no replica, the condition
    Placed False and Ready False with the reason; other conditions kept (the ApiError of an earlier pass,
    ...)."""
    kinds = {PLACED, "Ready"}
    kept = [c for c in pool.status.conditions if c.type not in kinds]
    made = [
        condition(
            pool.status.conditions,
            kind,
            status="False",
            reason=wait.reason,
            message=wait.message,
            now=now,
            generation=pool.generation,
        )
        for kind in (PLACED, "Ready")
    ]
    conditions = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in [*kept, *made]]
    desired = pool.spec.replicas
    return {
        "phase": "Pending",
        "observedGeneration": pool.generation,
        "replicas": 0,
        "readyReplicas": 0,
        "readyText": f"0/{desired}",
        "conditions": conditions,
    }


def host_wait_event(wait: HostWait) -> Event:
    """The Event of a new reason (posted once per reason and generation by the caller)."""
    return Event(
        "Normal" if wait.reason == PLACEMENT_PENDING else "Warning", wait.reason, wait.message[:1000]
    )
