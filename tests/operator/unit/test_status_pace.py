"""A pool's status while it is being created (``planner.status_pace``, issue 36): written at once when it
is the first, when a worker loads, fails or goes, and when the pool settles; while only Pending workers
are waited for, its progress is written at most every ``CREATING_STATUS_INTERVAL_S``; an unchanged status
is never written."""

from __future__ import annotations

from modelpool_contract.api import ModelPoolStatus, WorkerStatus
from modelpool_contract.states import WorkerState
from modelpool_operator.planner.status_pace import CREATING_STATUS_INTERVAL_S, creating, status_delay


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
