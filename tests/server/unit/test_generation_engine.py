"""The continuous-batching generation engine (``model_server.engine.generation_engine``) in-process, on a tiny
Llama built from a config and loaded through the real text-generation task: streams interleave and each
gets its own text, greedy equals ``generate`` for every request (and the token metrics count them), stop
strings and max_tokens end one request while others run, cancelled and timed-out requests leave every
table as it was, admission in tokens (400 with the numbers, 429 with Retry-After).  Plus its pure
decisions, and the serial path's stopping criterion for a generation nobody waits for (the server's view
of the engine is in test_task_server.py)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from model_server.config import ServerConfig
from model_server.engine.generation_engine import (
    GREEDY_TEMPERATURE,
    PAGE_TOKENS,
    BatchingEngine,
    admission_error,
    attach,
    cgroup_memory_limit,
    default_kv_cache_tokens,
    finish_reason,
    refusal,
    sampling,
)
from model_server.engine.unit import Unit
from model_server.errors import InvalidInput, Overloaded, ServerError
from model_server.metrics import Metrics
from model_server.tasks.base import GenerationItem, GenerationParams, GenerationResult
from model_server.tasks.generation import watching_cancel
from model_server.tasks.text_generation import TextGenerationTask
from model_server.worker_stats import inference_wedged
from model_server.worker_view import Field, WorkerView
from testkit.waiting import wait_for_async
from tests.server.tiny_fixtures import load_task, tiny_llama_generation, torch_threads

__all__ = ["tiny_llama_generation"]  # the session fixture, re-exported for pytest

PROMPTS = [
    "Hello, world!",
    "A man is eating food.",
    "Once upon a time there was",
    "The quick brown fox",
    "What is in this picture?",
    "numbers 0123456789",
]
WAIT_S = 30.0  # every wait below is bounded by this


# ---- pure decisions -------------------------------------------------------------------------------


def test_admission_refuses_what_can_never_fit_with_the_numbers() -> None:
    error = admission_error([(100, 60)], capacity=128, reserved=0, retry_after_s=1)
    assert isinstance(error, InvalidInput)
    assert "160 tokens" in str(error) and "100 in the prompt + 60 max_tokens" in str(error)
    assert "holds 128 (--kv-cache-tokens)" in str(error)


def test_admission_is_429_when_the_running_requests_hold_the_cache() -> None:
    assert admission_error([(10, 20)], capacity=128, reserved=64, retry_after_s=3) is None
    full = admission_error([(10, 20)], capacity=128, reserved=128 - PAGE_TOKENS + 1, retry_after_s=3)
    assert isinstance(full, Overloaded) and full.retry_after_s == 3
    assert "KV cache full" in str(full)
    # Several generations in one request each hold whole pages: 3 x 1 page fit 3 pages, 4 do not.
    assert admission_error([(10, 10)] * 3, capacity=3 * PAGE_TOKENS, reserved=0, retry_after_s=1) is None
    assert isinstance(
        admission_error([(10, 10)] * 4, capacity=3 * PAGE_TOKENS, reserved=0, retry_after_s=1), InvalidInput
    )


def test_temperature_zero_is_greedy_and_seed_is_refused_only_when_sampling() -> None:
    assert sampling(GenerationParams(temperature=0.0)) == {"temperature": GREEDY_TEMPERATURE, "top_p": 0.0}
    assert sampling(GenerationParams(temperature=0.7, top_p=0.9)) == {"temperature": 0.7, "top_p": 0.9}
    assert refusal(GenerationParams(temperature=0.0, seed=1)) is None
    refused = refusal(GenerationParams(temperature=1.0, seed=1))
    assert refused is not None and "seed" in str(refused)


def test_finish_reason() -> None:
    assert finish_reason([5, 6], 2, {0}, stopped=False) == "length"
    assert finish_reason([5, 0], 2, {0}, stopped=False) == "stop"  # end of sequence on the last token
    assert finish_reason([5], 2, {0}, stopped=True) == "stop"


def test_default_cache_size_follows_the_memory_budget_never_the_host() -> None:
    assert (
        default_kv_cache_tokens(bytes_per_token=1000, context=128, budget_bytes=None, share=0.25) == 16 * 128
    )
    assert (
        default_kv_cache_tokens(bytes_per_token=1000, context=4096, budget_bytes=400_000, share=0.25) == 100
    )
    assert (
        default_kv_cache_tokens(bytes_per_token=1000, context=4096, budget_bytes=0, share=0.25) == PAGE_TOKENS
    )


def test_cgroup_memory_limit(tmp_path: Path) -> None:
    assert cgroup_memory_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text("max\n")
    assert cgroup_memory_limit(tmp_path) is None
    (tmp_path / "memory.max").write_text("1073741824\n")
    assert cgroup_memory_limit(tmp_path) == 1 << 30


# ---- the engine on a tiny Llama ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def task(tiny_llama_generation: Path) -> Iterator[TextGenerationTask]:
    with torch_threads(1):
        yield load_task(TextGenerationTask(), tiny_llama_generation)


def _engine(task: TextGenerationTask, kv_tokens: int) -> BatchingEngine:
    engine = attach(
        task, choice="batching", device="cpu", trust_remote_code=False, kv_tokens=kv_tokens, on_fatal=print
    )
    assert engine is not None
    return engine


@pytest.fixture(scope="module")
def engine(task: TextGenerationTask) -> Iterator[BatchingEngine]:
    engine = _engine(task, 256 * PAGE_TOKENS)  # room for 100 requests of 2 pages each
    yield engine
    engine.close()


@dataclass(eq=False)
class Call:
    """One request's unit, what it streamed and how it ended."""

    unit: Unit
    pieces: list[str] = field(default_factory=list)
    outcome: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def submit(
    engine: BatchingEngine,
    prompt: str,
    params: GenerationParams,
    log: list[int] | None = None,
    *,
    deadline: float = 60.0,
    arrived_ago: float = 0.0,
) -> Call:
    call: Call

    def emit(piece: str) -> None:
        call.pieces.append(piece)
        if log is not None:
            log.append(id(call))

    unit = Unit(
        [GenerationItem(prompt=prompt, params=params)], time.monotonic() + deadline, lambda _: None, emit=emit
    )
    unit.arrived -= arrived_ago
    call = Call(unit)

    def done(_: Unit, outcome: Any) -> None:
        if not call.outcome.done():
            call.outcome.set_result(outcome)

    engine.submit(unit, done)
    return call


