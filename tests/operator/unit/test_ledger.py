"""The memory ledger: derived from observed workers + reservations; admission arithmetic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.states import WorkerState
from modelpool_operator.budget import (
    BudgetLimit,
    ReservationBook,
    admits,
    budget_status,
    build_ledger,
    live_reservations,
)
from modelpool_operator.observe.observation import budget_limit
from modelpool_operator.observe.worker_state import ObservedWorker
from tests.operator.unit.op_pods import GI, at


def worker(name: str, state: WorkerState = "Ready", pool: str = "p", memory: int = 2 * GI) -> ObservedWorker:
    charged = 0 if state in ("Failed", "Dead") else memory
    return ObservedWorker(
        name=name, namespace="ns", pool=pool, state=state, memory=charged, requested_memory=memory
    )


def test_used_is_the_sum_of_charged_workers_and_failed_are_free() -> None:
    ledger = build_ledger(10 * GI, [worker("a"), worker("b", "Failed"), worker("c", "Loading", pool="q")])
    assert (ledger.used, ledger.reserved, ledger.free) == (4 * GI, 0, 6 * GI)
    assert dict(ledger.shares) == {("ns", "p"): 2 * GI, ("ns", "q"): 2 * GI}


def test_reservation_ends_when_its_pod_is_seen() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", "a", 2 * GI, at(0))
    book.reserve("ns", "p", "b", 2 * GI, at(0))
    ledger = build_ledger(10 * GI, [worker("a", "Pending")], book.all())
    # "a" is charged once (as a pod), "b" is still reserved.
    assert (ledger.used, ledger.reserved) == (2 * GI, 2 * GI)
    assert [r.worker for r in ledger.reservations] == ["b"]


def test_a_reservation_outlives_any_delay_until_its_pod_is_observed() -> None:
    """A slow API server or a lagging watch: the pod stays unobserved for an hour, its memory stays
    reserved (it used to expire after a 60 s TTL and be counted nowhere)."""
    book = ReservationBook()
    book.reserve("ns", "p", "a", GI, at(0))
    book.answered("ns", "a", at(1), check_s=60)
    assert [r.worker for r in book.prune([])] == ["a"]
    assert build_ledger(4 * GI, [], book.all()).reserved == GI
    assert [r.worker for r in live_reservations(book.all(), [])] == ["a"]
    assert book.prune([("ns", "a")]) == () and len(book) == 0


def test_a_refused_create_releases_at_once() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", "a", GI, at(0))
    book.release("ns", "a")
    assert len(book) == 0


def test_only_answered_reservations_are_asked_about_once_per_check_interval() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", "inflight", GI, at(0))  # its create has not answered: never asked about
    book.reserve("ns", "p", "made", GI, at(0))
    book.answered("ns", "made", at(1), check_s=60)
    assert book.due(at(60), 60) == ()
    assert [r.worker for r in book.due(at(3600), 60)] == ["made"]
    assert book.due(at(3600), 60) == ()  # handed out: another pass does not ask again at once
    assert [r.worker for r in book.due(at(3660), 60)] == ["made"]  # still unobserved: asked again
    assert {r.worker for r in book.all()} == {"inflight", "made"}  # asking ends nothing


def test_a_pod_known_absent_ends_its_reservation_but_not_a_newer_one() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", "a", GI, at(0))
    book.answered("ns", "a", at(0), check_s=60)
    (asked,) = book.due(at(60), 60)
    book.absent(asked)
    assert len(book) == 0
    # The answer about an older reservation of the same name never ends the one made since.
    book.reserve("ns", "p", "a", GI, at(100))
    book.absent(asked)
    assert [r.created for r in book.all()] == [at(100)]


# What became of a create: made (201), existed (409), refused (4xx), no answer (timeout, 5xx) with or
# without the pod made.
OUTCOMES = ("made", "existed", "refused", "unknown-made", "unknown-not-made")
STEPS = st.tuples(
    st.sampled_from(["reserve", "answer", "observe", "delete", "check", "tick"]),
    st.integers(0, 3),
    st.sampled_from(OUTCOMES),
)
CHECK_S = 60.0


@given(st.lists(STEPS, max_size=80))
def test_memory_a_pod_may_hold_is_never_dropped_and_absent_pods_free_it(
    steps: list[tuple[str, int, str]],
) -> None:
    """A world of pods and a watch that sees them late (or never: deleted first), driven at random. At
    every step, a pod that may exist (its create in flight, made, or unknown) and that the watch has not
    shown is reserved. At the end, once the creates answered and the checks ran, only such pods are."""
    book, now = ReservationBook(), 0.0
    world: dict[str, str] = {}  # name -> "inflight" | "exists" | "none"
    observed: set[str] = set()

    def check() -> None:
        for asked in book.due(at(now), CHECK_S):
            if world.get(asked.worker) != "exists":  # the API's answer: the pod does not exist
                book.absent(asked)

    def answer(name: str, outcome: str) -> None:
        if outcome == "refused":
            world[name] = "none"
            book.release("ns", name)
        else:
            world[name] = "exists" if outcome in ("made", "existed", "unknown-made") else "none"
            book.answered("ns", name, at(now), CHECK_S)

    for op, index, outcome in steps:
        name = f"w{index}"
        free = world.get(name, "none") == "none" and name not in observed
        if op == "reserve" and free and all(r.worker != name for r in book.all()):
            book.reserve("ns", "p", name, GI, at(now))
            world[name] = "inflight"
        elif op == "answer" and world.get(name) == "inflight":
            answer(name, outcome)
        elif op == "observe" and world.get(name) == "exists":
            observed.add(name)
        elif op == "delete" and world.get(name) == "exists":
            world[name] = "none"
            observed.discard(name)
        elif op == "check":
            check()
        elif op == "tick":
            now += 30
        book.prune(("ns", n) for n in observed)
        held = {r.worker for r in book.all()}
        unseen = {n for n, s in world.items() if s in ("inflight", "exists") and n not in observed}
        assert unseen <= held, f"memory of {sorted(unseen - held)} counted nowhere"

    for name in [n for n, s in world.items() if s == "inflight"]:
        answer(name, "unknown-not-made")
    now += CHECK_S
    check()
    held = {r.worker for r in book.all()}
    assert held == {n for n, s in world.items() if s == "exists" and n not in observed}


def test_budget_limit_none_total_or_invalid() -> None:
    # No ModelBudget and missing_budget=admit: no limit (test_missing_budget.py has the refuse side).
    assert budget_limit({}, "default", missing="admit") == BudgetLimit()
    assert budget_limit({"default": [{"memory": "8Gi"}]}, "default", missing="refuse") == BudgetLimit(
        total=8 * GI
    )
    # Through the CRD's pattern, refused by the parser: fail closed, saying why.
    limit = budget_limit({"default": [{"memory": "1e41"}]}, "default", missing="admit")
    assert limit.total is None and limit.invalid is not None
    assert limit.invalid.startswith("ModelBudget default is invalid: spec.memory: invalid quantity")
    assert "too large" in limit.invalid
    missing = budget_limit({"default": [{}]}, "default", missing="admit").invalid
    assert missing == "ModelBudget default is invalid: spec.memory: Field required"


def test_an_invalid_budget_admits_nothing() -> None:
    ledger = build_ledger(None, [worker("a")], invalid="ModelBudget default is invalid: ...")
    assert not admits(ledger, 1) and ledger.free == 0
    assert not admits(build_ledger(10**15, [], invalid="x"), 1)


def test_admits_is_inclusive_and_unlimited_without_budget() -> None:
    ledger = build_ledger(4 * GI, [worker("a")])
    assert admits(ledger, 2 * GI)
    assert not admits(ledger, 2 * GI + 1)
    assert not admits(ledger.with_reserved(1), 2 * GI)
    assert admits(build_ledger(None, [worker("a")]), 10**15)


def test_budget_status_wire() -> None:
    wire = budget_status(build_ledger(8 * GI, [worker("a"), worker("b", pool="q")], [])).wire()
    assert wire["used"] == "4Gi" and wire["usedBytes"] == 4 * GI and wire["reserved"] == "0"
    assert wire["pools"] == [
        {"namespace": "ns", "name": "p", "memory": "2Gi", "memoryBytes": 2 * GI},
        {"namespace": "ns", "name": "q", "memory": "2Gi", "memoryBytes": 2 * GI},
    ]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(list[WorkerState](["Pending", "Ready", "Failed", "Dead", "Evicting"])),
            st.integers(1, 8),
        ),
        max_size=20,
    )
)
def test_ledger_is_derived_never_counted(specs: list[tuple[WorkerState, int]]) -> None:
    workers = [worker(f"w{i}", state, memory=mem * GI) for i, (state, mem) in enumerate(specs)]
    ledger = build_ledger(None, workers)
    assert ledger.used == sum(mem * GI for state, mem in specs if state not in ("Failed", "Dead"))
    assert sum(ledger.shares.values()) == ledger.used
