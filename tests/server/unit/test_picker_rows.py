"""The endpoint picker's protocol on a text-generation worker's probe port (issue 33, item 2), the pure
part: ``metrics.picker_rows`` and the gauges over a real shared view (no process). The process part, a real
server scraped under load, is tests/server/process/test_picker_protocol.py."""

from __future__ import annotations

import pytest

from model_server.metrics import WorkerGauges, picker_rows, render_worker
from model_server.state_machine import StateMachine
from model_server.worker_view import PAGE_TOKENS, Field, WorkerView
from modelpool_contract import picker
from testkit import prom


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
