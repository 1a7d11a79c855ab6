"""Endpoint choice: least outstanding requests, then the reported queue depth, rotating among equals."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from modelpool_gateway.picker import Candidate, pick

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


def test_fewest_in_flight_wins() -> None:
    assert pick([Candidate(A, 3), Candidate(B, 1), Candidate(C, 2)]) == B


def test_queue_depth_breaks_ties_and_unknown_depth_counts_as_empty() -> None:
    assert pick([Candidate(A, 1, 5), Candidate(B, 1, 2)]) == B
    assert pick([Candidate(A, 1, 5), Candidate(B, 1, None)]) == B
    # In-flight counts first: a deep reported queue does not outweigh our own requests.
    assert pick([Candidate(A, 0, 50), Candidate(B, 1, 0)]) == A


def test_equals_take_turns() -> None:
    candidates = [Candidate(A, 0), Candidate(B, 0), Candidate(C, 0)]
    chosen = Counter(pick(candidates, turn=t) for t in range(300))
    assert chosen == {A: 100, B: 100, C: 100}


def test_excluded_workers_are_skipped_and_none_is_left() -> None:
    candidates = [Candidate(A, 0), Candidate(B, 5)]
    assert pick(candidates, exclude={A}) == B
    assert pick(candidates, exclude={A, B}) is None
    assert pick([]) is None


loads = st.lists(
    st.tuples(st.integers(0, 5), st.one_of(st.none(), st.integers(0, 5))), min_size=1, max_size=8
)


@given(loads, st.integers(0, 100), st.sets(st.integers(0, 7)))
def test_the_choice_is_never_more_loaded_than_any_other(
    raw: list[tuple[int, int | None]], turn: int, excluded: set[int]
) -> None:
    candidates = [Candidate(("ns", str(i)), f, q) for i, (f, q) in enumerate(raw)]
    exclude = {("ns", str(i)) for i in excluded}
    chosen = pick(candidates, exclude, turn)
    eligible = [c for c in candidates if c.key not in exclude]
    if not eligible:
        assert chosen is None
        return
    best = next(c for c in candidates if c.key == chosen)
    assert chosen not in exclude
    assert all((best.in_flight, best.queue_depth or 0) <= (c.in_flight, c.queue_depth or 0) for c in eligible)
