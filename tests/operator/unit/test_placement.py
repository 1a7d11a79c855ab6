"""The shared hosts' ledger and placement decisions, case by case (pure: placement/)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from modelpool_contract.api import ModelHostStatus, parse_host_spec
from modelpool_operator.budget import build_ledger
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
from modelpool_operator.placement.ledger import Host, Resident, fits, ledger, over_committed
from modelpool_operator.placement.status import ObservedHost, host_status

GI = 2**30


def model(
    name: str,
    state: str = "Idle",
    *,
    gib: int = 10,
    device: int = 0,
    prio: int = 0,
    used: float = 0,
    **kw: object,
) -> Resident:
    return Resident(
        pool=("ns", name),
        state=state,  # type: ignore[arg-type]
        device=device,
        declared=gib * GI,
        priority=prio,
        last_used=used,
        **kw,  # type: ignore[arg-type]
    )


def host(*residents: Resident, name: str = "h-0", devices: int = 1, cap: int = 40, ram: int = 40) -> Host:
    return Host(name=name, capacities=(cap * GI,) * devices, host_memory=ram * GI, residents=residents)


# ---- the ledger -------------------------------------------------------------------------------------------


def test_awake_models_charge_their_device_sleeping_ones_host_ram_failed_ones_nothing() -> None:
    h = host(
        model("a", "Ready", gib=10),
        model("b", "Loading", gib=5, device=1),
        model("c", "Sleeping", gib=8),
        model("d", "Failed", gib=20),
        model("e", "Waking", gib=4, device=1),
        devices=2,
    )
    led = ledger(h)
    assert [d.awake for d in led.devices] == [10 * GI, 9 * GI]
    assert [d.asleep for d in led.devices] == [
        8 * GI,
        4 * GI,
    ]  # a Waking model holds its RAM copy until awake
    assert led.devices[0].free == 30 * GI and led.parked == 12 * GI and led.host_free == 28 * GI
    assert fits(h, 0, 30 * GI) and not fits(h, 0, 30 * GI + 1)


def test_a_model_is_charged_the_larger_of_its_declaration_and_its_measurement_as_on_its_host() -> None:
    """One rule in both ledgers (``device_charge``): crediting a measurement below the declaration would
    show room the host does not give (it charges the larger), and its load would be refused."""
    loaded = model("a", "Ready", gib=10, measured=6 * GI)
    assert loaded.device_charge == 10 * GI  # smaller than declared: the declaration
    assert replace(loaded, measured=14 * GI).device_charge == 14 * GI  # larger: the measurement
    for state in ("Loading", "Waking", "Idle", "Processing"):
        assert replace(loaded, state=state).device_charge == 10 * GI
        assert replace(loaded, state=state, measured=12 * GI).device_charge == 12 * GI
    assert replace(loaded, measured=None).device_charge == 10 * GI
    # Asleep: its parked bytes as the host reports them, else what it held awake.
    assert replace(loaded, state="Sleeping").host_charge == 10 * GI
    assert replace(loaded, state="Sleeping", parked=5 * GI).host_charge == 5 * GI


def test_over_commitment_by_measurement_is_reported() -> None:
    h = host(model("a", "Ready", gib=10, measured=50 * GI), model("b", "Sleeping", parked=45 * GI))
    assert len(over_committed(h)) == 2
    assert over_committed(host(model("a", "Ready"))) == []


# ---- make_room ------------------------------------------------------------------------------------------


def test_make_room_sleeps_lowest_priority_then_least_recently_used_never_busy_ones() -> None:
    h = host(
        model("old", used=1, prio=0),
        model("new", used=9, prio=0),
        model("low", used=50, prio=-5),
        model("loading", "Loading", used=0, prio=-10),
        cap=40,
    )
    # 0 free; 15Gi wanted: the low-priority one first, then the least recently used.
    room = make_room(h, 0, 15 * GI, priority=0)
    assert room == Room("h-0", 0, sleep=(("ns", "low"), ("ns", "old")))
    # Room already there: nothing to do.
    assert make_room(host(cap=40), 0, 40 * GI, priority=0) == Room("h-0", 0)


@pytest.mark.parametrize("state", ["Loading", "Processing", "Waking", "Pending", "Evicting"])
def test_make_room_never_chooses_a_model_that_is_working(state: str) -> None:
    h = host(model("busy", state, gib=30), model("idle", gib=10), cap=40)
    assert make_room(h, 0, 20 * GI, priority=0) is None
    assert make_room(h, 0, 10 * GI, priority=0) == Room("h-0", 0, sleep=(("ns", "idle"),))


def test_make_room_never_sleeps_a_model_with_requests() -> None:
    h = host(model("queued", busy=True), model("vip", prio=5), cap=20)
    assert make_room(h, 0, 20 * GI, priority=0) is None
    assert make_room(h, 0, 10 * GI, priority=0) == Room("h-0", 0, sleep=(("ns", "vip"),))


def test_idle_models_of_any_priority_sleep_for_a_newcomer_the_lowest_priority_then_lru_first() -> None:
    """Sleeping is cheap and reversible (the weights stay in host RAM): a device full of idle models of a
    higher priority makes room for a lower one by putting them to sleep. (Before: only models of a
    priority no higher than the newcomer's, so 45-57 of bench.placement's 100 pools stayed short.)"""
    h = host(
        model("vip-old", prio=5, used=1),
        model("vip-new", prio=5, used=9),
        model("mid", prio=2, used=50),
        cap=30,
    )
    assert make_room(h, 0, 10 * GI, priority=0) == Room("h-0", 0, sleep=(("ns", "mid"),))
    assert make_room(h, 0, 20 * GI, priority=0) == Room("h-0", 0, sleep=(("ns", "mid"), ("ns", "vip-old")))
    assert make_room(h, 0, 30 * GI, priority=-3) == Room(
        "h-0", 0, sleep=(("ns", "mid"), ("ns", "vip-old"), ("ns", "vip-new"))
    )


def test_only_a_lower_priority_is_ever_unloaded() -> None:
    """Unloading costs a cold start: never for a newcomer of the same or a lower priority (that pool would
    be placed again and unload the other in turn), neither an idle model the RAM cannot park nor a
    sleeping one for RAM or for its process's overhead."""
    no_ram = host(model("idle", prio=1), cap=10, ram=0)
    assert make_room(no_ram, 0, 10 * GI, priority=1) is None
    assert make_room(no_ram, 0, 10 * GI, priority=0) is None
    assert make_room(no_ram, 0, 10 * GI, priority=2) == Room("h-0", 0, unload=(("ns", "idle"),))
    # RAM full with an equal's sleeper: the idle model may not park, nor the sleeper go.
    full = host(model("idle", used=5, prio=1), model("sleeper", "Sleeping", used=1, prio=1), cap=10, ram=10)
    assert make_room(full, 0, 10 * GI, priority=1) is None
    assert make_room(full, 0, 10 * GI, priority=2) == Room(
        "h-0", 0, sleep=(("ns", "idle"),), unload=(("ns", "sleeper"),)
    )


