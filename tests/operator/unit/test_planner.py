"""The planner: creation, failure backoff, idle eviction, budget admission/preemption, roll-over."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import ModelPoolStatus
from modelpool_contract.states import WorkerState
from modelpool_operator.budget import ReservationBook, admits, build_ledger
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import (
    EVICT_IDLE,
    EVICT_PREEMPTED,
    EVICT_ROLLOVER,
    PlannerSettings,
    backoff_delay,
    plan,
    preemption_candidates,
)
from modelpool_operator.pool import OtherPool, worker_name
from tests.operator.unit.op_planner import cond, ledger_for, make_spec, view, w
from tests.operator.unit.op_pods import GI, at

NOW = at(1000)


# ---- creation and the target ----------------------------------------------------------------------------


def test_empty_pool_creates_replicas_with_deterministic_names() -> None:
    out = plan(view(), [], ledger_for(100 * GI), now=NOW)
    assert [c.name for c in out.create] == [worker_name("p", "h1", 0), worker_name("p", "h1", 1)]
    assert all(c.memory == 2 * GI for c in out.create)
    assert out.status.phase == "Pending" and out.status.ready_text == "0/2"
    assert cond(out, "Progressing") == ("True", "Scaling")
    assert cond(out, "BudgetExceeded") == ("False", "WithinBudget")
    # One Event for the pass's creations (a scale-up of 300 pools told 6,000 Events one by one).
    [creating] = [e for e in out.events if e.reason == "CreatingWorker"]
    names = [worker_name("p", "h1", 0), worker_name("p", "h1", 1)]
    assert creating.message == f"creating worker {names[0]}; creating worker {names[1]}"


def test_reservations_count_as_workers_in_flight() -> None:
    book = ReservationBook()
    book.reserve("ns", "p", worker_name("p", "h1", 0), 2 * GI, NOW)
    out = plan(view(), [], ledger_for(100 * GI, book=book), now=NOW)
    assert [c.name for c in out.create] == [worker_name("p", "h1", 1)]


def test_ready_pool_is_stable() -> None:
    workers = [w("p-a", "Ready"), w("p-b", "Processing", queue=2)]
    out = plan(view(), workers, ledger_for(100 * GI, workers), now=NOW)
    assert out.idle
    assert out.status.phase == "Ready" and out.status.ready_replicas == 2 and out.status.replicas == 2
    assert out.status.memory.charged == "4Gi"
    assert cond(out, "Ready") == ("True", "WorkersReady")
    assert cond(out, "Progressing") == ("False", "Stable")


def test_condition_transition_time_is_kept_while_unchanged() -> None:
    workers = [w("p-a"), w("p-b")]
    fixed = make_spec(autoscaling={"enabled": False})  # an autoscaled pool would scale down meanwhile
    first = plan(view(fixed), workers, ledger_for(None, workers), now=NOW)
    later = plan(view(fixed, status=first.status), workers, ledger_for(None, workers), now=at(2000))
    times = {c.type: c.last_transition_time for c in later.status.conditions}
    assert times == {c.type: c.last_transition_time for c in first.status.conditions}
    assert all(c.observed_generation == 1 for c in later.status.conditions)


def test_scale_down_removes_pending_first_never_loading() -> None:
    workers = [
        w("p-a", "Loading"),
        w("p-b", "Pending"),
        w("p-c", "Ready", last_request=10),
        w("p-d", "Processing"),
    ]
    out = plan(view(make_spec(replicas=1)), workers, ledger_for(None, workers), now=NOW)
    assert [d.name for d in out.delete] == ["p-b"]
    assert [e.name for e in out.evict] == ["p-c"]
    assert not out.create


def test_spec_replicas_change_resets_the_target() -> None:
    status = ModelPoolStatus(target_replicas=1, spec_replicas=2)
    out = plan(view(make_spec(replicas=3), status=status), [], ledger_for(None), now=NOW)
    assert out.status.target_replicas == 3 and len(out.create) == 3
    same = plan(view(make_spec(replicas=2), status=status), [w("p-a")], ledger_for(None), now=NOW)
    assert same.status.target_replicas == 1 and not same.create


def test_scale_up_under_load_one_at_a_time_up_to_replicas() -> None:
    status = ModelPoolStatus(target_replicas=1, spec_replicas=3)
    workers = [w("p-a", "Processing", queue=60)]
    spec = make_spec(replicas=3, autoscaling={"enabled": False})  # with autoscaling, test_autoscale.py
    out = plan(view(spec, status=status), workers, ledger_for(None, workers), now=NOW)
    assert out.status.target_replicas == 2 and len(out.create) == 1
    idle = plan(view(spec, status=status), [w("p-a", "Ready")], ledger_for(None), now=NOW)
    assert idle.status.target_replicas == 1 and not idle.create


# ---- failures and backoff ---------------------------------------------------------------------------------


def test_failed_worker_is_free_kept_during_backoff_then_deleted_and_replaced() -> None:
    workers = [w("p-a", "Ready"), w("p-b", "Failed", reason="LoadFailed")]
    ledger = ledger_for(100 * GI, workers)
    assert ledger.used == 2 * GI  # the failed worker is charged nothing
    first = plan(view(), workers, ledger, now=NOW)
    assert not first.delete and not first.create  # kept for inspection; backoff: 5 s
    assert first.status.backoff.failures == 1
    assert first.status.backoff.next_attempt_after == "2026-01-01T12:16:45Z"
    assert (first.status.backoff.last_worker, first.status.backoff.last_reason) == ("p-b", "LoadFailed")
    assert first.requeue_after == 5.0
    assert cond(first, "Degraded") == ("True", "LoadFailed")
    assert ("Warning", "LoadFailed") in [(e.type, e.reason) for e in first.events]
    failed_entry = next(x for x in first.status.workers if x.name == "p-b")
    assert (failed_entry.state, failed_entry.memory) == ("Failed", "0")

    # The same failure seen again is not counted twice.
    again = plan(view(status=first.status), workers, ledger, now=at(1002))
    assert again.status.backoff.failures == 1 and not again.create and not again.delete

    # When the backoff is over, the failed pod is deleted and its replacement created in the same pass.
    later = plan(view(status=again.status), workers, ledger, now=at(1006))
    assert [d.name for d in later.delete] == ["p-b"] and len(later.create) == 1
    assert later.status.backoff.failures == 1

    # Once gone, the failure stays on record (reason, message) while the pool recovers.
    remaining = [w("p-a", "Ready"), w(later.create[0].name, "Loading")]
    gone = plan(view(status=later.status), remaining, ledger_for(100 * GI, remaining), now=at(1007))
    assert gone.status.backoff.last_reason == "LoadFailed" and not gone.create

    # Ready for only a few seconds (it may crash again at once): the count is kept, so backoff still grows.
    fresh = [w("p-a"), w(later.create[0].name, since=1095)]
    brief = plan(view(status=gone.status), fresh, ledger_for(100 * GI, fresh), now=at(1100))
    assert brief.status.backoff.failures == 1

    healthy = [w("p-a"), w(later.create[0].name, since=1095)]
    reset = plan(view(status=brief.status), healthy, ledger_for(100 * GI, healthy), now=at(1160))
    assert reset.status.backoff.failures == 0 and reset.status.backoff.next_attempt_after is None
    assert reset.status.backoff.last_reason == "LoadFailed"


def test_backoff_grows_and_is_capped() -> None:
    delays = [backoff_delay(n, 5, 300) for n in range(0, 12)]
    assert delays[:5] == [0, 5, 10, 20, 40]
    assert max(delays) == 300 and delays[-1] == 300
    assert all(a <= b for a, b in itertools.pairwise(delays))
    assert backoff_delay(10**6, 5, 300) == 300


def test_all_failed_pool_phase_failed() -> None:
    workers = [w("p-a", "Failed", reason="OOMKilled"), w("p-b", "Failed", reason="OOMKilled")]
    out = plan(view(), workers, ledger_for(10 * GI, workers), now=NOW)
    assert out.status.phase == "Failed"
    assert out.status.backoff.failures == 2 and out.status.backoff.next_attempt_after is not None
    assert out.status.memory.charged == "0"


# ---- idle eviction ----------------------------------------------------------------------------------------


def test_idle_workers_are_evicted_lru_first_down_to_min() -> None:
    spec = make_spec(replicas=4, minReplicas=1, idleTimeoutSeconds=60)
    workers = [
        w("p-a", "Idle", last_request=900),  # idle 100 s
        w("p-b", "Idle", last_request=100),  # idle 900 s: least recently used
        w("p-c", "Idle", last_request=500),
        w("p-d", "Processing", queue=1),
    ]
    out = plan(
        view(spec, ModelPoolStatus(target_replicas=4, spec_replicas=4)),
        workers,
        ledger_for(None, workers),
        now=NOW,
    )
    assert [(e.name, e.reason) for e in out.evict] == [
        ("p-b", EVICT_IDLE),
        ("p-c", EVICT_IDLE),
        ("p-a", EVICT_IDLE),
    ]
    assert out.status.target_replicas == 1
    assert not out.create
    states = {x.name: x.state for x in out.status.workers}
    assert states == {"p-a": "Evicting", "p-b": "Evicting", "p-c": "Evicting", "p-d": "Processing"}

    # Next pass: the evictions are observed; the target is not lowered twice, nothing is re-created.
    observed = [w(x.name, "Evicting", evicting=EVICT_IDLE, evicting_since=1000) for x in workers[:3]] + [
        workers[3]
    ]
    nxt = plan(view(spec, out.status), observed, ledger_for(None, observed), now=at(1002))
    assert nxt.status.target_replicas == 1 and not nxt.create and not nxt.evict
    assert nxt.requeue_after == 3.0  # drain grace left
    done = plan(view(spec, nxt.status), observed, ledger_for(None, observed), now=at(1006))
    assert sorted(d.name for d in done.delete) == ["p-a", "p-b", "p-c"]


def test_idle_not_long_enough_requeues_at_the_timeout() -> None:
    spec = make_spec(replicas=2, minReplicas=0, idleTimeoutSeconds=60)
    workers = [w("p-a", "Idle", last_request=980), w("p-b", "Ready")]
    out = plan(view(spec), workers, ledger_for(None, workers), now=NOW)
    assert not out.evict and out.requeue_after == 40.0


def test_idle_eviction_disabled_with_zero_timeout() -> None:
    spec = make_spec(replicas=2, idleTimeoutSeconds=0)
    workers = [w("p-a", "Idle", last_request=0), w("p-b", "Idle", last_request=0)]
    assert not plan(view(spec), workers, ledger_for(None, workers), now=NOW).evict


# ---- the budget ------------------------------------------------------------------------------------------


def test_budget_admits_only_what_fits_and_reports_numbers() -> None:
    out = plan(view(), [], ledger_for(3 * GI), now=NOW)
    assert len(out.create) == 1
    status, reason = cond(out, "BudgetExceeded")
    assert (status, reason) == ("True", "InsufficientMemory")
    message = next(c.message for c in out.status.conditions if c.type == "BudgetExceeded")
    assert "needs 2Gi" in message and "total 3Gi" in message and "reserved 2Gi" in message
    assert ("Warning", "BudgetExceeded") in [(e.type, e.reason) for e in out.events]


INVALID = "ModelBudget default is invalid: spec.memory: invalid quantity '1e41': too large"


def test_an_invalid_budget_admits_nothing_preempts_nothing_and_says_why() -> None:
    """Fail closed: no worker, nobody preempted for it, no outdated worker retired to make room; the
    condition and a Warning Event carry the parser's reason, once."""
    idle_low = [w("low-a", "Idle", pool="low", last_request=0)]
    others = [OtherPool("ns", "low", priority=0, min_replicas=0, workers=tuple(idle_low))]
    old = [w("p-old", template_hash="h0")]
    ledger = build_ledger(None, [*idle_low, *old], invalid=INVALID)
    spec = make_spec(replicas=2, minReplicas=0, priority=10)
    out = plan(view(spec), old, ledger, others=others, now=NOW)
    assert not out.create and not out.evict
    budget = next(c for c in out.status.conditions if c.type == "BudgetExceeded")
    assert (budget.status, budget.reason) == ("True", "BudgetInvalid")
    assert budget.message == f"{INVALID}; no worker is admitted until it is fixed"
    assert [(e.type, e.reason) for e in out.events if "Budget" in e.reason] == [("Warning", "BudgetInvalid")]
    again = plan(view(spec, out.status), old, ledger, others=others, now=at(1001))
    assert not [e for e in again.events if "Budget" in e.reason]  # told once
    # Fixed: the workers are admitted.
    fixed = plan(
        view(spec, again.status), old, ledger_for(100 * GI, idle_low, old), others=others, now=at(1002)
    )
    assert fixed.create and cond(fixed, "BudgetExceeded") == ("False", "WithinBudget")


