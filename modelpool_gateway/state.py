"""Pure views of the API objects the gateway watches: a worker pod as an endpoint, a ModelPool as a pool.

``worker_from_pod`` and ``pool_from_object`` take the plain JSON dicts the API server sends and keep only
what routing, holding and explaining need, so the cache holds small frozen objects, not whole pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from modelpool_gateway.contract_names import (
    ANNOTATION_DEMANDED_AT,
    CONDITION_BUDGET_EXCEEDED,
    CONDITION_DEGRADED,
    DEFAULT_ACTIVATION_TIMEOUT_SECONDS,
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    DEFAULT_REPLICAS,
    DEFAULT_SERVER_PORT,
    HTTP_PORT_NAME,
    LABEL_POOL,
    LABEL_SERVING,
    SERVER_CONTAINER,
)

# (namespace, name) of a pool or a pod.
Key = tuple[str, str]


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp (as the API server and the operator write them), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def rfc3339(moment: datetime) -> str:
    """UTC, second precision, ``Z`` suffix: the form Kubernetes uses."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
class WorkerState:
    """A worker as the operator last reported it in the pool's status."""

    name: str
    state: str
    since: datetime | None = None
    queue_depth: int | None = None
    reason: str | None = None
    message: str | None = None
    load_progress: float | None = None


@dataclass(frozen=True)
class Pool:
    """A ModelPool: the names it answers to, its hold bound, and what its status says about workers."""

    namespace: str
    name: str
    served_model_name: str | None = None
    task: str | None = None
    activation_timeout_s: float = float(DEFAULT_ACTIVATION_TIMEOUT_SECONDS)
    created: datetime | None = None
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

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


def _container_port(spec: Mapping[str, Any]) -> int:
    containers = spec.get("containers") or []
    ordered = sorted(containers, key=lambda c: c.get("name") != SERVER_CONTAINER)
    for container in ordered:
        ports = container.get("ports") or []
        for port in sorted(ports, key=lambda p: p.get("name") != HTTP_PORT_NAME):
            number = port.get("containerPort")
            if isinstance(number, int) and 0 < number < 65536:
                return number
    return DEFAULT_SERVER_PORT


def _pod_ready(status: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def worker_from_pod(pod: Mapping[str, Any]) -> Worker | None:
    """The worker a pod is, or None for a pod without the pool label."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    pool = labels.get(LABEL_POOL)
    if not pool:
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


def _true_condition(status: Mapping[str, Any], kind: str) -> str | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return str(cond.get("message") or cond.get("reason") or kind)
    return None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _worker_state(entry: Mapping[str, Any]) -> WorkerState:
    progress = entry.get("loadProgress")
    return WorkerState(
        name=str(entry.get("name") or ""),
        state=str(entry.get("state") or ""),
        since=parse_time(entry.get("since")),
        queue_depth=_int_or_none(entry.get("queueDepth")),
        reason=entry.get("reason") or None,
        message=entry.get("message") or None,
        load_progress=float(progress) if isinstance(progress, int | float) else None,
    )


def _activation_timeout(spec: Mapping[str, Any]) -> float:
    value = spec.get("activationTimeoutSeconds")
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return float(DEFAULT_ACTIVATION_TIMEOUT_SECONDS)


def _int(spec: Mapping[str, Any], name: str, default: int) -> int:
    value = spec.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def wakes_on_demand(spec: Mapping[str, Any]) -> bool:
    """The operator's rule (``planner.autoscale``): a pool at zero gets a worker for fresh demand when its
    ceiling, maxReplicas while autoscaling (on by default when maxReplicas > minReplicas) and spec.replicas
    otherwise, is at least one."""
    replicas = _int(spec, "replicas", DEFAULT_REPLICAS)
    low, high = (
        _int(spec, "minReplicas", DEFAULT_MIN_REPLICAS),
        _int(spec, "maxReplicas", DEFAULT_MAX_REPLICAS),
    )
    enabled = (spec.get("autoscaling") or {}).get("enabled")
    autoscaling = high > low if not isinstance(enabled, bool) else enabled
    return (high if autoscaling else replicas) >= 1


def pool_from_object(obj: Mapping[str, Any]) -> Pool:
    """The pool view of a ModelPool object (spec and status as the API server stores them)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    workers = tuple(_worker_state(w) for w in status.get("workers") or [] if isinstance(w, Mapping))
    served = spec.get("servedModelName")
    return Pool(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        served_model_name=str(served) if served else None,
        task=(spec.get("model") or {}).get("task"),
        activation_timeout_s=_activation_timeout(spec),
        created=parse_time(meta.get("creationTimestamp")),
        demanded_at=parse_time((meta.get("annotations") or {}).get(ANNOTATION_DEMANDED_AT)),
        phase=status.get("phase") or None,
        workers=workers,
        budget_exceeded=_true_condition(status, CONDITION_BUDGET_EXCEEDED),
        degraded=_true_condition(status, CONDITION_DEGRADED),
        backoff_until=parse_time((status.get("backoff") or {}).get("nextAttemptAfter")),
        queue_depths={w.name: w.queue_depth for w in workers if w.queue_depth is not None},
        wakes_on_demand=wakes_on_demand(spec),
    )
