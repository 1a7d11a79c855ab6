"""The endpoint picker's protocol on a text-generation worker's probe port (issue 33, item 2), through real
processes: a server with the streaming echo generation handler (``testkit.echo_models``), scraped on its
probe port while streams are held after their first piece: the waiting and running counts move with the
load and come back to 0, and ``/v1/models`` lists the model; and a tiny Llama on the continuous-batching
engine, whose KV share follows a running generation. The pure part: tests/server/unit/test_picker_rows.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from model_server.worker_view import PAGE_TOKENS
from modelpool_contract import picker
from testkit import prom, tiny_models
from testkit.echo_models import GENERATION
from testkit.server import ServerProcess, launch
from testkit.waiting import wait_for


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