def test_a_pool_that_wants_nothing_still_shows_the_budget_is_invalid() -> None:
    workers = [w("p-a"), w("p-b")]
    out = plan(view(), workers, build_ledger(None, workers, invalid=INVALID), now=NOW)
    assert cond(out, "BudgetExceeded") == ("False", "BudgetInvalid")


def test_preemption_evicts_lower_priority_idle_workers_lru_first() -> None:
    low = [w("low-a", "Idle", pool="low", last_request=500), w("low-b", "Idle", pool="low", last_request=100)]
    busy = [w("low-c", "Processing", pool="low", queue=3), w("low-d", "Loading", pool="low")]
    high_pool = [w("hi-a", "Idle", pool="hi", last_request=0)]
    others = [
        OtherPool("ns", "low", priority=0, min_replicas=0, workers=tuple(low + busy)),
        OtherPool("ns", "hi", priority=100, min_replicas=0, workers=tuple(high_pool)),
    ]
    spec = make_spec(replicas=1, priority=10)
    ledger = ledger_for(10 * GI, low, busy, high_pool)  # 10Gi used of 10Gi
    out = plan(view(spec, name="me"), [], ledger, others=others, now=NOW)
    assert not out.create
    assert [(e.pool, e.name, e.reason) for e in out.evict] == [("low", "low-b", EVICT_PREEMPTED)]
    assert cond(out, "BudgetExceeded") == ("True", "WaitingForMemory")

    # While that worker drains, nothing more is evicted.
    draining = [w("low-b", "Evicting", pool="low", evicting=EVICT_PREEMPTED, evicting_since=1000)]
    others2 = [OtherPool("ns", "low", 0, 0, tuple([low[0], *busy, *draining])), others[1]]
    again = plan(view(spec, out.status, name="me"), [], ledger, others=others2, now=at(1001))
    assert not again.evict and not again.create


