"""Hypothesis: the shared hosts' ledger over random sequences of place / load / serve / measure / sleep /
wake / unload / fail, applying every decision as the operator would.

Invariants, checked at every step:
* no device and no host RAM is ever over-committed by a decision, each model's process overhead (the
  host's ``overhead``, charged on its device awake or asleep, never for a Failed or Dead one) included:
  what a decision places or wakes fits after the sleeps and unloads it names, and a decision never
  lowers a device's free memory below zero
  (nor below where a measurement left it); while no measurement has grown beyond a device, no device is
  over-committed at all;
* a Loading, Processing, Waking (or Pending, Evicting, busy) model is never chosen to sleep or unload;
  only sleeping or idle models are unloaded;
* priority: room for a newcomer (a placement, a wake) puts idle models of any priority to sleep, but
  only those idle since before the decision's ``idle_before``; it unloads only models of a lower
  priority than the newcomer's;
* the ModelBudget admits host pods as workers, each charged at least what its devices hand out, so the
  models on them stay within the budget (a test of its own below);
* placements are deterministic: the same hosts in another order give the same decision; and a replica
  is refused (NoRoom) only when no device has the room nor can make it.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from modelpool_contract.api import parse_host_spec
from modelpool_contract.states import WorkerState
from modelpool_operator.budget import Ledger
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
from modelpool_operator.placement.ledger import Host, ModelKey, Resident, ledger, over_committed

GI = 2**30
POOLS = [("ns", f"m{i}") for i in range(12)]
# The only states a decision may take a model out of (spelt out here, not taken from the code under test).
IDLE = {"Ready", "Idle"}
DOWN = {"Failed", "Dead"}  # their processes are gone: charged nothing
SIZES = st.sampled_from([1, 2, 5, 10, 15, 20, 30, 50, 90])  # GiB; 90 fits no device
PRIORITIES = st.integers(-2, 2)


def check_room(
    before: Host, room: Room, priority: int | None = None, idle_before: float = float("inf")
) -> None:
    """What a room names may be slept or unloaded: idle models, or (unloads) sleeping ones; for a newcomer
    of ``priority``, only models idle since before ``idle_before`` sleep and only lower priorities go."""
    named = [*room.sleep, *room.unload]
    assert len(named) == len(set(named)), room
    for key in room.sleep:
        resident = before.resident(key)
        assert resident is not None and resident.state in IDLE and not resident.busy, (key, resident)
        if priority is not None:
            assert max(resident.last_used, resident.since) <= idle_before or resident.state == "Idle"
    for key in room.unload:
        resident = before.resident(key)
        assert resident is not None, key
        assert resident.state == "Sleeping" or (resident.state in IDLE and not resident.busy), (key, resident)
        if priority is not None:
            assert resident.priority < priority, (key, resident, priority)


def check_decision(before: Host, after: Host, target: int | None, need: int = 0) -> None:
    """A decision never over-commits: the target device has ``need`` free, no device and not the host RAM
    ends below zero or below where it was."""
    b, a = ledger(before), ledger(after)
    for was, now in zip(b.devices, a.devices, strict=True):
        assert now.free >= min(was.free, 0), (before, after)
    if target is not None:
        assert a.devices[target].free >= need, (before, after)
    assert a.host_free >= min(b.host_free, 0), (before, after)


class SharedHosts(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, Host] = {}
        self.clock = 0.0
        self.grown = False  # a measurement took a device beyond its capacity

    @initialize(
        shapes=st.lists(
            st.tuples(
                st.integers(1, 2),
                st.sampled_from([20, 40, 80]),
                st.sampled_from([0, 20, 60, 200]),
                st.sampled_from([0, 0, 1, 3]),  # each model's process overhead, GiB
            ),
            min_size=1,
            max_size=3,
        ),
        # Enough to fill the hosts often, so that later placements must make room.
        models=st.lists(st.tuples(st.sampled_from(POOLS), SIZES, PRIORITIES), min_size=4, max_size=16),
    )
    def make_hosts(
        self, shapes: list[tuple[int, int, int, int]], models: list[tuple[ModelKey, int, int]]
    ) -> None:
        for i, (devices, cap, ram, overhead) in enumerate(shapes):
            name = f"h-{i}"
            self.hosts[name] = Host(
                name=name, capacities=(cap * GI,) * devices, host_memory=ram * GI, overhead=overhead * GI
            )
        # Start from hosts already holding idle models (placed by the rule below, then loaded).
        for pool, gib, priority in models:
            self.place_replica(pool, gib, priority)
        for host, r in self.residents("Pending"):
            self.set_resident(host, r, replace(r, state="Idle", last_used=self.tick()))

    # ---- helpers ----

    def tick(self) -> float:
        self.clock += 1
        return self.clock

    def residents(self, *states: str) -> list[tuple[str, Resident]]:
        return [
            (h.name, r) for h in self.hosts.values() for r in h.residents if not states or r.state in states
        ]

    def set_resident(self, host: str, old: Resident, new: Resident) -> None:
        h = self.hosts[host]
        self.hosts[host] = h.with_residents(new if r is old else r for r in h.residents)

    def decide(self, host: str, room: Room, target: int | None, need: int = 0) -> Host:
        before = self.hosts[host]
        check_room(before, room)
        after = apply_room(before, room)
        check_decision(before, after, target, need)
        self.hosts[host] = after
        return after

    # ---- rules ----

    @rule(pool=st.sampled_from(POOLS), gib=SIZES, priority=PRIORITIES, recent=st.sampled_from([0, 0, 3, 8]))
    def place_replica(self, pool: ModelKey, gib: int, priority: int, recent: int = 0) -> None:
        request = PlacementRequest(pool, gib * GI, priority)
        hosts = list(self.hosts.values())
        # Only models idle for ``recent`` ticks may sleep (the planner's MIN_IDLE_S).
        idle_before = self.clock - recent
        decision = place(request, hosts, idle_before=idle_before)
        assert place(request, hosts[::-1], idle_before=idle_before) == decision  # whatever the order
        if isinstance(decision, Unplaced):
            event(f"unplaced: {decision.reason}")
            if decision.reason == "NoRoom":
                for h in hosts:
                    if h.holds(pool):
                        continue
                    need = request.memory + h.overhead  # a new model brings its process
                    for d in ledger(h).devices:
                        assert d.free < need
                        assert make_room(h, d.index, need, priority=priority, idle_before=idle_before) is None
            return
        assert isinstance(decision, Placement)
        event("placed awake" if decision.room.empty else "placed after making room")
        before = self.hosts[decision.host]
        assert not before.holds(pool)
        check_room(before, decision.room, priority, idle_before)
        if any((r := before.resident(k)) is not None and r.priority > priority for k in decision.room.sleep):
            event("slept a higher priority")
        after = admit(before, decision, request, now=self.tick())
        check_decision(before, after, decision.device)
        self.hosts[decision.host] = after

    @rule(data=st.data(), idle=st.booleans())
    def finish_loading(self, data: st.DataObject, idle: bool) -> None:
        loading = self.residents("Pending", "Loading")
        if loading:
            host, r = data.draw(st.sampled_from(loading))
            state: WorkerState = "Loading" if r.state == "Pending" else ("Idle" if idle else "Ready")
            self.set_resident(host, r, replace(r, state=state, since=self.tick()))

    @rule(data=st.data(), busy=st.booleans())
    def serve(self, data: st.DataObject, busy: bool) -> None:
        serving = self.residents("Ready", "Idle", "Processing")
        if serving:
            host, r = data.draw(st.sampled_from(serving))
            state: WorkerState = "Idle" if r.state == "Processing" else "Processing"
            now = self.tick()
            served = replace(r, state=state, busy=busy and state != "Idle", last_used=now, since=now)
            self.set_resident(host, r, served)

    @rule(data=st.data(), percent=st.integers(25, 200))
    def measure(self, data: st.DataObject, percent: int) -> None:
        awake = self.residents("Loading", "Ready", "Idle", "Processing")
        if awake:
            host, r = data.draw(st.sampled_from(awake))
            self.set_resident(host, r, replace(r, measured=r.declared * percent // 100))
            if over_committed(self.hosts[host]):
                self.grown = True

    @rule(data=st.data(), any_state=st.booleans())
    def idle_sleep(self, data: st.DataObject, any_state: bool) -> None:
        # Mostly an idle model (an idle timeout), sometimes any model (which must be refused unless idle).
        present = self.residents() if any_state else self.residents(*IDLE)
        if present:
            host, r = data.draw(st.sampled_from(present))
            room = sleep(self.hosts[host], r.pool)
            if room is None:
                assert r.state not in IDLE or r.busy
            else:
                event("slept" if room.sleep else "unloaded instead of sleeping")
                # It sleeps (after unloading older sleepers), or it is unloaded itself, nothing else.
                assert room.sleep == (r.pool,) or (room.sleep == () and room.unload == (r.pool,)), room
                self.decide(host, room, None)

    @rule(data=st.data())
    def wake_on_request(self, data: st.DataObject) -> None:
        asleep = self.residents("Sleeping")
        if asleep:
            host, r = data.draw(st.sampled_from(asleep))
            room = wake(self.hosts[host], r.pool)
            event("woken" if room is not None else "could not wake")
            if room is not None:
                check_room(self.hosts[host], room, r.priority)
                after = self.decide(host, room, r.device, need=r.awake_bytes)
                waking = after.resident(r.pool)
                assert waking is not None and waking.state == "Sleeping"  # never its own unload
                before = after
                self.set_resident(host, waking, replace(waking, state="Waking", last_used=self.tick()))
                check_decision(before, self.hosts[host], r.device)

    @rule(data=st.data())
    def woken(self, data: st.DataObject) -> None:
        waking = self.residents("Waking")
        if waking:
            host, r = data.draw(st.sampled_from(waking))
            self.set_resident(host, r, replace(r, state="Ready", since=self.tick()))

    @rule(data=st.data(), gib=st.integers(0, 40))
    def host_ram_short(self, data: st.DataObject, gib: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.hosts)))
        before = self.hosts[name]
        chosen = unload_candidates(before, gib * GI)
        if chosen is None:
            return
        for key in chosen:
            resident = before.resident(key)
            assert resident is not None and resident.state == "Sleeping"
        after = self.decide(name, Room(name, 0, unload=chosen), None)
        assert ledger(after).host_free >= gib * GI

    @rule()
    def rebalance(self) -> None:
        # A measurement that grew beyond a device: the operator sleeps idle models until it fits again.
        for name, h in list(self.hosts.items()):
            for d in ledger(h).devices:
                if d.free < 0:
                    room = make_room(self.hosts[name], d.index, 0, priority=10**6)
                    if room is not None:
                        self.decide(name, room, d.index)

    @rule(data=st.data(), dead=st.booleans())
    def fail_or_go(self, data: st.DataObject, dead: bool) -> None:
        present = self.residents()
        if present:
            host, r = data.draw(st.sampled_from(present))
            self.set_resident(host, r, replace(r, state="Dead" if dead else "Failed"))

    # ---- invariants ----

    @invariant()
    def within_capacity_unless_measured_beyond(self) -> None:
        for h in self.hosts.values():
            ledger(h)  # every resident on a device its host has
            if not self.grown:
                assert over_committed(h) == [], h
                # Counted here without the ledger: awake weights and every present model's process.
                for index, capacity in enumerate(h.capacities):
                    on = [r for r in h.residents if r.device == index]
                    awake = sum(r.awake_bytes for r in on if r.state not in DOWN | {"Sleeping"})
                    processes = sum(h.overhead for r in on if r.state not in DOWN)
                    assert awake + processes <= capacity, h
            assert ledger(h).host_free >= 0, h  # host RAM: only decisions fill it

    @invariant()
    def one_replica_per_host(self) -> None:
        for h in self.hosts.values():
            present = [r.pool for r in h.residents if r.present]
            assert len(present) == len(set(present))


SharedHosts.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_shared_hosts = SharedHosts.TestCase


@given(
    total=st.none() | st.integers(0, 10**4),
    used=st.integers(0, 10**4),
    reserved=st.integers(0, 10**3),
    devices=st.integers(0, 8),
    device=st.integers(1, 200),
    ram=st.integers(0, 100),
    wanted=st.integers(0, 20),
)
def test_the_budget_bounds_the_host_pods_and_so_every_model_on_them(
    *, total: int | None, used: int, reserved: int, devices: int, device: int, ram: int, wanted: int
) -> None:
    spec = parse_host_spec({"gpusPerHost": devices, "deviceMemory": device, "hostMemory": ram})
    charge = host_charge(spec)
    # What the per-device ledgers can ever hand out on one pod is within what the pod is charged.
    assert spec.devices * spec.device_memory_bytes <= charge
    budget = Ledger(total=total, used=used, reserved=reserved)
    admitted = hosts_admitted(budget, charge, wanted)
    assert 0 <= admitted <= wanted
    if total is not None:
        assert admitted == 0 or used + reserved + admitted * charge <= total
        # As many as fit: one more would not.
        assert admitted == wanted or used + reserved + (admitted + 1) * charge > total
    else:
        assert admitted == wanted
