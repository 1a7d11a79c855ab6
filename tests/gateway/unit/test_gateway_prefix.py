"""Prefix-aware choice (CHWBL): the same prefix keeps its worker while loads allow, no worker is taken past
the bound while another is under it, one worker more or less moves about 1/n of the keys; the prefix key
of chat and completion bodies, bounded, never raising."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_gateway.picker import Candidate, load_bound
from modelpool_gateway.prefix import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    key_hash,
    pick_prefix,
    prefix_key,
    ring_order,
)
from modelpool_gateway.state import Key


def _workers(n: int) -> list[Key]:
    return [("ns", f"gen-{i}") for i in range(n)]


positions = st.integers(min_value=0, max_value=2**64 - 1)


@given(st.integers(min_value=1, max_value=12), positions, st.integers(min_value=0, max_value=50))
def test_the_same_prefix_keeps_its_worker_while_loads_are_even(n: int, position: int, load: int) -> None:
    even = [Candidate(k, load) for k in _workers(n)]
    first = pick_prefix(even, position)
    assert first == ring_order(_workers(n), position)[0]
    assert all(pick_prefix(list(reversed(even)), position) == first for _ in range(3))


@given(
    st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=10),
    positions,
    st.floats(min_value=1.0, max_value=4.0),
)
def test_never_a_worker_over_the_bound_while_one_is_under_it(
    loads: list[int], position: int, factor: float
) -> None:
    candidates = [Candidate(k, load) for k, load in zip(_workers(len(loads)), loads, strict=True)]
    chosen = pick_prefix(candidates, position, load_factor=factor)
    bound = load_bound(sum(loads), len(loads), factor)
    by_key = {c.key: c.in_flight for c in candidates}
    assert chosen is not None
    assert by_key[chosen] + 1 <= bound  # with factor >= 1 someone is always under the bound
    # ... and it is the first such worker clockwise from the key.
    under = [k for k in ring_order(by_key, position) if by_key[k] + 1 <= bound]
    assert chosen == under[0]


def test_a_hot_prefix_spills_to_the_next_worker_and_comes_back() -> None:
    workers = _workers(3)
    position = key_hash("system: you are a helpful assistant")
    home, neighbour, _ = ring_order(workers, position)
    # Home holds 3 of 3 in flight: bound ceil(1.25 * 4 / 3) = 2, so the next request goes clockwise.
    busy = [Candidate(k, 3 if k == home else 0) for k in workers]
    assert pick_prefix(busy, position) == neighbour
    assert pick_prefix([Candidate(k, 0) for k in workers], position) == home


@settings(max_examples=20)
@given(st.integers(min_value=2, max_value=10))
def test_one_worker_more_or_less_moves_about_one_nth_of_the_keys(n: int) -> None:
    keys = [key_hash(f"system prompt {i}") for i in range(2000)]
    before = _workers(n)
    grown = _workers(n + 1)
    owner = {p: ring_order(before, p)[0] for p in keys}
    after = {p: ring_order(grown, p)[0] for p in keys}
    moved = [p for p in keys if owner[p] != after[p]]
    # Only keys taken by the new worker move; about 1/(n+1) of them (64 points per worker: within 2x).
    assert all(after[p] == grown[-1] for p in moved)
    assert len(moved) < 2 * len(keys) / (n + 1)
    # Removing a worker moves only that worker's keys.
    shrunk = before[1:]
    for p in keys:
        if owner[p] != before[0]:
            assert ring_order(shrunk, p)[0] == owner[p]


def test_keys_spread_over_the_workers() -> None:
    workers = _workers(4)
    counts = Counter(ring_order(workers, key_hash(f"prompt {i}"))[0] for i in range(4000))
    assert set(counts) == set(workers)
    assert min(counts.values()) > 500, counts


@given(positions, st.sets(st.sampled_from(_workers(4))))
def test_empty_ring_or_every_worker_excluded_is_none(position: int, excluded: set[Key]) -> None:
    assert pick_prefix([], position) is None
    assert ring_order([], position) == []
    candidates = [Candidate(k, 0) for k in _workers(4)]
    chosen = pick_prefix(candidates, position, excluded)
    if len(excluded) == 4:
        assert chosen is None
    else:
        assert chosen is not None and chosen not in excluded


def test_the_bound_is_mirrokni_s() -> None:
    assert load_bound(0, 2, 1.25) == 1
    assert load_bound(7, 4, 1.25) == math.ceil(1.25 * 8 / 4)


# ---- the prefix key ----

SYSTEM = "You are a terse assistant. " * 20


def _chat(*messages: tuple[str, object]) -> dict[str, object]:
    return {"model": "gen", "messages": [{"role": r, "content": c} for r, c in messages]}


def test_chats_sharing_a_long_system_prompt_share_a_key() -> None:
    a = prefix_key(CHAT_PATH, _chat(("system", SYSTEM), ("user", "what is a pod?")), 256)
    b = prefix_key(CHAT_PATH, _chat(("system", SYSTEM), ("user", "and a node?")), 256)
    assert a is not None and a == b and len(a) == 256
    # A short system prompt: the user's turn is in the key.
    c = prefix_key(CHAT_PATH, _chat(("system", "Be brief."), ("user", "what is a pod?")), 256)
    d = prefix_key(CHAT_PATH, _chat(("system", "Be brief."), ("user", "and a node?")), 256)
    assert c != d


def test_roles_and_content_parts_count() -> None:
    as_system = prefix_key(CHAT_PATH, _chat(("system", "hello")), 64)
    as_user = prefix_key(CHAT_PATH, _chat(("user", "hello")), 64)
    assert as_system != as_user
    parts = [
        {"type": "text", "text": "hel"},
        {"type": "image_url", "image_url": {}},
        {"type": "text", "text": "lo"},
    ]
    assert prefix_key(CHAT_PATH, _chat(("system", parts)), 64) == as_system


def test_completion_prompts() -> None:
    assert prefix_key(COMPLETIONS_PATH, {"prompt": "abcdef"}, 3) == "abc"
    assert prefix_key(COMPLETIONS_PATH, {"prompt": ["abcdef", "xyz"]}, 4) == "abcd"
    assert prefix_key(COMPLETIONS_PATH, {"prompt": [101, 2023, 7]}, 6) == "101,20"
    assert prefix_key(COMPLETIONS_PATH, {"prompt": ""}, 6) is None
    assert prefix_key("/v1/embeddings", {"input": "abcdef"}, 6) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=30,
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries({"messages": json_values}),
    st.fixed_dictionaries(
        {"messages": st.lists(st.fixed_dictionaries({"role": json_values, "content": json_values}))}
    ),
    st.fixed_dictionaries({"prompt": json_values}),
)


@given(st.sampled_from([CHAT_PATH, COMPLETIONS_PATH, "/v1/embeddings"]), bodies, st.integers(-5, 300))
def test_any_body_gives_a_bounded_key_or_none_and_never_raises(path: str, body: object, chars: int) -> None:
    key = prefix_key(path, body, chars)
    assert key is None or 0 < len(key) <= chars