def test_preemption_never_takes_from_higher_priority_or_busy_workers() -> None:
    others = [
        OtherPool("ns", "hi", 100, 0, (w("hi-a", "Idle", pool="hi"),)),
        OtherPool(
            "ns", "low", 0, 0, (w("low-a", "Processing", pool="low"), w("low-b", "Loading", pool="low"))
        ),
        OtherPool("ns", "eq", 10, 1, (w("eq-a", "Idle", pool="eq"),)),  # equal priority, at its minimum
    ]
    assert preemption_candidates(10, ("ns", "me"), others) == []
    ledger = build_ledger(8 * GI, [x for o in others for x in o.workers])
    out = plan(view(make_spec(replicas=1, priority=10), name="me"), [], ledger, others=others, now=NOW)
    assert not out.evict and not out.create
    assert cond(out, "BudgetExceeded") == ("True", "InsufficientMemory")


def test_preempted_pool_lowers_its_target_instead_of_recreating() -> None:
    spec = make_spec(replicas=2, minReplicas=0)
    prev = plan(view(spec), [w("p-a", "Idle", last_request=990), w("p-b")], ledger_for(None), now=NOW).status
    observed = [w("p-a", "Evicting", evicting=EVICT_PREEMPTED, evicting_since=1000), w("p-b")]
    out = plan(view(spec, prev), observed, ledger_for(None, observed), now=at(1001))
    assert out.status.target_replicas == 1 and not out.create


