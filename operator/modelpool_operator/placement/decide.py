"""Placement decisions over shared hosts' ledgers: which idle models sleep to make room, which sleeping
models are unloaded when host RAM runs short, and on which host and device a new replica goes.

Pure: hosts (``ledger.Host``) in, decisions out. A decision never over-commits a device or the host RAM
by the ledger: what it wakes or places fits after the sleeps and unloads it names, which are the first
things to apply.

Who makes room for a newcomer (a new replica, or a model waking). Sleeping is cheap and reversible (the
weights stay in host RAM; a wake takes a second or less) while unloading costs a cold start, so:

* an idle model (Ready or Idle, nothing queued or in flight, idle since before ``idle_before``: the
  planner passes ``now - MIN_IDLE_S``) of ANY priority may be put to sleep, the lowest priority first, then
  the least recently used (``eviction_order``); never a Loading, Processing or Waking model;
* only a model of a LOWER priority than the newcomer's is ever unloaded: a sleeping one, for the host RAM
  to park a model that must sleep (one that comes before that model in ``eviction_order``) or, when
  sleeping is not enough, for its process's overhead on the device (a CUDA context stays while a model
  sleeps); an idle one that the host RAM cannot park;
* an idle model of no lower priority that the host RAM cannot park is passed over.

So a pool never loses its model to a pool of no higher priority (which would be placed again, unloading
the other in turn: a ping-pong), while idle devices are shared by every priority. Every choice breaks ties
by name, so the same hosts give the same decision whatever their order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from modelpool_contract.quantity import format_quantity
from modelpool_operator.placement.ledger import (
    Host,
    ModelKey,
    Resident,
    eviction_order,
    ledger,
)

#: A model that served a request, loaded or woke less than this ago is not put to sleep for another: it is
#: likely to be asked again (a model woken for a request and slept at once would wake again: a thrash).
MIN_IDLE_S: Final = 10.0


@dataclass(frozen=True)
class Room:
    """What to do on ``host`` before ``device`` has the room asked for: put ``sleep`` to sleep and unload
    ``unload`` (sleeping models, or idle ones the host RAM cannot park). Both empty: the room is there."""

    host: str
    device: int
    sleep: tuple[ModelKey, ...] = ()
    unload: tuple[ModelKey, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.sleep and not self.unload


@dataclass(frozen=True)
class PlacementRequest:
    """A new replica of a shared pool: its size (the declared one, or a replica's measurement) and
    priority."""

    pool: ModelKey
    memory: int
    priority: int = 0


@dataclass(frozen=True)
class Placement:
    """Where the replica goes: ``room`` says what to sleep or unload there first (empty: awake room)."""

    host: str
    device: int
    room: Room


@dataclass(frozen=True)
class Unplaced:
    """No host can take the replica now: a CamelCase ``reason`` and a ``message`` for the pool's status."""

    reason: str
    message: str


# ---- making room --------------------------------------------------------------------------------------


def _may_sleep(resident: Resident, idle_before: float) -> bool:
    return resident.sleepable and resident.idle_since <= idle_before


@dataclass
class _Making:
    """A room being made on ``device`` for a newcomer of ``priority``: what it sleeps and unloads so far,
    the bytes that frees on the device, and the host RAM left. ``sleepers``: the sleeping models it may
    unload (of a lower priority only), in ``eviction_order``."""

    host: Host
    device: int
    priority: int
    ram_free: int
    sleepers: list[Resident]
    sleep: list[ModelKey] = field(default_factory=list)
    unload: list[ModelKey] = field(default_factory=list)
    freed: int = 0

    def drop(self, resident: Resident) -> None:
        """Unload ``resident``: its weights (if awake) and its process leave its device, its parked
        weights the host RAM."""
        self.unload.append(resident.pool)
        self.ram_free += resident.host_charge
        if resident.device == self.device:
            self.freed += resident.device_charge + self.host.overhead

    def park(self, resident: Resident) -> None:
        """Put an idle ``resident`` to sleep if the host RAM holds it, after unloading the sleepers that
        come before it when that makes the RAM; else unload it if its priority is lower; else pass it
        over."""
        size = resident.parked_bytes
        if size > self.ram_free:
            older = [
                s
                for s in self.sleepers
                if s.pool not in self.unload and eviction_order(s) < eviction_order(resident)
            ]
            if self.ram_free + sum(s.host_charge for s in older) >= size:
                for s in older:
                    if size <= self.ram_free:
                        break
                    self.drop(s)
        if size <= self.ram_free:
            self.sleep.append(resident.pool)
            self.ram_free -= size
            self.freed += resident.device_charge
        elif resident.priority < self.priority:
            self.drop(resident)


def _make_room_on(
    host: Host,
    device: int,
    need: int,
    priority: int,
    exclude: frozenset[ModelKey],
    *,
    idle_before: float = math.inf,
) -> Room | None:
    led = ledger(host)
    shortfall = need - led.devices[device].free
    if shortfall <= 0:
        return Room(host.name, device)
    others = [r for r in host.residents if r.pool not in exclude]
    # Only a lower priority is ever unloaded (a sleeping model anywhere on the host frees RAM).
    sleepers = sorted(
        (r for r in others if r.state == "Sleeping" and r.priority < priority), key=eviction_order
    )
    making = _Making(host, device, priority, led.host_free, sleepers)
    for resident in sorted(
        (r for r in others if r.device == device and _may_sleep(r, idle_before)), key=eviction_order
    ):
        if making.freed >= shortfall:
            break
        making.park(resident)
    # A sleeping model still holds its process's overhead on the device (a CUDA context): when sleeping
    # the idle ones is not enough, unloading sleeping ones gives that back.
    for resident in sleepers:
        if making.freed >= shortfall:
            break
        if resident.device == device and resident.pool not in making.unload:
            making.drop(resident)
    if making.freed < shortfall:
        return None
    return Room(host.name, device, sleep=tuple(making.sleep), unload=tuple(making.unload))


def _park(host: Host, resident: Resident) -> Room:
    """Put ``resident`` (awake, idle) to sleep where the host RAM holds it, after unloading the sleeping
    models that come before it in ``eviction_order``; else unload it."""
    ram_free = ledger(host).host_free
    size = resident.parked_bytes
    unload: list[ModelKey] = []
    if size > ram_free:
        older = [
            s
            for s in sorted((r for r in host.residents if r.state == "Sleeping"), key=eviction_order)
            if eviction_order(s) < eviction_order(resident)
        ]
        if ram_free + sum(s.host_charge for s in older) >= size:
            for s in older:
                if size <= ram_free:
                    break
                unload.append(s.pool)
                ram_free += s.host_charge
        else:
            return Room(host.name, resident.device, unload=(resident.pool,))
    return Room(host.name, resident.device, sleep=(resident.pool,), unload=tuple(unload))


def make_room(
    host: Host,
    device: int,
    need: int,
    *,
    priority: int,
    exclude: Iterable[ModelKey] = (),
    idle_before: float = math.inf,
) -> Room | None:
    """What to sleep (and unload) on ``device`` so that ``need`` more bytes fit awake there for a newcomer
    of ``priority`` (see the module doc: idle models of any priority, idle since before ``idle_before``,
    sleep; only lower priorities are unloaded), not touching ``exclude``; None when that cannot free
    enough. For a new model, ``need`` is its size plus ``host.overhead``; ``need`` 0 brings a device that
    measurements over-committed back within its capacity."""
    return _make_room_on(host, device, need, priority, frozenset(exclude), idle_before=idle_before)


def unload_candidates(host: Host, need: int = 0) -> tuple[ModelKey, ...] | None:
    """The sleeping models to unload so that ``need`` more bytes fit in the host RAM (0: bring the RAM
    back within ``hostMemory``), lowest priority then least recently used first; () when it fits already,
    None when even unloading every sleeping model would not do. Never a Waking model (it is not asleep)."""
    shortfall = need - ledger(host).host_free
    chosen: list[ModelKey] = []
    for resident in sorted((r for r in host.residents if r.state == "Sleeping"), key=eviction_order):
        if shortfall <= 0:
            break
        chosen.append(resident.pool)
        shortfall -= resident.host_charge
    return tuple(chosen) if shortfall <= 0 else None


def wake(host: Host, pool: ModelKey) -> Room | None:
    """What to sleep (and unload) so that ``pool``'s sleeping model can wake on its device; None when the
    device cannot be freed enough (or the model is not asleep there). Its own RAM copy is counted held
    until it is awake, as a Waking model's is."""
    resident = host.resident(pool)
    if resident is None or resident.state != "Sleeping":
        return None
    return _make_room_on(host, resident.device, resident.awake_bytes, resident.priority, frozenset({pool}))


def sleep(host: Host, pool: ModelKey) -> Room | None:
    """Put ``pool``'s idle model to sleep (an idle timeout): ``Room.sleep`` names it when the host RAM holds
    its weights (after unloading sleeping models before it in ``eviction_order``), else ``Room.unload``
    does. None when it may not sleep (not Ready or Idle, or busy)."""
    resident = host.resident(pool)
    if resident is None or not resident.sleepable:
        return None
    return _park(host, resident)


# ---- placing ------------------------------------------------------------------------------------------


def place(
    request: PlacementRequest, hosts: Sequence[Host], *, idle_before: float = math.inf
) -> Placement | Unplaced:
    """A host and device for a new replica of a shared pool, among ``hosts`` (its ModelHost's pods) that
    accept models and do not already hold the pool: a device with the room awake (the tightest fit, so
    large rooms stay whole), else one where making room does it (``make_room``: the fewest unloads, then
    the lowest priority put to sleep, then the fewest sleeps, then the tightest fit), else why not."""
    open_hosts = sorted((h for h in hosts if h.accepting), key=lambda h: h.name)
    if not open_hosts:
        return Unplaced("NoHost", "no host pod accepts models (none exists, or none is ready)")
    free_hosts = [h for h in open_hosts if not h.holds(request.pool)]
    if not free_hosts:
        return Unplaced(
            "EveryHostHoldsIt", f"every one of the {len(open_hosts)} host pods already holds the model"
        )
    largest = max(c - h.overhead for h in free_hosts for c in h.capacities)
    if request.memory > largest:
        return Unplaced("LargerThanDevice", _larger_than_device(request, free_hosts))
    awake = [
        (d.free - _need(h, request), h.name, d.index)
        for h in free_hosts
        for d in ledger(h).devices
        if d.free >= _need(h, request)
    ]
    if awake:
        _, name, index = min(awake)
        return Placement(name, index, Room(name, index))
    made: list[tuple[tuple[int, float, int, int, str, int], Room]] = []
    for h in free_hosts:
        for d in ledger(h).devices:
            room = _make_room_on(
                h, d.index, _need(h, request), request.priority, frozenset(), idle_before=idle_before
            )
            if room is not None:
                slept = max((_priority(h, key) for key in room.sleep), default=-math.inf)
                left = ledger(apply_room(h, room)).devices[d.index].free - _need(h, request)
                made.append(((len(room.unload), slept, len(room.sleep), left, h.name, d.index), room))
    if made:
        _, room = min(made, key=lambda item: item[0])
        return Placement(room.host, room.device, room)
    return Unplaced("NoRoom", _no_room(request, free_hosts))


def _need(host: Host, request: PlacementRequest) -> int:
    """What a new replica takes on a device of ``host``: its size and its process's overhead."""
    return request.memory + host.overhead


def _larger_than_device(request: PlacementRequest, hosts: Sequence[Host]) -> str:
    largest = max(hosts, key=lambda h: (max(h.capacities) - h.overhead, h.name))
    capacity = format_quantity(max(largest.capacities))
    if not largest.overhead:
        return (
            f"the model ({format_quantity(request.memory)}) is larger than any device ({capacity}): raise "
            "the ModelHost's deviceMemory or lower resources.memory"
        )
    return (
        f"the model ({format_quantity(request.memory)}) and its process's overhead "
        f"({format_quantity(largest.overhead)}, the ModelHost's modelOverhead) are larger than any device "
        f"({capacity}): raise the ModelHost's deviceMemory or lower resources.memory"
    )


def _priority(host: Host, pool: ModelKey) -> int:
    resident = host.resident(pool)
    return 0 if resident is None else resident.priority


def _no_room(request: PlacementRequest, hosts: Sequence[Host]) -> str:
    best = max(
        ((d.free, h.name, d.index) for h in hosts for d in ledger(h).devices), key=lambda x: (x[0], x[1:])
    )
    free, name, index = best
    need = max(_need(h, request) for h in hosts)
    return (
        f"no device has {format_quantity(need)} free, nor can make it by sleeping idle models or unloading "
        f"ones of priority < {request.priority}: the most free is {format_quantity(max(free, 0))} on "
        f"{name} device {index}"
    )


# ---- applying a decision to the ledger's view ------------------------------------------------------------


def apply_room(host: Host, room: Room) -> Host:
    """``host`` as it will be once ``room`` is done: ``sleep`` Sleeping, ``unload`` gone. The planner's
    running view within one pass (as the budget's ``Ledger.with_reserved``)."""
    if room.host != host.name:
        raise ValueError(f"a room on {room.host} applied to {host.name}")
    asleep, gone = set(room.sleep), set(room.unload)
    # Only the present model of each pool: a failed replica of the same pool on the host stays as it is.
    return host.with_residents(
        replace(r, state="Sleeping") if r.present and r.pool in asleep else r
        for r in host.residents
        if not (r.present and r.pool in gone)
    )


def admit(host: Host, placement: Placement, request: PlacementRequest, *, now: float) -> Host:
    """``host`` after ``placement``: its room made, and the new replica Pending on the device, charged its
    declared size."""
    made = apply_room(host, placement.room)
    newcomer = Resident(
        pool=request.pool,
        state="Pending",
        device=placement.device,
        declared=request.memory,
        priority=request.priority,
        last_used=now,
    )
    return made.with_residents((*made.residents, newcomer))
