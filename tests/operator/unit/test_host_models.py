"""A ModelHost pass's placing (``planner.host_models``, pure): which models are loaded, put to sleep and
unloaded on its host pods, in which order, and the annotation each host pod carries; and a shared pool's
status over the host pods holding its model (``planner.shared.shared_status``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.placements import read_models
from modelpool_contract.states import WorkerState
from modelpool_operator.observe.hosts import host_reports
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.decide import Room, apply_room
from modelpool_operator.placement.ledger import Host, Resident, over_committed
from modelpool_operator.planner.host_models import (
    Control,
    ModelCalls,
    SharedPool,
    _with_loading,
    models_annotations,
    plan_models,
)
from modelpool_operator.planner.shared import HostWait, shared_status, shared_wire
from modelpool_operator.pool import PoolView, host_load_settings

GI = 2**30
NS = "ns"


def host(name: str, *residents: Resident, capacity: int = 4 * GI, ram: int = 8 * GI) -> Host:
    return Host(name=name, capacities=(capacity,), host_memory=ram, residents=residents)


def model(pool: str, state: str = "Ready", size: int = GI, device: int = 0, **fields: object) -> Resident:
    return Resident(pool=(NS, pool), state=state, device=device, declared=size, **fields)  # type: ignore[arg-type]


def pool(name: str, replicas: int = 1, size: int = GI, **fields: object) -> SharedPool:
    return SharedPool(name, replicas, load=f'{{"source": "/models/{name}"}}', declared=size, **fields)  # type: ignore[arg-type]


def calls(*hosts: Host, pools: list[SharedPool], **kwargs: object) -> list[tuple[str, str, str]]:
    placing = plan_models(NS, hosts, pools, **kwargs)  # type: ignore[arg-type]
    return [(c.action, c.pod, c.pool) for c in placing.calls]


def test_a_pool_is_loaded_on_as_many_host_pods_as_its_replicas_the_tightest_fit_first() -> None:
    roomy, tight = host("h-0"), host("h-1", model("other", size=2 * GI))
    assert calls(roomy, tight, pools=[pool("emb", replicas=1), pool("other")]) == [("load", "h-1", "emb")]
    both = calls(roomy, tight, pools=[pool("emb", replicas=2), pool("other")])
    assert sorted(both) == [("load", "h-0", "emb"), ("load", "h-1", "emb")]
    load = plan_models(NS, [roomy], [pool("emb")]).calls[0]
    assert load == Control("load", "h-0", "emb", "placed", '{"source": "/models/emb"}')


def test_a_host_pod_of_two_devices_takes_loads_on_both_each_call_naming_its_device() -> None:
    two = Host(name="h-0", capacities=(4 * GI, 4 * GI), host_memory=0)
    placing = plan_models(NS, [two], [pool("a", size=3 * GI), pool("b", size=3 * GI)])
    assert [(c.action, c.pool, c.device) for c in placing.calls] == [("load", "a", 0), ("load", "b", 1)]
    # Neither device holds a third 3 GiB model (and nothing may sleep: no host RAM): not placed.
    placing = plan_models(NS, [two], [pool(n, size=3 * GI) for n in "abc"])
    assert [c.device for c in placing.calls] == [0, 1] and placing.unplaced["c"].reason == "NoRoom"
    # A load in flight is charged on the device it named: the next model goes on the other one.
    on_one = plan_models(NS, [two], [pool("a", size=3 * GI), pool("b", size=3 * GI)],
                          loading={("h-0", "a")}, devices={("h-0", "a"): 1})  # fmt: skip
    assert [(c.pool, c.device) for c in on_one.calls] == [("b", 0)]
    # A model the host reports on device 1 is charged there.
    held = Host(name="h-0", capacities=(4 * GI, 4 * GI), residents=(model("a", size=3 * GI, device=1),))
    assert [
        (c.pool, c.device) for c in plan_models(NS, [held], [pool("a"), pool("b", size=3 * GI)]).calls
    ] == [("b", 0)]


def test_a_load_in_flight_or_a_host_in_backoff_is_not_tried_again() -> None:
    assert calls(host("h-0"), pools=[pool("emb")], loading={("h-0", "emb")}) == []
    assert calls(host("h-0"), host("h-1"), pools=[pool("emb")], backoff={("h-0", "emb")}) == [
        ("load", "h-1", "emb")
    ]


def test_a_model_whose_pool_is_gone_or_deleted_or_changed_is_unloaded() -> None:
    h = host("h-0", model("gone"), model("bye"), model("changed"), model("kept"))
    pools = [pool("bye", deleting=True), pool("changed"), pool("kept")]
    loaded = {("h-0", "changed"): '{"source": "/models/old"}', ("h-0", "kept"): pool("kept").load}
    got = calls(h, pools=pools, loaded=loaded)
    # The changed one comes back with its new settings at a later pass (once the host shows it gone).
    assert got == [("unload", "h-0", "bye"), ("unload", "h-0", "changed"), ("unload", "h-0", "gone")]
    assert calls(host("h-0", model("kept")), pools=pools, loaded=loaded) == [("load", "h-0", "changed")]
    # Loaded by an earlier operator process: a host reporting another source or task is stale.
    assert calls(host("h-0", model("kept")), pools=[pool("kept")], stale={("h-0", "kept")}) == [
        ("unload", "h-0", "kept")
    ]


def test_fewer_replicas_unload_the_sleeping_then_the_least_used_first() -> None:
    hosts = [
        host("h-0", model("emb", last_used=50.0)),
        host("h-1", model("emb", "Sleeping")),
        host("h-2", model("emb", last_used=10.0)),
    ]
    assert calls(*hosts, pools=[pool("emb", replicas=1)]) == [
        ("unload", "h-1", "emb"),
        ("unload", "h-2", "emb"),
    ]


def test_room_is_made_by_sleeping_an_idle_model_of_lower_priority_before_the_load() -> None:
    full = host("h-0", model("old", "Idle", size=3 * GI, priority=0, last_used=1.0))
    placing = plan_models(NS, [full], [pool("old", size=3 * GI), pool("new", size=2 * GI, priority=5)])
    assert [(c.action, c.pool) for c in placing.calls] == [("sleep", "old"), ("load", "new")]
    # A busy one makes no room: the pool says why.
    busy = host("h-0", model("old", "Processing", size=3 * GI))
    placing = plan_models(NS, [busy], [pool("old", size=3 * GI), pool("new", size=2 * GI)])
    assert placing.calls == () and placing.unplaced["new"].reason == "NoRoom"


def test_idle_models_of_a_higher_priority_sleep_for_lower_ones_but_not_when_used_lately() -> None:
    """The bench's case (``bench.placement``): devices full of idle models of a higher priority, pools of
    a lower one waiting while host RAM is free. They sleep for them (before: the pools stayed short); a
    model used less than ``MIN_IDLE_S`` ago stays awake (the pool waits for the next pass)."""
    hosts = [
        host("h-0", model("vip-0", "Ready", size=4 * GI, priority=3, last_used=50.0)),
        host("h-1", model("vip-1", "Idle", size=4 * GI, priority=3, last_used=95.0)),
    ]
    pools = [pool("vip-0", size=4 * GI, priority=3), pool("vip-1", size=4 * GI, priority=3)]
    pools += [pool("low", size=2 * GI), pool("lower", size=2 * GI, priority=-1)]
    placing = plan_models(NS, hosts, pools, now=100.0)
    assert [(c.action, c.pod, c.pool) for c in placing.calls] == [
        ("sleep", "h-0", "vip-0"),
        ("load", "h-0", "low"),
        ("load", "h-0", "lower"),
    ]
    later = plan_models(NS, hosts, pools[:3], now=106.0)
    assert [(c.action, c.pod, c.pool) for c in later.calls] == [
        ("sleep", "h-0", "vip-0"),
        ("load", "h-0", "low"),
    ]
    soon = plan_models(NS, hosts[1:], pools, now=100.0)
    assert soon.calls == () and soon.unplaced["low"].reason == "NoRoom"
    # The pass comes again when vip-1 has been idle MIN_IDLE_S (used at 95: at 105), not a resync later.
    assert soon.retry_in == pytest.approx(5.0) and placing.retry_in is None


def test_without_host_ram_room_is_unloaded_only_for_a_higher_priority() -> None:
    """Two pools of one priority on a host without RAM to park them: the newcomer waits (else each would
    unload the other at every pass); a higher-priority one unloads the idle model."""
    full = host("h-0", model("old", "Idle", size=3 * GI), ram=0)
    placing = plan_models(NS, [full], [pool("old", size=3 * GI), pool("new", size=2 * GI)])
    assert placing.calls == () and placing.unplaced["new"].reason == "NoRoom"
    urgent = plan_models(NS, [full], [pool("old", size=3 * GI), pool("new", size=2 * GI, priority=1)])
    assert [(c.action, c.pool) for c in urgent.calls] == [("unload", "old"), ("load", "new")]


def test_a_failed_model_stays_and_its_pool_is_not_loaded_there_again() -> None:
    placing = plan_models(NS, [host("h-0", model("emb", "Failed"))], [pool("emb")])
    assert placing.calls == () and placing.unplaced["emb"].reason == "EveryHostHoldsIt"


def test_host_memory_short_unloads_the_least_recently_used_sleeping_model() -> None:
    h = host(
        "h-0",
        model("a", "Sleeping", size=2 * GI, last_used=1.0),
        model("b", "Sleeping", size=2 * GI, last_used=2.0),
        ram=3 * GI,
    )
    assert calls(h, pools=[pool("a"), pool("b")]) == [("unload", "h-0", "a")]


def test_one_pass_never_over_commits_a_device() -> None:
    """Many pools at once on two small hosts: what the pass leaves (every load charged its declared size)
    fits each device."""
    hosts = [host("h-0", capacity=3 * GI), host("h-1", capacity=3 * GI)]
    pools = [pool(f"p{i}", replicas=2, size=GI) for i in range(5)]
    placing = plan_models(NS, hosts, pools)
    placed: dict[str, list[Resident]] = {"h-0": [], "h-1": []}
    for call in placing.loads():
        placed[call.pod].append(model(call.pool, "Pending"))
    assert all(len(v) == 3 for v in placed.values())
    assert not [o for h in hosts for o in over_committed(h.with_residents(placed[h.name]))]
    assert set(placing.unplaced) == {"p3", "p4"}


def test_the_annotation_holds_each_pools_state_on_the_host() -> None:
    got = models_annotations([host("h-0", model("emb"), model("gpt", "Sleeping")), host("h-1")])
    assert read_models({"modelpool.dev/models": got["h-0"]}) == {"emb": "Ready", "gpt": "Sleeping"}
    assert got["h-1"] == "{}"


# ---- a shared pool's status --------------------------------------------------------------------------


def view(replicas: int = 2) -> PoolView:
    return PoolView.from_body(
        {
            "metadata": {"name": "emb", "namespace": NS, "generation": 3},
            "spec": {
                "model": {"source": "hf://sentence-transformers/all-MiniLM-L6-v2", "task": "text-embedding"},
                "resources": {"memory": "1Gi"},
                "replicas": replicas,
                "maxReplicas": 4,
                "idleTimeoutSeconds": 2,
                "host": "cpu",
            },
        }
    )


def replica(pod: str, state: WorkerState, memory: int, **seen: Any) -> ObservedWorker:
    """A shared pool's model on host pod ``pod`` (``observe.hosts.hosted_workers``)."""
    return ObservedWorker(name=pod, namespace=NS, pool="m", state=state, memory=memory, **seen)


