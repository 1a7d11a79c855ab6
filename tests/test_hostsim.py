"""The simulated shared host (``testkit.hostsim``) answers as the real one, through the real probe-port
handler: the control key is checked, a load the device cannot hold even with every idle model asleep is
refused with 507 and counted as a violation, the host sleeps idle models itself to make room (counted),
``/stats`` is the host's document, an unload of a Loading model is a violation, and an idle model sleeps
after its idle timeout; a host of two devices (``--gpus 2``) loads each model on the device its body names
and makes room on that device only."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest

from model_server.state_machine import State
from model_server.supervisor.host import HostSupervisor
from model_server.supervisor.host_control import HostControlServer
from modelpool_contract.placements import default_model_overhead
from modelpool_contract.stats import HostStats
from modelpool_operator.observe.hosts import HostedPool, host_residents
from modelpool_operator.placement.ledger import Host, fits, ledger
from testkit.hostsim import Audit, Eviction, HostSim, SimHost, SimModel, gpus, model_overhead
from testkit.kubectl import wait_for

GI = 1 << 30


@pytest.fixture
def host() -> Iterator[tuple[SimHost, str]]:
    sim = SimHost("h-0", device_memory=4 * GI, host_memory=8 * GI, key="k", audit=Audit(), load_s=0.05)
    server = HostControlServer(("127.0.0.1", 0), cast(HostSupervisor, sim))
    server.serve_in_thread()
    try:
        yield sim, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def load(
    url: str,
    name: str,
    gib: int,
    key: str = "k",
    *,
    idle_after: float | None = None,
    device: int | None = None,
) -> httpx.Response:
    settings: dict[str, object] = {"source": f"/models/{name}", "task": "text-embedding", "memory": gib * GI}
    if idle_after is not None:
        settings["idle_after"] = idle_after
    if device is not None:
        settings["device"] = device
    config = json.dumps(settings)
    body = {"parameters": {"config": config}}
    return httpx.post(
        f"{url}/v2/repository/models/{name}/load", json=body, headers={"Authorization": f"Bearer {key}"}
    )


def test_the_simulated_host_answers_as_the_real_one(host: tuple[SimHost, str]) -> None:
    sim, url = host
    assert load(url, "a", 2, key="wrong").status_code == 401
    assert load(url, "a", 2).json()["state"] == "Ready"
    assert load(url, "b", 2).json()["state"] == "Ready"
    # The device is full: the host sleeps the least recently used idle model itself (a) to load c.
    sim.touch("b")
    assert load(url, "c", 2).status_code == 200
    assert sim.states() == {"a": "Sleeping", "b": "Ready", "c": "Ready"} and sim.audit.host_made_room == 1
    stats = httpx.get(f"{url}/stats").json()
    assert stats["host"]["devices"][0]["awake"] == 4 * GI and stats["host"]["devices"][0]["asleep"] == 2 * GI
    assert stats["models"]["a"]["memory"]["gpu_reserved_bytes"] == 0
    assert stats["models"]["b"]["memory"]["gpu_reserved_bytes"] == 2 * GI
    assert stats["models"]["b"]["model"] == {"name": "b", "task": "text-embedding", "source": "/models/b"}
    assert sim.audit.violations == []
    # 5 GiB never fits a 4 GiB device: refused as the real host refuses it, and a violation.
    refused = load(url, "d", 5)
    assert refused.status_code == 507 and "do not fit on device 0" in refused.json()["error"]
    assert len(sim.audit.violations) == 1


def test_unloading_a_loading_model_is_a_violation(host: tuple[SimHost, str]) -> None:
    sim, url = host
    sim.load_s = 0.5
    loading = threading.Thread(target=load, args=(url, "a", 1))
    loading.start()
    try:
        wait_for(lambda: sim.states().get("a") == "Loading", timeout=5, interval=0.01, message="loading")
        unload = httpx.post(f"{url}/v2/repository/models/a/unload", headers={"Authorization": "Bearer k"})
        assert unload.status_code == 200
        assert sim.audit.violations and "unloaded while Loading" in sim.audit.violations[0]
    finally:
        loading.join(5)


def test_the_simulated_host_charges_each_model_its_process_overhead() -> None:
    # As the real host with --model-overhead 512Mi: each loaded model holds 512 MiB awake or asleep, so
    # on 4 GiB a third 1 GiB model needs the least recently used one asleep (1.5 + 1.5 + 0.5 > 4 - 1).
    sim = SimHost("h-0", device_memory=4 * GI, host_memory=8 * GI, key="k", audit=Audit(), load_s=0.01,
                  overhead=GI // 2)  # fmt: skip
    server = HostControlServer(("127.0.0.1", 0), cast(HostSupervisor, sim))
    server.serve_in_thread()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert load(url, "a", 1).status_code == 200 and load(url, "b", 1).status_code == 200
        sim.touch("b")
        assert load(url, "c", 1).status_code == 200
        assert sim.states() == {"a": "Sleeping", "b": "Ready", "c": "Ready"}
        device = httpx.get(f"{url}/stats").json()["host"]["devices"][0]
        assert device["awake"] == 2 * GI and device["asleep"] == GI
        assert device["overhead"] == 3 * GI // 2 and device["model_overhead"] == GI // 2
        assert device["free"] == GI // 2
        assert load(url, "d", 3).status_code == 507  # 3 GiB + 3 x 512 MiB + its own: never on 4 GiB
        assert len(sim.audit.violations) == 1 and "refused" in sim.audit.violations[0]
    finally:
        server.shutdown()
        server.server_close()


def test_a_host_pods_overhead_is_read_as_the_host_reads_its_flags() -> None:
    assert model_overhead(["--device", "auto", "--model-overhead", "123"]) == 123
    assert model_overhead(["--device", "cpu"]) == default_model_overhead(gpu=False)
    assert model_overhead(["--device", "auto"]) == default_model_overhead(gpu=True)


def test_the_simulated_host_sleeps_idle_models_as_a_sleep_idle_host_does() -> None:
    """As ``modelpool-server --shared-host --sleep-idle``: a model quiet for its ``idle_after`` (its pool's
    idleTimeoutSeconds) turns Idle, then sleeps unless host RAM is short (then it is asked again after
    RETRY_SLEEP_S); a request makes an Idle model Ready again. (Before: the simulated hosts kept every
    model awake for ever.)"""
    sim = SimHost("h-0", device_memory=8 * GI, host_memory=3 * GI, key="k", audit=Audit(), load_s=0.01,
                  sleep_idle=True)  # fmt: skip
    server = HostControlServer(("127.0.0.1", 0), cast(HostSupervisor, sim))
    server.serve_in_thread()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert load(url, "a", 2, idle_after=30).status_code == 200
        assert load(url, "b", 2, idle_after=60).status_code == 200
        now = time.time()
        assert sim.idle_tick(now + 10) == [] and sim.states() == {"a": "Ready", "b": "Ready"}
        sim.touch("b", at=now + 20)
        assert sim.idle_tick(now + 31) == ["a"] and sim.states() == {"a": "Sleeping", "b": "Ready"}
        # b: quiet for 60 s after its request at +20; 3 GiB of RAM hold a's 2 GiB, not b's 2 more.
        assert sim.idle_tick(now + 79) == [] and sim.states()["b"] == "Ready"
        assert sim.idle_tick(now + 81) == [] and sim.states()["b"] == "Idle"
        sim.touch("b", at=now + 82)  # a request: Idle -> Processing -> Ready
        assert sim.states()["b"] == "Ready"
        assert sim.audit.violations == [] and sim.audit.evictions == []  # the host's own sleeps
    finally:
        server.shutdown()
        server.server_close()
    quiet = SimHost("h-1", device_memory=8 * GI, host_memory=8 * GI, key="k", audit=Audit())
    model = SimModel("m", GI, GI, "/models/m", "text-embedding", idle_after=5)
    model.state_machine.to(State.LOADING)
    model.state_machine.to(State.READY)
    quiet.models["m"] = model
    assert quiet.idle_tick(time.time() + 6) == [] and quiet.states() == {"m": "Idle"}  # no --sleep-idle


def test_the_auditor_checks_the_priority_rule_a_sleep_may_pass_over_priority_an_unload_may_not() -> None:
    """Sleeping is cheap, unloading costs a cold start: a sleep of a higher priority's idle model for a
    newcomer is right when it came first (lowest priority, then least recently used, among those the RAM
    parks); an unload of a priority no lower than the newcomer's is wrong. (Before: any eviction of a
    higher priority was wrong, and an unload of an equal was not.)"""
    sleep_vip = Eviction(0, "h-0", "sleep", "vip", 3, 5.0, (("other", 3, 9.0),), "low", 0)
    assert sleep_vip.wrong() == ""
    assert (
        "came before it" in Eviction(0, "h-0", "sleep", "vip", 3, 5.0, (("low2", 0, 9.0),), "low", 0).wrong()
    )
    assert "only a lower priority" in Eviction(0, "h-0", "unload", "eq", 1, 5.0, (), "new", 1).wrong()
    assert Eviction(0, "h-0", "unload", "low", 0, 5.0, (), "new", 1).wrong() == ""


def test_a_pool_short_while_idle_models_of_any_priority_could_sleep_is_wrongly_short(tmp_path: Path) -> None:
    priority = {"vip": 3, "low": 0, "eq": 1, "new": 1}
    sim = HostSim(tmp_path / "kubeconfig", "ns", 0, audit=Audit(lambda m: priority.get(m, 0)))
    host = SimHost("h-0", device_memory=4 * GI, host_memory=2 * GI, key=None, audit=sim.audit, load_s=0)
    sim.hosts["h-0"] = host
    for name, gib in (("vip", 2), ("eq", 2)):
        model = SimModel(name, gib * GI, gib * GI, f"/models/{name}", "text-embedding")
        model.state_machine.to(State.LOADING)
        model.state_machine.to(State.READY)
        host.models[name] = model
    wanted = {"vip": (1, 2 * GI, 3), "eq": (1, 2 * GI, 1), "new": (1, 2 * GI, 1)}
    # vip (priority 3) is idle and the RAM parks it: "new" (priority 1) was left short wrongly.
    assert sim.wrongly_short(wanted) == [f"new ({2 * GI} bytes, priority 1) fits on h-0"]
    # vip busy: eq (an equal) sleeps instead, parked in the 2 GiB of RAM.
    host.models["vip"].busy = True
    assert sim.wrongly_short(wanted) != []
    host.host_memory = 0  # no RAM: eq (an equal) may not be unloaded: the pool is rightly short
    assert sim.wrongly_short(wanted) == []
    assert sim.wrongly_short({**wanted, "new": (1, 2 * GI, 2)}) != []  # a higher one: eq is unloaded


def test_a_host_of_two_devices_loads_each_model_on_its_device_and_makes_room_there_only() -> None:
    sim = SimHost("h-0", device_memory=4 * GI, host_memory=8 * GI, key="k", audit=Audit(), load_s=0.01,
                  devices=gpus(["--gpus", "2"]))  # fmt: skip
    server = HostControlServer(("127.0.0.1", 0), cast(HostSupervisor, sim))
    server.serve_in_thread()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for name, device in (("a", 0), ("b", 0), ("c", 1)):
            assert load(url, name, 2, device=device).status_code == 200
        # No device index 2 on a host of two: a 400 naming the field, nothing loaded.
        refused = load(url, "x", 1, device=2)
        assert refused.status_code == 400 and "parameters.config.device" in refused.json()["error"]
        # Device 1 has room for d: nothing on device 0 sleeps, though a (idle, the least recently used) could.
        sim.touch("b")
        assert load(url, "d", 2, device=1).status_code == 200
        assert sim.states() == {"a": "Ready", "b": "Ready", "c": "Ready", "d": "Ready"}
        # Device 0 is full: e there sleeps a, its least recently used idle model, and not c or d.
        assert load(url, "e", 1, device=0).status_code == 200
        assert sim.states() == {"a": "Sleeping", "b": "Ready", "c": "Ready", "d": "Ready", "e": "Ready"}
        # A load that names no device goes to the roomiest: device 0 (3 GiB free; device 1 has none).
        assert load(url, "f", 1).status_code == 200 and sim.models["f"].device == 0
        stats = httpx.get(f"{url}/stats").json()
        devices = stats["host"]["devices"]
        assert [(d["index"], d["awake"], d["free"]) for d in devices] == [(0, 4 * GI, 0), (1, 4 * GI, 0)]
        assert devices[0]["asleep"] == 2 * GI and devices[1]["models"] == ["c", "d"]
        assert {name: doc["device"] for name, doc in stats["models"].items()} == {
            "a": 0,
            "b": 0,
            "c": 1,
            "d": 1,
            "e": 0,
            "f": 0,
        }
        assert sim.audit.violations == [] and sim.audit.transitions > 0
    finally:
        server.shutdown()
        server.server_close()


def test_a_host_pods_devices_are_read_as_the_host_reads_its_flags() -> None:
    assert gpus(["--device", "auto", "--gpus", "4"]) == 4
    assert gpus(["--device", "cpu"]) == 1 and gpus(["--device", "auto"]) == 1


def test_an_eviction_on_one_device_has_only_that_devices_idle_models_as_candidates() -> None:
    """Room is made on one device: an older idle model on the other device was no better victim."""
    from model_server.state_machine import LocalStore, State, StateMachine
    from testkit.hostsim import SimModel

    def idle(name: str, device: int, used: float) -> SimModel:
        store = LocalStore()
        store.write(State.READY, 0.0, "")  # Ready for long: a candidate the operator saw idle
        return SimModel(name, GI, GI, f"/models/{name}", "text-embedding", last_used=used,
                        state_machine=StateMachine(store=store), device=device)  # fmt: skip

    for other_device, wrong in ((0, 0), (1, 1)):
        sim = SimHost("h-0", device_memory=4 * GI, host_memory=8 * GI, key="k", audit=Audit(), devices=2)
        older, victim = idle("older", other_device, used=1.0), idle("victim", 1, used=2.0)
        sim.models = {"older": older, "victim": victim}
        sim.audit.evicted(sim, "sleep", victim)
        sim.audit.loaded("h-0", "newcomer")
        # The same device: the older model came first (a wrong victim); the other device: no candidate.
        assert len(sim.audit.wrong_evictions()) == wrong, (other_device, sim.audit.evictions)


@pytest.mark.parametrize("factor", [0.5, 1.5])
def test_the_operator_and_the_host_see_the_same_room_when_a_model_measures_below_or_above_its_declaration(
    factor: float,
) -> None:
    """One charge rule (``device_charge``) in both ledgers: with each model measuring half (or 1.5x) its
    declaration, the operator's ledger, built from the host's own ``/stats``, finds on each device the
    room the host reports; a model the operator finds room for, the host loads."""
    sim = SimHost("h-0", device_memory=8 * GI, host_memory=0, key="k", audit=Audit(), load_s=0.01,
                  overhead=GI // 4, measured_factor=factor)  # fmt: skip
    server = HostControlServer(("127.0.0.1", 0), cast(HostSupervisor, sim))
    server.serve_in_thread()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    pools = {name: HostedPool(name, declared=2 * GI) for name in ("a", "b", "c")}
    try:
        for name in ("a", "b"):
            assert load(url, name, 2).status_code == 200
        wait_for(lambda: set(sim.states().values()) == {"Ready"}, timeout=10, message="both loaded")
        stats = httpx.get(f"{url}/stats").json()
        seen = Host(
            "h-0", (8 * GI,), overhead=GI // 4, residents=host_residents("ns", HostStats.parse(stats), pools)
        )
        assert ledger(seen).devices[0].free == stats["host"]["devices"][0]["free"]
        # Each charged max(2 GiB, measured) + 1/4 GiB: the operator's fit is the host's.
        room = fits(seen, 0, 2 * GI + GI // 4)
        assert room == (factor <= 1)
        assert (load(url, "c", 2).status_code == 200) == room
    finally:
        server.shutdown()
        server.server_close()