def test_an_idle_model_the_ram_cannot_park_and_may_not_be_unloaded_is_passed_over() -> None:
    h = host(model("big-vip", gib=20, prio=5, used=0), model("small", gib=10, prio=5, used=9), cap=30, ram=10)
    # big-vip comes first (least recently used) but 10 GiB of RAM cannot park it: small sleeps instead.
    assert make_room(h, 0, 10 * GI, priority=0) == Room("h-0", 0, sleep=(("ns", "small"),))
    assert make_room(h, 0, 20 * GI, priority=0) is None


def test_a_model_used_loaded_or_woken_lately_is_not_put_to_sleep() -> None:
    """``idle_before``: only models idle since before it sleep (the planner passes now - MIN_IDLE_S), so a
    model woken for a request is not put back to sleep at once (a thrash)."""
    h = host(
        model("served", "Ready", used=95),  # served a request at 95
        model("woken", "Ready", used=10, since=97),  # Ready (woken) at 97
        model("idle", "Idle", used=20, since=99),  # turned Idle at 99: idle since its last request, 20
        model("old", "Ready", used=30, since=40),
        cap=40,
    )
    assert make_room(h, 0, 20 * GI, priority=0, idle_before=90) == Room(
        "h-0", 0, sleep=(("ns", "idle"), ("ns", "old"))
    )
    assert make_room(h, 0, 30 * GI, priority=0, idle_before=90) is None
    assert make_room(h, 0, 30 * GI, priority=0, idle_before=96) == Room(
        "h-0", 0, sleep=(("ns", "idle"), ("ns", "old"), ("ns", "served"))
    )


