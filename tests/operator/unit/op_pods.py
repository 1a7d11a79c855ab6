"""Pod-dict builders for the operator's pure-function tests: every shape the kubelet or KWOK produces."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from modelpool_contract import labels as contract
from modelpool_contract.times import rfc3339

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
GI = 2**30


def at(seconds: float) -> datetime:
    """T0 plus ``seconds``."""
    return T0 + timedelta(seconds=seconds)


def running(started: float = 10) -> dict[str, Any]:
    return {"running": {"startedAt": rfc3339(at(started))}}


def waiting(reason: str, message: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"reason": reason}
    if message is not None:
        body["message"] = message
    return {"waiting": body}


def terminated(
    code: int, reason: str = "Error", message: str | None = None, finished: float = 20
) -> dict[str, Any]:
    body: dict[str, Any] = {"exitCode": code, "reason": reason, "finishedAt": rfc3339(at(finished))}
    if message is not None:
        body["message"] = message
    return {"terminated": body}


def pod(
    name: str = "w-0",
    *,
    pool: str = "p",
    namespace: str = "ns",
    phase: str = "Running",
    state: dict[str, Any] | None = None,
    last_state: dict[str, Any] | None = None,
    ready: bool = False,
    restarts: int = 0,
    node: str | None = "node-1",
    memory: int = 2 * GI,
    template_hash: str = "h1",
    created: float = 0,
    deleted: float | None = None,
    evicting: str | None = None,
    evicting_since: float | None = None,
    conditions: list[dict[str, Any]] | None = None,
    pod_reason: str | None = None,
    pod_message: str | None = None,
    serving: bool = True,
    container_statuses: bool = True,
) -> dict[str, Any]:
    """A worker pod as the API returns it (only the fields the operator reads)."""
    annotations = {contract.ANNOTATION_MEMORY: str(memory)}
    if evicting is not None:
        annotations[contract.ANNOTATION_EVICTING] = evicting
        annotations[contract.ANNOTATION_EVICTING_SINCE] = rfc3339(at(evicting_since or 0)) or ""
    labels = {
        contract.LABEL_POOL: pool,
        contract.LABEL_WORKER: name,
        contract.LABEL_TEMPLATE_HASH: template_hash,
    }
    if serving:
        labels[contract.LABEL_SERVING] = "true"
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "labels": labels,
        "annotations": annotations,
        "creationTimestamp": rfc3339(at(created)),
    }
    if deleted is not None:
        meta["deletionTimestamp"] = rfc3339(at(deleted))
    status: dict[str, Any] = {"phase": phase}
    if conditions is not None:
        status["conditions"] = conditions
    elif phase == "Running":
        status["conditions"] = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": rfc3339(at(30))},
        ]
    if pod_reason is not None:
        status["reason"] = pod_reason
    if pod_message is not None:
        status["message"] = pod_message
    if container_statuses:
        cs: dict[str, Any] = {
            "name": "server",
            "ready": ready,
            "restartCount": restarts,
            "state": state
            if state is not None
            else (running() if phase == "Running" else waiting("ContainerCreating")),
        }
        if last_state is not None:
            cs["lastState"] = last_state
        status["containerStatuses"] = [cs]
    spec: dict[str, Any] = {
        "containers": [{"name": "server", "resources": {"limits": {"memory": str(memory)}}}]
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def stats(
    state: str, *, since: float = 40, last_request: float | None = None, **extra: Any
) -> dict[str, Any]:
    """A server ``/stats`` body (``modelpool_contract.stats.WorkerStats`` fields; docs/design.md)."""
    body: dict[str, Any] = {
        "state": state,
        "state_since": at(since).timestamp(),
        "queue_depth": 0,
        "queue_capacity": 100,
        "in_flight": 0,
        "last_request_time": at(last_request).timestamp() if last_request is not None else None,
        "requests_total": 0,
        "rejected_total": 0,
        "errors_total": 0,
        "load_error": None,
        "load_progress": None,
        "memory": {"rss_bytes": 1, "gpu_allocated_bytes": 0, "gpu_reserved_bytes": 0},
        "model": {"name": "p", "task": "text-embedding", "source": "/models/x"},
    }
    body.update(extra)
    return body
