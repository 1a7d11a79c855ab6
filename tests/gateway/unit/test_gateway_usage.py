"""The usage a request's answer reports (modelpool_gateway.usage): found at the end of JSON answers and of
streams however the answer is cut into chunks, a bounded tail kept, and a malformed or missing usage
object counted as nothing, never an error."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from modelpool_gateway.usage import NO_USAGE, TAIL_BYTES, Usage, UsageScanner, items, parse_usage


def _chat_json(prompt: int, completion: int, text: str = "hello") -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        }
    ).encode()


def _stream(words: list[str], prompt: int) -> bytes:
    events: list[dict[str, Any]] = [{"choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
    # A word may itself say "usage": only the usage object counts, never text that looks like one.
    events.append({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": len(words)}})
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _scan(body: bytes, cuts: list[int]) -> Usage:
    scanner = UsageScanner()
    at = 0
    for cut in sorted(c % (len(body) + 1) for c in cuts):
        scanner.feed(body[at:cut])
        at = max(at, cut)
    scanner.feed(body[at:])
    return scanner.usage()


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.lists(st.integers(0, 10**5), max_size=20))
def test_a_json_answers_usage_is_found_however_it_is_chunked(
    prompt: int, completion: int, cuts: list[int]
) -> None:
    assert _scan(_chat_json(prompt, completion), cuts) == Usage(prompt, completion)


@given(
    st.lists(st.sampled_from(["a ", '"usage": {"prompt_tokens": 99} ', "é", "word "]), max_size=400),
    st.integers(0, 5000),
    st.lists(st.integers(0, 10**5), max_size=20),
)
def test_a_streams_usage_is_its_last_events_however_it_is_chunked(
    words: list[str], prompt: int, cuts: list[int]
) -> None:
    assert _scan(_stream(words, prompt), cuts) == Usage(prompt, len(words))


def test_only_the_answers_tail_is_kept() -> None:
    scanner = UsageScanner()
    scanner.feed(b'{"usage": {"prompt_tokens": 5}, "data": "' + b"x" * (2 * TAIL_BYTES))
    scanner.feed(b'"}')
    assert len(scanner._tail) == TAIL_BYTES
    assert scanner.usage() == NO_USAGE, "the usage object left the tail: not counted"
    embeddings = (
        b'{"data": [' + b"0.1, " * 10_000 + b'0.1], "usage": {"prompt_tokens": 7, "total_tokens": 7}}'
    )
    assert _scan(embeddings, [100, 5000, 40_000]) == Usage(7, 0)


def test_a_malformed_or_missing_usage_counts_nothing() -> None:
    for tail in (
        b"",
        b'{"choices": []}',
        b'{"usage": null}',
        b'{"usage": {"prompt_tokens": -1}}',
        b'{"usage": {"prompt_tokens": "3"}}',
        b'{"usage": {"prompt_tokens": true}}',
        b'{"usage": {"prompt_tokens": 3',
        b'"usage" "no colon"',
    ):
        assert parse_usage(tail) == NO_USAGE, tail
    # A broken last object falls back to the previous whole one.
    assert parse_usage(b'{"usage": {"prompt_tokens": 3}} {"usage": {"prompt_') == Usage(3, 0)


def test_what_a_request_asks_to_compute() -> None:
    assert items("/v1/embeddings", {"input": "one"}) == ("embeddings", 1)
    assert items("/v1/embeddings", {"input": ["a", "b", "c"]}) == ("embeddings", 3)
    assert items("/v1/embeddings", {"input": 5}) is None
    assert items("/v1/images/generations", {"prompt": "x"}) == ("images", 1)
    assert items("/v1/images/generations", {"prompt": "x", "n": 4}) == ("images", 4)
    assert items("/v1/images/generations", {"n": True}) is None
    assert items("/v1/images/generations", {"n": 0}) is None
    assert items("/v1/chat/completions", {"messages": []}) is None
    assert items("/v1/embeddings", ["not", "an", "object"]) is None