def test_make_room_unloads_older_sleepers_for_ram_else_unloads_the_idle_model() -> None:
    # RAM 10Gi, full with an old sleeper; the idle model is more recent: the sleeper goes, it sleeps.
    h = host(model("idle", used=5), model("sleeper", "Sleeping", used=1), cap=10, ram=10)
    assert make_room(h, 0, 10 * GI, priority=1) == Room(
        "h-0", 0, sleep=(("ns", "idle"),), unload=(("ns", "sleeper"),)
    )
    # The sleeper was used more recently: the idle model is unloaded instead of parked.
    h = host(model("idle", used=1), model("sleeper", "Sleeping", used=5), cap=10, ram=10)
    assert make_room(h, 0, 10 * GI, priority=1) == Room("h-0", 0, unload=(("ns", "idle"),))
    # No RAM at all (hostMemory unset): nothing sleeps, idle models are unloaded.
    h = host(model("idle"), cap=10, ram=0)
    assert make_room(h, 0, 10 * GI, priority=1) == Room("h-0", 0, unload=(("ns", "idle"),))


def test_need_zero_brings_an_over_committed_device_back() -> None:
    h = host(model("grew", "Ready", measured=35 * GI, used=9), model("idle", gib=10, used=1), cap=40)
    room = make_room(h, 0, 0, priority=0)
    assert room == Room("h-0", 0, sleep=(("ns", "idle"),))
    assert over_committed(apply_room(h, room)) == []


# ---- unload_candidates, sleep, wake ------------------------------------------------------------------------


def test_unload_candidates_are_sleeping_models_lowest_priority_then_least_recently_used() -> None:
    h = host(
        model("a", "Sleeping", used=3),
        model("b", "Sleeping", used=1),
        model("c", "Sleeping", used=9, prio=-1),
        model("w", "Waking", used=0),
        ram=40,
    )
    # 40 RAM, 40 held (a, b, c, and w's copy): 15Gi wanted.
    assert unload_candidates(h, 15 * GI) == (("ns", "c"), ("ns", "b"))
    assert unload_candidates(h, 0) == ()
    assert unload_candidates(h, 31 * GI) is None  # the Waking model's copy is never a candidate


def test_sleep_parks_an_idle_model_or_unloads_it_when_ram_is_short() -> None:
    h = host(model("idle", used=5), model("old", "Sleeping", used=1), ram=15)
    assert sleep(h, ("ns", "idle")) == Room("h-0", 0, sleep=(("ns", "idle"),), unload=(("ns", "old"),))
    assert sleep(host(model("idle"), ram=0), ("ns", "idle")) == Room("h-0", 0, unload=(("ns", "idle"),))
    assert sleep(host(model("p", "Processing")), ("ns", "p")) is None
    assert sleep(host(), ("ns", "missing")) is None


def test_wake_makes_room_on_the_models_own_device_and_never_unloads_it() -> None:
    h = host(
        model("sleeper", "Sleeping", gib=20, used=9, prio=1),
        model("idle", gib=30, used=1),
        cap=40,
        ram=20,
    )
    # 10 free, 20 wanted: the idle model must go; RAM is full with the sleeper's own copy, which is not
    # unloaded to park it, so it is unloaded (its priority is lower).
    assert wake(h, ("ns", "sleeper")) == Room("h-0", 0, unload=(("ns", "idle"),))
    # Of the same priority, it may not be unloaded: no room.
    assert (
        wake(replace(h, residents=(replace(h.residents[0], priority=0), h.residents[1])), ("ns", "sleeper"))
        is None
    )
    assert wake(host(model("sleeper", "Sleeping", gib=20)), ("ns", "sleeper")) == Room("h-0", 0)
    assert wake(h, ("ns", "idle")) is None  # not asleep


# ---- place -------------------------------------------------------------------------------------------------


