"""Worker lifecycle: one pure function from a pod (a plain dict) and its last ``/stats`` to a state.

``observe_worker`` is the only place that decides which of the eight states a worker is in, with a
reason a user can act on.  It covers every pod shape the kubelet (or KWOK's chaos stages) can produce:

* Pending: not started yet (scheduling, image pull, container creation); reason Unschedulable once the
  scheduler has failed to place it for longer than ``unschedulable_timeout_s``.
* Loading / Ready / Processing / Idle: the server's own state from ``/stats`` (one writer per fact);
  without stats, the container's readiness decides between Loading and Ready.
* Evicting: the pod is being deleted, or the operator annotated it for eviction, or the server drains.
* Dead: the pod is gone or its server exited cleanly.
* Failed: LoadFailed (exit code 3, the termination message), OOMKilled, CrashLoopBackOff,
  ImagePullBackOff/ErrImagePull, other non-zero exits, kubelet eviction, Unresponsive (only when the
  node/kubelet says so).

An unreachable ``/stats`` (``stats is None``) never makes a worker Failed: liveness is the kubelet's call,
and KWOK pods have no server behind their IP.  A Failed or Dead worker is charged no memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelpool_operator.api import WorkerState, WorkerStatus
from modelpool_operator.quantity import QuantityError, format_quantity, parse_quantity

# Labels and annotations the operator owns (DESIGN: one prefix).
LABEL_POOL = "modelpool.dev/pool"
LABEL_WORKER = "modelpool.dev/worker"
LABEL_TEMPLATE_HASH = "modelpool.dev/template-hash"
LABEL_SERVING = "modelpool.dev/serving"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
# Memory (bytes) this worker is charged; written by the pod builder so the ledger need not parse specs.
ANNOTATION_MEMORY = "modelpool.dev/memory-bytes"
# Set by the operator when it decides to evict a worker: the value is the reason (IdleTimeout, ...).
ANNOTATION_EVICTING = "modelpool.dev/evicting"
# When the eviction was decided (RFC 3339), so the drain grace can be measured across passes/restarts.
ANNOTATION_EVICTING_SINCE = "modelpool.dev/evicting-since"

SERVER_CONTAINER = "server"
# The server's exit code for a load failure (its reason is in the termination message).
EXIT_LOAD_FAILED = 3

# Waiting reasons that mean the container will not start without someone changing something.
_FAILED_WAITING = {
    "CrashLoopBackOff": "CrashLoopBackOff",
    "ImagePullBackOff": "ImagePullBackOff",
    "ErrImagePull": "ImagePullBackOff",
    "ErrImageNeverPull": "ImagePullBackOff",
    "InvalidImageName": "InvalidImageName",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerError",
    "RunContainerError": "RunContainerError",
}
# Pod/condition reasons by which the node lifecycle controller says the kubelet stopped answering.
_UNRESPONSIVE_REASONS = {"NodeLost", "NodeNotReady", "Unreachable"}
# Server (/stats) states the operator understands, case-insensitively.
_STATS_STATES: dict[str, WorkerState] = {s.lower(): s for s in ("Loading", "Ready", "Processing", "Idle")}
_STATS_STATES.update({"evicting": "Evicting", "draining": "Evicting", "failed": "Failed"})
_MESSAGE_LIMIT = 1024


@dataclass(frozen=True)
class LifecycleSettings:
    """Tunables of the state decision (the operator maps its configuration onto this)."""

    # A pod the scheduler cannot place for this long is reported with reason Unschedulable.
    unschedulable_timeout_s: float = 120.0


@dataclass(frozen=True)
class ObservedWorker:
    """A worker as observed in one pass: its state and everything the planner and status need."""

    name: str
    namespace: str
    pool: str
    state: WorkerState
    reason: str | None = None
    message: str | None = None
    since: datetime | None = None
    node: str | None = None
    # Bytes charged against the budget now (0 when Failed/Dead); ``requested`` is what it would be.
    memory: int = 0
    requested_memory: int = 0
    queue_depth: int | None = None
    in_flight: int | None = None
    last_request_time: datetime | None = None
    restarts: int = 0
    load_progress: float | None = None
    template_hash: str | None = None
    # Carries the serving label (the pool's Service routes to it when ready).
    serving: bool = True
    # The operator's eviction annotation (reason), and when it was set.
    evicting_reason: str | None = None
    evicting_since: datetime | None = None
    deleting: bool = False
    created: datetime | None = None
    stats_known: bool = False
    uid: str | None = None
    # When the pod's Ready condition last became True (None while not ready).
    ready_since: datetime | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, pod name)."""
        return (self.namespace, self.name)

    @property
    def pool_key(self) -> tuple[str, str]:
        """(namespace, pool name)."""
        return (self.namespace, self.pool)

    @property
    def active(self) -> bool:
        """Counts towards the pool's workers: exists, not failed, not on its way out."""
        return self.state in ("Pending", "Loading", "Ready", "Processing", "Idle")

    @property
    def serving_state(self) -> bool:
        """Can answer requests (Ready, Processing, Idle)."""
        return self.state in ("Ready", "Processing", "Idle")

    @property
    def evictable(self) -> bool:
        """May be chosen for eviction: never Loading or Processing (their work would be lost)."""
        return self.state in ("Ready", "Idle") and not (self.in_flight or 0) and not (self.queue_depth or 0)

    def idle_since(self) -> datetime | None:
        """Since when the worker has been able to serve but got no request: the later of its last request
        and the moment its pod became ready (a worker that never served is idle from when it became
        ready, not from its creation, which would count the model load as idle time).  Without either,
        the state's ``since`` (conservative: the clock restarts, never an early eviction)."""
        known = [t for t in (self.last_request_time, self.ready_since) if t is not None]
        return max(known) if known else (self.since or self.created)

    def to_status(self) -> WorkerStatus:
        """The ``status.workers[]`` entry."""
        return WorkerStatus(
            name=self.name,
            state=self.state,
            since=rfc3339(self.since),
            node=self.node,
            memory=format_quantity(self.memory),
            queue_depth=self.queue_depth,
            last_request_time=rfc3339(self.last_request_time),
            restarts=self.restarts,
            reason=self.reason,
            message=self.message,
            load_progress=self.load_progress,
            template_hash=self.template_hash,
        )


