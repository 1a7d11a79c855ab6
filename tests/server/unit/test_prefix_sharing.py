"""Prefix sharing on the continuous-batching engine (``model_server.engine.prefix_cache``), in-process on
the tiny Llama: requests sharing a long system prompt give ``generate``'s greedy tokens with sharing on
and off, one after the other and all at once; a later request takes the shared blocks from the cache
instead of computing them (the manager's own match, counted in ``modelpool_prefix_cache_hit_tokens``);
and the accounting stays exact: blocks kept for reuse count as free and make room on demand, so a
request that needs the whole cache runs after others left their blocks behind, and the engine's tables
and reservations (``modelpool_kv_cache_reserved_tokens``, ``/stats``) go back to idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from model_server.engine.generation_engine import PAGE_TOKENS, BatchingEngine, attach
from model_server.engine.unit import Unit
from model_server.metrics import Metrics
from model_server.tasks.base import GenerationItem, GenerationParams, GenerationResult
from model_server.tasks.text_generation import TextGenerationTask
from testkit.waiting import wait_for_async
from tests.server.tiny_fixtures import load_task, tiny_llama_generation, torch_threads

__all__ = ["tiny_llama_generation"]  # the session fixture, re-exported for pytest

WAIT_S = 30.0
# A system prompt of more than two cache pages of the tiny tokenizer (checked below), in its words.
SYSTEM = (
    "system\nuser\nassistant: answer briefly and politely; "
    + "Once upon a time there was a tiny model that served requests behind a bounded queue. " * 5
)
QUESTIONS = ["Hello, world!", "A man is eating food.", "What is in this picture?", "numbers 0123456789"]
MAX_TOKENS = 12
HITS = "modelpool_prefix_cache_hit_tokens_total"


@pytest.fixture(scope="module")
def task(tiny_llama_generation: Path) -> Iterator[TextGenerationTask]:
    with torch_threads(1):
        yield load_task(TextGenerationTask(), tiny_llama_generation)


def make_engine(task: TextGenerationTask, pages: int, *, sharing: bool = True) -> BatchingEngine:
    engine = attach(
        task,
        choice="batching",
        device="cpu",
        trust_remote_code=False,
        kv_tokens=pages * PAGE_TOKENS,
        on_fatal=print,
        prefix_sharing=sharing,
    )
    assert engine is not None
    return engine


def ids(task: TextGenerationTask, prompt: str) -> list[int]:
    return [int(i) for i in task._tokenizer(prompt)["input_ids"]]


def shared_tokens(task: TextGenerationTask, prompt: str, earlier: list[str]) -> int:
    """The prompt tokens the cache can give ``prompt`` after ``earlier`` ran: the whole pages of its
    longest common prefix with one of them, never its last token (the manager's rule)."""
    mine = ids(task, prompt)
    best = 0
    for other in earlier:
        theirs = ids(task, other)
        differ = (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b)
        common = next(differ, min(len(mine), len(theirs)))
        best = max(best, min(common, len(mine) - 1) // PAGE_TOKENS * PAGE_TOKENS)
    return best


def greedy(task: TextGenerationTask, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    [expected] = task.run(
        [GenerationItem(prompt=prompt, params=GenerationParams(max_tokens=max_tokens, temperature=0.0))]
    )
    return expected.text


def submit(
    engine: BatchingEngine, prompt: str, max_tokens: int = MAX_TOKENS, pieces: list[str] | None = None
) -> asyncio.Future[Any]:
    outcome: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    item = GenerationItem(prompt=prompt, params=GenerationParams(max_tokens=max_tokens, temperature=0.0))
    streamed: list[str] = [] if pieces is None else pieces
    unit = Unit([item], time.monotonic() + 60.0, lambda _: None, emit=streamed.append)

    def done(_: Unit, result: Any) -> None:
        if not outcome.done():
            outcome.set_result(result)

    engine.submit(unit, done)
    return outcome


async def text(outcome: asyncio.Future[Any]) -> str:
    results = await asyncio.wait_for(outcome, WAIT_S)
    assert isinstance(results, list), results
    [one] = results
    assert isinstance(one, GenerationResult)
    return one.text


async def idle(engine: BatchingEngine, tables: dict[str, int]) -> None:
    """Every table back to ``tables`` (cached blocks count as free): nothing held, nothing reserved."""
    await wait_for_async(
        lambda: engine.tables() == tables, WAIT_S, 0.01, lambda: f"{tables} != {engine.tables()}"
    )


@asynccontextmanager
async def fresh_engine(
    task: TextGenerationTask, pages: int, *, sharing: bool = True
) -> AsyncIterator[BatchingEngine]:
    """An engine of ``pages`` KV pages (``make_engine``), closed on the way out; a block that ends without
    an error must leave every table as it was at the start (``idle``)."""
    engine = make_engine(task, pages, sharing=sharing)
    try:
        at_start = engine.tables()
        yield engine
        await idle(engine, at_start)
    finally:
        engine.close()


def test_the_system_prompt_spans_more_than_two_pages(task: TextGenerationTask) -> None:
    for question in QUESTIONS:
        prompt = len(ids(task, SYSTEM + question))
        assert prompt > 2 * PAGE_TOKENS and prompt + MAX_TOKENS <= 128, prompt  # the tiny Llama's context


@pytest.mark.asyncio(loop_scope="module")
async def test_one_after_the_other_each_later_request_takes_the_system_prompt_from_the_cache(
    task: TextGenerationTask,
) -> None:
    prompts = [SYSTEM + q for q in QUESTIONS]
    expected = [greedy(task, p) for p in prompts]
    async with fresh_engine(task, 64) as engine:
        assert engine.prefix is not None
        engine.metrics = metrics = Metrics()
        for index, (prompt, want) in enumerate(zip(prompts, expected, strict=True)):
            before = metrics.registry.get_sample_value(HITS) or 0.0
            assert await text(submit(engine, prompt)) == want  # greedy: generate's text
            hit = (metrics.registry.get_sample_value(HITS) or 0.0) - before
            # The first computes its whole prompt; each later one reuses the shared pages exactly.
            assert hit == shared_tokens(task, prompt, prompts[:index]), (index, hit)
            assert hit >= (2 * PAGE_TOKENS if index else 0)
        prompted = metrics.registry.get_sample_value("modelpool_prompt_tokens_total")
        assert prompted == sum(len(ids(task, p)) for p in prompts)
        # Kept for the next request, and counted free: fresh_engine finds every table idle at the end.
        assert engine.prefix.cached_blocks() > 0


@pytest.mark.parametrize("sharing", [True, False], ids=["sharing", "no-sharing"])
@pytest.mark.asyncio(loop_scope="module")
async def test_all_at_once_with_sharing_on_and_off_each_request_gets_generates_tokens(
    task: TextGenerationTask, sharing: bool
) -> None:
    prompts = [SYSTEM + q for q in QUESTIONS] * 2  # each twice: the second copy may share the first's
    expected = [greedy(task, p) for p in prompts]
    async with fresh_engine(task, 64, sharing=sharing) as engine:
        assert (engine.prefix is not None) == sharing
        engine.metrics = metrics = Metrics()
        outcomes = [submit(engine, p) for p in prompts]
        assert [await text(o) for o in outcomes] == expected
        again = [await text(submit(engine, p)) for p in prompts[:2]]  # after the batch: from the cache
        assert again == expected[:2]
        hits = metrics.registry.get_sample_value(HITS) or 0.0
        assert (hits >= 2 * 2 * PAGE_TOKENS) if sharing else hits == 0.0


@pytest.mark.asyncio(loop_scope="module")
async def test_cached_pages_make_room_for_an_admitted_request_at_once_beside_a_running_one(
    task: TextGenerationTask,
) -> None:
    """Eight pages.  A finished request left 3 pages cached; a long one runs and holds 2 of its 4; a new
    request of 4 pages is admitted (4 + 4 reserved) but finds 3 free: it takes a cached page and starts
    at once.  transformers alone evicts cached pages only under its safety margin (3 free of 8 is above
    it) or when no request at all can be scheduled, so the new one would wait for the long one's end."""
    extra = " The quick brown fox jumps over the lazy dog."
    first, new = (q + " " + SYSTEM + extra for q in (QUESTIONS[0], QUESTIONS[2]))
    long_prompt, long_tokens, new_tokens = "Once upon a time there was", 100, 20
    assert all(3 * PAGE_TOKENS < len(ids(task, p)) <= 4 * PAGE_TOKENS - new_tokens for p in (first, new))
    assert len(ids(task, long_prompt)) + long_tokens <= 4 * PAGE_TOKENS
    [long_expected] = task.run(
        [GenerationItem(prompt=long_prompt, params=GenerationParams(max_tokens=long_tokens, temperature=0.0))]
    )
    assert long_expected.completion_tokens == long_tokens  # no early end of sequence: it runs that long
    expected_new = greedy(task, new, new_tokens)
    async with fresh_engine(task, 8) as engine:
        assert engine.prefix is not None
        assert await text(submit(engine, first, new_tokens)) == greedy(task, first, new_tokens)
        assert engine.prefix.cached_blocks() == 3
        pieces: list[str] = []
        running = submit(engine, long_prompt, long_tokens, pieces)
        await wait_for_async(lambda: len(pieces) >= 40, WAIT_S, 0.005, "40 tokens of the long request")
        assert await text(submit(engine, new, new_tokens)) == expected_new
        assert not running.done()  # it started beside the long one, not after it
        assert engine.prefix.evicted_blocks >= 1
        assert await text(running) == long_expected.text


@pytest.mark.asyncio(loop_scope="module")
async def test_cached_pages_are_evicted_page_by_page_and_the_latest_prefix_stays(
    task: TextGenerationTask,
) -> None:
    """Four pages of cache and requests of four pages each, every prompt its own: each leaves its full
    pages cached and the next one evicts just what it needs, least recently released first, so the last
    prompt's pages are still there for it to run again from them."""
    prompts = [q + " " + SYSTEM for q in QUESTIONS[:3]]  # no two share a first page
    sizes = [len(ids(task, p)) for p in prompts]
    max_tokens = 4 * PAGE_TOKENS - max(sizes)
    assert max_tokens >= 8, sizes
    expected = [greedy(task, p, max_tokens) for p in prompts]
    async with fresh_engine(task, 4) as engine:
        assert engine.prefix is not None
        idle_tables = engine.tables()
        for prompt, want in zip(prompts, expected, strict=True):
            assert await text(submit(engine, prompt, max_tokens)) == want
            assert engine.prefix.cached_blocks() >= 2  # its prompt's full pages, kept
            await idle(engine, idle_tables)
        assert engine.prefix.evicted_blocks >= 4  # the later two made room
        # The last prompt's pages are still cached: it runs again from them.
        hits_before = engine.prefix.hit_tokens
        assert await text(submit(engine, prompts[-1], max_tokens)) == expected[-1]
        assert engine.prefix.hit_tokens - hits_before >= 2 * PAGE_TOKENS