def test_place_takes_awake_room_first_the_tightest_fit() -> None:
    roomy = host(name="h-0", cap=40)
    tight = host(model("a", "Ready", gib=25), name="h-1", cap=40)
    request = PlacementRequest(("ns", "new"), 10 * GI)
    assert place(request, [roomy, tight]) == Placement("h-1", 0, Room("h-1", 0))
    # The same whatever the hosts' order.
    assert place(request, [tight, roomy]) == place(request, [roomy, tight])


def test_place_makes_room_by_sleeping_with_the_fewest_unloads_then_sleeps() -> None:
    a = host(  # two sleeps
        model("x", gib=5, used=1),
        model("y", gib=5, used=2),
        model("w", "Processing"),
        name="h-a",
        cap=20,
        ram=20,
    )
    b = host(model("z", gib=20), name="h-b", cap=20, ram=0)  # one unload
    c = host(model("v", gib=20), name="h-c", cap=20, ram=40)  # one sleep
    request = PlacementRequest(("ns", "new"), 10 * GI)
    assert place(request, [a, b, c]) == Placement("h-c", 0, Room("h-c", 0, sleep=(("ns", "v"),)))
    assert place(request, [a, b]) == Placement("h-a", 0, Room("h-a", 0, sleep=(("ns", "x"), ("ns", "y"))))


def test_place_prefers_sleeping_a_lower_priority_then_the_fewest_sleeps() -> None:
    vip = host(model("vip", gib=20, prio=5), name="h-a", cap=20)
    low = host(model("low-1", gib=10, prio=0), model("low-2", gib=10, prio=1), name="h-b", cap=20)
    request = PlacementRequest(("ns", "new"), 15 * GI, priority=2)
    assert place(request, [vip, low]) == Placement(
        "h-b", 0, Room("h-b", 0, sleep=(("ns", "low-1"), ("ns", "low-2")))
    )
    # Only vips idle: they sleep for a lower priority.
    assert place(request, [vip]) == Placement("h-a", 0, Room("h-a", 0, sleep=(("ns", "vip"),)))
    # Unless they were used lately.
    lately = place(
        request, [replace(vip, residents=(replace(vip.residents[0], last_used=95),))], idle_before=90
    )
    assert isinstance(lately, Unplaced) and lately.reason == "NoRoom"


def test_place_sleeps_where_another_host_would_unload_an_equal() -> None:
    """Two hosts: on one, room means unloading an idle model of the same priority (no RAM to park it); on
    the other, sleeping an idle model of a higher one. The second is made (before: the first was chosen
    for its fewer sleeps, then refused by the planner, and the pool stayed short)."""
    equal = host(model("equal", gib=10, prio=1), name="h-a", cap=10, ram=0)
    vip = host(model("vip-1", gib=5, prio=3), model("vip-2", gib=5, prio=3, used=1), name="h-b", cap=10)
    request = PlacementRequest(("ns", "new"), 10 * GI, priority=1)
    assert place(request, [equal, vip]) == Placement(
        "h-b", 0, Room("h-b", 0, sleep=(("ns", "vip-1"), ("ns", "vip-2")))
    )


def test_place_says_why_not() -> None:
    request = PlacementRequest(("ns", "new"), 10 * GI)
    nothing = place(request, [])
    assert isinstance(nothing, Unplaced) and nothing.reason == "NoHost"
    held = place(request, [host(model("new", "Ready"))])
    assert isinstance(held, Unplaced) and held.reason == "EveryHostHoldsIt"
    huge = place(PlacementRequest(("ns", "new"), 90 * GI), [host(cap=80)])
    assert isinstance(huge, Unplaced) and huge.reason == "LargerThanDevice" and "deviceMemory" in huge.message
    busy = place(request, [host(model("p", "Processing", gib=35), cap=40)])
    assert isinstance(busy, Unplaced) and busy.reason == "NoRoom"
    assert busy.message.endswith("the most free is 5Gi on h-0 device 0")
    closed = place(request, [replace(host(), accepting=False)])
    assert isinstance(closed, Unplaced) and closed.reason == "NoHost"


def test_admit_charges_the_newcomer_on_its_device_after_its_room() -> None:
    h = host(model("x", gib=30), cap=40, ram=40)
    request = PlacementRequest(("ns", "new"), 20 * GI, priority=1)
    placement = place(request, [h])
    assert isinstance(placement, Placement)
    after = admit(h, placement, request, now=7.0)
    assert after.resident(("ns", "x")) == replace(h.residents[0], state="Sleeping")
    assert after.resident(("ns", "new")) == Resident(
        ("ns", "new"), "Pending", 0, 20 * GI, priority=1, last_used=7.0
    )
    assert ledger(after).devices[0].awake == 20 * GI and over_committed(after) == []


