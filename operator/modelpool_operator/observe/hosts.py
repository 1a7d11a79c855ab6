"""Shared hosts as observed (issue 21): a ModelHost's pods, from the host pods index, as the placement
ledger's ``Host`` values (pure: slim pods and the parsed ModelHost spec in, plain values out).

A host pod accepts models while it runs, is Ready and is not being deleted; its models are the pools the
operator recorded on it (``modelpool_contract.placements``), none of them placed yet while the passes of
shared pools do not place (``planner.shared``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from modelpool_contract.api import ModelHostSpec
from modelpool_operator.placement.ledger import Host


def host_pod_ready(pod: Mapping[str, Any]) -> bool:
    """Running, its Ready condition True, and not being deleted."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def observe_hosts(spec: ModelHostSpec, pods: Iterable[Mapping[str, Any]]) -> list[Host]:
    """The ledger's view of each host pod (sorted by name): the ModelHost's devices and host RAM; a pod
    accepts models only while ready."""
    capacities = (spec.device_memory_bytes,) * spec.devices
    hosts = [
        Host(
            name=str((pod.get("metadata") or {}).get("name") or ""),
            capacities=capacities,
            host_memory=spec.host_memory_bytes,
            accepting=host_pod_ready(pod),
        )
        for pod in pods
    ]
    return sorted(hosts, key=lambda h: h.name)