# ---- time helpers --------------------------------------------------------------------------------------


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 string, an epoch number, or a datetime, as an aware UTC datetime (None if unparseable)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        try:
            return datetime.fromtimestamp(float(value), tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and value:
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            try:
                return datetime.fromtimestamp(float(text), tz=UTC)
            except (OverflowError, OSError, ValueError):
                return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def rfc3339(value: datetime | None) -> str | None:
    """A datetime as ``2026-01-02T03:04:05Z`` (seconds precision, UTC), the way Kubernetes writes times."""
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the decision --------------------------------------------------------------------------------------


def _server_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == SERVER_CONTAINER:
            return dict(status)
    return dict(statuses[0]) if statuses else {}


def requested_memory(pod: Mapping[str, Any]) -> int:
    """Bytes the worker is charged while it holds memory: the builder's annotation, else the server
    container's memory limit (or request)."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(ANNOTATION_MEMORY)
    if raw is not None:
        try:
            return parse_quantity(str(raw))
        except QuantityError:
            pass
    containers = (pod.get("spec") or {}).get("containers") or []
    chosen = next((c for c in containers if c.get("name") == SERVER_CONTAINER), None)
    if chosen is None and containers:
        chosen = containers[0]
    resources = (chosen or {}).get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get("memory")
        if value is not None:
            try:
                return parse_quantity(value)
            except QuantityError:
                continue
    return 0


def _clip(message: Any) -> str | None:
    if message is None:
        return None
    text = str(message).strip()
    if not text:
        return None
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 1] + "…"


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _terminated_failure(terminated: Mapping[str, Any]) -> tuple[str, str | None]:
    """(reason, message) for a container that terminated with a failure."""
    code = _int_or_none(terminated.get("exitCode"))
    kubelet_reason = terminated.get("reason") or ""
    message = _clip(terminated.get("message"))
    if kubelet_reason == "OOMKilled":
        return (
            "OOMKilled",
            message or f"the server was killed for exceeding its memory limit (exit code {code})",
        )
    if code == EXIT_LOAD_FAILED:
        return "LoadFailed", message or "the model failed to load (exit code 3); see the worker's logs"
    if kubelet_reason in ("ContainerCannotRun", "StartError"):
        return kubelet_reason, message or f"the container could not start (exit code {code})"
    detail = f"exit code {code}" + (f" ({kubelet_reason})" if kubelet_reason else "")
    return "Error", f"{detail}: {message}" if message else f"the server exited with {detail}"


def _stats_state(stats: Mapping[str, Any]) -> WorkerState | None:
    raw = stats.get("state")
    return _STATS_STATES.get(raw.lower()) if isinstance(raw, str) else None


def observe_worker(
    pod: Mapping[str, Any],
    stats: Mapping[str, Any] | None,
    now: datetime,
    settings: LifecycleSettings | None = None,
) -> ObservedWorker:
    """The worker behind ``pod`` as of ``now``.

    ``pod`` is the Pod as a plain dict (API JSON, camelCase); ``stats`` the worker's last ``/stats`` JSON,
    or None when unknown (never scraped, unreachable, KWOK).  Pure: no I/O, no clock.
    """
    settings = settings or LifecycleSettings()
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = pod.get("status") or {}
    container = _server_container(pod)
    state_info = container.get("state") or {}
    last_state = container.get("lastState") or {}
    stats = stats if isinstance(stats, Mapping) else None

    name = str(meta.get("name") or "")
    created = parse_time(meta.get("creationTimestamp"))
    deletion = parse_time(meta.get("deletionTimestamp"))
    requested = requested_memory(pod)
    evicting_reason = annotations.get(ANNOTATION_EVICTING) or None
    evicting_since = parse_time(annotations.get(ANNOTATION_EVICTING_SINCE))

    base: dict[str, Any] = {
        "name": name,
        "namespace": str(meta.get("namespace") or ""),
        "pool": str(labels.get(LABEL_POOL) or ""),
        "node": (pod.get("spec") or {}).get("nodeName") or None,
        "requested_memory": requested,
        "restarts": _int_or_none(container.get("restartCount")) or 0,
        "template_hash": labels.get(LABEL_TEMPLATE_HASH),
        "serving": str(labels.get(LABEL_SERVING, "")).lower() == "true",
        "evicting_reason": evicting_reason,
        "evicting_since": evicting_since,
        "deleting": deletion is not None,
        "created": created,
        "stats_known": stats is not None,
        "uid": meta.get("uid"),
    }
    ready_cond = _condition(pod, "Ready")
    if ready_cond is not None and ready_cond.get("status") == "True":
        base["ready_since"] = parse_time(ready_cond.get("lastTransitionTime"))
    if stats is not None:
        base["queue_depth"] = _int_or_none(stats.get("queue_depth"))
        base["in_flight"] = _int_or_none(stats.get("in_flight"))
        base["last_request_time"] = parse_time(stats.get("last_request_time"))

    def result(
        state: WorkerState, reason: str | None, message: str | None, since: datetime | None
    ) -> ObservedWorker:
        charged = 0 if state in ("Failed", "Dead") else requested
        progress = None
        if state == "Loading" and stats is not None:
            raw = stats.get("load_progress")
            if isinstance(raw, int | float) and not isinstance(raw, bool):
                progress = min(1.0, max(0.0, float(raw)))
        return ObservedWorker(
            state=state,
            reason=reason,
            message=_clip(message),
            since=since,
            memory=charged,
            load_progress=progress,
            **base,
        )

    phase = status.get("phase") or "Pending"
    terminated = state_info.get("terminated")
    waiting = state_info.get("waiting")
    running = state_info.get("running")

    # 1. The pod is on its way out (deleted) or already finished cleanly.
    if deletion is not None:
        if terminated is not None or phase in ("Succeeded", "Failed"):
            return result("Dead", "Deleted", "the worker pod is being removed", deletion)
        return result("Evicting", evicting_reason or "Deleting", "the worker pod is being deleted", deletion)
    if phase == "Succeeded" or (terminated is not None and _int_or_none(terminated.get("exitCode")) == 0):
        finished = parse_time((terminated or {}).get("finishedAt")) or now
        return result("Dead", "Completed", "the server exited cleanly", finished)

    # 2. Failures the kubelet reports.
    if terminated is not None:
        reason, message = _terminated_failure(terminated)
        return result("Failed", reason, message, parse_time(terminated.get("finishedAt")) or now)
    if waiting is not None and waiting.get("reason") in _FAILED_WAITING:
        reason = _FAILED_WAITING[str(waiting["reason"])]
        message = _clip(waiting.get("message"))
        previous = last_state.get("terminated")
        if reason == "CrashLoopBackOff" and previous is not None:
            prev_reason, prev_message = _terminated_failure(previous)
            message = f"{prev_reason}: {prev_message}" if prev_message else prev_reason
        return result("Failed", reason, message, parse_time(previous and previous.get("finishedAt")) or now)
    if phase == "Failed":
        pod_reason = status.get("reason") or "Failed"
        if pod_reason in _UNRESPONSIVE_REASONS:
            pod_reason = "Unresponsive"
        return result("Failed", pod_reason, status.get("message") or "the pod failed", now)
    if (
        phase == "Running"
        and ready_cond is not None
        and ready_cond.get("status") != "True"
        and (
            ready_cond.get("reason") in _UNRESPONSIVE_REASONS or status.get("reason") in _UNRESPONSIVE_REASONS
        )
    ):
        return result(
            "Failed",
            "Unresponsive",
            ready_cond.get("message") or "the node stopped reporting the worker's status",
            parse_time(ready_cond.get("lastTransitionTime")) or now,
        )

    # 3. Not started yet.
    if phase == "Pending" or running is None:
        scheduled = _condition(pod, "PodScheduled")
        if scheduled is not None and scheduled.get("status") == "False":
            waited = (now - created).total_seconds() if created else 0.0
            if scheduled.get("reason") == "Unschedulable" and waited >= settings.unschedulable_timeout_s:
                return result("Pending", "Unschedulable", scheduled.get("message"), created)
            return result("Pending", "Scheduling", scheduled.get("message"), created)
        if waiting is not None:
            return result(
                "Pending", waiting.get("reason") or "ContainerCreating", waiting.get("message"), created
            )
        return result("Pending", "Scheduled" if base["node"] else "Scheduling", None, created)

    started = parse_time(running.get("startedAt")) or created

    # 4. The operator is evicting it (stop routing, let it drain).
    if evicting_reason is not None:
        return result(
            "Evicting", evicting_reason, "the operator is draining this worker", evicting_since or now
        )

    # 5. Running: the server's own state when known (one writer per fact), else the container's readiness.
    if stats is not None:
        server_state = _stats_state(stats)
        since = parse_time(stats.get("state_since"))
        if server_state == "Failed":
            return result(
                "Failed",
                "LoadFailed" if stats.get("load_error") else "ServerFailed",
                stats.get("load_error") or "the server reports Failed",
                since or now,
            )
        if server_state == "Evicting":
            return result("Evicting", "Draining", "the server is draining", since or now)
        if server_state == "Loading":
            return result("Loading", "LoadingModel", None, since or started)
        if server_state is not None:
            return result(server_state, None, None, since or started)
    if container.get("ready") is True or (ready_cond is not None and ready_cond.get("status") == "True"):
        since = parse_time(ready_cond.get("lastTransitionTime")) if ready_cond else None
        return result("Ready", None, None, since or started)
    return result("Loading", "Starting", None, started)


def pod_json(pod: Mapping[str, Any]) -> str:
    """A compact rendering for logs and test failure messages."""
    return json.dumps(pod, sort_keys=True, default=str)[:2000]