def test_two_pools_planning_in_turn_never_over_admit() -> None:
    book = ReservationBook()
    total = 7 * GI
    created: list[str] = []
    for name in ("a", "b", "a", "b"):
        ledger = ledger_for(total, book=book)
        out = plan(view(make_spec(replicas=3), name=name), [], ledger, now=NOW)
        for c in out.create:
            book.reserve("ns", name, c.name, c.memory, NOW)
            created.append(c.name)
    assert len(created) == 3  # 3 x 2Gi fit in 7Gi; a fourth never does
    assert build_ledger(total, [], book.all()).reserved <= total


# ---- roll-over --------------------------------------------------------------------------------------------


def test_rollover_surges_then_retires_old_workers_keeping_the_ready_minimum() -> None:
    spec = make_spec(replicas=2)
    old = [
        w("p-old-a", template_hash="h0", last_request=10),
        w("p-old-b", template_hash="h0", last_request=20),
    ]
    first = plan(view(spec), old, ledger_for(100 * GI, old), now=NOW)
    assert len(first.create) == 1 and not first.evict  # surge one, nobody retired yet
    new_a = w(first.create[0].name, "Loading")
    second = plan(view(spec, first.status), [*old, new_a], ledger_for(100 * GI), now=at(1001))
    assert not second.create and not second.evict  # new one not ready: keep both old
    new_a = w(first.create[0].name, "Ready")
    third = plan(view(spec, second.status), [*old, new_a], ledger_for(100 * GI), now=at(1002))
    assert [(e.name, e.reason) for e in third.evict] == [("p-old-a", EVICT_ROLLOVER)]
    assert cond(third, "Progressing") == ("True", "RollingOver")


