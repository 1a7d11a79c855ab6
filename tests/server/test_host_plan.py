"""A shared host's pure decisions (``model_server/host_plan.py``): routing by model name, the device
ledger, which idle models sleep to make room, when a sleep is refused."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from model_server.host_config import HostConfig
from model_server.host_plan import (
    SlotFacts,
    device_free,
    device_overhead,
    device_used,
    host_used,
    make_room,
    model_of,
    sleep_refusal,
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
@given(SLOTS, st.integers(0, 20), st.integers(0, 40), st.none() | st.integers(0, 40))
def test_made_room_fits_never_takes_working_models_and_respects_host_memory(
    slots: list[SlotFacts], need: int, capacity: int, host: int | None
) -> None:
    chosen = make_room(need, 0, capacity, host, slots)
    if chosen is None:
        return
    by_name = {s.name: s for s in slots}
    picked = [by_name[name] for name in chosen]
    assert all(s.device == 0 and s.state in SLEEPABLE and not s.busy for s in picked)
    after = [replace(s, state=State.SLEEPING) if s.name in chosen else s for s in slots]
    # Never over-committed, the processes' overhead included (a sleep leaves it on the device).
    assert device_used(0, after) + device_overhead(0, after) + need <= capacity
    assert device_overhead(0, after) == device_overhead(0, slots)
    if host is not None and chosen:
        assert host_used(after) <= max(host, host_used(slots))
    assert [s.last_used for s in picked] == sorted(s.last_used for s in picked)  # least recently used first
