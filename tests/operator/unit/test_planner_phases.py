"""The planner's phases one at a time: each test brings a ``Draft`` to the phase under test by running the
phases before it, runs that one phase, and checks what it added to the draft."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from modelpool_contract.api import BackoffStatus, Condition, ModelPoolSpec, ModelPoolStatus, WorkerStatus
from modelpool_contract.demand import Demand
from modelpool_contract.times import rfc3339
from modelpool_operator.budget import Ledger, ReservationBook
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import (
    EVICT_IDLE,
    EVICT_PREEMPTED,
    EVICT_ROLLOVER,
    EVICT_SCALE_DOWN,
    PHASES,
    Delete,
    Draft,
    Evict,
    PlannerSettings,
    admit,
    conclude,
    handle_failures,
    retire,
    roll_over,
    scale_up_under_load,
    set_target,
    tell_transitions,
)
from modelpool_operator.pool import OtherPool
from tests.operator.unit.op_planner import ledger_for, make_spec, view, w
from tests.operator.unit.op_pods import GI, at

NOW = at(1000)
Phase = Callable[[Draft], None]


def draft_before(
    phase: Phase | None,
    workers: Sequence[ObservedWorker] = (),
    *,
    spec: ModelPoolSpec | None = None,
    status: ModelPoolStatus | None = None,
    ledger: Ledger | None = None,
    others: Sequence[OtherPool] = (),
    settings: PlannerSettings | None = None,
    demanded_at: datetime | None = None,
) -> Draft:
    """A draft on which every phase before ``phase`` has run (None: all of them)."""
    pool = replace(view(spec or make_spec(), status), demand=Demand(demanded_at) if demanded_at else None)
    ledger = ledger or ledger_for(None, list(workers))
    draft = Draft(pool, list(workers), ledger, NOW, others, settings or PlannerSettings())
    for earlier in PHASES:
        if earlier is phase:
            break
        earlier(draft)
    return draft


def last_status(*workers: tuple[str, str], target: int | None = None, replicas: int = 2) -> ModelPoolStatus:
    """A previous status listing these (name, state) workers, recorded for ``spec.replicas == replicas``."""
    return ModelPoolStatus(
        workers=[WorkerStatus(name=name, state=state) for name, state in workers],  # type: ignore[arg-type]
        target_replicas=target,
        spec_replicas=replicas,
    )


def run(phase: Phase, draft: Draft) -> list[str]:
    """Run ``phase`` on ``draft``; the reasons of the Events it added."""
    before = len(draft.events)
    phase(draft)
    return [e.reason for e in draft.events[before:]]


# ---- 1. transitions -------------------------------------------------------------------------------------


def test_transitions_tell_ready_failed_and_gone_workers() -> None:
    status = last_status(("p-a", "Loading"), ("p-b", "Ready"), ("p-gone", "Ready"), ("p-dead", "Dead"))
    workers = [w("p-a", "Ready"), w("p-b", "Failed", reason="OOMKilled"), w("p-new", "Ready")]
    draft = draft_before(tell_transitions, workers, status=status)
    assert run(tell_transitions, draft) == ["WorkerReady", "OOMKilled", "WorkerReady", "WorkerRemoved"]
    assert draft.events[-1].message == "worker p-gone is gone"
    assert draft.events[1].type == "Warning"


def test_transitions_skip_unchanged_workers_and_creations_in_flight() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", "p-coming", 2 * GI, NOW)
    status = last_status(("p-a", "Ready"), ("p-coming", "Pending"))
    workers = [w("p-a", "Ready")]
    draft = draft_before(
        tell_transitions, workers, status=status, ledger=ledger_for(None, workers, book=book)
    )
    tell_transitions(draft)
    assert draft.events == []


def test_unschedulable_is_told_when_the_reason_changes() -> None:
    status = ModelPoolStatus(workers=[WorkerStatus(name="p-a", state="Pending", reason="Scheduling")])
    stuck = [w("p-a", "Pending", reason="Unschedulable")]
    draft = draft_before(tell_transitions, stuck, status=status)
    assert run(tell_transitions, draft) == ["Unschedulable"] and draft.events[0].type == "Warning"
    again = ModelPoolStatus(workers=[WorkerStatus(name="p-a", state="Pending", reason="Unschedulable")])
    draft = draft_before(tell_transitions, stuck, status=again)
    tell_transitions(draft)
    assert draft.events == []


# ---- 2. target ------------------------------------------------------------------------------------------


def test_target_follows_spec_replicas_when_they_change() -> None:
    draft = draft_before(set_target, spec=make_spec(replicas=4), status=last_status(target=1, replicas=2))
    set_target(draft)
    assert draft.target == 4


def test_target_keeps_a_lowered_value_while_spec_replicas_stay() -> None:
    draft = draft_before(set_target, spec=make_spec(replicas=4), status=last_status(target=1, replicas=4))
    set_target(draft)
    assert draft.target == 1


def test_target_drops_for_a_shrinking_eviction_started_elsewhere_but_not_below_min() -> None:
    spec = make_spec(replicas=3, minReplicas=1)
    status = last_status(("p-a", "Idle"), ("p-b", "Idle"), target=3, replicas=3)
    workers = [w("p-a", "Evicting", evicting=EVICT_PREEMPTED), w("p-b", "Evicting", evicting=EVICT_IDLE)]
    draft = draft_before(set_target, workers, spec=spec, status=status)
    set_target(draft)
    assert draft.target == 1
    # Already Evicting in the last status: counted then, not again.
    status = last_status(("p-a", "Evicting"), target=2, replicas=3)
    draft = draft_before(set_target, workers[:1], spec=spec, status=status)
    set_target(draft)
    assert draft.target == 2


# ---- 3. failures ----------------------------------------------------------------------------------------


def test_a_new_failure_is_counted_once_and_backs_off() -> None:
    settings = PlannerSettings(backoff_base_s=4, backoff_cap_s=60)
    failed = [w("p-a", "Failed", reason="LoadFailed")]
    draft = draft_before(handle_failures, failed, status=last_status(("p-a", "Loading")), settings=settings)
    assert run(handle_failures, draft) == ["BackOff"]
    assert draft.backoff.failures == 1 and draft.backoff.next_attempt == NOW + timedelta(seconds=4)
    assert (draft.backoff.last_worker, draft.backoff.last_reason) == ("p-a", "LoadFailed")
    # Kept (it charges nothing, its logs stay readable) until the replacement is due.
    assert draft.deletes == [] and draft.requeue == [4.0]


def test_a_failure_seen_before_is_not_counted_again_and_is_deleted_once_due() -> None:
    status = last_status(("p-a", "Failed"))
    status.backoff = BackoffStatus(failures=2, next_attempt_after=rfc3339(at(999)), last_worker="p-a")
    draft = draft_before(handle_failures, [w("p-a", "Failed", reason="OOMKilled")], status=status)
    assert run(handle_failures, draft) == []
    assert draft.backoff.failures == 2
    assert draft.deletes == [Delete("p-a", "OOMKilled")]


# ---- 4. retire ------------------------------------------------------------------------------------------


def test_retire_deletes_drained_workers_and_waits_for_the_others() -> None:
    settings = PlannerSettings(drain_grace_s=5)
    workers = [
        w("p-a", "Evicting", evicting=EVICT_IDLE, evicting_since=990),
        w("p-b", "Evicting", evicting=EVICT_IDLE, evicting_since=998),
        w("p-c", "Dead", reason="Completed"),
        w("p-d", "Ready"),
    ]
    draft = draft_before(retire, workers, spec=make_spec(replicas=1), settings=settings)
    retire(draft)
    assert draft.deletes == [Delete("p-a", EVICT_IDLE), Delete("p-c", "Completed")]
    assert draft.requeue == [3.0]


def test_retire_scales_down_pending_first_then_least_recently_used() -> None:
    workers = [
        w("p-a", "Idle", last_request=500),
        w("p-b", "Idle", last_request=900),
        w("p-c", "Pending"),
        w("p-d", "Processing", queue=3),
    ]
    status = last_status(target=1, replicas=1)
    draft = draft_before(retire, workers, spec=make_spec(replicas=1, idleTimeoutSeconds=0), status=status)
    retire(draft)
    assert draft.deletes == [Delete("p-c", EVICT_SCALE_DOWN)]
    assert draft.evicts == [
        Evict("ns", "p", "p-a", EVICT_SCALE_DOWN, "Idle"),
        Evict("ns", "p", "p-b", EVICT_SCALE_DOWN, "Idle"),
    ]
    assert [x.name for x in draft.active] == ["p-d"]  # never a worker with work in hand
    assert draft.evicting_now == {"p-a": EVICT_SCALE_DOWN, "p-b": EVICT_SCALE_DOWN}


def test_retire_evicts_idle_workers_down_to_min_replicas_lowering_the_target() -> None:
    spec = make_spec(replicas=3, minReplicas=1, idleTimeoutSeconds=60)
    workers = [w("p-a", "Idle", last_request=100), w("p-b", "Idle", last_request=200), w("p-c", "Idle")]
    draft = draft_before(retire, workers, spec=spec)
    retire(draft)
    assert [e.name for e in draft.evicts] == ["p-c", "p-a"]  # least recently used first
    assert all(e.reason == EVICT_IDLE for e in draft.evicts)
    assert draft.target == 1 and [x.name for x in draft.active] == ["p-b"]


def test_retire_requeues_at_the_next_idle_timeout() -> None:
    spec = make_spec(replicas=1, idleTimeoutSeconds=60)
    draft = draft_before(retire, [w("p-a", "Idle", last_request=980)], spec=spec)
    retire(draft)
    assert draft.evicts == [] and draft.requeue == [40.0]


def test_retire_counts_recorded_demand_as_use_of_idle_workers() -> None:
    # The server reports Idle, but a gateway still holds requests (the pod is not Ready yet) and recorded
    # demand 10 s ago: the worker is idle for 10 s, not for the 900 s since its last request.
    spec = make_spec(replicas=1, idleTimeoutSeconds=60)
    workers = [w("p-a", "Idle", last_request=100)]
    draft = draft_before(retire, workers, spec=spec, demanded_at=NOW - timedelta(seconds=10))
    retire(draft)
    assert draft.evicts == [] and draft.requeue == [50.0]
    # Demand older than the timeout keeps nothing.
    draft = draft_before(retire, workers, spec=spec, demanded_at=NOW - timedelta(seconds=61))
    retire(draft)
    assert [(e.name, e.reason) for e in draft.evicts] == [("p-a", EVICT_IDLE)]


# ---- 5. scale up under load -----------------------------------------------------------------------------


def test_scale_up_when_every_serving_queue_is_half_full() -> None:
    spec = make_spec(replicas=3, queue={"capacity": 10}, autoscaling={"enabled": False})
    workers = [w("p-a", "Processing", queue=5), w("p-b", "Processing", queue=7)]
    draft = draft_before(scale_up_under_load, workers, spec=spec, status=last_status(target=2, replicas=3))
    assert run(scale_up_under_load, draft) == ["ScalingUp"]
    assert draft.target == 3


def test_no_scale_up_while_a_worker_is_starting_or_queues_are_short() -> None:
    spec = make_spec(replicas=3, queue={"capacity": 10}, autoscaling={"enabled": False})
    status = last_status(target=2, replicas=3)
    starting = [w("p-a", "Processing", queue=5), w("p-b", "Loading")]
    short = [w("p-a", "Processing", queue=5), w("p-b", "Processing", queue=4)]
    for workers in (starting, short):
        draft = draft_before(scale_up_under_load, workers, spec=spec, status=status)
        assert run(scale_up_under_load, draft) == []
        assert draft.target == 2


# ---- 6. admit -------------------------------------------------------------------------------------------


def test_admit_creates_up_to_the_target_within_the_budget() -> None:
    draft = draft_before(admit, spec=make_spec(replicas=3), ledger=ledger_for(5 * GI))
    admit(draft)
    assert [c.memory for c in draft.creates] == [2 * GI, 2 * GI]
    assert draft.admission.blocked and not draft.admission.waiting_for_memory
    assert draft.admission.waiting_bytes == 2 * GI
    assert "a worker needs 2Gi but the budget has 1Gi free (total 5Gi" in draft.admission.message


def test_admit_holds_creations_during_the_backoff() -> None:
    status = last_status()
    status.backoff = BackoffStatus(failures=1, next_attempt_after=rfc3339(at(1030)))
    draft = draft_before(admit, status=status)
    admit(draft)
    assert draft.creates == [] and draft.admission.backoff_wait == 30.0 and 30.0 in draft.requeue


def test_admit_preempts_an_idle_worker_of_a_lower_priority_pool() -> None:
    victim = w("low-a", "Idle", pool="low", last_request=10)
    low = OtherPool("ns", "low", priority=-1, min_replicas=0, workers=(victim,))
    spec = make_spec(replicas=1, priority=5)
    draft = draft_before(admit, spec=spec, ledger=ledger_for(2 * GI, [victim]), others=[low])
    assert run(admit, draft) == ["Preempting"]
    assert draft.creates == []
    assert draft.evicts == [Evict("ns", "low", "low-a", EVICT_PREEMPTED, "Idle")]
    assert draft.admission.blocked and draft.admission.waiting_for_memory


def test_admit_drops_outdated_workers_that_never_started() -> None:
    workers = [w("p-old", "Pending", template_hash="h0"), w("p-a", "Ready")]
    draft = draft_before(admit, workers, spec=make_spec(replicas=1))
    admit(draft)
    assert draft.deletes == [Delete("p-old", EVICT_ROLLOVER)] and draft.outdated == []


# ---- 7. roll over ---------------------------------------------------------------------------------------


def test_roll_over_retires_old_workers_while_the_target_stays_ready() -> None:
    workers = [
        w("p-old-a", template_hash="h0", last_request=10),
        w("p-old-b", template_hash="h0", last_request=20),
        w("p-new", template_hash="h1"),
    ]
    draft = draft_before(roll_over, workers, spec=make_spec(replicas=2))
    roll_over(draft)
    # Three ready, target two: one old worker may go (least recently used), the other stays for now.
    assert draft.evicts == [Evict("ns", "p", "p-old-a", EVICT_ROLLOVER, "Ready")]


def test_roll_over_never_goes_below_the_target_while_replacements_are_pending() -> None:
    workers = [w("p-old-a", template_hash="h0"), w("p-old-b", template_hash="h0")]
    draft = draft_before(roll_over, workers, spec=make_spec(replicas=2))
    assert len(draft.creates) == 1  # admit surged one new worker
    roll_over(draft)
    assert draft.evicts == []


# ---- 8. conclude ----------------------------------------------------------------------------------------


def test_conclude_writes_the_status_and_tells_about_the_budget_once() -> None:
    draft = draft_before(None, spec=make_spec(replicas=2), ledger=ledger_for(3 * GI))
    out = conclude(draft)
    assert out.status.phase == "Pending" and out.status.ready_text == "0/2"
    assert out.status.memory.waiting_bytes == 2 * GI
    budget = next(c for c in out.status.conditions if c.type == "BudgetExceeded")
    assert (budget.status, budget.reason) == ("True", "InsufficientMemory")
    assert [e.reason for e in out.events] == ["BudgetExceeded", "CreatingWorker"]
    # Already reported: no second Warning.
    status = ModelPoolStatus(conditions=[Condition(type="BudgetExceeded", status="True")])
    draft = draft_before(None, spec=make_spec(replicas=2), status=status, ledger=ledger_for(3 * GI))
    assert [e.reason for e in conclude(draft).events] == ["CreatingWorker"]


def test_conclude_keeps_since_of_unchanged_workers_and_marks_evictions() -> None:
    status = ModelPoolStatus(
        workers=[WorkerStatus(name="p-a", state="Idle", since="2026-01-01T11:00:00Z")],
        target_replicas=1,
        spec_replicas=1,
    )
    workers = [w("p-a", "Idle", last_request=990), w("p-b", "Idle", last_request=100)]
    spec = make_spec(replicas=1, idleTimeoutSeconds=600)
    out = conclude(draft_before(None, workers, spec=spec, status=status))
    entries = {e.name: e for e in out.status.workers}
    assert entries["p-a"].since == "2026-01-01T11:00:00Z"
    assert (entries["p-b"].state, entries["p-b"].reason) == ("Evicting", EVICT_SCALE_DOWN)
    assert out.status.phase == "Idle" and out.status.ready_replicas == 1
