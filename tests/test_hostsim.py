"""The simulated shared host (``testkit.hostsim``) answers as the real one, through the real probe-port
handler: the control key is checked, a load the device cannot hold even with every idle model asleep is
refused with 507 and counted as a violation, the host sleeps idle models itself to make room (counted),
``/stats`` is the host's document, and an unload of a Loading model is a violation."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import cast

import httpx
import pytest

from model_server.supervisor.host import HostSupervisor
from model_server.supervisor.host_control import HostControlServer
from testkit.hostsim import Audit, SimHost
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


def load(url: str, name: str, gib: int, key: str = "k") -> httpx.Response:
    config = json.dumps({"source": f"/models/{name}", "task": "text-embedding", "memory": gib * GI})
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
    assert refused.status_code == 507 and "do not fit on the device" in refused.json()["error"]
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
