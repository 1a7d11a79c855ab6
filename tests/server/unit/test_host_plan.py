"""A shared host's pure decisions (``model_server/host_plan.py``): routing by model name, the device
ledger, which idle models sleep to make room, when a sleep is refused; a host of several devices: how many
it has and what each one's models run on, a load's device index, the roomiest device, ``/stats``' report."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_server.config import ConfigError
from model_server.engine.worker import cuda_index
from model_server.host_config import HostConfig, LoadError, load_host_config, parse_load_body, slot_config
from model_server.host_plan import (
    SlotFacts,
    device_free,
    device_names,
    device_overhead,
    device_refusal,
    device_report,
    device_used,
    host_used,
    make_room,
    model_of,
    roomiest_device,
    sleep_refusal,
    visible_gpus,
)
from model_server.state_machine import SLEEPABLE, State
from modelpool_contract.placements import default_model_overhead

GB = 1 << 30


def slot(
    name: str, state: State = State.IDLE, *, used: float = 0.0, gb: int = 1, **more: object
) -> SlotFacts:
    return replace(SlotFacts(name, state, 0, gb * GB, gb * GB, used), **more)  # type: ignore[arg-type]


def test_a_request_names_its_model_by_the_v2_path_or_the_openai_body() -> None:
    assert model_of("/v2/models/minilm/infer", b"{}") == "minilm"
    assert model_of("/v2/models/minilm", None) == "minilm"
    assert model_of("/v1/embeddings", json.dumps({"model": "e5", "input": "x"}).encode()) == "e5"
    for body in (None, b"", b"not json", b"[1]", b'{"model": 5}', b'{"model": ""}', b'{"input": "x"}'):
        assert model_of("/v1/embeddings", body) is None
    assert model_of("/v2/models//infer", None) is None


def test_the_ledger_charges_awake_models_on_their_device_and_sleeping_ones_in_host_memory() -> None:
    slots = [
        slot("a", State.READY),
        slot("b", State.SLEEPING, gb=2),
        slot("c", State.WAKING),
        slot("d", State.LOADING),
        slot("e", State.FAILED),
        slot("f", State.IDLE, device=1),
    ]
    assert device_used(0, slots) == 3 * GB  # a, c, d: Sleeping charged host memory, Failed nothing
    assert device_used(1, slots) == GB
    assert host_used(slots) == 2 * GB


def test_every_loaded_model_is_charged_its_process_overhead_awake_or_asleep() -> None:
    over = {"overhead": GB // 2}
    slots = [
        slot("awake", State.READY, **over),
        slot("asleep", State.SLEEPING, gb=2, **over),
        slot("loading", State.LOADING, **over),
        slot("failed", State.FAILED, **over),  # its process is gone: nothing
        slot("dead", State.DEAD, **over),
        slot("elsewhere", State.IDLE, device=1, **over),
    ]
    assert device_used(0, slots) == 2 * GB  # the weights: awake and loading
    assert device_overhead(0, slots) == 3 * GB // 2  # awake, asleep and loading each hold a process
    assert device_free(0, 4 * GB, slots) == GB // 2
    # A new model needs its size and its overhead; a sleep gives back the weights, never the overhead.
    assert make_room(GB // 2, 0, 4 * GB, None, slots) == []
    assert make_room(GB, 0, 4 * GB, None, slots) == ["awake"]
    assert make_room(2 * GB, 0, 4 * GB, None, slots) is None  # its sleep frees 1 GB, not its 0.5 GB process
    more = [*slots, slot("idle", State.IDLE, used=5.0, **over)]  # 1 GB awake + 0.5 GB: over by 1 GB
    assert device_free(0, 4 * GB, more) == -GB
    assert make_room(GB, 0, 4 * GB, None, more) == ["awake", "idle"]
    assert make_room(2 * GB, 0, 4 * GB, None, more) is None


def test_the_host_charges_the_contract_default_overhead_unless_told() -> None:
    gpu = HostConfig(device_memory="8Gi")  # type: ignore[arg-type]
    cpu = HostConfig(device_memory="8Gi", device="cpu")  # type: ignore[arg-type]
    assert gpu.overhead == default_model_overhead(gpu=True) > 0
    assert cpu.overhead == default_model_overhead(gpu=False) > 0
    assert HostConfig(device_memory="8Gi", model_overhead="300Mi").overhead == 300 << 20  # type: ignore[arg-type]
    assert HostConfig(device_memory="8Gi", model_overhead=0).overhead == 0  # type: ignore[arg-type]


def test_room_is_made_by_sleeping_the_least_recently_used_idle_models_only() -> None:
    slots = [
        slot("new", State.PROCESSING, used=1.0),
        slot("old", State.IDLE, used=2.0),
        slot("older", State.READY, used=1.5),
        slot("busy", State.READY, used=0.5, busy=True),
        slot("loading", State.LOADING, used=0.1),
        slot("waking", State.WAKING, used=0.2),
        slot("elsewhere", State.IDLE, used=0.0, device=1),
    ]
    assert make_room(GB, 0, 8 * GB, None, slots) == []  # 6 GB charged: 2 free
    assert make_room(3 * GB, 0, 8 * GB, None, slots) == ["older"]
    assert make_room(4 * GB, 0, 8 * GB, None, slots) == ["older", "old"]
    assert make_room(5 * GB, 0, 8 * GB, None, slots) is None  # the rest are never put to sleep
    assert make_room(3 * GB, 0, 8 * GB, 0, slots) is None  # no host memory for their weights


def test_a_sleep_is_refused_unless_ready_or_idle_without_work_and_with_host_memory() -> None:
    asleep = slot("asleep", State.SLEEPING, gb=3)
    assert sleep_refusal(slot("a"), None, [asleep]) == ""
    assert sleep_refusal(slot("a"), 4 * GB, [asleep]) == ""
    assert "host memory short" in sleep_refusal(slot("a", gb=2), 4 * GB, [asleep])
    assert "work in hand" in sleep_refusal(slot("a", busy=True), None, [])
    for state in set(State) - SLEEPABLE:
        assert sleep_refusal(slot("a", state), None, []) == f"a {state} model cannot sleep"


SLOTS = st.lists(
    st.builds(
        SlotFacts,
        name=st.text("abcdefgh", min_size=1, max_size=3),
        state=st.sampled_from(list(State)),
        device=st.integers(0, 1),
        device_bytes=st.integers(0, 8),
        host_bytes=st.integers(0, 8),
        last_used=st.floats(0, 100),
        busy=st.booleans(),
        overhead=st.integers(0, 3),
    ),
    max_size=10,
    unique_by=lambda s: s.name,
)


@settings(max_examples=300, deadline=None)
@given(SLOTS, st.integers(0, 20), st.integers(0, 40), st.none() | st.integers(0, 40), st.integers(0, 1))
def test_made_room_fits_never_takes_working_models_and_respects_host_memory(
    slots: list[SlotFacts], need: int, capacity: int, host: int | None, device: int
) -> None:
    chosen = make_room(need, device, capacity, host, slots)
    if chosen is None:
        return
    by_name = {s.name: s for s in slots}
    picked = [by_name[name] for name in chosen]
    assert all(s.device == device and s.state in SLEEPABLE and not s.busy for s in picked)
    after = [replace(s, state=State.SLEEPING) if s.name in chosen else s for s in slots]
    # Never over-committed, the processes' overhead included (a sleep leaves it on the device).
    assert device_used(device, after) + device_overhead(device, after) + need <= capacity
    assert device_overhead(device, after) == device_overhead(device, slots)
    other = 1 - device  # the other device's ledger is untouched
    assert device_free(other, capacity, after) == device_free(other, capacity, slots)
    if host is not None and chosen:
        assert host_used(after) <= max(host, host_used(slots))
    assert [s.last_used for s in picked] == sorted(s.last_used for s in picked)  # least recently used first


def test_the_gpus_a_host_sees_are_cuda_visible_devices_else_the_nvidia_device_files() -> None:
    dev = ["null", "nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps"]
    assert visible_gpus(None, dev) == 2  # the device plugin mounted two GPUs
    assert visible_gpus(None, ["null", "zero"]) == 0
    assert visible_gpus("1,0,3", dev) == 3 and visible_gpus("GPU-8d3e,GPU-1a2b", []) == 2
    assert visible_gpus("", dev) == 0 and visible_gpus("-1", dev) == 0
    assert visible_gpus("0,-1,2", dev) == 1  # CUDA stops at the first invalid entry


def test_a_host_of_several_gpus_runs_the_models_of_gpu_i_on_cuda_i_and_one_device_is_unchanged() -> None:
    assert device_names("auto", 2) == ("cuda:0", "cuda:1")
    assert device_names("cuda", 3) == ("cuda:0", "cuda:1", "cuda:2")
    for device in ("auto", "cuda", "cpu", "cuda:3"):
        assert device_names(device, 1) == (device,)  # one device: the models run with the host's --device
    assert device_names("cpu", 4) == ("cpu",) and device_names("cuda:1", 4) == ("cuda:1",)
    assert (cuda_index("cuda:1"), cuda_index("cuda:12")) == (1, 12)
    assert cuda_index("cuda") is cuda_index("cpu") is cuda_index("auto") is None


def test_the_hosts_devices_are_its_gpus_flag_else_those_visible_and_a_cpu_host_has_one() -> None:
    def names(*argv: str, env: dict[str, str] | None = None, dev: list[str] | None = None) -> tuple[str, ...]:
        config = load_host_config(["--shared-host", "--device-memory", "8Gi", *argv])
        return config.device_names(env or {}, dev or [])

    assert names("--gpus", "2") == ("cuda:0", "cuda:1")
    assert names(dev=["nvidia0", "nvidia1"]) == ("cuda:0", "cuda:1")  # auto: the GPUs visible
    assert names(env={"CUDA_VISIBLE_DEVICES": "3"}, dev=["nvidia0", "nvidia1"]) == ("auto",)
    assert names() == ("auto",)  # no GPU visible: one device, as before
    assert names("--device", "cpu") == ("cpu",) and names("--device", "cuda:1") == ("cuda:1",)
    for argv in (["--device", "cpu", "--gpus", "2"], ["--device", "cuda:0", "--gpus", "2"], ["--gpus", "0"]):
        with pytest.raises(ConfigError, match="--gpus"):
            load_host_config(["--shared-host", "--device-memory", "8Gi", *argv])


def test_a_load_names_its_device_index_and_one_the_host_does_not_have_is_refused() -> None:
    def body(**config: object) -> bytes:
        settings = {"source": "/m", "task": "text-embedding", **config}
        return json.dumps({"parameters": {"config": json.dumps(settings)}}).encode()

    assert parse_load_body(body(device=1), 2).device == 1
    settings, memory, device = parse_load_body(body(memory="1Gi"))
    assert (memory, device) == (GB, None) and "device" not in settings
    assert device_refusal(0, 1) == "" and device_refusal(3, 4) == ""
    for bad, devices, said in [
        (1, 1, "device 1 is not one of this host's (device 0)"),
        (2, 2, "device 2 is not one of this host's (devices 0-1)"),
        (-1, 2, "not one of this host's"),
        ("0", 2, "must be a device index"),
        (True, 2, "must be a device index"),
    ]:
        assert said in device_refusal(bad, devices)
        with pytest.raises(LoadError, match=r"parameters\.config\.device"):
            parse_load_body(body(device=bad), devices)
    host = HostConfig(device_memory="8Gi", gpus=2)  # type: ignore[arg-type]
    assert slot_config(host, "m", settings, 0, "cuda:1").device == "cuda:1"
    assert slot_config(host, "m", settings, 0).device == "auto"


def test_a_load_that_names_no_device_goes_to_the_roomiest() -> None:
    slots = [slot("a", State.READY, gb=3), slot("b", State.SLEEPING, gb=4, device=1)]
    assert roomiest_device(1, 8 * GB, []) == 0
    assert roomiest_device(2, 8 * GB, []) == 0  # equals: the lowest index
    assert roomiest_device(2, 8 * GB, slots) == 1  # b sleeps: device 1 is all free
    assert roomiest_device(3, 8 * GB, [*slots, slot("c", device=1)]) == 2


def test_each_device_reports_its_own_ledger() -> None:
    over = {"overhead": GB // 4}
    slots = [
        slot("a", State.READY, gb=2, **over),
        slot("b", State.SLEEPING, gb=3, **over),
        slot("c", State.IDLE, gb=1, device=1, **over),
    ]
    zero = device_report(0, "cuda:0", 8 * GB, GB // 4, slots)
    one = device_report(1, "cuda:1", 8 * GB, GB // 4, slots)
    assert zero == {
        "index": 0, "device": "cuda:0", "capacity": 8 * GB, "awake": 2 * GB, "asleep": 3 * GB,
        "overhead": GB // 2, "model_overhead": GB // 4, "free": 8 * GB - 2 * GB - GB // 2,
        "models": ["a", "b"],
    }  # fmt: skip
    assert (one["awake"], one["asleep"], one["overhead"], one["models"]) == (GB, 0, GB // 4, ["c"])