async def result(call: Call) -> GenerationResult:
    outcome = await asyncio.wait_for(call.outcome, WAIT_S)
    assert isinstance(outcome, list), outcome
    [one] = outcome
    assert isinstance(one, GenerationResult)
    return one


def greedy_generate(task: TextGenerationTask, prompt: str, max_tokens: int) -> str:
    [expected] = task.run(
        [GenerationItem(prompt=prompt, params=GenerationParams(max_tokens=max_tokens, temperature=0.0))]
    )
    return expected.text


async def until(condition: Callable[[], bool], shown: Callable[[], object] = lambda: None) -> None:
    await wait_for_async(condition, WAIT_S, 0.01, lambda: f"condition not met in time: {shown()}")


@pytest.mark.asyncio(loop_scope="module")
async def test_streams_interleave_and_greedy_equals_generate(
    task: TextGenerationTask, engine: BatchingEngine
) -> None:
    expected = [greedy_generate(task, p, 24) for p in PROMPTS]
    engine.metrics = metrics = Metrics()
    order: list[int] = []
    calls = [submit(engine, p, GenerationParams(max_tokens=24, temperature=0.0), order) for p in PROMPTS]
    results = [await result(c) for c in calls]
    engine.metrics = None
    generated = sum(r.completion_tokens for r in results)
    registry = metrics.registry
    assert registry.get_sample_value("modelpool_generated_tokens_total") == generated
    assert registry.get_sample_value("modelpool_time_to_first_token_seconds_count") == len(PROMPTS)
    assert registry.get_sample_value("modelpool_inter_token_latency_seconds_count") == generated - len(
        PROMPTS
    )
    for call, got, want in zip(calls, results, expected, strict=True):
        assert got.text == want  # greedy: the same text as generate, for every request
        assert "".join(call.pieces) == got.text  # its own pieces, nobody else's
    # Interleaved: the first request's pieces do not all come before the second one's first piece.
    first, second = id(calls[0]), id(calls[1])
    assert order.index(second) < len(order) - 1 - order[::-1].index(first)