def test_rollover_with_fewer_replicas_retires_surplus_outdated_workers_first() -> None:
    spec = make_spec(replicas=1)
    old = [w(f"p-old-{i}", template_hash="h0", last_request=i) for i in range(3)]
    out = plan(view(spec), old, ledger_for(100 * GI, old), now=NOW)
    assert [e.name for e in out.evict] == ["p-old-0", "p-old-1"]
    assert not out.create  # no surge room yet: 1 ready outdated worker + 1 surge once the others are gone
    nxt = plan(view(spec, out.status), old[2:], ledger_for(100 * GI, old[2:]), now=at(1010))
    assert len(nxt.create) == 1 and not nxt.evict


def test_rollover_without_room_for_a_surge_retires_one_within_max_unavailable() -> None:
    spec = make_spec(replicas=1, minReplicas=0)
    old = [w("p-old", template_hash="h0")]
    out = plan(view(spec), old, ledger_for(2 * GI, old), now=NOW)
    assert not out.create
    assert [(e.name, e.reason) for e in out.evict] == [("p-old", EVICT_ROLLOVER)]


def test_rollover_keeps_loading_outdated_workers_and_deletes_pending_ones() -> None:
    spec = make_spec(replicas=2)
    workers = [w("p-l", "Loading", template_hash="h0"), w("p-p", "Pending", template_hash="h0")]
    out = plan(view(spec), workers, ledger_for(None, workers), now=NOW)
    assert [d.name for d in out.delete] == ["p-p"]
    assert all(e.name != "p-l" for e in out.evict)


