"""Shared hosts (issue 21): the per-device ledger of a host pod and the placement decisions over it.

Pure (no Kopf, no I/O): ``ledger`` charges each model on a host (``ledger``, ``fits``), ``decide`` picks
what sleeps, what is unloaded and where a new replica goes (``make_room``, ``unload_candidates``,
``wake``, ``sleep``, ``place``), ``charge`` says what a host pod costs the ModelBudget, and ``status``
writes a ModelHost's status. The operator's passes observe the hosts into ``Host`` values, call these,
and apply the answers.
"""

from modelpool_operator.placement.charge import host_charge, hosts_admitted
from modelpool_operator.placement.decide import (
    Placement,
    PlacementRequest,
    Room,
    Unplaced,
    admit,
    apply_room,
    make_room,
    place,
    sleep,
    unload_candidates,
    wake,
)
from modelpool_operator.placement.ledger import (
    DeviceLedger,
    Host,
    HostLedger,
    ModelKey,
    ModelState,
    Resident,
    eviction_order,
    fits,
    ledger,
    over_committed,
)
from modelpool_operator.placement.status import ObservedHost, host_pod_status, host_status, signed_quantity

__all__ = [
    "DeviceLedger",
    "Host",
    "HostLedger",
    "ModelKey",
    "ModelState",
    "ObservedHost",
    "Placement",
    "PlacementRequest",
    "Resident",
    "Room",
    "Unplaced",
    "admit",
    "apply_room",
    "eviction_order",
    "fits",
    "host_charge",
    "host_pod_status",
    "host_status",
    "hosts_admitted",
    "ledger",
    "make_room",
    "over_committed",
    "place",
    "signed_quantity",
    "sleep",
    "unload_candidates",
    "wake",
]