def test_a_shared_pools_status_lists_its_host_pods_with_the_models_state() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    replicas = [
        replica("cpu-1", "Sleeping", GI, node="n1", device=1),
        replica("cpu-0", "Ready", GI),  # a host that names no device: none shown
    ]
    status = shared_wire(shared_status(view(), replicas, None, now))
    assert status["phase"] == "Ready" and status["readyText"] == "2/2" and status["observedGeneration"] == 3
    # kubectl get's Desired and Declared columns; the memory is charged to the ModelHost's pods.
    assert status["targetReplicas"] == 2 and status["memory"]["declared"] == "1Gi"
    assert [(w["name"], w["host"], w["state"], w.get("device")) for w in status["workers"]] == [
        ("cpu-0", "cpu-0", "Ready", None),
        ("cpu-1", "cpu-1", "Sleeping", 1),
    ]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Placed"]["status"] == "True" and "cpu-0, cpu-1" in conditions["Placed"]["message"]
    assert conditions["Ready"]["status"] == "True"


def test_a_shared_pool_short_of_host_pods_says_why_and_loading_is_loading() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    wait = HostWait("NoRoom", "no device has 1Gi free")
    status = shared_wire(shared_status(view(), [replica("cpu-0", "Loading", GI)], wait, now))
    assert status["phase"] == "Loading" and status["replicas"] == 1 and status["readyReplicas"] == 0
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Placed"]["status"], conditions["Placed"]["reason"]) == ("False", "NoRoom")
    assert conditions["Ready"]["reason"] == "Loading"
    failed = shared_wire(shared_status(view(1), [replica("cpu-0", "Failed", GI, reason="OOM")], wait, now))
    assert failed["phase"] == "Failed" and failed["workers"][0]["memory"] == "0"
    assert "OOM" in {c["type"]: c for c in failed["conditions"]}["Ready"]["message"]
    assert shared_status(view(2), [], wait, now).phase == "Pending"


