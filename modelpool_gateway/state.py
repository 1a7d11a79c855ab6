"""Pure views of the API objects the gateway watches: a worker pod as an endpoint, a shared host's pod with
the models placed on it, a ModelPool as a pool.

``worker_from_pod`` and ``pool_from_object`` take the plain JSON dicts the API server sends and keep only
what routing, holding and explaining need, so the cache holds small frozen objects, not whole pods.  A
pool's spec and status are read with the operator's own pydantic models (``modelpool_contract.api``), so
the gateway's idea of a pool (its alias, its hold time, whether the operator wakes it) cannot drift from
the operator's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from modelpool_contract.api import (
    DEFAULT_ACTIVATION_TIMEOUT_SECONDS,
    ModelPoolStatus,
    WorkerStatus,
    parse_pool_spec,
    parse_pool_status,
    replica_ceiling,
)
from modelpool_contract.flags import WORKER_PORT
from modelpool_contract.labels import HTTP_PORT_NAME, LABEL_POOL, LABEL_SERVING, SERVER_CONTAINER
from modelpool_contract.placements import LABEL_HOST, host_model_name, read_models
from modelpool_contract.times import parse_time

# Pool status conditions the gateway explains a held request with (``api.ConditionType``).
CONDITION_BUDGET_EXCEEDED = "BudgetExceeded"
CONDITION_DEGRADED = "Degraded"

# (namespace, name) of a pool or a pod.
Key = tuple[str, str]


@dataclass(frozen=True)
class Worker:
    """One worker pod as an upstream: where it listens and whether the gateway may route to it."""

    namespace: str
    name: str
    pool: str
    ip: str | None
    port: int
    serving: bool
    ready: bool
    deleting: bool

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def pool_key(self) -> Key:
        return (self.namespace, self.pool)

    @property
    def routable(self) -> bool:
        """Marked serving by the operator, Ready by the kubelet, with an address, and not going away."""
        return self.serving and self.ready and bool(self.ip) and not self.deleting

    @property
    def base_url(self) -> str:
        host = f"[{self.ip}]" if self.ip and ":" in self.ip else str(self.ip)
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class HostPod:
    """One pod of a shared host (``modelpool.dev/host``): where it listens, whether it can take requests,
    and the pools placed on it with their models' states (``modelpool_contract.placements``)."""

    namespace: str
    name: str
    host: str
    ip: str | None
    port: int
    ready: bool
    deleting: bool
    models: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def reachable(self) -> bool:
        """Ready by the kubelet, with an address, and not going away."""
        return self.ready and bool(self.ip) and not self.deleting

    def upstream(self, pool: str) -> Worker:
        """The pod as the upstream of one of its pools (the picker's load is per pod: ``Worker.key``)."""
        return Worker(
            self.namespace, self.name, pool, self.ip, self.port, serving=True, ready=self.ready,
            deleting=self.deleting,
        )  # fmt: skip


@dataclass(frozen=True)
class WorkerState:
    """A worker as the operator last reported it in the pool's status."""

    name: str
    state: str
    since: datetime | None = None
    queue_depth: int | None = None
    reason: str | None = None
    message: str | None = None
    load_progress: float | None = None
    # The LoRA adapters it holds in memory (its /stats, through the pool's status).
    adapters: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Pool:
    """A ModelPool: the names it answers to, its hold bound, and what its status says about workers."""

    namespace: str
    name: str
    served_model_name: str | None = None
    task: str | None = None
    activation_timeout_s: float = float(DEFAULT_ACTIVATION_TIMEOUT_SECONDS)
    created: datetime | None = None
    # The pool object's uid: the demand Lease is owned by it (deleted with the pool).
    uid: str | None = None
    # When a gateway last recorded demand, as this gateway last read or wrote it (the demand Lease).
    demanded_at: datetime | None = None
    phase: str | None = None
    workers: tuple[WorkerState, ...] = ()
    # The message of a condition that is True (None while False or absent).
    budget_exceeded: str | None = None
    degraded: str | None = None
    backoff_until: datetime | None = None
    queue_depths: Mapping[str, int] = field(default_factory=dict)
    # Whether the operator starts a worker for recorded demand when the pool is at zero: its ceiling
    # (maxReplicas while autoscaling, else spec.replicas) is at least one.
    wakes_on_demand: bool = True
    # Why the spec does not parse (None: it does); such a pool is routed to by name only and never held.
    invalid: str | None = None
    # A shared pool's ModelHost (spec.host): its model is served by that host's pods that hold it, under
    # ``model_name``; None: dedicated workers.
    host: str | None = None
    # Requests each worker takes before it answers 429 (spec.queue.capacity; None: unknown, never queued
    # by the gateway's fair queue, ``fairness``).
    queue_capacity: int | None = None
    # The pool's LoRA adapters (spec.adapters): names a request's model may take to reach this pool.
    adapters: tuple[str, ...] = ()

    @property
    def model_name(self) -> str:
        """The name a request carries upstream: a worker knows its pool's name, a host the model's name
        there (``placements.host_model_name``)."""
        return host_model_name(self.name) if self.host else self.name

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    def holders(self, adapter: str) -> frozenset[str]:
        """The names of the workers that hold ``adapter`` in memory, as the status last said."""
        return frozenset(w.name for w in self.workers if adapter in w.adapters)


