"""SIGTERM drains the running generations of the continuous-batching engine: a real ``modelpool-server``
with a tiny Llama, two streaming completions in flight, SIGTERM; both end with their whole text and the
process exits 0 (issue 20: "SIGTERM drains running generations")."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from testkit import tiny_models
from testkit.server import ServerFactory, ServerProcess
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

# Two prompts the tiny Llama (seeded) continues greedily to max_tokens, without an end of sequence.
PROMPTS = ("the first stream", "a second stream")
# Long enough that both generations still run when SIGTERM arrives (a few milliseconds per token on the
# tiny Llama, whose context is widened for it: its rotary positions have no weights).
MAX_TOKENS = 400
CONTEXT = 1024
DEADLINE = 60.0


def _until_running(server: ServerProcess, count: int) -> dict[str, Any]:
    """The generation engine's figures once ``count`` sequences are running."""

    def running() -> dict[str, Any] | None:
        figures: dict[str, Any] = server.stats()["generation"]
        return figures if figures["running"] == count else None

    return wait_for(running, DEADLINE, 0.01, f"{count} running")


def _text(first: openai.types.Completion, rest: Iterator[openai.types.Completion]) -> tuple[str, str | None]:
    """A stream's whole text and its finish reason."""
    chunks = [first, *rest]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    return text, next(c.choices[0].finish_reason for c in reversed(chunks) if c.choices)


def test_sigterm_drains_running_generations(server: ServerFactory, tmp_path: Path) -> None:
    model = tiny_models.build_llama_generation(tmp_path / "llama", context=CONTEXT)
    proc = server(
        "--model", str(model), "--task", "text-generation", "--device", "cpu", "--name", "tiny",
        "--kv-cache-tokens", str(4 * CONTEXT), wait="ready",
    )  # fmt: skip
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=DEADLINE)
    assert proc.stats()["generation"]["engine"] == "continuous-batching"
    greedy: dict[str, Any] = {"model": "tiny", "max_tokens": MAX_TOKENS, "temperature": 0}
    # The whole text each prompt gets (greedy: the same however the batch is made up), both at once.
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        alone = list(pool.map(lambda p: client.completions.create(prompt=p, **greedy), PROMPTS))
    expected = [(r.choices[0].text, r.choices[0].finish_reason) for r in alone]
    assert [finish for _, finish in expected] == ["length", "length"], expected
    streams = [iter(client.completions.create(prompt=p, stream=True, **greedy)) for p in PROMPTS]
    firsts = [next(s) for s in streams]  # both have produced a token
    figures = _until_running(proc, 2)
    assert figures["kv_cache_reserved_tokens"] >= 2 * MAX_TOKENS
    proc.terminate()
    got = [_text(first, rest) for first, rest in zip(firsts, streams, strict=True)]
    assert got == expected, proc.log()[-3000:]
    assert proc.wait_exit(DEADLINE) == 0, proc.log()[-3000:]
    assert "drain complete" in proc.log()