# ---- properties -------------------------------------------------------------------------------------------

STATES: list[WorkerState] = [
    "Pending",
    "Loading",
    "Ready",
    "Processing",
    "Idle",
    "Evicting",
    "Failed",
    "Dead",
]


def _workers(pool: str, draw_states: list[tuple[WorkerState, int, int]]) -> list[ObservedWorker]:
    return [
        w(
            f"{pool}-{i}",
            state,
            pool=pool,
            last_request=float(lr),
            template_hash="h1" if i % 3 else "h0",
            evicting=EVICT_IDLE if state == "Evicting" else None,
            evicting_since=990 if state == "Evicting" else None,
            memory=mem * GI,
            queue=1 if state == "Processing" else 0,
        )
        for i, (state, lr, mem) in enumerate(draw_states)
    ]


_pool_workers = st.lists(
    st.tuples(st.sampled_from(STATES), st.integers(0, 1000), st.integers(1, 4)), max_size=8
)


@settings(max_examples=200, deadline=None)
@given(
    own=_pool_workers,
    other=_pool_workers,
    total=st.integers(0, 40),
    replicas=st.integers(0, 6),
    min_replicas=st.integers(0, 6),
    priority=st.integers(-2, 2),
    other_priority=st.integers(-2, 2),
    reserved=st.integers(0, 3),
)
def test_plan_invariants(  # noqa: PLR0917 - hypothesis arguments
    own: list[tuple[WorkerState, int, int]],
    other: list[tuple[WorkerState, int, int]],
    total: int,
    replicas: int,
    min_replicas: int,
    priority: int,
    other_priority: int,
    reserved: int,
) -> None:
    min_replicas = min(min_replicas, replicas)
    spec = make_spec(
        replicas=replicas, minReplicas=min_replicas, priority=priority, maxReplicas=max(replicas, 1)
    )
    mine = _workers("p", own)
    theirs = _workers("q", other)
    book = ReservationBook()
    for i in range(reserved):
        book.reserve("ns", "q", f"q-res-{i}", GI, NOW)
    ledger = ledger_for(total * GI, mine, theirs, book=book)
    out = plan(
        view(spec),
        mine,
        ledger,
        others=[OtherPool("ns", "q", other_priority, 0, tuple(theirs))],
        now=NOW,
        settings=PlannerSettings(),
    )
    by_name = {x.name: x for x in [*mine, *theirs]}
    # Loading and Processing workers are never chosen for eviction or deleted (unless Failed).
    for e in out.evict:
        assert by_name[e.name].state in ("Ready", "Idle")
    for d in out.delete:
        assert by_name[d.name].state not in ("Loading", "Processing", "Ready", "Idle")
    # Preemption only takes from pools of lower or equal priority.
    if any(e.pool == "q" for e in out.evict):
        assert other_priority <= priority
    # The budget is never exceeded by creations.
    if ledger.used + ledger.reserved <= total * GI:
        assert ledger.used + ledger.reserved + sum(c.memory for c in out.create) <= total * GI
    else:
        assert not out.create
    view_after = ledger.with_reserved(sum(c.memory for c in out.create))
    assert admits(view_after, 0) or not out.create
    # Failed workers are never charged, in the ledger or in status.
    for entry in out.status.workers:
        if entry.state == "Failed":
            assert entry.memory == "0"
    assert out.status.memory.charged_bytes == sum(x.memory for x in mine)
    # The target stays within [minReplicas, replicas]; names are unique and new.
    assert min_replicas <= (out.status.target_replicas or 0) <= replicas
    names = [c.name for c in out.create]
    assert len(set(names)) == len(names) and not set(names) & set(by_name)


