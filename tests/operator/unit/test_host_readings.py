"""What the operator's ledger charges a model from its host's ``/stats`` (``observe.hosts.host_residents``),
as the host itself charges it (``model_server.host_plan``: the declared size unless a measure is larger):
a reading of 0 GPU bytes is no measurement (a CPU host's models; a sleeping model, whose weights left the
device), so the model is charged its declared size, awake on the device or parked in host RAM. Found by
the placement audit (``testkit.hostsim``): charged 0, a CPU host looked empty to the ledger and the host
RAM of sleeping models looked free."""

from __future__ import annotations

from typing import Any

from modelpool_contract.stats import HostStats
from modelpool_operator.observe.hosts import HostedPool, host_reports, host_residents
from modelpool_operator.placement.ledger import Host, ledger

GI = 1 << 30


def stats(state: str, reserved: int) -> dict[str, Any]:
    return {
        "host": {"devices": []},
        "models": {"emb": {"state": state, "memory": {"gpu_reserved_bytes": reserved}}},
    }


def charges(state: str, reserved: int) -> tuple[int, int]:
    residents = host_residents(
        "ns", HostStats.parse(stats(state, reserved)), {"emb": HostedPool("emb", 2 * GI)}
    )
    led = ledger(Host("h-0", (8 * GI,), 16 * GI, residents))
    return led.devices[0].awake, led.parked


def test_a_cpu_hosts_model_without_a_gpu_reading_is_charged_its_declared_size() -> None:
    assert charges("Ready", 0) == (2 * GI, 0)


def test_a_sleeping_model_parks_its_declared_size_though_the_gpu_reads_nothing() -> None:
    assert charges("Sleeping", 0) == (0, 2 * GI)


def test_a_measured_model_is_charged_its_measure() -> None:
    assert charges("Ready", 3 * GI) == (3 * GI, 0)


def test_a_change_of_a_models_state_on_a_shared_host_is_news_for_its_modelhost() -> None:
    """Else a ModelHost's pass never followed its hosts' /stats (found by the placement audit: after each
    sleep or load the next pass waited for the resync, one step every 10-20 s per host)."""
    from modelpool_operator.observe.stats import _news

    assert _news(stats("Ready", 0)) != _news(stats("Sleeping", 0))
    assert _news(stats("Ready", 0)) != _news({"host": {"devices": []}, "models": {}})
    assert _news(stats("Ready", 0)) == _news(stats("Ready", 0))


def test_each_model_is_charged_on_the_device_its_host_reports_and_a_pod_has_the_devices_it_lists() -> None:
    """A host pod of several GPUs reports each model's device (``models.<name>.device``) and each device
    (``host.devices``): the ledger charges each model there, not on device 0."""
    from modelpool_contract.api import parse_host_spec
    from modelpool_operator.observe.hosts import host_devices, observe_hosts
    from tests.operator.unit.test_shared_pool_wait import pod

    report: dict[str, Any] = {
        "host": {"devices": [{"index": 0}, {"index": 1}, {"index": 2}]},
        "models": {
            "a": {"state": "Ready", "device": 2, "memory": {"gpu_reserved_bytes": 3 * GI}},
            "b": {"state": "Idle", "memory": {"gpu_reserved_bytes": GI}},  # names none: device 0
            "c": {"state": "Ready", "device": "one", "memory": {"gpu_reserved_bytes": GI}},  # unreadable: 0
        },
    }
    residents = {r.pool[1]: r.device for r in host_residents("ns", HostStats.parse(report), {})}
    assert residents == {"a": 2, "b": 0, "c": 0}
    assert host_devices(HostStats.parse(report), 2) == 3
    assert host_devices(HostStats.parse({"host": {"devices": []}}), 2) == 2
    assert host_devices(None, 1) == 1
    spec = parse_host_spec({"gpusPerHost": 2, "deviceMemory": "8Gi", "modelOverhead": 0})
    [h] = observe_hosts(spec, [pod("h-0")], host_reports({"h-0": report}))
    assert h.capacities == (8 * GI,) * 3
    assert [d.awake for d in ledger(h).devices] == [2 * GI, 0, 3 * GI]
    # A model on a device the report does not list still counts (on a device of its own), never fails.
    odd = {"host": {"devices": [{"index": 0}]}, "models": {"a": report["models"]["a"]}}
    [h] = observe_hosts(spec, [pod("h-0")], host_reports({"h-0": odd}))
    assert h.capacities == (8 * GI,) * 3 and ledger(h).devices[2].awake == 3 * GI
    # A shared pool's replicas say which device of their host pod holds the model (its status shows it).
    from modelpool_operator.observe.hosts import hosted_workers

    [a] = hosted_workers("ns", "a", GI, [pod("h-0")], host_reports({"h-0": report}))
    [b] = hosted_workers("ns", "b", GI, [pod("h-0")], host_reports({"h-0": report}))
    assert (a.name, a.device, b.device) == ("h-0", 2, None)


def test_a_models_state_since_is_read_for_its_idle_age() -> None:
    """The ledger's idle age (``Resident.idle_since``: a model just loaded, woken or used is not put to
    sleep for another) needs when the model entered its state, from its ``state_since``."""
    doc = {"state": "Ready", "state_since": 120.5, "last_request_time": 100.0}
    [resident] = host_residents("ns", HostStats.parse({"models": {"emb": doc}}), {})
    assert (resident.since, resident.idle_since) == (120.5, 120.5)
    [idle] = host_residents("ns", HostStats.parse({"models": {"emb": {**doc, "state": "Idle"}}}), {})
    assert idle.idle_since == 100.0  # turned Idle after a quiet spell: idle since its last request
