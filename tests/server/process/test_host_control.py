"""A shared host's control API over real HTTP, without models: the key guard (``--control-key-file``),
bad load bodies (400 naming the field, a device index the host lacks among them), unknown models (404);
health and ``/stats`` stay open. A host of two devices: its ledgers, index and ``/stats`` per device."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from model_server.config import ConfigError
from model_server.host_config import HostConfig, LoadError, load_host_config, parse_load_body, slot_config
from model_server.state_machine import State
from model_server.supervisor.host import HostSupervisor, NoRoom
from model_server.supervisor.host_control import HostControlServer, authorized
from modelpool_contract.placements import default_model_overhead

KEY = "s3cret-control-key"


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    key_file = tmp_path_factory.mktemp("key") / "key"
    key_file.write_text(KEY + "\n")
    # One device whatever GPUs the machine has (--gpus 1).
    config = HostConfig(device_memory="1Gi", max_models=1, gpus=1, control_key_file=key_file)  # type: ignore[arg-type]
    server = HostControlServer(("127.0.0.1", 0), HostSupervisor(config))
    server.serve_in_thread()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _load(url: str, name: str, config: object, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"parameters": {"config": json.dumps(config)}}
    return httpx.post(f"{url}/v2/repository/models/{name}/load", json=body, headers=headers, timeout=10)


def test_the_control_api_needs_its_key_and_health_and_stats_do_not(control: str) -> None:
    assert httpx.post(control + "/v2/repository/index", timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert httpx.post(control + "/v2/repository/index", headers=wrong, timeout=10).status_code == 401
    right = {"Authorization": f"Bearer {KEY}"}
    answer = httpx.post(control + "/v2/repository/index", headers=right, timeout=10)
    assert answer.status_code == 200 and answer.json() == []
    assert _load(control, "m", {"source": "/x", "task": "text-embedding"}, key=None).status_code == 401
    assert httpx.get(control + "/v2/health/live", timeout=10).status_code == 200
    stats = httpx.get(control + "/stats", timeout=10).json()
    device = stats["host"]["devices"][0]
    assert stats["models"] == {} and device["free"] == 1 << 30 and device["overhead"] == 0
    assert device["model_overhead"] == default_model_overhead(gpu=True)  # --device auto: maybe a GPU


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"source": "/x", "task": "nope"}, "parameters.config.task"),
        ({"task": "text-embedding"}, "parameters.config.source"),
        ({"source": "/x", "task": "text-embedding", "colour": "red"}, "colour"),
        ({"source": "/x", "task": "text-embedding", "memory": "lots"}, "parameters.config.memory"),
        (
            {"source": "/x", "task": "text-embedding", "device": 1},
            "parameters.config.device: device 1 is not",
        ),
        ([1, 2], "parameters.config must be a JSON object"),
    ],
)
def test_a_bad_load_body_is_a_400_naming_the_field(control: str, config: object, field: str) -> None:
    answer = _load(control, "m", config)
    assert answer.status_code == 400 and field in answer.json()["error"], answer.text


def test_an_unknown_model_is_a_404(control: str) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    for action in ("sleep", "wake", "unload"):
        url = f"{control}/v2/repository/models/nobody/{action}"
        assert httpx.post(url, headers=headers, timeout=10).status_code == 404


def test_authorized() -> None:
    assert authorized(None, None) and authorized("Bearer x", None)
    assert authorized(f"Bearer {KEY}", KEY) and authorized(f"bearer  {KEY} ", KEY)
    assert not authorized(None, KEY) and not authorized(KEY, KEY) and not authorized(f"Basic {KEY}", KEY)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--shared-host"], "--device-memory"),
        (["--shared-host", "--device-memory", "lots"], "--device-memory"),
        (["--shared-host", "--device-memory", "1Gi", "--device", "tpu"], "--device"),
        (["--shared-host", "--device-memory", "1Gi", "--max-models", "0"], "--max-models"),
    ],
)
def test_a_bad_host_flag_is_refused_naming_it(argv: list[str], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        load_host_config(argv)


def test_the_host_reads_quantities() -> None:
    config = load_host_config(["--shared-host", "--device-memory", "40Gi", "--host-memory", "1e9"])
    assert (config.device_memory, config.host_memory) == (40 << 30, 10**9)


def test_a_host_of_two_devices_keeps_a_ledger_each_and_makes_room_on_the_one_named() -> None:
    config = HostConfig(device_memory="4Gi", gpus=2, max_models=2, model_overhead=0)  # type: ignore[arg-type]
    host = HostSupervisor(config)
    assert host.devices == ("cuda:0", "cuda:1")
    # A model working on device 1 (a slot as a load leaves it, without its process).
    slot = host.slots[0]
    slot.config = slot_config(config, "a", {"model": "/x", "task": "text-embedding"}, 0, host.devices[1])
    slot.device, slot.memory = 1, 3 << 30
    for state in (State.LOADING, State.READY, State.PROCESSING):
        slot.state_machine.to(state)
    assert slot.config.device == "cuda:1"
    assert [(e["name"], e["device"]) for e in host.index()] == [("a", 1)]
    devices = host.stats()["host"]["devices"]
    assert [(d["device"], d["awake"], d["free"]) for d in devices] == [
        ("cuda:0", 0, 4 << 30),
        ("cuda:1", 3 << 30, 1 << 30),
    ]
    # 2 GiB: no room on device 1 (its one model works), room on device 0 without sleeping anything.
    with pytest.raises(NoRoom, match="device 1"):
        host._make_room(2 << 30, 1, keep=None)
    host._make_room(2 << 30, 0, keep=None)
    assert slot.state_machine.state is State.PROCESSING


def test_a_load_brings_its_pools_queue_to_its_model_and_the_host_bounds_it() -> None:
    """A shared pool's ``spec.queue`` reaches its model (it was silently the host's): its capacity is the
    model's door, its request timeout the model's deadline; beyond a door's size the load is refused."""
    config = HostConfig(device_memory="1Gi", max_models=1, gpus=1, queue_capacity=100)  # type: ignore[arg-type]
    own = slot_config(config, "a", {"model": "/x", "task": "text-embedding", "queue_capacity": 7,
                                    "request_timeout": 12.5}, 0)  # fmt: skip
    assert (own.queue_capacity, own.request_timeout) == (7, 12.5)
    default = slot_config(config, "a", {"model": "/x", "task": "text-embedding"}, 0)
    assert (default.queue_capacity, default.request_timeout) == (100, config.request_timeout)
    with pytest.raises(LoadError, match=r"parameters\.config\.queue_capacity: at most 100000"):
        slot_config(config, "a", {"model": "/x", "task": "text-embedding", "queue_capacity": 100_001}, 0)
    body = json.dumps({"parameters": {"config": json.dumps({"source": "/x", "task": "text-embedding",
                                                            "queue_capacity": 3})}}).encode()  # fmt: skip
    assert parse_load_body(body).settings["queue_capacity"] == 3
