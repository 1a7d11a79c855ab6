"""The per-device ledger of a shared host: what each model on it is charged, and where.

Plain values in, plain values out (no Kopf, no I/O). A host pod has devices (its GPUs, or the CPU alone
on a CPU host), each with the capacity ``ModelHost.spec.deviceMemory``, and ``hostMemory`` of RAM for
sleeping models' weights. Each model on it (a ``Resident``: one replica of a shared pool) is charged:

* awake (Pending, Loading, Ready, Processing, Idle, Waking, Evicting): on its device, the larger of its
  declared size (``spec.resources.memory``) and the accelerator memory its server measured
  (``modelpool_contract.placements.device_charge``: the host charges it by the same rule, so the two
  ledgers agree on every device's room);
* asleep (Sleeping): nothing on its device; its parked weights in host RAM (measured when the host
  reported them, else what it held awake). A Waking model still holds its RAM copy until it is awake;
* Failed or Dead: nothing.

Beyond its weights, every model present on a host (awake or asleep: not Failed or Dead) is charged the
host's ``overhead`` on its device: its own inference process, whose CUDA context stays on the GPU while
the model sleeps (on a CPU host: the process's RAM, out of ``deviceMemory``). A device's ``free`` is its
capacity less both, so that a device is never over-committed by the ledger, processes included
(``ModelHost.spec.modelOverhead``, default ``modelpool_contract.placements.default_model_overhead``).

The ledger is derived from the residents at every call, like the ModelBudget's (``budget.py``): nothing
is counted that could leak.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Final

from modelpool_contract.api import HostModelState
from modelpool_contract.placements import device_charge
from modelpool_contract.states import CHARGED_STATES, DEVICE_CHARGED_STATES, DORMANT_STATES, SLEEPABLE_STATES

#: A model's state on a host: the worker states, plus Sleeping (weights parked in host RAM, device memory
#: returned) and Waking (weights on their way back); the contract's one definition.
ModelState = HostModelState
#: Charged on its device: every state but Sleeping that holds memory (the host's own rule too).
AWAKE_STATES: Final = DEVICE_CHARGED_STATES
#: Holds host RAM.
PARKED_STATES: Final = DORMANT_STATES
#: Never chosen to sleep or to unload, whatever else holds.
PROTECTED_STATES: Final[frozenset[ModelState]] = frozenset({"Loading", "Processing", "Waking"})

#: A shared pool: (namespace, name). A host holds at most one replica of a pool, so it names a resident.
ModelKey = tuple[str, str]


@dataclass(frozen=True)
class Resident:
    """One shared pool's model on a host, as the operator observed it."""

    pool: ModelKey
    state: ModelState
    device: int
    declared: int
    measured: int | None = None  # accelerator bytes its server measured while awake
    parked: int | None = None  # host-RAM bytes its host reported while it sleeps
    priority: int = 0  # the pool's spec.priority
    last_used: float = 0.0  # when it last served a request (Unix seconds)
    busy: bool = False  # requests queued or in flight
    since: float = 0.0  # when it entered its state (Unix seconds; 0: unknown)

    @property
    def awake_bytes(self) -> int:
        """What it is charged on its device while awake (the host's rule: ``device_charge``)."""
        return device_charge(self.declared, self.measured)

    @property
    def parked_bytes(self) -> int:
        """What its weights hold in host RAM while it sleeps: reported, else what it held awake."""
        return self.parked if self.parked is not None else self.awake_bytes

    @property
    def device_charge(self) -> int:
        return self.awake_bytes if self.state in AWAKE_STATES else 0

    @property
    def host_charge(self) -> int:
        return self.parked_bytes if self.state in PARKED_STATES else 0

    @property
    def sleepable(self) -> bool:
        return self.state in SLEEPABLE_STATES and not self.busy

    @property
    def idle_since(self) -> float:
        """Since when it has had nothing to do: its last request, or when it turned Ready if later (loaded,
        woken, or done with a request). An Idle model turned Idle after a quiet spell: its last request."""
        return self.last_used if self.state == "Idle" else max(self.last_used, self.since)

    @property
    def present(self) -> bool:
        """Holds (or is about to hold) memory on the host: not Failed or Dead."""
        return self.state in CHARGED_STATES


