"""How the ModelBudget bounds shared hosts: each host pod is charged its whole devices, like a worker.

A host pod owns its GPUs (``nvidia.com/gpu``) whether its models fill them or not, so it is charged
against the ModelBudget as a dedicated worker is, with ``gpusPerHost x deviceMemory`` (a CPU host: its
``deviceMemory`` plus its ``hostMemory``, both RAM, as a CPU pool's workers are charged their RAM). The
budget's ledger (``modelpool_operator.budget``) then admits host pods exactly as it admits workers, with
reservations, unchanged for dedicated pools; the models placed inside a host are bounded by its per-device
ledger (``placement.ledger``), which never hands out more than ``deviceMemory`` per device. So the models
awake on shared hosts never exceed what the budget admitted: sum(awake) <= sum(host charges) <= total.
"""

from __future__ import annotations

from modelpool_contract.api import ModelHostSpec
from modelpool_operator.budget import Ledger, admits


def host_charge(spec: ModelHostSpec) -> int:
    """What one host pod is charged against the ModelBudget, in bytes."""
    devices = spec.devices * spec.device_memory_bytes
    return devices if spec.gpus_per_host > 0 else devices + spec.host_memory_bytes


def hosts_admitted(budget: Ledger, charge: int, wanted: int) -> int:
    """How many of ``wanted`` new host pods of ``charge`` bytes each the budget admits now (the caller
    reserves them, as it reserves workers)."""
    admitted = 0
    view = budget
    while admitted < wanted and admits(view, charge):
        view = view.with_reserved(charge)
        admitted += 1
    return admitted