@settings(max_examples=200, deadline=None)
@given(
    ready_old=st.integers(0, 4),
    ready_new=st.integers(0, 4),
    replicas=st.integers(1, 4),
    total=st.integers(0, 20),
)
def test_rollover_never_drops_below_the_ready_minimum(
    ready_old: int, ready_new: int, replicas: int, total: int
) -> None:
    spec = make_spec(replicas=replicas, minReplicas=0, maxReplicas=4)
    workers = [w(f"p-old-{i}", template_hash="h0", last_request=i) for i in range(ready_old)]
    workers += [w(f"p-new-{i}", template_hash="h1") for i in range(ready_new)]
    ledger = ledger_for(total * GI, workers)
    out = plan(view(spec), workers, ledger, now=NOW)
    ready_after = len(workers) - len(out.evict)
    stuck = any(c.type == "BudgetExceeded" and c.status == "True" for c in out.status.conditions)
    target = out.status.target_replicas or 0
    if not stuck:
        assert ready_after >= min(target, len(workers))
    assert all(e.reason in (EVICT_ROLLOVER, "ScaleDown") for e in out.evict)


def test_a_worker_that_never_served_is_idle_since_it_became_ready() -> None:
    # The model load is not idle time, and the Idle state's own since must not restart the clock.
    spec = make_spec(replicas=1, minReplicas=0, idleTimeoutSeconds=60)
    never = replace(w("p-a", "Idle", since=995), last_request_time=None, created=at(800), ready_since=at(930))
    out = plan(view(spec), [never], ledger_for(None, [never]), now=NOW)
    assert [(e.name, e.reason) for e in out.evict] == [("p-a", EVICT_IDLE)]
    fresh = replace(never, ready_since=at(960))  # ready 40 s ago: not yet
    out = plan(view(spec), [fresh], ledger_for(None, [fresh]), now=NOW)
    assert not out.evict and out.requeue_after == 20.0
    # A request after readiness counts from the request.
    used = replace(never, last_request_time=at(990))
    assert not plan(view(spec), [used], ledger_for(None, [used]), now=NOW).evict


def test_lower_priority_pool_leaves_freed_memory_to_a_waiting_higher_one() -> None:
    # "hi" preempted low's idle worker and waits for 2Gi; the victim is gone and 3Gi are free.  Low's
    # own pass (its minReplicas wants the worker back) must not take the memory first.
    hi = OtherPool("ns", "hi", priority=10, min_replicas=0, workers=(), waiting_memory=2 * GI)
    low_spec = make_spec(replicas=1, minReplicas=1, priority=-5)
    out = plan(view(low_spec, name="low"), [], ledger_for(3 * GI), others=[hi], now=NOW)
    assert not out.create
    assert cond(out, "BudgetExceeded") == ("True", "InsufficientMemory")
    budget = next(c for c in out.status.conditions if c.type == "BudgetExceeded")
    assert "left to higher-priority pools 2Gi" in budget.message
    assert out.status.memory.waiting_bytes == 2 * GI
    # The waiting pool itself takes it.
    mine = plan(view(make_spec(replicas=1, priority=10), name="hi"), [], ledger_for(3 * GI), now=NOW)
    assert len(mine.create) == 1 and mine.status.memory.waiting_bytes == 0
    # Equal or lower priority waiters, and waiters that can never fit, are not yielded to.
    for other in (
        OtherPool("ns", "eq", priority=-5, min_replicas=0, waiting_memory=2 * GI),
        OtherPool("ns", "huge", priority=10, min_replicas=0, waiting_memory=30 * GI),
    ):
        assert (
            len(plan(view(low_spec, name="low"), [], ledger_for(3 * GI), others=[other], now=NOW).create) == 1
        )


