"""Shared hosts as observed (issue 21): a ModelHost's pods, from the host pods index, as the placement
ledger's ``Host`` values (pure: slim pods and the parsed ModelHost spec in, plain values out).

A host pod accepts models while it runs, is Ready and is not being deleted; its models are those its
``/stats`` reports (``{"host": {"devices": [...]}, "models": {<name>: <WorkerStats and its "device">}}``),
each the resident of the shared pool of the ModelHost whose model has that name there
(``placements.host_model_name``: ``HostedPool``), else of a pool named after it, on the device index its
document names (0 when it names none: a host of one device). A host pod's devices are those its
``/stats`` lists (the ``--gpus`` its pod was made with), else the ModelHost's ``gpusPerHost`` (one on a
CPU host), each of ``deviceMemory``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, get_args

from modelpool_contract.api import HostModelState, ModelHostSpec
from modelpool_contract.states import WorkerState
from modelpool_contract.stats import WorkerStats
from modelpool_contract.times import parse_time, rfc3339
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.ledger import Host, Resident

_STATES = frozenset(get_args(HostModelState))


@dataclass(frozen=True)
class HostedPool:
    """What the ledger needs of a shared pool on the ModelHost: its name, declared size and priority."""

    name: str
    declared: int = 0
    priority: int = 0


def _state(value: object) -> TypeGuard[HostModelState]:
    return isinstance(value, str) and value in _STATES


def _count(doc: Mapping[str, Any], key: str) -> int | None:
    value = doc.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def host_devices(stats: Mapping[str, Any] | None, configured: int) -> int:
    """How many devices a host pod has: as many as its ``/stats`` lists (``host.devices``), else
    ``configured`` (the ModelHost's)."""
    host = (stats or {}).get("host")
    listed = host.get("devices") if isinstance(host, Mapping) else None
    return len(listed) if isinstance(listed, list) and listed else configured


def host_residents(
    namespace: str, stats: Mapping[str, Any] | None, pools: Mapping[str, HostedPool]
) -> tuple[Resident, ...]:
    """The models a host's ``/stats`` reports, as the ledger's residents (``pools``: by model name), each
    on the device its document names (0 when none); a model in an unknown state or an unreadable document
    is left out (unknown stats never fail anything)."""
    models = (stats or {}).get("models")
    if not isinstance(models, Mapping):
        return ()
    residents = []
    for name, doc in sorted(models.items()):
        if not isinstance(doc, Mapping) or not _state(doc.get("state")):
            continue
        pool = pools.get(str(name), HostedPool(str(name)))
        memory = doc.get("memory") if isinstance(doc.get("memory"), Mapping) else {}
        last, since = doc.get("last_request_time"), doc.get("state_since")
        # 0 GPU bytes is no measurement (a CPU host; a sleeping model, whose weights left the device):
        # charged its declared size then, as the host itself charges it (model_server.host_plan).
        reading = _count(memory or {}, "gpu_reserved_bytes")
        residents.append(
            Resident(
                pool=(namespace, pool.name),
                state=doc["state"],
                device=_count(doc, "device") or 0,
                declared=pool.declared,
                measured=reading if reading and doc["state"] not in ("Sleeping", "Waking") else None,
                priority=pool.priority,
                last_used=float(last) if isinstance(last, int | float) else 0.0,
                busy=bool(_count(doc, "queue_depth") or _count(doc, "in_flight")),
                since=float(since) if isinstance(since, int | float) else 0.0,
            )
        )
    return tuple(residents)


def host_pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, its Ready condition True, and not being deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def observe_hosts(
    spec: ModelHostSpec,
    pods: Iterable[Mapping[str, Any]],
    stats: Mapping[str, Mapping[str, Any] | None] | None = None,
    pools: Mapping[str, HostedPool] | None = None,
) -> list[Host]:
    """The ledger's view of each host pod (sorted by name): the ModelHost's devices and host RAM, the
    models its ``/stats`` reports (``stats``: by pod name); a pod accepts models only while ready and,
    when ``stats`` is given, once its ``/stats`` is known (until then what it holds is unknown, and a
    host the operator cannot reach cannot be given a model either)."""
    hosts = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        report = (stats or {}).get(name)
        residents = host_residents(str(meta.get("namespace") or ""), report, pools or {})
        # A model on a device the host does not list (an odd report) still counts, on a device of its own.
        devices = max([host_devices(report, spec.devices), *(r.device + 1 for r in residents)])
        hosts.append(
            Host(
                name=name,
                capacities=(spec.device_memory_bytes,) * devices,
                host_memory=spec.host_memory_bytes,
                overhead=spec.model_overhead_bytes,
                residents=residents,
                accepting=host_pod_ready(pod) and (stats is None or stats.get(name) is not None),
            )
        )
    return sorted(hosts, key=lambda h: h.name)


@dataclass(frozen=True)
class HostedReplica:
    """A shared pool's model on one host pod, as the host's ``/stats`` reports it."""

    pod: str
    state: WorkerState
    memory: int
    node: str | None = None
    reason: str | None = None
    queue_depth: int | None = None
    last_request_time: str | None = None
    # Since when the model is in its state there (the host's ``state_since``): a new failure has a new one.
    since: str | None = None
    device: int | None = None  # the index of the host pod's device it lives on, as the host reports it


def hosted_replicas(
    model: str,
    declared: int,
    pods: Iterable[Mapping[str, Any]],
    stats: Mapping[str, Mapping[str, Any] | None],
) -> list[HostedReplica]:
    """The host pods whose ``/stats`` reports the model ``model`` (a pool's ``host_model_name``), with its
    state there; its memory is what the host measured on the device, else ``declared``."""
    replicas = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        models = (stats.get(name) or {}).get("models")
        doc = models.get(model) if isinstance(models, Mapping) else None
        if not isinstance(doc, Mapping) or not _state(doc.get("state")):
            continue
        memory = doc.get("memory") if isinstance(doc.get("memory"), Mapping) else {}
        last, since = doc.get("last_request_time"), doc.get("state_since")
        reason = doc.get("reason")
        replicas.append(
            HostedReplica(
                pod=name,
                state=doc["state"],
                memory=_count(memory or {}, "gpu_reserved_bytes") or declared,
                node=(pod.get("spec") or {}).get("nodeName"),
                reason=str(reason)[:1000] if reason else None,
                queue_depth=_count(doc, "queue_depth"),
                last_request_time=rfc3339(parse_time(last)) if last else None,
                since=rfc3339(parse_time(since)) if since else None,
                device=_count(doc, "device"),
            )
        )
    return sorted(replicas, key=lambda r: r.pod)


def hosted_workers(
    namespace: str,
    pool: str,
    replicas: Iterable[HostedReplica],
    stats: Mapping[str, Mapping[str, Any] | None],
) -> list[ObservedWorker]:
    """A shared pool's replicas (``hosted_replicas``) as the planner's workers, for its autoscaler and its
    failure backoff: each named after its host pod, with the model's own figures from that host's
    ``/stats`` (``models.<pool>``: in flight, queued, its counters, its clock; a model's counters are its
    own, and a count that went back starts a new baseline, as a restarted worker's does)."""
    workers = []
    for replica in replicas:
        models = (stats.get(replica.pod) or {}).get("models")
        report = WorkerStats.parse(models.get(pool) if isinstance(models, Mapping) else None)
        workers.append(
            ObservedWorker(
                name=replica.pod,
                namespace=namespace,
                pool=pool,
                state=replica.state,
                reason=replica.reason,
                message=replica.reason,
                since=parse_time(replica.since),
                node=replica.node,
                queue_depth=report.queue_depth if report else None,
                in_flight=report.in_flight if report else None,
                last_request_time=parse_time(report.last_request_time) if report else None,
                stats_known=report is not None,
                uid=f"{replica.pod}/{pool}",
                requests_total=report.requests_total if report else None,
                rejected_total=report.rejected_total if report else None,
                stats_time=report.time if report else None,
            )
        )
    return workers


def reported_models(
    pods: Iterable[Mapping[str, Any]], stats: Mapping[str, Mapping[str, Any] | None]
) -> dict[tuple[str, str], tuple[str, str]]:
    """What each host pod reports of each model it holds: ``(pod, model) -> (source, task)`` (its
    ``/stats`` ``models.<name>.model``; models that report none are left out)."""
    reported = {}
    for pod in pods:
        name = str((pod.get("metadata") or {}).get("name") or "")
        models = (stats.get(name) or {}).get("models")
        for model, doc in models.items() if isinstance(models, Mapping) else ():
            said = doc.get("model") if isinstance(doc, Mapping) else None
            if isinstance(said, Mapping) and said.get("source") and said.get("task"):
                reported[(name, str(model))] = (str(said["source"]), str(said["task"]))
    return reported
