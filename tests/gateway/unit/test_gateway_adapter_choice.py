"""LoRA adapters in the gateway (issue 33, item 3), the pure parts: an adapter's name resolves to the pool
that declares it (after every pool name and alias), the pool view reads the declared adapters and which
workers hold each, and the picker prefers a worker holding the adapter while its load stays within the
bounded-load share.  Through real processes: tests/gateway/integration/test_gateway_adapters.py."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from modelpool_gateway.names import NameIndex, Resolved, Unresolved
from modelpool_gateway.picker import Candidate, load_bound, pick, pick_adapter
from modelpool_gateway.state import Pool, pool_from_object

A, B, C = ("ns", "a"), ("ns", "b"), ("ns", "c")


def test_an_adapter_resolves_to_its_pool_and_names_itself() -> None:
    index = NameIndex.build([Pool("ns", "llm", adapters=("sql", "poem")), Pool("ns", "other")])
    assert index.resolve("sql") == Resolved(("ns", "llm"), "sql")
    assert index.resolve("llm") == Resolved(("ns", "llm"))


def test_a_pool_name_wins_over_an_adapter_of_the_same_spelling() -> None:
    index = NameIndex.build([Pool("ns", "llm", adapters=("other",)), Pool("ns", "other")])
    assert index.resolve("other") == Resolved(("ns", "other"))


def test_an_adapter_two_pools_declare_is_ambiguous() -> None:
    index = NameIndex.build([Pool("a", "llm", adapters=("sql",)), Pool("b", "llm", adapters=("sql",))])
    found = index.resolve("sql")
    assert isinstance(found, Unresolved) and found.ambiguous


def _pool_object(workers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "llm"},
        "spec": {
            "model": {"source": "hf://org/llm", "task": "text-generation"},
            "resources": {"memory": "1Gi"},
            "adapters": [{"name": "sql", "source": "hf://org/sql"}, {"name": "poem", "source": "pvc://l/p"}],
        },
        "status": {"workers": workers},
    }


def test_the_pool_view_reads_the_adapters_and_who_holds_them() -> None:
    pool = pool_from_object(
        _pool_object(
            [
                {"name": "w0", "state": "Ready", "adapters": ["sql"]},
                {"name": "w1", "state": "Ready", "adapters": ["sql", "poem"]},
                {"name": "w2", "state": "Ready"},
            ]
        )
    )
    assert pool.adapters == ("sql", "poem")
    assert pool.holders("sql") == {"w0", "w1"} and pool.holders("poem") == {"w1"}
    assert pool.holders("chat") == frozenset()


def test_a_holder_is_preferred_over_a_less_loaded_worker() -> None:
    # 2 in flight over 3 workers: a worker may hold ceil(1.25 * 3 / 3) = 2 once it takes one.
    candidates = [Candidate(A, 1), Candidate(B, 1), Candidate(C, 0)]
    assert pick_adapter(candidates, {B}) == B


def test_the_least_loaded_holder_wins() -> None:
    candidates = [Candidate(A, 2), Candidate(B, 1), Candidate(C, 0)]
    assert pick_adapter(candidates, {A, B}) == B


def test_a_holder_over_its_share_spills_to_the_least_loaded() -> None:
    # 6 in flight over 3 workers, factor 1.25: a worker may hold ceil(1.25 * 7 / 3) = 3 once it takes one.
    candidates = [Candidate(A, 0), Candidate(B, 3), Candidate(C, 3)]
    assert load_bound(6, 3, 1.25) == 3
    assert pick_adapter(candidates, {B}) == A


def test_no_holder_is_plain_least_loaded() -> None:
    candidates = [Candidate(A, 2), Candidate(B, 1), Candidate(C, 3)]
    assert pick_adapter(candidates, set()) == pick(candidates) == B


def test_a_tried_holder_is_skipped() -> None:
    candidates = [Candidate(A, 0), Candidate(B, 0)]
    assert pick_adapter(candidates, {A}, exclude={A}) == B


def test_equal_holders_take_turns() -> None:
    candidates = [Candidate(A, 0), Candidate(B, 0), Candidate(C, 0)]
    chosen = Counter(pick_adapter(candidates, {A, B}, turn=t) for t in range(100))
    assert chosen == {A: 50, B: 50}


@given(
    st.lists(st.integers(0, 20), min_size=1, max_size=6),
    st.sets(st.integers(0, 5)),
    st.sets(st.integers(0, 5)),
)
def test_the_choice_is_a_candidate_within_the_bound_or_the_least_loaded(
    loads: list[int], held: set[int], tried: set[int]
) -> None:
    candidates = [Candidate(("ns", str(i)), load) for i, load in enumerate(loads)]
    holders = {("ns", str(i)) for i in held}
    exclude = {("ns", str(i)) for i in tried}
    chosen = pick_adapter(candidates, holders, exclude)
    open_ = [c for c in candidates if c.key not in exclude]
    if not open_:
        assert chosen is None
        return
    assert chosen in {c.key for c in open_}
    load = next(c.in_flight for c in open_ if c.key == chosen)
    bound = load_bound(sum(c.in_flight for c in open_), len(open_), 1.25)
    assert (chosen in holders and load + 1 <= bound) or load == min(c.in_flight for c in open_)