def test_other_pool_from_body_reads_priority_and_waiting_memory() -> None:
    body = {
        "metadata": {"namespace": "ns", "name": "hi"},
        "spec": make_spec(priority=7, minReplicas=1).wire(),
        "status": {"memory": {"charged": "0", "chargedBytes": 0, "waitingBytes": 2 * GI}},
    }
    other = OtherPool.from_body(body, [w("hi-a", pool="hi")])
    assert other is not None
    assert (other.key, other.priority, other.min_replicas, other.waiting_memory) == (
        ("ns", "hi"),
        7,
        1,
        2 * GI,
    )
    assert len(other.workers) == 1
    assert OtherPool.from_body({"metadata": {"name": "x"}, "spec": {"replicas": "many"}}) is None


def test_preemption_is_not_undone_by_the_victims_pool() -> None:
    total = 3 * GI
    low_spec = make_spec(replicas=1, minReplicas=1, priority=-5, idleTimeoutSeconds=3)
    hi_spec = make_spec(replicas=1, priority=10)
    victim = w("low-a", "Idle", pool="low", last_request=900)
    low_status = plan(view(low_spec, name="low"), [victim], ledger_for(total, [victim]), now=NOW).status

    def others_for_low(hi_status: ModelPoolStatus) -> list[OtherPool]:
        return [OtherPool("ns", "hi", 10, 0, (), waiting_memory=hi_status.memory.waiting_bytes)]

    # 1. hi cannot fit and preempts low's idle worker.
    hi1 = plan(
        view(hi_spec, name="hi"), [], ledger_for(total, [victim]),
        others=[OtherPool("ns", "low", -5, 1, (victim,))], now=at(1001),
    )  # fmt: skip
    assert [(e.pool, e.name) for e in hi1.evict] == [("low", "low-a")]
    assert hi1.status.memory.waiting_bytes == 2 * GI
    # 2. low sees its worker draining and deletes it after the grace; it does not re-create meanwhile.
    draining = replace(victim, state="Evicting", evicting_reason=EVICT_PREEMPTED, evicting_since=at(1001))
    low2 = plan(
        view(low_spec, low_status, name="low"), [draining], ledger_for(total, [draining]),
        others=others_for_low(hi1.status), now=at(1007),
    )  # fmt: skip
    assert [d.name for d in low2.delete] == ["low-a"] and not low2.create
    # 3. The pod is gone; low plans first (its minReplicas wants a worker) and leaves the memory to hi.
    low3 = plan(
        view(low_spec, low2.status, name="low"),
        [],
        ledger_for(total),
        others=others_for_low(hi1.status),
        now=at(1008),
    )
    assert not low3.create
    # 4. hi takes it.
    hi4 = plan(view(hi_spec, hi1.status, name="hi"), [], ledger_for(total), now=at(1009))
    assert len(hi4.create) == 1 and hi4.status.memory.waiting_bytes == 0


def test_unschedulable_is_told_once_when_the_reason_changes_though_the_state_stays_pending() -> None:
    # Pending/Scheduling -> Pending/Unschedulable changes only the reason: the Warning must still be sent,
    # once, and not again while the worker stays unschedulable.
    spec = make_spec(replicas=1)
    scheduling = [w("p-a", "Pending", reason="Scheduling")]
    first = plan(view(spec), scheduling, ledger_for(100 * GI, scheduling), now=NOW)
    assert ("Warning", "Unschedulable") not in [(e.type, e.reason) for e in first.events]
    stuck = [w("p-a", "Pending", reason="Unschedulable")]
    second = plan(view(spec, status=first.status), stuck, ledger_for(100 * GI, stuck), now=at(1130))
    told = [e for e in second.events if (e.type, e.reason) == ("Warning", "Unschedulable")]
    assert len(told) == 1 and "p-a" in told[0].message
    third = plan(view(spec, status=second.status), stuck, ledger_for(100 * GI, stuck), now=at(1140))
    assert ("Warning", "Unschedulable") not in [(e.type, e.reason) for e in third.events]