# ---- the ModelBudget over hosts ---------------------------------------------------------------------------


def test_a_host_pod_is_charged_its_whole_devices_against_the_budget() -> None:
    gpu = parse_host_spec({"gpusPerHost": 2, "deviceMemory": "80Gi", "hostMemory": "64Gi"})
    assert host_charge(gpu) == 160 * GI  # host RAM is not accelerator memory
    cpu = parse_host_spec({"deviceMemory": "16Gi", "hostMemory": "8Gi"})
    assert host_charge(cpu) == 24 * GI  # both RAM, as a CPU pool's workers are charged
    budget = build_ledger(400 * GI, [])
    assert hosts_admitted(budget, host_charge(gpu), wanted=5) == 2
    assert hosts_admitted(build_ledger(None, []), host_charge(gpu), wanted=5) == 5
    assert hosts_admitted(build_ledger(400 * GI, [], invalid="bad"), host_charge(gpu), wanted=5) == 0


def test_a_decision_touches_only_the_present_model_not_a_failed_replica_of_the_same_pool() -> None:
    # Found by the state machine: a pool failed on a host and placed there again.
    failed, again = model("m", "Failed", used=1), model("m", "Idle", used=2)
    after = apply_room(host(failed, again), Room("h-0", 0, sleep=(("ns", "m"),)))
    assert after.residents == (failed, replace(again, state="Sleeping"))
    assert apply_room(host(failed, again), Room("h-0", 0, unload=(("ns", "m"),))).residents == (failed,)


# ---- the ModelHost status ----------------------------------------------------------------------------------


def test_the_host_status_shows_each_device_and_the_totals_the_columns_print() -> None:
    h0 = host(
        model("a", "Ready", gib=10, measured=6 * GI, used=1_800_000_000),
        model("b", "Sleeping", gib=8),
        model("c", "Failed", gib=4),
        name="h-0",
        devices=2,
    )
    h1 = host(model("d", "Ready", gib=30, measured=45 * GI), name="h-1")  # over-committed by measurement
    status = host_status(
        [
            ObservedHost(h1, "Ready"),
            ObservedHost(h0, "Ready", node="gpu-1"),
            ObservedHost(host(name="h-2"), "Failed"),
        ],
        desired=3,
        selector="modelpool.dev/host=gpus",
    )
    assert (status.replicas, status.ready_replicas, status.ready_text, status.models) == (2, 2, "2/3", 3)
    assert [p.name for p in status.hosts] == ["h-0", "h-1", "h-2"]
    first = status.hosts[0]
    assert [(d.awake, d.asleep, d.free) for d in first.devices] == [
        ("10Gi", "8Gi", "30Gi"),
        ("0", "0", "40Gi"),
    ]
    assert first.host_memory_free == "32Gi" and first.node == "gpu-1"
    a, b, c = first.models
    assert (a.state, a.memory, a.measured, a.last_request_time) == (
        "Ready",
        "10Gi",
        False,  # measured 6Gi, below its 10Gi declaration: charged the declaration
        "2027-01-15T08:00:00Z",
    )
    assert (b.state, b.memory, b.measured) == ("Sleeping", "8Gi", False) and c.memory == "0"
    assert status.hosts[1].devices[0].free == "-5Gi"
    # Totals over the host pods that count (not the failed one): what AWAKE / ASLEEP / FREE print.
    assert (status.memory.awake, status.memory.asleep, status.memory.free) == ("55Gi", "8Gi", "65Gi")
    assert ModelHostStatus.model_validate(status.wire()) == status


# ---- each model's process overhead (ModelHost.spec.modelOverhead) ---------------------------------------


