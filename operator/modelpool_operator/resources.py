"""Pure builders of the objects the operator creates: worker Pods and the pool's Service.

No API calls here: the handlers build, adopt and create.  Everything a worker pod carries is derived
from the ModelPool body (metadata + spec) and ``PodSettings``, so the same spec always builds the same
pod, and ``template_hash`` tells when a spec change needs a roll-over.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from modelpool_operator.api import API_VERSION, MODELPOOL_KIND, ModelPoolSpec, parse_pool_spec
from modelpool_operator.lifecycle import (
    ANNOTATION_EVICTING,
    ANNOTATION_EVICTING_SINCE,
    ANNOTATION_MEMORY,
    LABEL_MANAGED_BY,
    LABEL_POOL,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    LABEL_WORKER,
    SERVER_CONTAINER,
    rfc3339,
)

MANAGED_BY = "modelpool-operator"
HTTP_PORT_NAME = "http"
TERMINATION_LOG = "/dev/termination-log"
# Spec fields that shape the pod; replicas/min/max/priority do not (changing them never rolls workers).
_TEMPLATE_FIELDS = ("model", "resources", "queue", "idle_timeout_seconds", "image", "pod_template")
# The server's own Idle threshold when the pool disables idle eviction (it still reports Idle).
_DEFAULT_IDLE_AFTER_S = 300


@dataclass(frozen=True)
class PodSettings:
    """Operator-wide defaults of worker pods (mapped from the operator's configuration)."""

    default_image: str = "ghcr.io/modelpool/modelpool-server:0.1.0"
    port: int = 8000
    # The server drains queued work for up to this long after SIGTERM; the kubelet waits a bit longer.
    drain_timeout_s: int = 30
    # startupProbe: period x failureThreshold bounds the model load (10 s x 180 = 30 min for big models).
    startup_period_s: int = 10
    startup_failure_threshold: int = 180
    image_pull_policy: str = "IfNotPresent"
    # Cache directory for hf:// downloads, inside an emptyDir (the root filesystem may be read-only).
    hf_home: str = "/cache/huggingface"


def template_hash(spec: ModelPoolSpec | Mapping[str, Any]) -> str:
    """A short, stable hash of the spec fields that shape a worker pod."""
    model = spec if isinstance(spec, ModelPoolSpec) else parse_pool_spec(spec)
    shaping = {name: getattr(model, name) for name in _TEMPLATE_FIELDS}
    payload = {
        key: value.model_dump(mode="json", by_alias=True) if hasattr(value, "model_dump") else value
        for key, value in shaping.items()
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return digest[:10]


def worker_selector(pool_name: str) -> dict[str, str]:
    """Labels every worker of the pool carries."""
    return {LABEL_POOL: pool_name}


def worker_name(pool_name: str, thash: str, index: int) -> str:
    """A deterministic worker name: ``<pool>-<hash5>-<index>`` (≤ 63 chars, so it fits a label value).

    Deterministic names make a create idempotent: an operator restarted in the middle of a scale-up gets
    409 AlreadyExists instead of a duplicate worker.
    """
    return f"{pool_name[:45].rstrip('-')}-{thash[:5]}-{index}"


def _source_args(spec: ModelPoolSpec) -> list[str]:
    source = spec.model.source
    if spec.model.revision and source.startswith("hf://"):
        source = source.split("@", 1)[0] + "@" + spec.model.revision
    return ["--model", source]


def server_args(pool_name: str, spec: ModelPoolSpec, settings: PodSettings) -> list[str]:
    """The ``modelpool-server`` command-line arguments for this pool."""
    idle_after = spec.idle_timeout_seconds or _DEFAULT_IDLE_AFTER_S
    args = [
        *_source_args(spec),
        "--task", spec.model.task,
        "--name", pool_name,
        "--port", str(settings.port),
        "--queue-capacity", str(spec.queue.capacity),
        "--max-batch-size", str(spec.queue.max_batch_size),
        "--max-batch-delay-ms", str(spec.queue.max_batch_delay_ms),
        "--request-timeout", _number(spec.queue.request_timeout_seconds),
        "--idle-after", str(idle_after),
        "--drain-timeout", str(settings.drain_timeout_s),
        "--device", "auto",
        "--dtype", spec.model.dtype,
    ]  # fmt: skip
    # No --host and no --termination-log: the server's defaults (0.0.0.0, /dev/termination-log, which is
    # the container's terminationMessagePath) are right in a pod, and leaving them to MODELPOOL_HOST /
    # MODELPOOL_TERMINATION_LOG lets a node that runs workers as plain processes give each its own.
    if spec.model.trust_remote_code:
        args.append("--trust-remote-code")
    return args


def _http_get(path: str) -> dict[str, Any]:
    return {"path": path, "port": HTTP_PORT_NAME}


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _volumes(spec: ModelPoolSpec, settings: PodSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [{"name": "cache", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [
        {"name": "cache", "mountPath": settings.hf_home.rsplit("/", 1)[0] or "/cache"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    source = spec.model.source
    if source.startswith("pvc://"):
        claim = source[len("pvc://") :].split("/", 1)[0]
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        # The server resolves pvc://claim/sub/path under /models/<claim>.
        mounts.append({"name": "model", "mountPath": f"/models/{claim}", "readOnly": True})
    return volumes, mounts


def build_worker_pod(
    pool: Mapping[str, Any],
    worker_name: str,
    template_hash: str,
    settings: PodSettings | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The worker Pod for ``pool`` (the ModelPool body: metadata + spec), as an API dict.

    Owner reference to the pool when its uid is known (deletion cascades).  ``now`` is unused today and
    kept for builders that stamp times.
    """
    del now
    settings = settings or PodSettings()
    meta = pool.get("metadata") or {}
    pool_name = str(meta.get("name") or "")
    namespace = meta.get("namespace")
    spec = parse_pool_spec(pool.get("spec") or {})
    memory = spec.resources.memory_bytes
    template = spec.pod_template

    labels = {
        **template.labels,
        LABEL_POOL: pool_name,
        LABEL_WORKER: worker_name,
        LABEL_TEMPLATE_HASH: template_hash,
        # The Service selects serving workers; eviction removes this label first (stop routing, then drain).
        LABEL_SERVING: "true",
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    annotations = {**template.annotations, ANNOTATION_MEMORY: str(memory)}
    for owned in (ANNOTATION_EVICTING, ANNOTATION_EVICTING_SINCE):
        annotations.pop(owned, None)

    limits: dict[str, Any] = {"memory": str(memory)}
    requests: dict[str, Any] = {"memory": str(memory)}
    if spec.resources.gpus > 0:
        limits["nvidia.com/gpu"] = str(spec.resources.gpus)
        requests["nvidia.com/gpu"] = str(spec.resources.gpus)
    if spec.resources.cpu is not None:
        requests["cpu"] = str(spec.resources.cpu)

    env = [{"name": e.name, "value": e.value} for e in template.env]
    env_names = {e["name"] for e in env}
    for name, value in (("HF_HOME", settings.hf_home), ("PYTHONUNBUFFERED", "1")):
        if name not in env_names:
            env.append({"name": name, "value": value})

    volumes, mounts = _volumes(spec, settings)
    container: dict[str, Any] = {
        "name": SERVER_CONTAINER,
        "image": spec.image or settings.default_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["modelpool-server"],
        "args": server_args(pool_name, spec, settings),
        "env": env,
        "ports": [{"name": HTTP_PORT_NAME, "containerPort": settings.port, "protocol": "TCP"}],
        "resources": {"limits": limits, "requests": requests},
        # Loading a big model takes minutes: liveness/readiness only start once startup succeeded.
        "startupProbe": {
            "httpGet": _http_get("/v2/health/live"),
            "periodSeconds": settings.startup_period_s,
            "failureThreshold": settings.startup_failure_threshold,
            "timeoutSeconds": 5,
        },
        "readinessProbe": {
            "httpGet": _http_get("/v2/health/ready"),
            "periodSeconds": 5,
            "failureThreshold": 2,
            "timeoutSeconds": 3,
        },
        "livenessProbe": {
            "httpGet": _http_get("/v2/health/live"),
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
        # The server writes a load failure's reason here; the operator shows it as the worker's message.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # Never: the operator itself replaces a failed worker (with per-pool backoff and a fresh budget
        # decision), and a Failed pod keeps its termination message and charges nothing meanwhile.  With
        # Always, the kubelet would restart a worker that failed to load forever, holding its memory.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.drain_timeout_s + 10,
        "securityContext": {
            "runAsNonRoot": True,
            # The uid the Dockerfile's images run as.
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "enableServiceLinks": False,
        "volumes": volumes,
    }
    if template.node_selector:
        pod_spec["nodeSelector"] = dict(template.node_selector)
    if template.tolerations:
        pod_spec["tolerations"] = [t.wire() for t in template.tolerations]
    if template.service_account_name:
        pod_spec["serviceAccountName"] = template.service_account_name
    if template.priority_class_name:
        pod_spec["priorityClassName"] = template.priority_class_name
    if template.runtime_class_name:
        pod_spec["runtimeClassName"] = template.runtime_class_name
    if template.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in template.image_pull_secrets]

    metadata: dict[str, Any] = {"name": worker_name, "labels": labels, "annotations": annotations}
    if namespace:
        metadata["namespace"] = namespace
    owner = owner_reference(pool)
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def owner_reference(pool: Mapping[str, Any]) -> dict[str, Any] | None:
    """The controller owner reference to the ModelPool (None when its uid is unknown)."""
    meta = pool.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        return None
    return {
        "apiVersion": API_VERSION,
        "kind": MODELPOOL_KIND,
        "name": meta.get("name"),
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def build_service(pool: Mapping[str, Any], settings: PodSettings | None = None) -> dict[str, Any]:
    """The pool's ClusterIP Service: routes to ready workers that still carry the serving label."""
    settings = settings or PodSettings()
    meta = pool.get("metadata") or {}
    pool_name = str(meta.get("name") or "")
    metadata: dict[str, Any] = {
        "name": pool_name,
        "labels": {LABEL_POOL: pool_name, LABEL_MANAGED_BY: MANAGED_BY},
    }
    if meta.get("namespace"):
        metadata["namespace"] = meta["namespace"]
    owner = owner_reference(pool)
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_POOL: pool_name, LABEL_SERVING: "true"},
            "ports": [
                {
                    "name": HTTP_PORT_NAME,
                    "port": settings.port,
                    "targetPort": HTTP_PORT_NAME,
                    "protocol": "TCP",
                }
            ],
            "publishNotReadyAddresses": False,
        },
    }


def eviction_patch(reason: str, now: datetime) -> dict[str, Any]:
    """The pod patch that starts an eviction: stop routing (drop the serving label), mark why and when."""
    return {
        "metadata": {
            "labels": {LABEL_SERVING: None},
            "annotations": {ANNOTATION_EVICTING: reason, ANNOTATION_EVICTING_SINCE: rfc3339(now)},
        }
    }
