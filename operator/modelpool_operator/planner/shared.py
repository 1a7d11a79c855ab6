"""A shared pool's pass (``spec.host``), pure: it never gets dedicated workers (they would own GPUs the
ModelHost owns); its ModelHost's pass places its model on host pods (``planner.host_models``), and its status
lists the host pods holding it with the model's state there (``shared_status``), or says why it has none.

Why none, in order: the ModelHost does not exist (``HostNotFound``) or its spec does not parse
(``HostInvalid``); else what ``placement.place`` answers over the host pods (``NoHost``: none is ready,
``LargerThanDevice``, ``NoRoom``, ``EveryHostHoldsIt``); else ``PlacementPending``: a host pod has room and
the ModelHost's pass is loading the model there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from modelpool_contract.api import (
    AutoscalingStatus,
    BackoffStatus,
    MemoryStatus,
    ModelPoolStatus,
    PoolPhase,
    WorkerStatus,
    autoscaling_enabled,
)
from modelpool_contract.quantity import format_quantity
from modelpool_contract.times import rfc3339
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.decide import PlacementRequest, Unplaced, place
from modelpool_operator.placement.ledger import Host
from modelpool_operator.planner.draft import Event
from modelpool_operator.planner.shared_scale import FAILING_EVERYWHERE, SharedScale
from modelpool_operator.planner.status import Setting, with_conditions
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
        return HostWait(HOST_INVALID, f"{prefix}: its spec is invalid: {host_error}")
    request = PlacementRequest(pool.key, pool.spec.resources.memory_bytes, pool.spec.priority)
    decided = place(request, hosts)
    if isinstance(decided, Unplaced):
        return HostWait(decided.reason, f"{prefix}: {decided.message}")
    return HostWait(
        PLACEMENT_PENDING, f"{prefix}: host pod {decided.host} has room; the model is being placed there"
    )


def host_wait_status(pool: PoolView, wait: HostWait, now: datetime) -> ModelPoolStatus:
    """The status of a waiting shared pool, as a patch (``shared_wire(..., patch=True)``: the fields it
    sets): phase Pending, no replica, the condition Placed False and Ready False with the reason; other
    conditions kept (the ApiError of an earlier pass, ...)."""
    waiting: Setting = ("False", wait.reason, wait.message)
    settings = {PLACED: waiting, "Ready": waiting}
    conditions = with_conditions(pool.status.conditions, settings, now=now, generation=pool.generation)
    return ModelPoolStatus(
        phase="Pending",
        observed_generation=pool.generation,
        replicas=0,
        ready_replicas=0,
        ready_text=f"0/{pool.spec.replicas}",
        conditions=conditions,
    )


def shared_wire(status: ModelPoolStatus, *, patch: bool = False) -> dict[str, Any]:
    """A shared pool's status on the wire: every field but the unset ones (None), as a ModelHost's is;
    ``patch``: only the fields its builder set (``host_wait_status``: the others are left as they are)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=patch)


def host_wait_event(wait: HostWait) -> Event:
    """The Event of a new reason (posted once per reason and generation by the caller)."""
    return Event("Normal" if wait.reason == PLACEMENT_PENDING else "Warning", wait.reason, wait.message)


#: A replica that serves requests: a sleeping or waking one too (a request wakes it on the host).
SERVING: frozenset[str] = frozenset({"Ready", "Processing", "Idle", "Sleeping", "Waking"})
_LOADING: frozenset[str] = frozenset({"Pending", "Loading"})


def _phase(desired: int, ready: int, replicas: Sequence[ObservedWorker]) -> PoolPhase:
    if ready and ready >= desired:
        return "Ready"
    if ready:
        return "Degraded"
    if any(r.state in _LOADING for r in replicas):
        return "Loading"
    if replicas and all(r.state == "Failed" for r in replicas):
        return "Failed"
    return "ScaledToZero" if desired == 0 else "Pending"


