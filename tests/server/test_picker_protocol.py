"""The endpoint picker's protocol on a text-generation worker's probe port (issue 33, item 2).

Units: ``metrics.picker_rows`` (pure) and the gauges over a real shared view.  Process: a real server with
the streaming echo generation handler (``tests.server.handlers:EchoGeneration``, imported by that name),
scraped on its probe port while streams are held after their first piece: the waiting and running counts
move with the load and come back to 0, and ``/v1/models`` lists the model; and a tiny Llama on the
continuous-batching engine, whose KV share follows a running generation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from model_server.metrics import WorkerGauges, picker_rows, render_worker
from model_server.state_machine import StateMachine
from model_server.worker_view import PAGE_TOKENS, Field, WorkerView
from modelpool_contract import picker
from testkit import prom, tiny_models
from testkit.server import ServerProcess, launch
from testkit.waiting import wait_for

GENERATION = "tests.server.handlers:EchoGeneration"


def _by_name(
    rows: list[tuple[str, str, tuple[tuple[str, str], ...], float]],
) -> dict[str, tuple[dict[str, str], float]]:
    return {name: (dict(labels), value) for name, _, labels, value in rows}


def test_picker_rows_carry_the_vllm_names_and_a_share_of_the_cache() -> None:
    rows = _by_name(picker_rows(3, 2, kv_tokens=4096, kv_reserved=1024, now=1234.5))
    assert rows[picker.WAITING] == ({}, 3.0)
    assert rows[picker.RUNNING] == ({}, 2.0)
    assert rows[picker.KV_USAGE] == ({}, 0.25)
    cache = {picker.CACHE_BLOCK_SIZE: str(PAGE_TOKENS), picker.CACHE_NUM_BLOCKS: str(4096 // PAGE_TOKENS)}
    assert rows[picker.CACHE_INFO] == (cache, 1.0)
    lora = {picker.LORA_RUNNING: "", picker.LORA_WAITING: "", picker.LORA_MAX: "0"}
    assert rows[picker.LORA_INFO] == (lora, 1234.5)


@pytest.mark.parametrize(("tokens", "reserved"), [(None, None), (0.0, 0.0), (64.0, None)])
def test_an_unknown_or_empty_cache_is_no_use(tokens: float | None, reserved: float | None) -> None:
    rows = _by_name(picker_rows(0, 0, kv_tokens=tokens, kv_reserved=reserved, now=0.0))
    assert rows[picker.KV_USAGE] == ({}, 0.0)


def test_the_share_never_leaves_0_to_1() -> None:
    """A reservation counted in whole pages may pass the cache's tokens for a moment: the picker's gauge
    stays a share."""
    assert _by_name(picker_rows(0, 0, kv_tokens=100, kv_reserved=128, now=0.0))[picker.KV_USAGE][1] == 1.0


def _gauges(picker_on: bool) -> tuple[WorkerView, WorkerGauges]:
    view = WorkerView(8, http_processes=1)
    return view, WorkerGauges(view, StateMachine(store=view.state_store()), picker=picker_on)


def test_the_gauges_read_the_view_at_scrape_time() -> None:
    view, gauges = _gauges(True)
    assert view.door.take() and view.door.take()
    view.set(Field.IN_FLIGHT, 1)
    view.set(Field.KV_CACHE_TOKENS, 2048)
    view.set(Field.KV_CACHE_RESERVED, 512)
    found = prom.samples(render_worker(gauges, None).decode())
    assert prom.sample(found, picker.WAITING) == 2
    assert prom.sample(found, picker.RUNNING) == 1
    assert prom.sample(found, picker.KV_USAGE) == 0.25
    info = {picker.CACHE_BLOCK_SIZE: str(PAGE_TOKENS), picker.CACHE_NUM_BLOCKS: str(2048 // PAGE_TOKENS)}
    assert prom.sample(found, picker.CACHE_INFO, **info) == 1


def test_a_worker_the_picker_does_not_serve_exports_none_of_its_names() -> None:
    _, gauges = _gauges(False)
    text = render_worker(gauges, None).decode()
    assert not [s for s in prom.iter_samples(text) if s.name.startswith("vllm:")]


def test_only_text_generation_speaks_the_protocol() -> None:
    assert picker.speaks_picker("text-generation")
    assert not picker.speaks_picker("text-embedding")
    labels = {picker.ENGINE_TYPE_LABEL: "vllm", picker.LEGACY_ENGINE_TYPE_LABEL: "vllm"}
    assert picker.engine_labels("text-generation") == labels
    assert picker.engine_labels("vision") == {}


# ---- a real worker process ------------------------------------------------------------------------------


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[ServerProcess, Path]]:
    """A text-generation worker whose streams wait after their first piece until the gate file exists."""
    gate = tmp_path / "emit-gate"
    args = ["--model", "/", "--task", "text-generation", "--handler", GENERATION, "--device", "cpu"]
    proc = launch([*args, "--name", "gen"], env={"HANDLER_EMIT_GATE": str(gate)}, probe=True)
    try:
        proc.wait("/v2/health/ready", timeout=120)
        yield proc, gate
    finally:
        gate.touch()
        proc.stop()


def _scrape(proc: ServerProcess) -> prom.Samples:
    assert proc.probe_url is not None
    return prom.samples(httpx.get(proc.probe_url + "/metrics", timeout=5).text)


def _stream(proc: ServerProcess, prompt: str, out: list[int]) -> None:
    body = {"model": "gen", "prompt": prompt, "max_tokens": 10, "stream": True}
    with httpx.stream("POST", proc.url + "/v1/completions", json=body, timeout=120) as response:
        out.append(response.status_code)
        for _ in response.iter_lines():
            pass


def test_the_probe_port_counts_move_with_the_load(held: tuple[ServerProcess, Path]) -> None:
    proc, gate = held
    idle = _scrape(proc)
    assert (prom.sample(idle, picker.WAITING), prom.sample(idle, picker.RUNNING)) == (0, 0)
    assert prom.sample(idle, picker.KV_USAGE) == 0  # the echo handler has no KV cache
    codes: list[int] = []
    streams = [threading.Thread(target=_stream, args=(proc, f"s{i} two three", codes)) for i in range(3)]
    for thread in streams:
        thread.start()

    def loaded() -> bool:
        found = _scrape(proc)
        return prom.sample(found, picker.RUNNING) == 1 and prom.sample(found, picker.WAITING) == 2

    # The serial engine holds one stream after its first piece; the other two wait in the queue.
    wait_for(loaded, timeout=60, message="one stream running and two waiting on the probe port")
    gate.touch()
    for thread in streams:
        thread.join(timeout=60)
    assert codes == [200, 200, 200]

    def drained() -> bool:
        found = _scrape(proc)
        return prom.sample(found, picker.RUNNING) == 0 and prom.sample(found, picker.WAITING) == 0

    wait_for(drained, timeout=30, message="nothing running or waiting")


def test_v1_models_lists_the_served_model(held: tuple[ServerProcess, Path]) -> None:
    proc, _ = held
    models = httpx.get(proc.url + "/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == ["gen"]


# The continuous-batching engine's KV cache, as the picker sees it: a tiny Llama generating.
CONTEXT = 1024
KV_TOKENS = 4 * CONTEXT
MAX_TOKENS = 400


@pytest.fixture
def llama(tmp_path: Path) -> Iterator[ServerProcess]:
    model = tiny_models.build_llama_generation(tmp_path / "llama", context=CONTEXT)
    args = ["--model", str(model), "--task", "text-generation", "--device", "cpu", "--name", "tiny"]
    proc = launch([*args, "--kv-cache-tokens", str(KV_TOKENS)], probe=True)
    try:
        proc.wait("/v2/health/ready", timeout=180)
        yield proc
    finally:
        proc.stop()


@pytest.mark.slow
def test_the_kv_share_moves_with_a_generation(llama: ServerProcess) -> None:
    """While a long generation runs its reservation shows as a share of the cache, then goes back to 0;
    the cache's geometry is the engine's pages."""
    idle = _scrape(llama)
    assert prom.sample(idle, picker.KV_USAGE) == 0
    info = {picker.CACHE_BLOCK_SIZE: str(PAGE_TOKENS), picker.CACHE_NUM_BLOCKS: str(KV_TOKENS // PAGE_TOKENS)}
    assert prom.sample(idle, picker.CACHE_INFO, **info) == 1
    body = {"model": "tiny", "prompt": "the first stream", "max_tokens": MAX_TOKENS, "temperature": 0}
    with httpx.stream("POST", llama.url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # generating
        found = _scrape(llama)
        share = prom.sample(found, picker.KV_USAGE)
        # The reservation: prompt plus max_tokens in whole pages, over the cache's tokens.
        assert (
            share is not None
            and MAX_TOKENS / KV_TOKENS <= share <= (MAX_TOKENS + 2 * PAGE_TOKENS) / KV_TOKENS
        )
        assert prom.sample(found, picker.RUNNING) == 1
        for _ in lines:
            pass
    wait_for(lambda: prom.sample(_scrape(llama), picker.KV_USAGE) == 0, timeout=30, message="the share freed")