def test_the_load_settings_are_the_pools_model_and_what_a_host_accepts() -> None:
    from model_server.host_config import HostConfig, parse_load_body, slot_config
    from modelpool_contract.api import QueueSpec

    settings = host_load_settings(view().spec)
    assert settings["source"] == "hf://sentence-transformers/all-MiniLM-L6-v2"
    assert settings["memory"] == GI and settings["idle_after"] == 2
    body = json.dumps({"parameters": {"config": json.dumps(settings)}}).encode()
    parsed, memory, device = parse_load_body(body)
    config = slot_config(HostConfig(device_memory="4Gi"), "emb", parsed, 0)  # type: ignore[arg-type]
    assert memory == GI and config.task == "text-embedding" and config.idle_after == 2 and device is None
    # The pool's queue reaches its model (it was silently the host's): its door and its deadline.
    spec = view().spec.model_copy(update={"queue": QueueSpec(capacity=7, request_timeout_seconds=12.5)})
    queued = json.dumps({"parameters": {"config": json.dumps(host_load_settings(spec))}}).encode()
    own = slot_config(HostConfig(device_memory="4Gi"), "emb", parse_load_body(queued).settings, 0)  # type: ignore[arg-type]
    assert (own.queue_capacity, own.request_timeout) == (7, 12.5)