def test_every_present_model_is_charged_its_process_overhead_on_its_device_awake_or_asleep() -> None:
    h = replace(
        host(
            model("awake", "Ready", gib=10),
            model("asleep", "Sleeping", gib=8),
            model("loading", "Loading", gib=5),
            model("failed", "Failed", gib=20),
            model("other", "Idle", gib=1, device=1),
            devices=2,
        ),
        overhead=GI,
    )
    device0, device1 = ledger(h).devices
    assert (device0.awake, device0.asleep, device0.overhead, device0.free) == (
        15 * GI,
        8 * GI,
        3 * GI,
        22 * GI,
    )
    assert (device1.overhead, device1.free) == (GI, 38 * GI)
    assert ledger(h).overhead == 4 * GI
    assert fits(h, 0, 22 * GI) and not fits(h, 0, 22 * GI + 1)


def test_a_new_replica_needs_its_size_and_its_overhead() -> None:
    h = replace(host(model("a", "Processing", gib=30), cap=40), overhead=2 * GI)  # 8 GiB free
    assert place(PlacementRequest(("ns", "new"), 6 * GI), [h]) == Placement("h-0", 0, Room("h-0", 0))
    refused = place(PlacementRequest(("ns", "new"), 7 * GI), [h])
    assert isinstance(refused, Unplaced) and refused.reason == "NoRoom", refused
    assert "9Gi free" in refused.message
    larger = place(PlacementRequest(("ns", "new"), 39 * GI), [h])
    assert isinstance(larger, Unplaced) and larger.reason == "LargerThanDevice", larger
    assert "modelOverhead" in larger.message
    after = admit(h, Placement("h-0", 0, Room("h-0", 0)), PlacementRequest(("ns", "new"), 6 * GI), now=1)
    assert ledger(after).devices[0].free == 0 and over_committed(after) == []


def test_sleeping_models_are_unloaded_for_their_overhead_when_sleeping_idle_ones_is_not_enough() -> None:
    # 4 GiB processes: two awake idle models (10 GiB each) and three sleeping ones fill 40 GiB.
    h = replace(
        host(
            model("idle-old", "Idle", gib=10, used=1),
            model("idle-new", "Idle", gib=10, used=5),
            model("zz-asleep", "Sleeping", gib=2, used=2),
            model("asleep-old", "Sleeping", gib=2, used=0),
            model("asleep-vip", "Sleeping", gib=2, used=0, prio=5),
            ram=40,
        ),
        overhead=4 * GI,
    )
    assert ledger(h).devices[0].free == 0
    # 24 GiB: both idle models sleep (20 GiB), then the lowest-ranked sleeping one is unloaded (4 GiB);
    # a higher priority's sleeper stays.
    room = make_room(h, 0, 24 * GI, priority=1)
    assert room == Room(
        "h-0", 0, sleep=(("ns", "idle-old"), ("ns", "idle-new")), unload=(("ns", "asleep-old"),)
    )
    assert ledger(apply_room(h, room)).devices[0].free == 24 * GI
    assert make_room(h, 0, 29 * GI, priority=1) is None  # only two sleepers may go: 28 GiB at most
    # Sleeping ones of the newcomer's priority stay (unloading is for a higher one only).
    assert make_room(h, 0, 24 * GI, priority=0) is None
    placed = place(PlacementRequest(("ns", "new"), 20 * GI, priority=1), [h])
    assert isinstance(placed, Placement) and placed.room == room


def test_the_host_spec_defaults_the_overhead_by_kind_and_the_host_status_shows_it() -> None:
    gpu = parse_host_spec({"gpusPerHost": 1, "deviceMemory": "80Gi"})
    cpu = parse_host_spec({"deviceMemory": "8Gi"})
    assert gpu.model_overhead_bytes == 512 * 2**20 and cpu.model_overhead_bytes == 384 * 2**20
    assert parse_host_spec({"deviceMemory": "8Gi", "modelOverhead": 0}).model_overhead_bytes == 0
    with pytest.raises(ValueError, match=r"spec\.modelOverhead"):
        parse_host_spec({"deviceMemory": "8Gi", "modelOverhead": "-1Mi"})
    h = replace(host(model("a", "Ready", gib=6), model("b", "Sleeping", gib=8)), overhead=GI)
    status = host_status([ObservedHost(h, "Ready")], desired=1)
    [device] = status.hosts[0].devices
    assert (device.awake, device.asleep, device.overhead, device.free) == ("6Gi", "8Gi", "2Gi", "32Gi")
    assert (status.memory.overhead, status.memory.free) == ("2Gi", "32Gi")
