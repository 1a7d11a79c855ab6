"""What the operator believes of a worker's word about its own work (``observe.claims``; issue 30 item 5):
a claim of Processing (or of requests in flight or queued) is believed for at most the pool's request
timeout plus ``PROCESSING_GRACE_S``, measured by the operator; past it the worker counts as Idle for
eviction, preemption may take it, and an Event says why. A worker's queue figures count at most its
queue's capacity, so a made-up queue depth moves its own pool's autoscaler only that far."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.api import ModelPoolStatus, WorkerStatus
from modelpool_contract.times import rfc3339
from modelpool_operator.observe.claims import (
    PROCESSING_GRACE_S,
    REASON_NOT_BELIEVED,
    BusyClaim,
    believe,
    bounded_load,
    claim_believed,
)
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import plan, preemption_candidates
from modelpool_operator.pool import OtherPool
from tests.operator.unit.op_planner import ledger_for, make_spec, view, w
from tests.operator.unit.op_pods import at

SPEC = make_spec(queue={"requestTimeoutSeconds": 30, "capacity": 10})
BOUND = 30 + PROCESSING_GRACE_S


def _passes(reports: list[tuple[float, ObservedWorker]], **kw: Any) -> list[ObservedWorker]:
    """``believe`` over passes at the given seconds, the record carried from one to the next."""
    claims: dict[str, BusyClaim] = kw.pop("claims", {})
    seen: list[ObservedWorker] = []
    for t, worker in reports:
        believed, claims = believe(
            [worker], spec=SPEC, claims=claims, previous=kw.get("previous", ()), now=at(t)
        )
        seen.append(believed[0])
    return seen


def _liar(t: float) -> ObservedWorker:
    """Reports Processing, with a state_since of "just now", at every scrape."""
    return w("p-0", "Processing", since=t, in_flight=1, queue=0)


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(0, 3_600_000))
def test_a_claim_is_believed_exactly_within_its_bound(start_ms: int, later_ms: int, bound_ms: int) -> None:
    since = at(0) + timedelta(milliseconds=start_ms)
    now = since + timedelta(milliseconds=later_ms)
    assert claim_believed(since, now, bound_ms / 1000) == (later_ms <= bound_ms)


def test_a_worker_that_always_reports_processing_counts_as_idle_past_the_bound() -> None:
    times = [0, 10, 30, 50, 60, 61, 90]
    seen = _passes([(t, _liar(t)) for t in times])
    believed = [x for t, x in zip(times, seen, strict=True) if t <= BOUND]
    assert all(x.state == "Processing" and not x.evictable for x in believed)
    past = [x for t, x in zip(times, seen, strict=True) if t > BOUND]
    assert past and all(x.state == "Idle" and x.evictable and x.claim_expired for x in past)
    assert {x.reason for x in past} == {REASON_NOT_BELIEVED}
    assert past[0].since == at(0)  # since when it claimed, as the operator measured it
    assert "requestTimeoutSeconds" in (past[0].message or "")


def _busy(t: float, done: int) -> ObservedWorker:
    """An honest worker under steady traffic: Processing since long before, ``done`` requests finished."""
    return replace(w("p-0", "Processing", since=-3600, in_flight=4, queue=2), requests_total=done)


def test_a_busy_worker_that_finishes_requests_stays_believed_however_long() -> None:
    # Busy for ten bounds on end, finishing requests between passes: Processing, never evictable, and
    # its hour-old state_since (steady traffic) is no reason to doubt it, at first sight or later.
    times = [0, 20, 40, 60, 80, 100, 200, 400, 600]
    seen = _passes([(t, _busy(t, done=int(t))) for t in times])
    assert all(x.state == "Processing" and not x.evictable and not x.claim_expired for x in seen)


def test_a_busy_worker_that_stops_finishing_requests_is_bounded_from_its_last_progress() -> None:
    # Wedged at 100 s: its counter stops; believed until 100 + BOUND, not a moment after.
    times = [0, 50, 100, 130, 100 + BOUND, 100 + BOUND + 1, 100 + BOUND + 30]
    seen = _passes([(t, _busy(t, done=int(min(t, 100)))) for t in times])
    expired = [x.claim_expired for x in seen]
    assert expired == [False, False, False, False, False, True, True]
    assert seen[-1].state == "Idle" and seen[-1].since == at(100)


def test_after_a_restart_a_worker_that_reports_progress_gets_a_fresh_bound() -> None:
    # The status says Processing since an hour ago (steady traffic): no Warning, no eviction at the first
    # pass after a restart; one already not believed keeps its since.
    entry = WorkerStatus(name="p-0", state="Processing", since=rfc3339(at(-3600)))
    assert not _passes([(0, _busy(0, done=7))], previous=[entry])[0].claim_expired
    wedged = WorkerStatus(name="p-0", state="Idle", since=rfc3339(at(-3600)), reason=REASON_NOT_BELIEVED)
    assert _passes([(0, _busy(0, done=7))], previous=[wedged])[0].claim_expired


def test_requests_claimed_in_flight_on_an_idle_worker_are_bounded_too() -> None:
    seen = _passes([(t, w("p-0", "Idle", in_flight=3, queue=2)) for t in (0, 30, 61)])
    assert [x.evictable for x in seen] == [False, False, True]


def test_a_pause_in_the_claim_starts_the_clock_again() -> None:
    seen = _passes([(0, _liar(0)), (40, w("p-0", "Idle", since=40)), (50, _liar(50)), (100, _liar(100))])
    assert [x.state for x in seen] == ["Processing", "Idle", "Processing", "Processing"]
    assert not seen[-1].claim_expired  # 50 s of claim since the pause


def test_after_a_restart_the_last_status_carries_the_claim() -> None:
    entry = WorkerStatus(name="p-0", state="Processing", since=rfc3339(at(0)))
    seen = _passes([(BOUND + 1, _liar(BOUND + 1))], previous=[entry])
    assert seen[0].claim_expired and seen[0].since == at(0)
    expired = WorkerStatus(name="p-0", state="Idle", since=rfc3339(at(0)), reason=REASON_NOT_BELIEVED)
    assert _passes([(BOUND + 1, _liar(BOUND + 1))], previous=[expired])[0].claim_expired


def test_a_new_pod_under_the_same_name_starts_afresh() -> None:
    claims = {"p-0": BusyClaim("old-uid", at(0))}
    seen = _passes([(BOUND + 5, replace(_liar(BOUND + 5), uid="new-uid"))], claims=claims)
    assert seen[0].state == "Processing" and not seen[0].claim_expired


def test_a_worker_own_older_since_is_believed_against_itself() -> None:
    long_busy = w("p-0", "Processing", since=0, in_flight=1)
    assert _passes([(BOUND + 1, long_busy)])[0].claim_expired


def test_preemption_takes_an_unbelieved_worker_of_another_pool() -> None:
    def others(worker: ObservedWorker) -> list[OtherPool]:
        return [OtherPool("ns", "low", priority=0, min_replicas=0, workers=(worker,))]

    liar = w("low-0", "Processing", pool="low", in_flight=1, last_request=0)
    assert preemption_candidates(10, ("ns", "high"), others(liar)) == []
    (expired,) = _passes([(0, liar), (BOUND + 1, liar)])[1:]
    assert preemption_candidates(10, ("ns", "high"), others(expired)) == [expired]


def test_the_pool_is_told_once_why_a_worker_counts_as_idle() -> None:
    (expired,) = _passes([(0, _liar(0)), (BOUND + 1, _liar(BOUND + 1))])[1:]
    spec = make_spec(replicas=1, idleTimeoutSeconds=3600, queue={"requestTimeoutSeconds": 30, "capacity": 10})
    first = plan(view(spec), [expired], ledger_for(None, [expired]), now=at(BOUND + 1))
    told = [e for e in first.events if e.reason == REASON_NOT_BELIEVED]
    assert len(told) == 1 and told[0].type == "Warning" and "p-0" in told[0].message
    (entry,) = first.status.workers
    assert (entry.state, entry.reason, entry.since) == ("Idle", REASON_NOT_BELIEVED, rfc3339(at(0)))
    again = plan(view(spec, first.status), [expired], ledger_for(None, [expired]), now=at(BOUND + 6))
    assert not [e for e in again.events if e.reason == REASON_NOT_BELIEVED]


@given(st.integers(-(10**12), 10**12) | st.none(), st.integers(-(10**12), 10**12) | st.none())
def test_queue_figures_count_at_most_the_queue_capacity(queued: int | None, flying: int | None) -> None:
    worker = replace(w("p-0", "Processing"), queue_depth=queued, in_flight=flying)
    bounded = bounded_load(worker, 10)
    for before, after in ((queued, bounded.queue_depth), (flying, bounded.in_flight)):
        assert after == (None if before is None else max(0, min(before, 10)))
    if queued is not None and flying is not None and 0 <= queued <= 10 and 0 <= flying <= 10:
        assert bounded is worker


def test_a_made_up_queue_depth_moves_its_pool_only_as_far_as_the_capacity_allows() -> None:
    policy = {"targetPerWorker": 5, "scaleUpWindowSeconds": 10, "stableWindowSeconds": 60}
    spec = make_spec(replicas=1, minReplicas=1, maxReplicas=50, autoscaling=policy, queue={"capacity": 10})
    liar = w("p-0", "Processing", queue=10**9, in_flight=10**9)
    (believed,), _ = believe([liar], spec=spec, claims={}, previous=(), now=at(0))
    pool = view(spec, ModelPoolStatus(target_replicas=1, spec_replicas=1))
    decided = plan(pool, [believed], ledger_for(None, [believed]), now=at(0))
    # 10 queued + 10 in flight at most: 20 requests for a target of 5 each, not maxReplicas.
    assert decided.status.target_replicas == 4
    unbounded = plan(pool, [liar], ledger_for(None, [liar]), now=at(0))
    assert unbounded.status.target_replicas == 50  # what the claim alone would have done


def test_claims_of_a_worker_not_busy_are_not_kept() -> None:
    _, claims = believe(
        [w("p-0", "Idle")], spec=SPEC, claims={"p-0": BusyClaim(None, at(0))}, previous=(), now=at(1)
    )
    assert claims == {}
