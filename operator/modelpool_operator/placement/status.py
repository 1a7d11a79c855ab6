"""A ModelHost's status from the hosts' ledgers (pure): per host pod its devices and models, and the
totals the printer columns show (GPU memory awake, asleep, the models' processes' overhead, free)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from modelpool_contract.api import (
    HostDeviceStatus,
    HostMemoryTotals,
    HostModelStatus,
    HostPodStatus,
    ModelHostStatus,
)
from modelpool_contract.quantity import format_quantity
from modelpool_contract.states import CHARGED_STATES, SERVING_STATES, WorkerState
from modelpool_operator.placement.ledger import Host, Resident, ledger


@dataclass(frozen=True)
class ObservedHost:
    """A host pod as observed: its ledger's view, its pod's state, its node."""

    host: Host
    state: WorkerState
    node: str | None = None


def signed_quantity(num_bytes: int) -> str:
    """Bytes as a quantity, negative ones too (a device a measurement over-committed shows ``-2Gi`` free)."""
    return "-" + format_quantity(-num_bytes) if num_bytes < 0 else format_quantity(num_bytes)


def _measured(resident: Resident) -> bool:
    """Whether its charge is a figure its host reported (parked bytes asleep; awake, a measurement above
    its declaration, which is charged otherwise: ``device_charge``)."""
    if resident.state == "Sleeping":
        return resident.parked is not None
    return resident.measured is not None and resident.measured > resident.declared


def _model(resident: Resident) -> HostModelStatus:
    charge = resident.host_charge if resident.state == "Sleeping" else resident.device_charge
    last = resident.last_used
    return HostModelStatus(
        namespace=resident.pool[0],
        pool=resident.pool[1],
        state=resident.state,
        device=resident.device,
        memory=format_quantity(charge),
        memory_bytes=charge,
        measured=_measured(resident),
        last_request_time=datetime.fromtimestamp(last, UTC).isoformat().replace("+00:00", "Z")
        if last
        else None,
    )


def host_pod_status(observed: ObservedHost) -> HostPodStatus:
    """One host pod's devices (capacity, awake, asleep, free) and models (sorted by namespace/name)."""
    led = ledger(observed.host)
    devices = [
        HostDeviceStatus(
            index=d.index,
            capacity=format_quantity(d.capacity),
            capacity_bytes=d.capacity,
            awake=format_quantity(d.awake),
            awake_bytes=d.awake,
            asleep=format_quantity(d.asleep),
            asleep_bytes=d.asleep,
            overhead=format_quantity(d.overhead),
            overhead_bytes=d.overhead,
            free=signed_quantity(d.free),
            free_bytes=d.free,
        )
        for d in led.devices
    ]
    models = [_model(r) for r in sorted(observed.host.residents, key=lambda r: r.pool)]
    return HostPodStatus(
        name=observed.host.name,
        state=observed.state,
        node=observed.node,
        devices=devices,
        host_memory=format_quantity(led.host_memory),
        host_memory_free=signed_quantity(led.host_free),
        models=models,
    )


def host_status(
    hosts: Sequence[ObservedHost], *, desired: int, selector: str | None = None
) -> ModelHostStatus:
    """The ModelHost's status: its host pods (sorted by name), the counts and the memory totals."""
    pods = [host_pod_status(h) for h in sorted(hosts, key=lambda h: h.host.name)]
    counted = [h for h in hosts if h.state in CHARGED_STATES]
    ready = sum(1 for h in hosts if h.state in SERVING_STATES)
    ledgers = [ledger(h.host) for h in counted]
    awake = sum(led.awake for led in ledgers)
    asleep = sum(led.parked for led in ledgers)
    overhead = sum(led.overhead for led in ledgers)
    free = sum(led.free for led in ledgers)
    return ModelHostStatus(
        replicas=len(counted),
        ready_replicas=ready,
        ready_text=f"{ready}/{desired}",
        models=sum(1 for h in counted for r in h.host.residents if r.present),
        memory=HostMemoryTotals(
            awake=format_quantity(awake),
            awake_bytes=awake,
            asleep=format_quantity(asleep),
            asleep_bytes=asleep,
            overhead=format_quantity(overhead),
            overhead_bytes=overhead,
            free=signed_quantity(free),
            free_bytes=free,
        ),
        hosts=pods,
        selector=selector,
    )