@pytest.mark.asyncio(loop_scope="module")
async def test_stop_and_max_tokens_end_one_request_while_others_continue(
    task: TextGenerationTask, engine: BatchingEngine
) -> None:
    long_text = greedy_generate(task, PROMPTS[2], 60)
    stop = long_text[5:8]
    long = submit(engine, PROMPTS[2], GenerationParams(max_tokens=60, temperature=0.0))
    short = submit(engine, PROMPTS[0], GenerationParams(max_tokens=3, temperature=0.0))
    stopped = submit(engine, PROMPTS[2], GenerationParams(max_tokens=60, temperature=0.0, stop=(stop,)))
    short_result, stopped_result = await result(short), await result(stopped)
    assert not long.outcome.done()  # still generating while the other two ended
    assert short_result.completion_tokens == 3 and short_result.finish_reason == "length"
    assert (
        stopped_result.text == long_text[: long_text.index(stop)] and stopped_result.finish_reason == "stop"
    )
    assert (await result(long)).text == long_text


@pytest.mark.asyncio(loop_scope="module")
async def test_cancelled_and_timed_out_requests_leave_every_table_as_it_was(engine: BatchingEngine) -> None:
    await until(lambda: engine.tables()["active"] == 0 and engine.reserved == 0)
    before = engine.tables()
    params = GenerationParams(max_tokens=50, temperature=0.7)
    calls = [
        submit(engine, PROMPTS[i % len(PROMPTS)], params, deadline=0.05 if i % 2 else 60.0)
        for i in range(100)
    ]
    await until(lambda: sum(bool(c.pieces) for c in calls) >= 10)  # the batch is generating
    for call in calls[::2]:
        engine.abandon(call.unit)  # the client disconnected
    # The others' deadline passed: each ends at its next token (None: nobody is answered).  A few may have
    # ended on their own first (sampling drew end-of-sequence).
    outcomes = [await asyncio.wait_for(call.outcome, WAIT_S) for call in calls]
    assert all(o is None or isinstance(o, list) for o in outcomes)
    assert sum(o is None for o in outcomes) >= 80
    await until(lambda: engine.tables() == before, lambda: (before, engine.tables()))
    again = submit(engine, PROMPTS[0], GenerationParams(max_tokens=4, temperature=0.0))
    assert (await result(again)).completion_tokens == 4


@pytest.mark.asyncio(loop_scope="module")
async def test_too_large_is_400_and_a_full_cache_is_429_others_unharmed(task: TextGenerationTask) -> None:
    small = _engine(task, 3 * PAGE_TOKENS)
    try:
        running = submit(small, PROMPTS[0], GenerationParams(max_tokens=40, temperature=0.0))  # 2 pages
        too_large = submit(small, PROMPTS[0], GenerationParams(max_tokens=100, temperature=0.0))
        error = await asyncio.wait_for(too_large.outcome, WAIT_S)
        assert isinstance(error, InvalidInput) and "--kv-cache-tokens" in str(error), error
        full = submit(small, PROMPTS[1], GenerationParams(max_tokens=40, temperature=0.0))
        refused = await asyncio.wait_for(full.outcome, WAIT_S)
        assert isinstance(refused, Overloaded), refused
        assert refused.retry_after_s is not None and refused.retry_after_s >= 1, refused
        assert (await result(running)).text == greedy_generate(task, PROMPTS[0], 40)
        assert small.reserved == 0
    finally:
        small.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_seed_with_sampling_is_a_400_naming_it(engine: BatchingEngine) -> None:
    call = submit(engine, PROMPTS[0], GenerationParams(max_tokens=4, temperature=1.0, seed=3))
    error = await asyncio.wait_for(call.outcome, WAIT_S)
    assert isinstance(error, ServerError) and error.status == 400 and "seed" in str(error)


@pytest.mark.asyncio(loop_scope="module")
async def test_time_to_first_token_counts_from_the_arrival_queue_included(engine: BatchingEngine) -> None:
    engine.metrics = metrics = Metrics()
    await result(submit(engine, PROMPTS[0], GenerationParams(max_tokens=2, temperature=0.0)))
    # The same request, as if it had waited 5 s in the data plane's queue before the engine took it.
    engine.metrics = queued = Metrics()
    late = submit(engine, PROMPTS[0], GenerationParams(max_tokens=2, temperature=0.0), arrived_ago=5.0)
    await result(late)
    engine.metrics = None
    ttft = "modelpool_time_to_first_token_seconds_sum"
    first, waited = metrics.registry.get_sample_value(ttft), queued.registry.get_sample_value(ttft)
    assert first is not None and first < 5.0
    assert waited is not None and waited >= 5.0