def _zero_message(pool: PoolView) -> str:
    """How a shared pool at zero comes back (the Ready condition's message)."""
    if pool.spec.replicas == 0 and not autoscaling_enabled(pool.spec):
        return "no host pod holds the model: spec.replicas is 0 and autoscaling is off"
    return (
        "no host pod holds the model; the gateway's next request places it on a host pod (the request "
        "waits while the model loads; set minReplicas to keep it placed)"
    )


def shared_status(
    pool: PoolView,
    replicas: Sequence[ObservedWorker],
    wait: HostWait | None,
    now: datetime,
    scale: SharedScale | None = None,
) -> ModelPoolStatus:
    """The status of a shared pool whose ModelHost exists (``shared_wire``): its replicas on host pods
    (``workers``, each named after its host pod), the phase as for dedicated workers, the condition Placed
    (True once as many host pods hold the model as its target asks; else False with ``wait``'s reason)
    and Ready (True while a replica serves; else why: failed, with the retry, loading, or at zero).
    ``scale``: the pass's count (``planner.shared_scale``; None: ``spec.replicas``, nothing more)."""
    desired = scale.target if scale is not None else pool.spec.replicas
    present = sorted((r for r in replicas if r.state not in ("Failed", "Dead")), key=lambda r: r.name)
    ready = sum(1 for r in replicas if r.state in SERVING)
    pods = ", ".join(r.name for r in present)
    placed: Setting
    serving: Setting
    if len(present) >= desired:
        placed = ("True", "Placed", f"on host pods {pods}" if pods else "its target is 0 replicas")
    elif wait is not None:
        placed = ("False", wait.reason, wait.message)
    else:
        placed = ("False", PLACEMENT_PENDING, f"{len(present)} of {desired} host pods hold the model")
    failed = next((r for r in replicas if r.state == "Failed"), None)
    if ready:
        serving = ("True", "Serving", f"{ready} of {desired} replicas serve")
    elif scale is not None and scale.failing_everywhere is not None:
        serving = ("False", FAILING_EVERYWHERE, scale.failing_everywhere)
    elif failed is not None:
        retry = f"; retrying in {scale.retry_in:.0f}s" if scale is not None and scale.retry_in else ""
        serving = ("False", "Failed", f"host pod {failed.name}: {failed.reason or 'the model failed'}{retry}")
    elif desired == 0 and not present:
        serving = ("False", "ScaledToZero", _zero_message(pool))
    elif present:
        serving = ("False", "Loading", f"the model is loading on host pods {pods}")
    else:
        serving = ("False", placed[1], placed[2])
    settings = {PLACED: placed, "Ready": serving}
    conditions = with_conditions(pool.status.conditions, settings, now=now, generation=pool.generation)
    workers = [
        WorkerStatus(
            name=r.name,
            state=r.state,
            node=r.node,
            memory=format_quantity(r.memory if r.state not in ("Failed", "Dead") else 0),
            queue_depth=r.queue_depth,
            last_request_time=rfc3339(r.last_request_time),
            reason=r.reason,
            host=r.name,
            device=r.device,
            since=rfc3339(r.since),
        )
        for r in sorted(replicas, key=lambda r: r.name)
    ]
    return ModelPoolStatus(
        phase=_phase(desired, ready, replicas),
        observed_generation=pool.generation,
        replicas=len(present),
        ready_replicas=ready,
        target_replicas=desired,
        spec_replicas=pool.spec.replicas if scale is not None else None,
        ready_text=f"{ready}/{desired}",
        workers=workers,
        # The budget charges the host pods (the ModelHost), not the pool: what each replica is charged on
        # its host's device until measured is its declared size.
        memory=MemoryStatus(declared=format_quantity(pool.spec.resources.memory_bytes)),
        conditions=conditions,
        backoff=scale.backoff if scale is not None else BackoffStatus(),
        autoscaling=scale.autoscaling if scale is not None else AutoscalingStatus(),
    )
