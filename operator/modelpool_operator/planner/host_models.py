"""The models on a ModelHost's pods (pure): which shared pools' models to load, unload and put to sleep on
its host pods, as the control calls that do it (``plan_models``), and the ``modelpool.dev/models``
annotation of each host pod. Where a new replica goes is ``placement.place``'s decision, over the ledger.

Over the host pods as the ledger sees them (``placement.ledger.Host``: their models from ``/stats``) and
the shared pools on the ModelHost (``SharedPool``), in this order, each step on the view the previous ones
leave (``placement.apply_room``, ``placement.admit``), so a device is never over-committed by what one
pass decides:

1. unload the models whose pool is gone or being deleted, and those whose pool's load settings changed
   since they were loaded (they are loaded again with the new ones by a later pass: a model this pass
   unloads from a host pod is not loaded there again in the same pass);
2. on each host pod whose parked weights exceed its ``hostMemory``: unload ``unload_candidates``;
3. pool by pool (the highest priority first, then by name): a pool held by more host pods than its
   ``replicas`` is unloaded from the surplus ones (sleeping first, then the least recently used); one held
   by fewer is placed (``placement.place``) on more, each placement's room made first (its sleeps and
   unloads), until it has its replicas or ``place`` says why not (``unplaced``). Room is made by
   sleeping idle models of any priority (idle for ``MIN_IDLE_S`` at least: one just used, loaded or
   woken stays awake) and by unloading only models of a lower priority (``placement.decide``): a pool
   never loses its model to a pool of no higher priority, which would be placed again and unload the
   other in turn.

A model whose load is in flight (``loading``) is a Pending resident charged its declared size on the device
its load named (``devices``), and is neither placed again nor unloaded; a (host pod, pool) in ``backoff``
(a control call there failed recently) is not tried again yet. A Failed model stays where it failed, so
its pool's status shows why, until its pool's backoff is over (``SharedPool.retry``: unloaded, then placed
again), its settings change or its pool goes; meanwhile the pool is placed on other host pods (a failed
model is not one of its replicas). A pool's ``replicas`` is its count as its own pass decided it
(``planner.shared_scale``: autoscaling, demand, idleness).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from modelpool_contract.placements import models_annotation
from modelpool_operator.placement.decide import (
    MIN_IDLE_S,
    Placement,
    PlacementRequest,
    Room,
    Unplaced,
    admit,
    apply_room,
    place,
    unload_candidates,
)
from modelpool_operator.placement.ledger import Host, ModelKey, Resident

#: (host pod, pool name): one model on one host pod.
Slot = tuple[str, str]
Action = Literal["load", "unload", "sleep"]


@dataclass(frozen=True)
class SharedPool:
    """A shared pool on the ModelHost: how many host pods should hold its model, and how a host loads it
    (``load``: the JSON of ``pool.host_load_settings``)."""

    name: str
    replicas: int
    load: str
    declared: int = 0
    priority: int = 0
    deleting: bool = False
    # The host pods where its Failed model is due for a retry (its pool's backoff ran out): unloaded there,
    # then placed again.
    retry: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Control:
    """One control call on a host pod: load (with ``load``, the settings' JSON, on device index ``device``
    of the host pod), unload or sleep ``pool``'s model; ``why`` says so in the log and the Events."""

    action: Action
    pod: str
    pool: str
    why: str
    load: str | None = None
    device: int = 0


@dataclass(frozen=True)
class ModelCalls:
    """A ModelHost pass's control calls (in order: every sleep and unload before any load), and the
    pools that could not be placed now, with ``place``'s reason."""

    calls: tuple[Control, ...] = ()
    unplaced: Mapping[str, Unplaced] = field(default_factory=dict)
    # Seconds until an idle model that is too fresh to sleep now (``MIN_IDLE_S``) may make room for an
    # unplaced pool: the pass runs again then, not a resync later. None: nothing to wait for.
    retry_in: float | None = None

    def loads(self) -> tuple[Control, ...]:
        return tuple(c for c in self.calls if c.action == "load")