def _container_port(spec: Mapping[str, Any]) -> int:
    containers = spec.get("containers") or []
    ordered = sorted(containers, key=lambda c: c.get("name") != SERVER_CONTAINER)
    for container in ordered:
        ports = container.get("ports") or []
        for port in sorted(ports, key=lambda p: p.get("name") != HTTP_PORT_NAME):
            number = port.get("containerPort")
            if isinstance(number, int) and 0 < number < 65536:
                return number
    return WORKER_PORT  # the operator's worker port when a pod names none


def _pod_ready(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def worker_from_pod(pod: Mapping[str, Any]) -> Worker | None:
    """The worker a pod is, or None for a pod without the pool label or a shared host's pod (which the
    operator labels with a pool of its own, ``host_<name>``, to charge it to the budget; the host-pod watch
    routes to it)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    pool = labels.get(LABEL_POOL)
    if not pool or LABEL_HOST in labels:
        return None
    status = pod.get("status") or {}
    return Worker(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        pool=str(pool),
        ip=status.get("podIP") or None,
        port=_container_port(pod.get("spec") or {}),
        serving=labels.get(LABEL_SERVING) == "true",
        ready=_pod_ready(status),
        deleting=bool(meta.get("deletionTimestamp")),
    )


def host_pod_from_pod(pod: Mapping[str, Any]) -> HostPod | None:
    """The host pod a pod is, or None for a pod without the host label."""
    meta = pod.get("metadata") or {}
    host = (meta.get("labels") or {}).get(LABEL_HOST)
    if not host:
        return None
    status = pod.get("status") or {}
    return HostPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        host=str(host),
        ip=status.get("podIP") or None,
        port=_container_port(pod.get("spec") or {}),
        ready=_pod_ready(status),
        deleting=bool(meta.get("deletionTimestamp")),
        models=read_models(meta.get("annotations")),
    )


def _true_condition(status: ModelPoolStatus, kind: str) -> str | None:
    for cond in status.conditions:
        if cond.type == kind and cond.status == "True":
            return cond.message or cond.reason or kind
    return None


def _worker_state(entry: WorkerStatus) -> WorkerState:
    return WorkerState(
        name=entry.name,
        state=entry.state,
        since=parse_time(entry.since),
        queue_depth=entry.queue_depth,
        reason=entry.reason or None,
        message=entry.message or None,
        load_progress=entry.load_progress,
        adapters=frozenset(entry.adapters or ()),
    )


def spec_error(exc: ValidationError) -> str:
    """The first thing wrong with a spec, as ``spec.field.path: message`` (pydantic's locations in camelCase,
    the names ``kubectl explain`` shows)."""
    errors = exc.errors()
    if not errors:
        return str(exc)[:300]
    first = errors[0]
    path = ".".join(str(part) for part in ("spec", *first.get("loc", ())))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{path}: {first.get('msg', 'invalid')}{more}"


def pool_from_object(obj: Mapping[str, Any]) -> Pool:
    """The pool view of a ModelPool object, read with the operator's own models (``modelpool_contract.api``).

    A spec those models refuse (the CRD should have: an old CRD, or a pool stored before a validation was
    added) never fails the watch: the pool is kept under its name, with ``invalid`` saying why, no alias, no
    hold time and no wake on demand (the operator starts no worker for it, and leaves the ones it has:
    requests still go to its serving workers)."""
    meta = obj.get("metadata") or {}
    status = parse_pool_status(obj.get("status"))
    workers = tuple(_worker_state(w) for w in status.workers)
    common: dict[str, Any] = {
        "namespace": str(meta.get("namespace") or ""),
        "name": str(meta.get("name") or ""),
        "uid": str(meta["uid"]) if meta.get("uid") else None,
        "created": parse_time(meta.get("creationTimestamp")),
        "phase": status.phase,
        "workers": workers,
        "budget_exceeded": _true_condition(status, CONDITION_BUDGET_EXCEEDED),
        "degraded": _true_condition(status, CONDITION_DEGRADED),
        "backoff_until": parse_time(status.backoff.next_attempt_after),
        "queue_depths": {w.name: w.queue_depth for w in workers if w.queue_depth is not None},
    }
    try:
        spec = parse_pool_spec(obj.get("spec") or {})
    except ValidationError as exc:
        return Pool(**common, activation_timeout_s=0.0, wakes_on_demand=False, invalid=spec_error(exc))
    return Pool(
        **common,
        served_model_name=spec.served_model_name,
        task=spec.model.task,
        activation_timeout_s=float(spec.activation_timeout_seconds),
        wakes_on_demand=replica_ceiling(spec) >= 1,
        host=spec.host,
        queue_capacity=spec.queue.capacity,
        adapters=tuple(a.name for a in spec.adapters),
    )
