"""Pure builders of the objects the operator creates: worker Pods, the pool's (headless) Service, and a
ModelHost's host pods and control key Secret.

No API calls here: the reconciliation pass builds and creates.  Everything a worker pod carries is
derived from the parsed pool (``pool.PoolView``: identity, spec, template hash) and ``PodSettings``, so
the same spec always builds the same pod.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from modelpool_contract.api import (
    API_VERSION,
    MODELHOST_KIND,
    MODELPOOL_KIND,
    EnvVar,
    ModelCacheSpec,
    ModelHostSpec,
    ModelPoolSpec,
    Quantity,
)
from modelpool_contract.exits import termination_grace_period_s
from modelpool_contract.flags import (
    CPU_SHARE_ENV,
    DEFAULT_SAMPLE_RATIO,
    DEFAULT_SERVER_IMAGE,
    DEFAULT_WORKER_CPU,
    DRAIN_TIMEOUT_S,
    IDLE_AFTER_S,
    SERVER_COMMAND,
    TERMINATION_LOG,
    WORKER_PORT,
    WORKER_PROBE_PORT,
    ServerArgs,
    runtime_setting,
)
from modelpool_contract.labels import (
    ANNOTATION_EVICTED_IN_STATE,
    ANNOTATION_EVICTING,
    ANNOTATION_EVICTING_SINCE,
    ANNOTATION_MEMORY,
    HTTP_PORT_NAME,
    LABEL_MANAGED_BY,
    LABEL_POOL,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    LABEL_WORKER,
    PROBE_PORT_NAME,
    SERVER_CONTAINER,
)
from modelpool_contract.logs import DEFAULT_LOG_FORMAT, LogFormat
from modelpool_contract.mounts import (
    CACHE_MOUNT_PATH,
    HOME_PATH,
    PVC_MOUNT_ROOT,
    SCRATCH_ENV,
    TMP_PATH,
    parse_pvc_source,
    pvc_mount_path,
)
from modelpool_contract.picker import engine_labels
from modelpool_contract.placements import LABEL_HOST
from modelpool_contract.stats import LIVE_PATH, READY_PATH
from modelpool_contract.times import rfc3339
from modelpool_operator.effects.scheduling import scheduling_fields
from modelpool_operator.host import HostView, host_pod_name, host_pool_label, host_template_hash
from modelpool_operator.placement.charge import host_charge
from modelpool_operator.pool import PoolView, template_hash

MANAGED_BY = "modelpool-operator"
# Where a pool's API key (spec.auth.apiKeySecret) is mounted, and the file the server reads it from.
API_KEY_DIR = "/etc/modelpool/api-key"
API_KEY_FILE = f"{API_KEY_DIR}/api-key"


@dataclass(frozen=True)
class PodSettings:
    """Operator-wide defaults of worker pods (mapped from the operator's configuration)."""

    default_image: str = DEFAULT_SERVER_IMAGE
    port: int = WORKER_PORT
    # Probes and /stats: answered by the worker's supervisor, apart from the traffic (probe_server).
    probe_port: int = WORKER_PROBE_PORT
    # The server drains queued work for up to this long after SIGTERM; the kubelet waits a bit longer.
    drain_timeout_s: int = DRAIN_TIMEOUT_S
    # startupProbe: period x failureThreshold bounds the model load (2 s x 900 = 30 min for big models).
    # A short period because a worker is routable only once its probes pass: a pool woken from zero would
    # otherwise hold its first request up to a whole period after the server answers (10 s measured).
    startup_period_s: int = 2
    startup_failure_threshold: int = 900
    image_pull_policy: str = "IfNotPresent"
    # The model cache of pools that set no spec.model.cache (None: an emptyDir per worker).
    model_cache: ModelCacheSpec | None = None
    # The CPU request of worker and host pods whose spec sets no resources.cpu (None: none). Without one
    # each worker sizes its threads to every core of the node, and workers sharing it stall each other.
    default_cpu: str | None = DEFAULT_WORKER_CPU
    # Where workers and host pods send their traces (--otlp-endpoint; None: no traces), and the share of
    # untraced requests they sample. Only passed when set, so pods of an install without traces (and
    # their template hashes) stay as they were.
    otlp_endpoint: str | None = None
    trace_sample_ratio: float = DEFAULT_SAMPLE_RATIO
    # The operator's log format, passed on to its workers and host pods (``modelpool_contract.logs``).
    log_format: LogFormat = DEFAULT_LOG_FORMAT


def cpu_request(explicit: Quantity | None, default: str | None) -> str | None:
    """Pure: a worker's or host pod's CPU request: its spec's ``resources.cpu``, else the operator's
    default (None: no request).  A request only, never a limit (KServe's default resources set both), as
    ``resources.cpu`` is: the request already sizes the server's threads (``model_server.cpu_budget``, from
    the downward API), so a limit would add no protection from neighbours, only CFS throttling of a
    worker's lockstep pools and HTTP processes whenever they burst onto idle cores."""
    return str(explicit) if explicit is not None else default


def _model_source(spec: ModelPoolSpec) -> str:
    source = spec.model.source
    if spec.model.revision and source.startswith("hf://"):
        source = source.split("@", 1)[0] + "@" + spec.model.revision
    return source


def server_args(pool_name: str, spec: ModelPoolSpec, settings: PodSettings) -> list[str]:
    """The ``modelpool-server`` command-line arguments for this pool."""
    # No --host and no --termination-log: the server's defaults (0.0.0.0, /dev/termination-log, which is
    # the container's terminationMessagePath) are right in a pod, and leaving them to MODELPOOL_HOST /
    # MODELPOOL_TERMINATION_LOG lets a node that runs workers as plain processes give each its own.
    return ServerArgs(
        model=_model_source(spec),
        task=spec.model.task,
        name=pool_name,
        port=settings.port,
        probe_port=settings.probe_port,
        queue_capacity=spec.queue.capacity,
        max_batch_size=spec.queue.max_batch_size,
        max_batch_delay_ms=spec.queue.max_batch_delay_ms,
        request_timeout=spec.queue.request_timeout_seconds,
        # The server's own Idle threshold when the pool disables idle eviction (it still reports Idle).
        idle_after=spec.idle_timeout_seconds or IDLE_AFTER_S,
        drain_timeout=settings.drain_timeout_s,
        device="auto",
        dtype=spec.model.dtype,
        trust_remote_code=spec.model.trust_remote_code,
        pvc_root=PVC_MOUNT_ROOT if parse_pvc_source(spec.model.source) or adapter_claims(spec) else None,
        api_key_file=API_KEY_FILE if spec.auth is not None and spec.auth.api_key_secret is not None else None,
        intra_op_threads=spec.resources.cpu_threads,
        otlp_endpoint=settings.otlp_endpoint,
        trace_sample_ratio=settings.trace_sample_ratio if settings.otlp_endpoint is not None else None,
        log_format=_log_format(settings),
        adapter=tuple(f"{a.name}={a.source}" for a in spec.adapters) or None,
        max_adapters=spec.max_loaded_adapters if spec.adapters else None,
        runtime=runtime_setting(spec.model.runtime),
    ).argv()


def _log_format(settings: PodSettings) -> LogFormat | None:
    """The workers' ``--log-format`` (the operator's own): none for the server's default."""
    return None if settings.log_format == DEFAULT_LOG_FORMAT else settings.log_format


def adapter_claims(spec: ModelPoolSpec) -> list[str]:
    """The claims of the pool's ``pvc://`` adapters the model's own claim does not already mount, each once,
    in the order declared (their volumes are ``adapter-claim-<i>``)."""
    model = parse_pvc_source(spec.model.source)
    claims: list[str] = []
    for adapter in spec.adapters:
        pvc = parse_pvc_source(adapter.source)
        if pvc is not None and pvc.claim not in claims and (model is None or pvc.claim != model.claim):
            claims.append(pvc.claim)
    return claims


def _http_get(path: str) -> dict[str, Any]:
    """A probe on the probe port: the supervisor answers it at once however busy the traffic keeps the
    serving port."""
    return {"path": path, "port": PROBE_PORT_NAME}


def _cache_volume(spec: ModelPoolSpec, settings: PodSettings, namespace: str) -> dict[str, Any]:
    """The ``cache`` volume (HF_HOME): shared as the pool or the operator says for hf:// sources, else an
    emptyDir (the root filesystem may be read-only, and libraries still want a writable HF_HOME).

    The operator's own hostPath default is shared per namespace, never across: its workers mount
    ``<path>/<namespace>`` (every namespace's workers run as uid 10001, so one directory for all would let
    one namespace plant weights or code another loads). A pool's own hostPath already ends in its
    namespace (``policy``)."""
    own = spec.model.cache
    cache = own or settings.model_cache
    if cache is None or cache.type == "none" or not spec.model.source.startswith("hf://"):
        return {"name": "cache", "emptyDir": {}}
    if cache.type == "pvc":
        return {"name": "cache", "persistentVolumeClaim": {"claimName": cache.claim_name}}
    path = cache.path or ""  # a hostPath cache always has one (``ModelCacheSpec``)
    if own is None and namespace:
        path = f"{path.rstrip('/')}/{namespace}"
    return {"name": "cache", "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _volumes(
    spec: ModelPoolSpec, settings: PodSettings, namespace: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # The root filesystem is read-only: tmp and home are where the server and its libraries write.
    volumes: list[dict[str, Any]] = [
        _cache_volume(spec, settings, namespace),
        {"name": "tmp", "emptyDir": {}},
        {"name": "home", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "cache", "mountPath": CACHE_MOUNT_PATH},
        {"name": "tmp", "mountPath": TMP_PATH},
        {"name": "home", "mountPath": HOME_PATH},
    ]
    pvc = parse_pvc_source(spec.model.source)
    if pvc is not None:
        # The server reads pvc://claim/sub/path from <--pvc-root>/claim/sub/path (server_args).
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": pvc.claim, "readOnly": True}})
        mounts.append({"name": "model", "mountPath": pvc.mount_path, "readOnly": True})
    for i, claim in enumerate(adapter_claims(spec)):
        # The server reads pvc://claim/path adapters below --pvc-root too.
        name = f"adapter-claim-{i}"
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        mounts.append({"name": name, "mountPath": pvc_mount_path(claim), "readOnly": True})
    if spec.auth is not None and spec.auth.api_key_secret is not None:
        secret = spec.auth.api_key_secret
        # Only the one key, as a file readable by the server's group (fsGroup) and nobody else.
        items = [{"key": secret.key, "path": API_KEY_FILE.rsplit("/", 1)[1]}]
        volumes.append(
            {"name": "api-key", "secret": {"secretName": secret.name, "items": items, "defaultMode": 0o440}}
        )
        mounts.append({"name": "api-key", "mountPath": API_KEY_DIR, "readOnly": True})
    return volumes, mounts


def _env_var(var: EnvVar) -> dict[str, Any]:
    """One container env entry: a plain value, or a Secret/ConfigMap key (never copied into the spec)."""
    if var.value_from is not None:
        return {"name": var.name, "valueFrom": var.value_from.wire()}
    return {"name": var.name, "value": var.value or ""}


def _container_resources(spec: ModelPoolSpec, cpu: str | None) -> dict[str, Any]:
    """Requests and limits: the container's RAM (``resources.hostMemory`` or its default, which is not
    what the worker is charged on GPU pools), GPUs, the CPU request ``cpu`` (``cpu_request``)."""
    ram_request, ram_limit = spec.resources.container_memory()
    requests: dict[str, Any] = {"memory": str(ram_request)}
    limits: dict[str, Any] = {} if ram_limit is None else {"memory": str(ram_limit)}
    if spec.resources.gpus > 0:
        limits["nvidia.com/gpu"] = str(spec.resources.gpus)
        requests["nvidia.com/gpu"] = str(spec.resources.gpus)
    if cpu is not None:
        requests["cpu"] = cpu
    return {"limits": limits, "requests": requests}


def cpu_share_env() -> dict[str, Any]:
    """The worker's CPU share: its container's CPU request in millicores, from the downward API (the
    kubelet fills it in, so it follows the request wherever it is set).  The server sizes its threads to
    it where no CPU limit caps the pod (``model_server.cpu_budget``)."""
    ref = {"containerName": SERVER_CONTAINER, "resource": "requests.cpu", "divisor": "1m"}
    return {"name": CPU_SHARE_ENV, "valueFrom": {"resourceFieldRef": ref}}


def _container(spec: ModelPoolSpec, pool_name: str, settings: PodSettings) -> dict[str, Any]:
    """The server container: image, arguments, resources, probes."""
    env = [_env_var(e) for e in spec.pod_template.env]
    env_names = {e["name"] for e in env}
    for name, value in (*SCRATCH_ENV, ("PYTHONUNBUFFERED", "1")):
        if name not in env_names:
            env.append({"name": name, "value": value})
    cpu = cpu_request(spec.resources.cpu, settings.default_cpu)
    if cpu is not None and CPU_SHARE_ENV not in env_names:
        env.append(cpu_share_env())
    # Every 2 s (a cheap answer from shared memory): the model loaded -> routable delay is at most one
    # period, and a draining or failed worker leaves the endpoints within three.
    readiness = {
        "httpGet": _http_get(READY_PATH),
        "periodSeconds": 2,
        "failureThreshold": 3,
        "timeoutSeconds": 2,
    }
    container = _server_container(
        settings,
        image=spec.image,
        args=server_args(pool_name, spec, settings),
        env=env,
        resources=_container_resources(spec, cpu),
        readiness=readiness,
    )
    # Loading a big model takes minutes: liveness/readiness only start once startup succeeded.
    container["startupProbe"] = {
        "httpGet": _http_get(LIVE_PATH),
        "periodSeconds": settings.startup_period_s,
        "failureThreshold": settings.startup_failure_threshold,
        "timeoutSeconds": 5,
    }
    return container


def _server_container(
    settings: PodSettings,
    *,
    image: str | None,
    args: list[str],
    env: list[dict[str, Any]],
    resources: dict[str, Any],
    readiness: dict[str, Any],
) -> dict[str, Any]:
    """The server container of a worker or host pod (``image``: the spec's, else the operator's default): its
    ports, probes, termination log and security."""
    return {
        "name": SERVER_CONTAINER,
        "image": image or settings.default_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": [SERVER_COMMAND],
        "args": args,
        "env": env,
        "ports": [
            {"name": HTTP_PORT_NAME, "containerPort": settings.port, "protocol": "TCP"},
            {"name": PROBE_PORT_NAME, "containerPort": settings.probe_port, "protocol": "TCP"},
        ],
        "resources": resources,
        "readinessProbe": readiness,
        "livenessProbe": {
            "httpGet": _http_get(LIVE_PATH),
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
        # The server writes a load failure's reason here; the operator shows it as the worker's message.
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _security_context(),
    }


def _pod_security_context() -> dict[str, Any]:
    """The pod-level security context of worker and host pods alike (a fresh dict each: pods are patched)."""
    return {
        "runAsNonRoot": True,
        # The uid the Dockerfile's images run as.
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_spec(spec: ModelPoolSpec, pool_name: str, settings: PodSettings, namespace: str) -> dict[str, Any]:
    """The worker pod's spec: the container, its volumes, and the pool's scheduling settings."""
    volumes, mounts = _volumes(spec, settings, namespace)
    container = _container(spec, pool_name, settings)
    container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # Never: the operator itself replaces a failed worker (with per-pool backoff and a fresh budget
        # decision), and a Failed pod keeps its termination message and charges nothing meanwhile.  With
        # Always, the kubelet would restart a worker that failed to load forever, holding its memory.
        "restartPolicy": "Never",
        # The server's worst case from SIGTERM to its exit (the drain, then stopping its processes), so
        # that the kubelet's SIGKILL never cuts it short and loses the exit code and its reason.
        "terminationGracePeriodSeconds": termination_grace_period_s(settings.drain_timeout_s),
        "securityContext": _pod_security_context(),
        "enableServiceLinks": False,
        # No API token for user-supplied code to steal, unless the pool asks for one.
        "automountServiceAccountToken": bool(spec.pod_template.automount_service_account_token),
        "volumes": volumes,
    }
    template = spec.pod_template
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
    # Spread over nodes by default: a drain or a node's failure takes as few of the pool's workers as it can.
    pod_spec |= scheduling_fields(
        template.affinity, template.topology_spread_constraints, {LABEL_POOL: pool_name}
    )
    return pod_spec


def _security_context() -> dict[str, Any]:
    """The server container's security context, on worker and host pods alike."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        # The server runs user-supplied code (trust_remote_code, any image): nothing it writes outlives the
        # pod or lands outside the volumes (SCRATCH_ENV points every cache at them).
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def owned_metadata(
    name: str, namespace: str, labels: dict[str, str], owner: dict[str, Any] | None
) -> dict[str, Any]:
    """Metadata of an object one of ours owns: its namespace when known, the controller owner reference
    when its uid is (the pool's or ModelHost's: ``owner_reference``, ``host_owner_reference``)."""
    metadata: dict[str, Any] = {"name": name, "labels": labels}
    if namespace:
        metadata["namespace"] = namespace
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return metadata


def _owned_metadata(pool: PoolView, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """Metadata of an object the pool owns."""
    return owned_metadata(name, pool.namespace, labels, owner_reference(pool))


def rendered_hash(spec_hash: str, pod_spec: Mapping[str, Any]) -> str:
    """Pure: the template hash of a pod as the operator renders it: its spec's own hash (the fields that
    shape it) and the pod spec built from it and the operator's settings. So whatever the operator adds
    (the server image it defaults to, the flags and env it passes, probes, volumes, a new version's
    rendering) is covered too: a pod built otherwise than this operator would build it now is outdated and
    rolled, one at a time within the budget, as a spec change is."""
    payload = json.dumps({"spec": spec_hash, "pod": pod_spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()[:10]


def worker_template_hash(pool: PoolView, settings: PodSettings) -> str:
    """The template hash of ``pool``'s workers under ``settings`` (``rendered_hash`` of the worker pod spec;
    the pool's labels and annotations are in its spec hash)."""
    return rendered_hash(template_hash(pool.spec), _pod_spec(pool.spec, pool.name, settings, pool.namespace))


def build_worker_pod(pool: PoolView, worker_name: str, settings: PodSettings | None = None) -> dict[str, Any]:
    """The worker Pod ``worker_name`` of ``pool`` (built from its spec and template hash), as an API dict.

    Owned by the pool when its uid is known (deletion cascades).
    """
    settings = settings or PodSettings()
    template = pool.spec.pod_template
    labels = {
        # The endpoint picker's engine type (a text-generation worker exports its vLLM names); before the
        # template's labels, so a pool that maps its own names (the picker's engineConfigs) can say so.
        **engine_labels(pool.spec.model.task),
        **template.labels,
        LABEL_POOL: pool.name,
        LABEL_WORKER: worker_name,
        LABEL_TEMPLATE_HASH: pool.template_hash,
        # The Service selects serving workers; eviction removes this label first (stop routing, then drain).
        LABEL_SERVING: "true",
        LABEL_MANAGED_BY: MANAGED_BY,
    }
    annotations = {**template.annotations, ANNOTATION_MEMORY: str(pool.spec.resources.memory_bytes)}
    for owned in (ANNOTATION_EVICTING, ANNOTATION_EVICTING_SINCE, ANNOTATION_EVICTED_IN_STATE):
        annotations.pop(owned, None)
    metadata = _owned_metadata(pool, worker_name, labels)
    metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": _pod_spec(pool.spec, pool.name, settings, pool.namespace),
    }


def _controller_reference(kind: str, name: str, uid: str | None) -> dict[str, Any] | None:
    """The controller owner reference to one of our resources (None when its uid is unknown)."""
    if not uid:
        return None
    return {
        "apiVersion": API_VERSION,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owner_reference(pool: PoolView) -> dict[str, Any] | None:
    """The controller owner reference to the ModelPool (None when its uid is unknown)."""
    return _controller_reference(MODELPOOL_KIND, pool.name, pool.uid)


#: ``spec.clusterIP`` of a headless Service.
HEADLESS = "None"


def serving_selector(pool_name: str) -> dict[str, str]:
    """The workers of ``pool_name`` that serve: the pool's Service selects them, and its InferencePool
    (an eviction drops the serving label first, so a draining worker leaves both)."""
    return {LABEL_POOL: pool_name, LABEL_SERVING: "true"}


def build_service(pool: PoolView, settings: PodSettings | None = None) -> dict[str, Any]:
    """The pool's headless Service: its DNS name resolves to the ready workers that still carry the
    serving label.

    Headless (``clusterIP: None``) because nothing needs a virtual IP: the gateway routes to pod addresses,
    and a ClusterIP per pool would exhaust the cluster's Service IP range (a /24 holds about 250 pools;
    the pools past it got no Service, and before this change no workers either)."""
    settings = settings or PodSettings()
    labels = {LABEL_POOL: pool.name, LABEL_MANAGED_BY: MANAGED_BY}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _owned_metadata(pool, pool.name, labels),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": HEADLESS,
            "selector": serving_selector(pool.name),
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


def eviction_patch(reason: str, now: datetime, state: str) -> dict[str, Any]:
    """The pod patch that starts an eviction: stop routing (drop the serving label), mark why and when,
    and the worker's ``state`` as observed when the eviction was decided (one patch, so no eviction is
    ever seen without it)."""
    return {
        "metadata": {
            "labels": {LABEL_SERVING: None},
            "annotations": {
                ANNOTATION_EVICTING: reason,
                ANNOTATION_EVICTING_SINCE: rfc3339(now),
                ANNOTATION_EVICTED_IN_STATE: state,
            },
        }
    }


# ---- shared hosts (a ModelHost's pods) -------------------------------------------------------------------

# Where a host pod's control key (the Secret ``control_key_secret_name``) is mounted: the host's control API
# (load, unload, sleep, wake on the probe port) answers only requests that carry it.
CONTROL_KEY_DIR = "/etc/modelpool/control-key"
CONTROL_KEY_ITEM = "key"
CONTROL_KEY_FILE = f"{CONTROL_KEY_DIR}/{CONTROL_KEY_ITEM}"


def control_key_secret_name(host: HostView | str) -> str:
    """``<ModelHost>-control-key``."""
    return f"{host if isinstance(host, str) else host.name}-control-key"


def host_owner_reference(host: HostView) -> dict[str, Any] | None:
    """The controller owner reference to the ModelHost (None when its uid is unknown)."""
    return _controller_reference(MODELHOST_KIND, host.name, host.uid)


def _host_metadata(host: HostView, name: str, labels: dict[str, str]) -> dict[str, Any]:
    """Metadata of an object the ModelHost owns: built as a pool's are (``owned_metadata``), so a ModelHost
    read without a namespace gives no ``namespace: ""`` (the object's namespace is then the request's)."""
    return owned_metadata(name, host.namespace, labels, host_owner_reference(host))


def host_labels(host: HostView) -> dict[str, str]:
    """What marks the ModelHost's objects (its pods, control key Secret and NetworkPolicy) as its own."""
    return {LABEL_HOST: host.name, LABEL_POOL: host_pool_label(host.name), LABEL_MANAGED_BY: MANAGED_BY}


def _host_pod_labels(host: HostView) -> dict[str, str]:
    return {**host_labels(host), LABEL_TEMPLATE_HASH: host.template_hash}


def build_control_key_secret(host: HostView, key: str) -> dict[str, Any]:
    """The ModelHost's control key Secret (owned by it: deleted with it)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _host_metadata(host, control_key_secret_name(host), host_labels(host)),
        "type": "Opaque",
        "stringData": {CONTROL_KEY_ITEM: key},
    }


def host_server_args(spec: ModelHostSpec, settings: PodSettings) -> list[str]:
    """``modelpool-server --shared-host`` and the flags a host understands (model_server/host_config.py):
    its ports, its devices (cpu on a CPU host; else the ``gpusPerHost`` GPUs the pod is given, ``--gpus``:
    the models of GPU i run on cuda:i), the device memory its ledger hands out on each and what it charges
    each model's process there, the host RAM for sleeping models (and then ``--sleep-idle``), the control
    key."""
    args = [
        "--shared-host",
        "--port",
        str(settings.port),
        "--probe-port",
        str(settings.probe_port),
        "--device",
        "cpu" if spec.gpus_per_host == 0 else "auto",
        "--device-memory",
        str(spec.device_memory_bytes),
        # What each model's process costs on the device, awake or asleep: the host's ledger charges it as
        # the operator's does (the same figure, spec.modelOverhead or the contract's default).
        "--model-overhead",
        str(spec.model_overhead_bytes),
        "--control-key-file",
        CONTROL_KEY_FILE,
    ]
    if spec.gpus_per_host > 0:
        # As many devices as the pod is given GPUs (the device plugin's: the container sees just those).
        args += ["--gpus", str(spec.gpus_per_host)]
    if spec.host_memory_bytes:
        # With RAM to park them in, a model that turns Idle (its pool's idleTimeoutSeconds) sleeps: its
        # device memory goes back to the others, and its next request wakes it on the host.
        args += ["--host-memory", str(spec.host_memory_bytes), "--sleep-idle"]
    if (log_format := _log_format(settings)) is not None:
        args += ["--log-format", log_format]
    return args + tracing_flags(settings)  # each model's processes trace with the host's settings


def tracing_flags(settings: PodSettings) -> list[str]:
    """Pure: a host pod's tracing flags, as ``ServerArgs`` renders a worker's (none without an endpoint)."""
    if settings.otlp_endpoint is None:
        return []
    ratio = f"{settings.trace_sample_ratio:g}"
    return ["--otlp-endpoint", settings.otlp_endpoint, "--trace-sample-ratio", ratio]


def _host_resources(spec: ModelHostSpec, cpu: str | None) -> dict[str, Any]:
    """nvidia.com/gpu = gpusPerHost; on a CPU host the RAM its models use (deviceMemory, awake) and park
    (hostMemory, asleep) as its memory request and limit; the CPU request ``cpu`` (``cpu_request``: the
    ModelHost's, else the operator's default), which its models share."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if spec.gpus_per_host > 0:
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(spec.gpus_per_host)
        # The parked weights live in the host's RAM (pinned): asked for, not limited (the CUDA runtime's
        # own use comes on top).
        if spec.host_memory_bytes:
            requests["memory"] = str(spec.host_memory_bytes)
    else:
        ram = spec.device_memory_bytes + spec.host_memory_bytes
        requests["memory"] = limits["memory"] = str(ram)
    if cpu is not None:
        requests["cpu"] = cpu
    return {"requests": requests, "limits": limits}


def build_host_pod(host: HostView, index: int, settings: PodSettings | None = None) -> dict[str, Any]:
    """The ``index``-th host pod of ``host``: ``modelpool-server --shared-host`` with its control key
    mounted, labelled ``modelpool.dev/host=<name>``, charged its whole devices (``ANNOTATION_MEMORY``:
    ``placement.host_charge``), owned by the ModelHost."""
    settings = settings or PodSettings()
    name = host_pod_name(host, index)
    metadata = _host_metadata(host, name, _host_pod_labels(host))
    metadata["annotations"] = {ANNOTATION_MEMORY: str(host_charge(host.spec))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": _host_pod_spec(host, settings)}


def host_pod_template_hash(host: HostView, settings: PodSettings) -> str:
    """The template hash of ``host``'s pods under ``settings`` (``rendered_hash`` of the host pod spec)."""
    return rendered_hash(host_template_hash(host.spec), _host_pod_spec(host, settings))


def _host_pod_spec(host: HostView, settings: PodSettings) -> dict[str, Any]:
    """A host pod's spec (the same for every index): the server container, its volumes, scheduling."""
    spec = host.spec
    env = [{"name": k, "value": v} for k, v in (*SCRATCH_ENV, ("PYTHONUNBUFFERED", "1"))]
    cpu = cpu_request(spec.resources.cpu, settings.default_cpu)
    if cpu is not None:
        env.append(cpu_share_env())
    container = _server_container(
        settings,
        image=spec.image,
        args=host_server_args(spec, settings),
        env=env,
        resources=_host_resources(spec, cpu),
        readiness={"httpGet": _http_get(READY_PATH), "periodSeconds": 2, "timeoutSeconds": 2},
    )
    container["volumeMounts"] = [
        {"name": "tmp", "mountPath": TMP_PATH},
        {"name": "home", "mountPath": HOME_PATH},
        {"name": "cache", "mountPath": CACHE_MOUNT_PATH},
        {"name": "control-key", "mountPath": CONTROL_KEY_DIR, "readOnly": True},
    ]
    secret = {
        "secretName": control_key_secret_name(host),
        "items": [{"key": CONTROL_KEY_ITEM, "path": CONTROL_KEY_ITEM}],
        "defaultMode": 0o440,
    }
    pod_spec: dict[str, Any] = {
        "containers": [container],
        # Never, as a worker's: the operator replaces a failed host pod (and re-places its models).
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": termination_grace_period_s(settings.drain_timeout_s),
        "securityContext": _pod_security_context(),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "home", "emptyDir": {}},
            {"name": "cache", "emptyDir": {}},
            {"name": "control-key", "secret": secret},
        ],
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.wire() for t in spec.tolerations]
    pod_spec |= scheduling_fields(
        spec.affinity, spec.topology_spread_constraints, {LABEL_POOL: host_pool_label(host.name)}
    )
    return pod_spec
