"""The JSON cost scan (``modelpool_gateway.jsoncost``) against the parsed document: the items and depth it
counts from the bytes are the ones the parse would build, whatever the strings hold and however the
document is spaced; and the bodies it must refuse are refused quickly, the ones it must pass passed."""

from __future__ import annotations

import json
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_gateway.config import GatewaySettings
from modelpool_gateway.jsoncost import TOO_DEEP, TOO_MANY_ITEMS, JsonCost, json_refusal, measure

MIB = 2**20
# Strings full of what the scan must not count: quotes, backslashes, brackets, commas, colons.
TRICKY = st.text(alphabet=st.sampled_from([*'"\\[]{},: ab\n\té€', "\U0001f600"]))
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TRICKY
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(TRICKY, inner, max_size=5),
    max_leaves=40,
)


def items_of(doc: Any) -> int:
    """What the scan counts, from the parsed document: an opener per container, a comma between its
    members and a colon per key."""
    if isinstance(doc, list):
        return 1 + max(len(doc) - 1, 0) + sum(items_of(v) for v in doc)
    if isinstance(doc, dict):
        return 1 + max(len(doc) - 1, 0) + len(doc) + sum(items_of(v) for v in doc.values())
    return 0


def depth_of(doc: Any) -> int:
    if isinstance(doc, list):
        return 1 + max((depth_of(v) for v in doc), default=0)
    if isinstance(doc, dict):
        return 1 + max((depth_of(v) for v in doc.values()), default=0)
    return 0


def dumps(doc: Any, ascii_only: bool, indent: int | None) -> bytes:
    return json.dumps(doc, ensure_ascii=ascii_only, indent=indent).encode()


@settings(max_examples=400, deadline=None)
@given(DOCUMENTS, st.booleans(), st.sampled_from([None, 0, 2]))
def test_the_scan_counts_what_the_parse_builds(doc: Any, ascii_only: bool, indent: int | None) -> None:
    body = dumps(doc, ascii_only, indent)
    assert measure(body, max_items=10**9, depth_limit=1000) == JsonCost(items_of(doc), depth_of(doc))


@settings(max_examples=400, deadline=None)
@given(DOCUMENTS, st.integers(0, 30), st.integers(0, 6))
def test_the_refusal_is_the_bound_the_parsed_document_passes(
    doc: Any, max_items: int, max_depth: int
) -> None:
    body = dumps(doc, False, None)
    if items_of(doc) > max_items:
        expected: str | None = TOO_MANY_ITEMS
    elif depth_of(doc) > max_depth:
        expected = TOO_DEEP
    else:
        expected = None
    assert json_refusal(body, max_items=max_items, max_depth=max_depth) == expected


def test_the_default_bounds_pass_the_largest_real_requests() -> None:
    bounds = GatewaySettings()
    sentences = [f"The quick brown fox, number {i}, jumps: over [the] lazy {{dog}}." for i in range(32)]
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": f"turn {i}, with: [brackets]"} for i in range(1000)],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    }
    real = [
        {"model": "m", "input": sentences},  # a 32-sentence embeddings batch
        {"model": "m", "input": [f"input {i}" for i in range(2048)]},  # OpenAI's most inputs per request
        chat,
        {"model": "m", "input": "a, b: [c] {d} " * (MIB // 2)},  # one 7 MiB text full of punctuation
    ]
    for doc in real:
        body = json.dumps(doc).encode()
        assert json_refusal(body, max_items=bounds.max_json_items, max_depth=bounds.max_json_depth) is None


def test_hostile_bodies_of_16_mib_are_refused_in_a_fraction_of_a_second() -> None:
    bounds = GatewaySettings()
    size = 16 * MIB
    hostile = {
        "empty dicts": (b"[" + b"{}," * (size // 3 - 1) + b"{}]", TOO_MANY_ITEMS),
        "short strings": (b"[" + b'"a,[{",' * (size // 8) + b'"x"]', TOO_MANY_ITEMS),
        "nesting": (b"[" * (size // 2) + b"]" * (size // 2), TOO_MANY_ITEMS),
        "nesting within the items": (b"[" * 1000 + b"]" * 1000, TOO_DEEP),
    }
    for name, (body, reason) in hostile.items():
        started = time.perf_counter()
        refused = json_refusal(body, max_items=bounds.max_json_items, max_depth=bounds.max_json_depth)
        took = time.perf_counter() - started
        assert refused == reason, name
        assert took < 1.0, f"{name}: {took:.2f} s"


def test_malformed_bodies_are_measured_as_far_as_they_are_json() -> None:
    # Left to the parser to refuse: an unterminated string, strings side by side, unbalanced brackets.
    assert json_refusal(b'["a", "unterminated', max_items=10, max_depth=2) is None
    assert json_refusal(b'["x' + b"," * 50, max_items=10, max_depth=2) is None
    assert json_refusal(b'"a,,,,,,,,,,,,""b"' * 1000, max_items=10, max_depth=2) is None
    assert json_refusal(b"]]]]" + b"," * 5, max_items=10, max_depth=2) is None
    # Well formed as far as the bound: refused there.
    assert json_refusal(b"[" + b"1," * 20 + b'"x', max_items=10, max_depth=2) == TOO_MANY_ITEMS
