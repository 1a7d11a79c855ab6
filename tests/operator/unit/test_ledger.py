"""The memory ledger: derived from observed workers + reservations; admission arithmetic."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from op_pods import GI, at

from modelpool_contract.api import WorkerState
from modelpool_operator.budget import ReservationBook, admits, budget_status, build_ledger, live_reservations
from modelpool_operator.worker_state import ObservedWorker


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


def test_reservation_expires_and_release_drops_it() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", "a", GI, at(0))
    book.reserve("ns", "p", "b", GI, at(50))
    assert [r.worker for r in book.prune([], at(61), ttl_s=60)] == ["b"]
    book.release("ns", "b")
    assert len(book) == 0
    assert live_reservations(book.all(), [], at(61), 60) == ()


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