class _View:
    """The host pods as the pass's calls leave them (the running view, as the budget's ``with_reserved``)."""

    def __init__(self, hosts: Iterable[Host]) -> None:
        self.hosts = {h.name: h for h in hosts}
        self.calls: list[Control] = []
        # Unloaded by this pass: not loaded there again before a later pass sees the host without it.
        self.unloaded: set[Slot] = set()

    def unload(self, pod: str, key: ModelKey, why: str) -> None:
        self._room(Room(pod, 0, unload=(key,)), why)

    def _room(self, room: Room, why: str) -> None:
        host = self.hosts[room.host]
        for key in room.sleep:
            self.calls.append(Control("sleep", room.host, key[1], why))
        for key in room.unload:
            self.calls.append(Control("unload", room.host, key[1], why))
            self.unloaded.add((room.host, key[1]))
        # A model that failed is no longer present: ``apply_room`` keeps it; the unload drops it here.
        gone = {k for k in room.unload if host.resident(k) is None}
        host = apply_room(host, Room(room.host, room.device, room.sleep, tuple(set(room.unload) - gone)))
        self.hosts[room.host] = host.with_residents(r for r in host.residents if r.pool not in gone)

    def place(self, placement: Placement, request: PlacementRequest, load: str, now: float) -> None:
        self._room(placement.room, f"making room for {request.pool[1]}")
        self.hosts[placement.host] = admit(self.hosts[placement.host], placement, request, now=now)
        self.calls.append(Control("load", placement.host, request.pool[1], "placed", load, placement.device))


def _with_loading(
    host: Host,
    namespace: str,
    loading: Iterable[Slot],
    pools: Mapping[str, SharedPool],
    devices: Mapping[Slot, int],
) -> Host:
    """``host`` with the loads in flight there that its ``/stats`` does not show yet, as Pending residents
    on the device each load named (0 when unknown)."""
    added = [
        Resident(
            pool=(namespace, pool),
            state="Pending",
            device=min(devices.get((pod, pool), 0), len(host.capacities) - 1),
            declared=p.declared,
            priority=p.priority,
        )
        for pod, pool in loading
        if pod == host.name and (p := pools.get(pool)) is not None and not _listed(host, pool)
    ]
    return host.with_residents((*host.residents, *added)) if added else host


def _listed(host: Host, pool: str) -> bool:
    """The host reports a model of that pool, in any state (Failed included)."""
    return any(r.pool[1] == pool for r in host.residents)


def _surplus_order(resident: Resident) -> tuple[bool, bool, bool, float, ModelKey]:
    """Which replica goes first when a pool has too many: a sleeping one, then one not serving yet
    (loading), then an idle one, the least recently used first; the serving ones stay."""
    loading = resident.state in ("Pending", "Loading")
    return (resident.state != "Sleeping", not loading, resident.busy, resident.last_used, resident.pool)


