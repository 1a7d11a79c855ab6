"""A pool's status while it is being created (``planner.status_pace``, issue 36): written at once when it
is the first, when a worker loads, fails or goes, and when the pool settles; while only Pending workers
are waited for, its progress is written at most every ``interval`` (a routine Pending step at most every
``ROUTINE_HOLD_S``); an unchanged status is never written. The Normal Events of a held pass, and those
of a creation after the pass that started it, wait (at most ``CREATING_EVENTS_HOLD_S``) and go together,
one per reason; Warnings never wait."""

from __future__ import annotations

from modelpool_contract.api import ModelPoolStatus, WorkerStatus
from modelpool_contract.states import WorkerState
from modelpool_operator.planner.draft import Event
from modelpool_operator.planner.status_pace import (
    CREATING_EVENTS_HOLD_S,
    GATHER_S,
    ROUTINE_HOLD_S,
    creating,
    hold_events,
    pace_events,
    routine,
    status_delay,
)


def status(*states: WorkerState) -> ModelPoolStatus:
    return ModelPoolStatus(workers=[WorkerStatus(name=f"w{i}", state=s) for i, s in enumerate(states)])


def test_a_pool_is_being_created_while_only_pending_workers_are_waited_for() -> None:
    assert creating(status("Pending", "Pending"))
    assert creating(status("Ready", "Pending", "Idle"))
    assert not creating(status("Ready", "Ready"))  # settled
    assert not creating(status())  # nothing wanted
    assert not creating(status("Pending", "Loading"))  # a worker loads: shown at once
    assert not creating(status("Pending", "Failed"))
    assert not creating(status("Pending", "Evicting"))


def test_a_creating_pools_progress_waits_for_the_interval_anything_else_is_written_at_once() -> None:
    interval = 5.0
    assert status_delay(changed=False, creating=True, since_write=0.1, interval=interval) is None
    assert status_delay(changed=False, creating=False, since_write=None, interval=interval) is None
    assert status_delay(changed=True, creating=True, since_write=None, interval=interval) == 0  # the first
    assert status_delay(changed=True, creating=True, since_write=0.5, interval=interval) == interval - 0.5
    gathered = GATHER_S
    assert (
        status_delay(
            changed=True, creating=True, since_write=interval, interval=interval, since_change=gathered
        )
        == 0
    )
    # A change after a long quiet is gathered a moment: the pool's other pods come Ready with it.
    assert status_delay(changed=True, creating=True, since_write=60, interval=interval) == GATHER_S
    assert (
        status_delay(changed=True, creating=True, since_write=60, interval=interval, since_change=0.5)
        == GATHER_S - 0.5
    )
    assert status_delay(changed=True, creating=False, since_write=0.1, interval=interval) == 0
    assert status_delay(changed=True, creating=True, since_write=0.1, interval=0) == 0  # pacing off


def wire(*workers: dict[str, object], ready: int = 0) -> dict[str, object]:
    return {"readyReplicas": ready, "workers": list(workers)}


def test_a_pending_workers_routine_steps_are_told_apart_from_progress() -> None:
    planned = wire({"name": "w0", "state": "Pending"}, {"name": "w1", "state": "Pending"})
    scheduling = wire(
        {"name": "w0", "state": "Pending", "reason": "Scheduling", "since": "t0"},
        {"name": "w1", "state": "Pending", "reason": "Scheduling", "since": "t0"},
    )
    bound = wire(
        {"name": "w0", "state": "Pending", "reason": "Scheduled", "node": "n1", "since": "t0"},
        {"name": "w1", "state": "Pending", "reason": "Scheduling", "message": "in the queue", "since": "t0"},
    )
    assert routine(planned, scheduling) and routine(scheduling, bound)
    assert not routine(None, planned)  # the first status
    assert not routine(bound, bound)  # no change at all
    one_ready = wire({"name": "w0", "state": "Ready"}, {"name": "w1", "state": "Pending"}, ready=1)
    assert not routine(bound, one_ready)  # a worker serving is progress
    stuck = wire(
        {"name": "w0", "state": "Pending", "reason": "Unschedulable", "message": "0/3 nodes"},
        {"name": "w1", "state": "Pending", "reason": "Scheduling"},
    )
    assert not routine(scheduling, stuck)  # out of the ordinary way: paced as any progress
    assert not routine(stuck, scheduling)
    # The first status, before any pod is observed, and the counts that follow the workers appearing.
    first = {**wire(), "replicas": 0, "memory": {"chargedBytes": 0}, "conditions": [not_ready("Scaling")]}
    appeared = {
        **planned,
        "replicas": 2,
        "memory": {"chargedBytes": 2},
        "conditions": [{**not_ready("Scaling"), "message": "0/2 workers ready"}],
    }
    assert routine(first, appeared)
    assert not routine(first, {**appeared, "conditions": [not_ready("Unschedulable")]})
    assert not routine(first, {**appeared, "observedGeneration": 2})  # a new spec seen


def not_ready(reason: str) -> dict[str, object]:
    return {"type": "Ready", "status": "False", "reason": reason, "message": "0/0 workers ready"}


def test_a_routine_pending_step_waits_longer_than_progress_unless_pacing_is_off() -> None:
    interval = 5.0

    def delay(
        written: float | None, *, creating: bool = True, interval: float = interval, since: float = 0
    ) -> float | None:
        return status_delay(
            changed=True,
            creating=creating,
            since_write=written,
            interval=interval,
            routine=True,
            since_change=since,
        )

    assert delay(interval) == ROUTINE_HOLD_S - interval  # progress would go now; a routine step waits
    assert delay(ROUTINE_HOLD_S) == GATHER_S  # at most that long, gathered as any change
    assert delay(ROUTINE_HOLD_S, since=GATHER_S) == 0
    assert delay(None) == 0  # the first status
    assert delay(1.0, creating=False) == 0  # settled: at once
    assert delay(1.0, interval=0) == 0  # pacing off: every change at once


def test_normal_events_wait_with_a_held_status_and_go_with_it_one_per_reason() -> None:
    ready_a = Event("Normal", "WorkerReady", "worker a is ready")
    ready_b = Event("Normal", "WorkerReady", "worker b is ready")
    failed = Event("Warning", "CreateFailed", "worker c: quota")
    post, held = pace_events([], [ready_a, failed], hold=True)
    assert post == [failed] and held == [ready_a]
    post, held = pace_events(held, [ready_b], hold=False)
    assert post == [Event("Normal", "WorkerReady", "worker a is ready; worker b is ready")] and held == []
    assert pace_events([], [], hold=False) == ([], [])


def test_a_creations_normal_events_wait_until_the_pool_settles_after_the_pass_that_started_it() -> None:
    def hold(
        *, deferred: bool = False, creating: bool = True, was: bool = True, held_for: float | None = None
    ) -> bool:
        return hold_events(deferred=deferred, creating=creating, was_creating=was, held_for=held_for)

    assert hold(deferred=True, creating=False, was=False)  # the status is held: its Events with it
    assert not hold(was=False)  # the pass that starts the creation tells its decision at once
    assert hold()  # the creation goes on: its WorkerReady Events wait
    assert hold(held_for=CREATING_EVENTS_HOLD_S - 1)
    assert not hold(held_for=CREATING_EVENTS_HOLD_S)  # a pool that stays Pending still tells its progress
    assert not hold(creating=False)  # settled: everything held goes, one per reason