def eviction_order(resident: Resident) -> tuple[int, float, ModelKey]:
    """Who makes room first: the lowest priority, then the least recently used (then by name, so that
    every decision is deterministic)."""
    return (resident.priority, resident.last_used, resident.pool)


@dataclass(frozen=True)
class Host:
    """One host pod: its devices' capacities, its RAM for sleeping models, and the models on it."""

    name: str
    capacities: tuple[int, ...]  # per device, bytes
    host_memory: int = 0  # RAM for sleeping models, bytes (0: nothing sleeps)
    residents: tuple[Resident, ...] = ()
    accepting: bool = True  # False: no new model goes there (not ready, being deleted)
    overhead: int = 0  # charged on its device to each model present, awake or asleep (its process)

    def resident(self, pool: ModelKey) -> Resident | None:
        """The pool's model on this host, if it is present."""
        return next((r for r in self.residents if r.pool == pool and r.present), None)

    def holds(self, pool: ModelKey) -> bool:
        return self.resident(pool) is not None

    def with_residents(self, residents: Iterable[Resident]) -> Host:
        return replace(self, residents=tuple(residents))


@dataclass(frozen=True)
class DeviceLedger:
    """One device: its capacity, what awake models are charged on it, what its sleeping models park, and
    what the processes of all its models (awake or asleep) hold on it."""

    index: int
    capacity: int
    awake: int
    asleep: int
    overhead: int = 0

    @property
    def free(self) -> int:
        """capacity - awake - overhead; negative when measurements grew beyond it (over-committed)."""
        return self.capacity - self.awake - self.overhead


@dataclass(frozen=True)
class HostLedger:
    """A host pod's devices and its host RAM."""

    host: str
    devices: tuple[DeviceLedger, ...]
    host_memory: int
    parked: int

    @property
    def host_free(self) -> int:
        """hostMemory - parked; negative when the parked weights grew beyond it."""
        return self.host_memory - self.parked

    @property
    def awake(self) -> int:
        return sum(d.awake for d in self.devices)

    @property
    def overhead(self) -> int:
        return sum(d.overhead for d in self.devices)

    @property
    def free(self) -> int:
        return sum(d.free for d in self.devices)


def ledger(host: Host) -> HostLedger:
    """The host's ledger, derived from its residents."""
    awake = [0] * len(host.capacities)
    asleep = [0] * len(host.capacities)
    overhead = [0] * len(host.capacities)
    for r in host.residents:
        if not 0 <= r.device < len(host.capacities):
            raise ValueError(f"{host.name}: {r.pool} is on device {r.device}, which the host does not have")
        awake[r.device] += r.device_charge
        asleep[r.device] += r.host_charge
        overhead[r.device] += host.overhead if r.present else 0
    devices = tuple(
        DeviceLedger(index=i, capacity=c, awake=awake[i], asleep=asleep[i], overhead=overhead[i])
        for i, c in enumerate(host.capacities)
    )
    return HostLedger(host=host.name, devices=devices, host_memory=host.host_memory, parked=sum(asleep))


def fits(host: Host, device: int, nbytes: int) -> bool:
    """True when ``nbytes`` more fit awake on ``device`` without sleeping anything (for a model already
    there: its overhead is charged; for a new one, add ``host.overhead`` to ``nbytes``)."""
    return ledger(host).devices[device].free >= nbytes


def over_committed(host: Host) -> list[str]:
    """What the ledger finds beyond a capacity (empty: nothing): each device, and the host RAM."""
    led = ledger(host)
    found = [
        f"{host.name} device {d.index}: {d.awake} charged + {d.overhead} overhead > {d.capacity}"
        for d in led.devices
        if d.free < 0
    ]
    if led.host_free < 0:
        found.append(f"{host.name} host memory: {led.parked} parked > {led.host_memory}")
    return found