def plan_models(
    namespace: str,
    hosts: Sequence[Host],
    pools: Sequence[SharedPool],
    *,
    loading: Iterable[Slot] = (),
    loaded: Mapping[Slot, str] | None = None,
    stale: Iterable[Slot] = (),
    backoff: Iterable[Slot] = (),
    now: float | None = None,
    devices: Mapping[Slot, int] | None = None,
) -> ModelCalls:
    """The control calls of one ModelHost pass (see the module doc). ``loaded``: the settings each model
    was loaded with by this process; ``stale``: models whose host reports another source or task than
    their pool's (loaded by an earlier process, or by hand); ``now`` (Unix seconds; None: no clock) puts
    to sleep only models idle for ``MIN_IDLE_S``; ``devices``: the device each load in flight named."""
    idle_before = math.inf if now is None else now - MIN_IDLE_S
    by_name = {p.name: p for p in pools}
    loading, blocked, loaded, stale = set(loading), set(backoff), loaded or {}, set(stale)
    view = _View(_with_loading(h, namespace, loading, by_name, devices or {}) for h in hosts)
    # 1. pools gone or being deleted, settings changed
    for pod, host in sorted(view.hosts.items()):
        for resident in sorted(host.residents, key=lambda r: r.pool):
            pool = by_name.get(resident.pool[1])
            slot = (pod, resident.pool[1])
            if slot in loading or slot in blocked:
                continue
            if pool is None or pool.deleting:
                view.unload(pod, resident.pool, "its pool is gone" if pool is None else "its pool is deleted")
            elif (slot in loaded and loaded[slot] != pool.load) or slot in stale:
                view.unload(pod, resident.pool, "its pool's model settings changed")
            elif resident.state == "Failed" and pod in pool.retry:
                view.unload(pod, resident.pool, "it failed and its pool's backoff is over: tried again")
    # 2. host RAM over-committed
    for pod in sorted(view.hosts):
        for key in unload_candidates(view.hosts[pod]) or ():
            if (pod, key[1]) not in loading:
                view.unload(pod, key, "the host's memory for sleeping models is short")
    # 3. each pool's replicas
    unplaced: dict[str, Unplaced] = {}
    for pool in sorted(pools, key=lambda p: (-p.priority, p.name)):
        if pool.deleting:
            continue
        key = (namespace, pool.name)
        holding = sorted(
            ((pod, r) for pod, h in view.hosts.items() if (r := h.resident(key)) is not None),
            key=lambda item: _surplus_order(item[1]),
        )
        for pod, _ in holding[: max(len(holding) - pool.replicas, 0)]:
            if (pod, pool.name) not in loading:
                view.unload(pod, key, f"its pool's count is {pool.replicas}")
        missing = pool.replicas - len(holding)
        request = PlacementRequest(key, pool.declared, pool.priority)
        for _ in range(max(missing, 0)):
            # Not where it failed (it stays there until its settings change) nor where a call failed lately.
            open_hosts = [
                h
                for pod, h in sorted(view.hosts.items())
                if not _listed(h, pool.name) and (pod, pool.name) not in blocked | view.unloaded
            ]
            decided = (
                place(request, open_hosts, idle_before=idle_before)
                if open_hosts
                else _nowhere(view.hosts.values(), pool.name)
            )
            if isinstance(decided, Unplaced):
                unplaced[pool.name] = decided
                break
            view.place(decided, request, pool.load, 0.0 if now is None else now)
    ordered = sorted(view.calls, key=lambda c: c.action == "load")  # stable: every sleep/unload first
    retry_in = _fresh_idle_in(view.hosts.values(), now) if unplaced and now is not None else None
    return ModelCalls(calls=tuple(ordered), unplaced=unplaced, retry_in=retry_in)


def _fresh_idle_in(hosts: Iterable[Host], now: float) -> float | None:
    """Seconds until the first sleepable model idle for less than ``MIN_IDLE_S`` may be slept (None: none)."""
    waits = [
        r.idle_since + MIN_IDLE_S - now
        for h in hosts
        for r in h.residents
        if r.sleepable and r.idle_since + MIN_IDLE_S > now
    ]
    return min(waits, default=None)


def _nowhere(hosts: Iterable[Host], pool: str) -> Unplaced:
    listed = [h.name for h in hosts if _listed(h, pool)]
    if listed:
        return Unplaced(
            "EveryHostHoldsIt", f"every host pod holds the model or failed it ({', '.join(listed)})"
        )
    return Unplaced("NoHost", "no host pod accepts models (none exists, or none is ready)")


def models_annotations(hosts: Iterable[Host]) -> dict[str, str]:
    """Each host pod's ``modelpool.dev/models`` value: its models' pools and states as its ``/stats`` says."""
    return {h.name: models_annotation({r.pool[1]: r.state for r in h.residents}) for h in hosts}