@pytest.mark.asyncio(loop_scope="module")
async def test_batch_started_follows_the_loops_last_output_while_generations_run(
    engine: BatchingEngine,
) -> None:
    """The supervisor's wedge watch on this path: BATCH_STARTED is set once a generation runs, moves on
    with every output batch, and is NaN again once nothing runs."""
    engine.view = view = WorkerView(capacity=4, http_processes=1)
    times: list[float] = []

    class Seen(list[int]):
        """Each piece's arrival (``submit``'s log) records BATCH_STARTED as it was then."""

        def append(self, _: int) -> None:
            times.append(view.get(Field.BATCH_STARTED))

    call = submit(engine, PROMPTS[2], GenerationParams(max_tokens=24, temperature=0.0), Seen())
    assert view.optional(Field.BATCH_STARTED) is not None  # set as soon as the request is admitted
    finished = await result(call)
    engine.view = None
    seen = times[1:]  # the first piece is the admission's empty one
    assert finished.completion_tokens == 24 and len(seen) >= 3
    assert all(not math.isnan(t) for t in seen)
    assert seen == sorted(seen) and len(set(seen)) >= 3, seen  # refreshed between output batches
    assert view.optional(Field.BATCH_STARTED) is None  # nothing runs: nothing to watch


@pytest.mark.asyncio(loop_scope="module")
async def test_a_loop_that_outputs_nothing_is_wedged_by_the_supervisors_rule(
    engine: BatchingEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = ServerConfig(model="/", task="text-generation", request_timeout=2, wedge_grace=1)
    engine.view = view = WorkerView(capacity=4, http_processes=1)
    swallowed: list[list[Any]] = []
    monkeypatch.setattr(engine, "_on_outputs", swallowed.append)  # the loop's outputs never arrive
    call = submit(engine, PROMPTS[0], GenerationParams(max_tokens=40, temperature=0.0))
    started = view.get(Field.BATCH_STARTED)
    await until(lambda: len(swallowed) >= 3)
    assert view.get(Field.BATCH_STARTED) == started  # no output: the time stands still
    assert inference_wedged(config, view, started + 2.5) == ""  # within the timeout + grace
    assert inference_wedged(config, view, started + 3.5).startswith("inference wedged: batch running for")
    engine.abandon(call.unit)
    monkeypatch.undo()
    engine.view = None
    assert await asyncio.wait_for(call.outcome, WAIT_S) is None
    assert view.optional(Field.BATCH_STARTED) is None
    await until(lambda: engine.reserved == 0 and engine.tables()["active"] == 0, engine.tables)


@pytest.mark.asyncio(loop_scope="module")
async def test_streams_decode_a_window_of_tokens_never_the_whole_completion(
    task: TextGenerationTask, engine: BatchingEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[int] = []
    tokenizer = task._tokenizer

    class Counting:
        """The real tokenizer, recording how many ids each decode is given."""

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return tokenizer(*args, **kwargs)

        def decode(self, ids: list[int], **kwargs: Any) -> str:
            decoded.append(len(ids))
            return str(tokenizer.decode(ids, **kwargs))

    monkeypatch.setattr(engine, "_tokenizer", Counting())
    streamed = submit(engine, PROMPTS[2], GenerationParams(max_tokens=60, temperature=0.0))
    stopped = submit(engine, PROMPTS[2], GenerationParams(max_tokens=60, temperature=0.0, stop=("@@",)))
    results = [await result(streamed), await result(stopped)]
    want = greedy_generate(task, PROMPTS[2], 60)
    assert [r.text for r in results] == [want, want] and "".join(streamed.pieces) == want
    assert max(decoded) <= 8, decoded  # a window of the last tokens, never the whole completion


def test_the_serial_path_stops_a_generation_nobody_waits_for(task: TextGenerationTask) -> None:
    item = GenerationItem(prompt=PROMPTS[2], params=GenerationParams(max_tokens=60, temperature=0.0))
    [whole] = task.run([item])
    pieces: list[str] = []
    with watching_cancel(lambda: len(pieces) >= 3):  # the client leaves after its third piece
        [cut] = task.run([item], emit=pieces.append)
    assert whole.completion_tokens > 20
    assert cut.completion_tokens <= 6  # stopped within a token or two of leaving