def test_a_host_pod_whose_stats_are_unknown_takes_no_model() -> None:
    """Until the operator has read a host pod's /stats it does not know what it holds (and cannot reach
    it): nothing is placed there."""
    from modelpool_contract.api import parse_host_spec
    from modelpool_operator.observe.hosts import observe_hosts
    from tests.operator.unit.test_shared_pool_wait import HOST
    from tests.operator.unit.test_shared_pool_wait import pod as host_pod

    spec = parse_host_spec(HOST)
    unknown, known = observe_hosts(
        spec, [host_pod("h-0"), host_pod("h-1")], host_reports({"h-0": None, "h-1": {}})
    )
    assert (unknown.accepting, known.accepting) == (False, True)
    assert calls(unknown, pools=[pool("emb")]) == []
    assert observe_hosts(spec, [host_pod("h-0")])[0].accepting  # no stats asked for: readiness alone


# ---- property: a pass, applied as the host would, never over-commits and never exceeds replicas ------------

_STATES = ("Loading", "Ready", "Idle", "Processing", "Sleeping", "Waking", "Failed")


@st.composite
def _scene(draw: st.DrawFn) -> tuple[list[Host], list[SharedPool]]:
    names = [f"p{i}" for i in range(draw(st.integers(1, 6)))]
    pools = [
        SharedPool(
            name,
            replicas=draw(st.integers(0, 3)),
            load="{}",
            declared=draw(st.integers(1, 4)) * GI,
            priority=draw(st.integers(0, 2)),
            deleting=draw(st.booleans()) and draw(st.booleans()),
        )
        for name in names
    ]
    hosts = []
    overhead = draw(st.sampled_from([0, GI // 2]))  # each model's process, awake or asleep
    for h in range(draw(st.integers(1, 3))):
        capacity, ram = 6 * GI, draw(st.sampled_from([0, 4 * GI, 8 * GI]))
        capacities = (capacity,) * draw(st.integers(1, 2))  # a host pod of one GPU or two
        residents: list[Resident] = []
        for name in draw(st.lists(st.sampled_from([*names, "orphan"]), unique=True, max_size=4)):
            size = next((p.declared for p in pools if p.name == name), GI)
            priority = next((p.priority for p in pools if p.name == name), 0)
            state = draw(st.sampled_from(_STATES))
            device = draw(st.integers(0, len(capacities) - 1))
            used = float(draw(st.integers(0, 9)))
            resident = model(name, state, size, device, last_used=used, priority=priority)
            candidate = Host(f"h-{h}", capacities, ram, (*residents, resident), overhead=overhead)
            if not over_committed(candidate):  # a host's own ledger never over-commits what it reports
                residents.append(resident)
        hosts.append(Host(f"h-{h}", capacities, ram, tuple(residents), overhead=overhead))
    return hosts, pools


def _applied(hosts: list[Host], placing: ModelCalls, pools: list[SharedPool]) -> dict[str, Host]:
    """The hosts once every call is done, in order (a load: the model Pending at its declared size)."""
    by_name, declared = {h.name: h for h in hosts}, {p.name: p.declared for p in pools}
    for call in placing.calls:
        h = by_name[call.pod]
        key = (NS, call.pool)
        if call.action == "unload":
            h = h.with_residents(r for r in h.residents if r.pool != key)
        elif call.action == "sleep":
            assert h.resident(key) is not None and h.resident(key).sleepable  # type: ignore[union-attr]
            h = apply_room(h, Room(h.name, 0, sleep=(key,)))
        else:
            assert not any(r.pool == key for r in h.residents), "loaded where it is already listed"
            h = h.with_residents(
                (*h.residents, model(call.pool, "Pending", declared[call.pool], call.device))
            )
        by_name[call.pod] = h
    return by_name


@settings(max_examples=300, deadline=None)
@given(_scene())
def test_a_placing_pass_never_over_commits_and_never_exceeds_replicas(
    scene: tuple[list[Host], list[SharedPool]],
) -> None:
    hosts, pools = scene
    # A load in flight where the host lists nothing of that pool yet: charged as Pending from the start.
    loading: set[tuple[str, str]] = set()
    devices: dict[tuple[str, str], int] = {}
    for h in (h for h in hosts if not h.residents):
        rooms = list(h.capacities)
        for p in (p for p in pools if p.replicas == 2):
            device = next((d for d, room in enumerate(rooms) if p.declared + h.overhead <= room), None)
            if device is not None:  # loads decided by earlier passes: they fit the device they named
                loading.add((h.name, p.name))
                devices[(h.name, p.name)] = device
                rooms[device] -= p.declared + h.overhead
    placing = plan_models(NS, hosts, pools, loading=loading, devices=devices)
    by_name = {p.name: p for p in pools}
    hosts = [_with_loading(h, NS, loading, by_name, devices) for h in hosts]
    after = _applied(hosts, placing, pools)
    assert not [o for h in after.values() for o in over_committed(h)]
    for p in pools:
        # (a load in flight is neither undone nor counted: the pass after it ends sees it)
        holding = sum(
            1
            for h in after.values()
            if h.resident((NS, p.name)) is not None and (h.name, p.name) not in loading
        )
        assert holding == 0 if p.deleting else holding <= p.replicas
    # Room is never made with a protected model (Loading, Processing, Waking): a pool deleted or scaled
    # down may lose one. Room for a pool unloads only models of a lower priority.
    for call in placing.calls:
        if call.why.startswith(("making room", "the host's memory")):
            [h] = [h for h in hosts if h.name == call.pod]
            r = next(r for r in h.residents if r.pool == (NS, call.pool))
            assert r.state not in ("Loading", "Processing", "Waking"), call
        if call.why.startswith("making room for ") and call.action == "unload":
            newcomer = by_name[call.why.removeprefix("making room for ")]
            assert r.priority < newcomer.priority, (call, r)


def test_successive_passes_place_every_pool_once_and_never_undo_a_placement() -> None:
    """No ping-pong: pools of mixed priorities over two hosts whose devices hold a third of them awake,
    passes every 5 s, each pass's calls applied as the host would (a load Ready at once): every pool is
    loaded exactly once and nothing is unloaded; models sleep only once idle for MIN_IDLE_S."""
    hosts = {h: host(h, capacity=8 * GI, ram=64 * GI) for h in ("h-0", "h-1")}
    pools = [pool(f"p{i:02d}", size=2 * GI, priority=i % 4) for i in range(12)]
    loads: dict[str, int] = {}
    for now in range(0, 100, 5):
        placing = plan_models(NS, list(hosts.values()), pools, now=float(now))
        for c in placing.calls:
            h, key = hosts[c.pod], (NS, c.pool)
            assert c.action != "unload", c
            if c.action == "sleep":
                slept = h.resident(key)
                assert slept is not None and now - slept.idle_since >= 10, (now, slept)
                hosts[c.pod] = apply_room(h, Room(c.pod, 0, sleep=(key,)))
            else:
                loads[c.pool] = loads.get(c.pool, 0) + 1
                ready = model(c.pool, "Ready", 2 * GI, priority=int(c.pool[1:]) % 4, since=float(now))
                hosts[c.pod] = h.with_residents((*h.residents, ready))
    assert loads == {p.name: 1 for p in pools}
    assert not plan_models(NS, list(hosts.values()), pools, now=200.0).calls
