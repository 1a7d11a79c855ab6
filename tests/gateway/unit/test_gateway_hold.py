"""Holding: the time budget, why a pool has no serving worker, and release in arrival order."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from modelpool_gateway.hold import RELEASE_HEAD_START_S, Baton, Holds, hold_budget, hold_reason, hopeless
from modelpool_gateway.state import Key, Pool, WorkerState

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
KEY: Key = ("ns", "pool")


def test_the_budget_is_the_activation_timeout_within_the_clients_deadline() -> None:
    assert hold_budget(120, None) == 120
    assert hold_budget(120, 7.5) == 7.5
    assert hold_budget(3, 60) == 3


def test_a_budget_exceeded_condition_is_named_without_its_figures() -> None:
    # The condition's figures describe the whole cluster's memory, other tenants' pools included.
    message = "needs 4Gi for worker pool-1; 2Gi of 8Gi free (budget default)"
    loading = WorkerState("pool-0", "Loading", since=NOW - timedelta(seconds=9))
    reason = hold_reason(Pool("ns", "pool", budget_exceeded=message, workers=(loading,)), NOW)
    assert reason.kind == "budget_exceeded"
    assert "ns/pool" in reason.message and "budget" in reason.message
    assert not any(ch.isdigit() for ch in reason.message), reason.message


def test_a_loading_worker_is_named_with_its_state_and_how_long() -> None:
    pool = Pool(
        "ns",
        "pool",
        workers=(
            WorkerState("pool-1", "Pending", since=NOW - timedelta(seconds=3)),
            WorkerState("pool-0", "Loading", since=NOW - timedelta(seconds=42), load_progress=0.5),
        ),
    )
    reason = hold_reason(pool, NOW)
    assert reason.kind == "loading"
    assert reason.message == (
        "pool ns/pool is still loading: worker pool-0 has been Loading for 42 s (50% loaded) (and 1 more)"
    )


def test_a_pending_worker_with_a_reason() -> None:
    pending = WorkerState("pool-0", "Pending", since=NOW, reason="Unschedulable", message="0/5 nodes")
    reason = hold_reason(Pool("ns", "pool", workers=(pending,)), NOW)
    assert reason.message.endswith("worker pool-0 has been Pending for 0 s (Unschedulable: 0/5 nodes)")


def test_failing_workers_say_why() -> None:
    pool = Pool("ns", "pool", degraded="replacing failed workers in 8s (failures: 2)")
    reason = hold_reason(pool, NOW)
    assert reason.kind == "failed"
    assert "replacing failed workers in 8s" in reason.message


def test_ready_in_status_but_not_serving_here() -> None:
    pool = Pool("ns", "pool", workers=(WorkerState("pool-0", "Evicting", reason="IdleTimeout"),))
    reason = hold_reason(pool, NOW)
    assert reason.kind == "not_serving"
    assert "pool-0 Evicting (IdleTimeout)" in reason.message


def test_a_pool_at_zero_waits_for_the_operator_and_names_the_recorded_demand() -> None:
    reason = hold_reason(Pool("ns", "pool", demanded_at=NOW), NOW)
    assert reason.kind == "waiting_for_operator"
    assert "waiting for the operator" in reason.message
    assert "2026-01-02T03:04:05Z" in reason.message
    assert "not recorded yet" in hold_reason(Pool("ns", "pool"), NOW).message


def test_a_pool_with_an_invalid_spec_says_why_first() -> None:
    pool = Pool("ns", "pool", invalid="spec.replicas: must be <= maxReplicas", wakes_on_demand=False)
    reason = hold_reason(pool, NOW)
    assert reason.kind == "invalid_spec"
    assert "spec.replicas: must be <= maxReplicas" in reason.message and "starts no worker" in reason.message


def test_a_pool_the_operator_will_not_wake_says_so() -> None:
    reason = hold_reason(Pool("ns", "pool", wakes_on_demand=False), NOW)
    assert reason.kind == "scaled_to_zero"
    assert "spec.replicas is 0 and autoscaling is off" in reason.message


def test_a_deleted_pool() -> None:
    assert hold_reason(None, NOW).kind == "pool_deleted"


async def test_released_in_arrival_order_one_at_a_time() -> None:
    routable = {"yes": False}
    holds = Holds(10, lambda key: routable["yes"])
    waiters = [holds.enter(KEY) for _ in range(3)]
    assert all(w is not None for w in waiters) and holds.held(KEY) == 3
    holds.changed(KEY)
    assert not any(w.future.done() for w in waiters if w), "no serving worker yet: nothing released"

    routable["yes"] = True
    holds.changed(KEY)
    first, second, third = (w for w in waiters if w)
    assert first.future.done() and not second.future.done(), "one at a time"
    assert holds.busy(KEY), "a new request queues behind the released ones"
    baton = first.future.result()
    assert isinstance(baton, Baton)
    baton.passed()
    assert second.future.done() and not third.future.done()
    # A baton that is never passed (its request stalls before being written) frees the next one anyway.
    await asyncio.sleep(RELEASE_HEAD_START_S * 3)
    assert third.future.done()
    third_baton = third.future.result()
    assert third_baton is not None
    third_baton.passed()
    assert not holds.busy(KEY) and holds.held(KEY) == 0


async def test_full_hold_refuses_and_a_leaving_waiter_frees_its_place() -> None:
    holds = Holds(2, lambda key: False)
    a, b = holds.enter(KEY), holds.enter(KEY)
    assert a is not None and b is not None
    assert holds.enter(KEY) is None
    holds.leave(KEY, a)
    assert a.future.cancelled()
    assert holds.enter(KEY) is not None
    assert holds.held(KEY) == 2 and holds.total() == 2


async def test_zero_bound_refuses_every_hold() -> None:
    assert Holds(0, lambda key: False).enter(KEY) is None


async def test_abandon_wakes_waiters_with_no_worker() -> None:
    holds = Holds(5, lambda key: False)
    waiters = [holds.enter(KEY), holds.enter(("ns", "other"))]
    holds.abandon(KEY)
    assert waiters[0] is not None and waiters[0].future.result() is None
    assert waiters[1] is not None and not waiters[1].future.done()
    holds.abandon()
    assert waiters[1].future.result() is None
    assert holds.total() == 0


@pytest.mark.parametrize("count", [1, 5])
async def test_a_waiter_that_left_is_never_released(count: int) -> None:
    routable = {"yes": False}
    holds = Holds(10, lambda key: routable["yes"])
    waiters = [holds.enter(KEY) for _ in range(count)]
    first = waiters[0]
    assert first is not None
    holds.leave(KEY, first)
    routable["yes"] = True
    holds.changed(KEY)
    assert first.future.cancelled()
    if count > 1:
        assert waiters[1] is not None and waiters[1].future.done()


def test_only_a_pool_the_operator_never_starts_a_worker_for_is_hopeless() -> None:
    assert hopeless(Pool("ns", "pool", wakes_on_demand=False), NOW) is not None
    assert hopeless(Pool("ns", "pool", invalid="spec.x: bad", wakes_on_demand=False), NOW) is not None
    assert hopeless(Pool("ns", "pool"), NOW) is None  # waits for the operator to start one
    # Replicas 0 with a worker still loading (scaled down a moment ago, say): it may yet serve.
    loading = WorkerState("pool-0", "Loading", since=NOW)
    assert hopeless(Pool("ns", "pool", wakes_on_demand=False, workers=(loading,)), NOW) is None
