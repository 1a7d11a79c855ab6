"""A pool's status while it is being created (``planner.status_pace``, issue 36): written at once when it
is the first, when a worker loads, fails or goes, and when the pool settles; while only Pending workers
are waited for, its progress is written at most every ``CREATING_STATUS_INTERVAL_S``; an unchanged status
is never written. The Normal Events of a held pass wait for the status and go with it, one per reason;
Warnings never wait."""

from __future__ import annotations

from modelpool_contract.api import ModelPoolStatus, WorkerStatus
from modelpool_contract.states import WorkerState
from modelpool_operator.planner.draft import Event
from modelpool_operator.planner.status_pace import (
    CREATING_STATUS_INTERVAL_S,
    creating,
    pace_events,
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
    interval = CREATING_STATUS_INTERVAL_S
    assert status_delay(changed=False, creating=True, since_write=0.1) is None
    assert status_delay(changed=False, creating=False, since_write=None) is None
    assert status_delay(changed=True, creating=True, since_write=None) == 0  # the first write
    assert status_delay(changed=True, creating=True, since_write=0.5) == interval - 0.5
    assert status_delay(changed=True, creating=True, since_write=interval) == 0
    assert status_delay(changed=True, creating=False, since_write=0.1) == 0


def test_normal_events_wait_with_a_held_status_and_go_with_it_one_per_reason() -> None:
    ready_a = Event("Normal", "WorkerReady", "worker a is ready")
    ready_b = Event("Normal", "WorkerReady", "worker b is ready")
    failed = Event("Warning", "CreateFailed", "worker c: quota")
    post, held = pace_events([], [ready_a, failed], deferred=True)
    assert post == [failed] and held == [ready_a]
    post, held = pace_events(held, [ready_b], deferred=False)
    assert post == [Event("Normal", "WorkerReady", "worker a is ready; worker b is ready")] and held == []
    assert pace_events([], [], deferred=False) == ([], [])
