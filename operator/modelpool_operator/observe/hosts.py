"""Shared hosts as observed (issue 21): a ModelHost's pods, from the host pods index, as the placement
ledger's ``Host`` values (pure: slim pods and the parsed ModelHost spec in, plain values out).

A host pod accepts models while it runs, is Ready and is not being deleted; its models are those its
``/stats`` reports (``modelpool_contract.stats.HostStats``, parsed once a pass by ``host_reports``: never
an error, an unreadable field is unknown),
each the resident of the shared pool of the ModelHost whose model has that name there
(``placements.host_model_name``: ``HostedPool``), else of a pool named after it, on the device index its
document names (0 when it names none: a host of one device). A host pod's devices are those its
``/stats`` lists (the ``--gpus`` its pod was made with), else the ModelHost's ``gpusPerHost`` (one on a
CPU host), each of ``deviceMemory``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from modelpool_contract.api import ModelHostSpec
from modelpool_contract.messages import fit_message
from modelpool_contract.stats import HostModelStats, HostStats
from modelpool_contract.times import parse_time, rfc3339
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.ledger import Host, Resident

#: Each host pod's ``/stats`` by pod name, parsed (None: unknown).
HostReports = Mapping[str, HostStats | None]


@dataclass(frozen=True)
class HostedPool:
    """What the ledger needs of a shared pool on the ModelHost: its name, declared size and priority."""

    name: str
    declared: int = 0
    priority: int = 0


def pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def host_reports(stats: Mapping[str, Mapping[str, Any] | None]) -> dict[str, HostStats | None]:
    """The host pods' ``/stats`` as the scraper holds them (JSON objects by pod name), parsed once."""
    return {name: HostStats.parse(doc) for name, doc in stats.items()}


def _models(report: HostStats | None) -> dict[str, HostModelStats]:
    """The models a report lists in a known state."""
    return {name: doc for name, doc in (report.models if report else {}).items() if doc.state is not None}


def host_devices(report: HostStats | None, configured: int) -> int:
    """How many devices a host pod has: as many as its ``/stats`` lists (``host.devices``), else
    ``configured`` (the ModelHost's)."""
    listed = report.host.devices if report is not None else []
    return len(listed) if listed else configured


def _reserved(doc: HostModelStats) -> int | None:
    return doc.memory.gpu_reserved_bytes if doc.memory is not None else None


def host_residents(
    namespace: str, report: HostStats | None, pools: Mapping[str, HostedPool]
) -> tuple[Resident, ...]:
    """The models a host's ``/stats`` reports, as the ledger's residents (``pools``: by model name), each
    on the device its document names (0 when none); a model in an unknown state is left out (unknown
    stats never fail anything)."""
    residents = []
    for name, doc in sorted(_models(report).items()):
        assert doc.state is not None  # _models keeps known states only
        pool = pools.get(name, HostedPool(name))
        # 0 GPU bytes is no measurement (a CPU host; a sleeping model, whose weights left the device):
        # charged its declared size then, as the host itself charges it (model_server.host_plan).
        reading = _reserved(doc)
        residents.append(
            Resident(
                pool=(namespace, pool.name),
                state=doc.state,
                device=doc.device or 0,
                declared=pool.declared,
                measured=reading if reading and doc.state not in ("Sleeping", "Waking") else None,
                priority=pool.priority,
                last_used=doc.last_request_time or 0.0,
                busy=bool(doc.queue_depth or doc.in_flight),
                since=doc.state_since or 0.0,
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
    stats: HostReports | None = None,
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


def hosted_workers(
    namespace: str, model: str, declared: int, pods: Iterable[Mapping[str, Any]], stats: HostReports
) -> list[ObservedWorker]:
    """A shared pool's replicas: the host pods whose ``/stats`` reports the model ``model`` (a pool's
    ``host_model_name``) in a known state, as the planner's workers (sorted by host pod), for its
    autoscaler, its failure backoff and its status. Each is named after its host pod, with the model's own
    figures from that host's ``/stats`` (``models.<model>``: its state there, in flight, queued, its
    counters, its clock; a model's counters are its own, and a count that went back starts a new baseline,
    as a restarted worker's does); its memory is what the host measured on the device, else ``declared``."""
    workers = []
    for pod in pods:
        name = pod_name(pod)
        doc = _models(stats.get(name)).get(model)
        if doc is None or doc.state is None:
            continue
        reason = fit_message(doc.reason) if doc.reason else None
        workers.append(
            ObservedWorker(
                name=name,
                namespace=namespace,
                pool=model,
                state=doc.state,
                reason=reason,
                message=reason,
                # To the second, as the status records it: a new failure is a ``since`` the status has not.
                since=parse_time(_rfc3339(doc.state_since)),
                node=(pod.get("spec") or {}).get("nodeName"),
                memory=_reserved(doc) or declared,
                queue_depth=doc.queue_depth,
                in_flight=doc.in_flight,
                last_request_time=parse_time(doc.last_request_time),
                stats_known=True,
                uid=f"{name}/{model}",
                requests_total=doc.requests_total,
                rejected_total=doc.rejected_total,
                stats_time=doc.time,
                device=doc.device,
            )
        )
    return sorted(workers, key=lambda w: w.name)


def _rfc3339(unix: float | None) -> str | None:
    return rfc3339(parse_time(unix)) if unix else None


def reported_models(
    pods: Iterable[Mapping[str, Any]], stats: HostReports
) -> dict[tuple[str, str], tuple[str, str]]:
    """What each host pod reports of each model it holds: ``(pod, model) -> (source, task)`` (its
    ``/stats`` ``models.<name>.model``; models that report none are left out)."""
    reported = {}
    for pod in pods:
        name = pod_name(pod)
        report = stats.get(name)
        for model, doc in (report.models if report else {}).items():
            said = doc.model
            if said is not None and said.source and said.task:
                reported[(name, model)] = (said.source, said.task)
    return reported
