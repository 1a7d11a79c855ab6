"""Autoscaling and waking from zero (``planner.autoscale``; docs/operator.md, "Autoscaling"): the load and
its windows, the decision, the two phases, the status of a pool at zero, and hypothesis properties of
whole plans: the count stays within [minReplicas, maxReplicas] and the budget, Loading and Processing
workers are never chosen, and under a constant load the count changes at most once."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import AutoscalingStatus, ModelPoolSpec, ModelPoolStatus, autoscaling_enabled
from modelpool_contract.demand import Demand
from modelpool_contract.states import WorkerState
from modelpool_contract.times import rfc3339, rfc3339_ms
from modelpool_operator.budget import ReservationBook, build_ledger
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import (
    EVICT_SCALE_DOWN,
    PHASES,
    Draft,
    LoadSample,
    Plan,
    autoscale,
    plan,
    wake_on_demand,
)
from modelpool_operator.planner.autoscale import (
    average,
    count_refusals,
    decide,
    observe_load,
    pool_load,
    record,
)
from modelpool_operator.pool import OtherPool, PoolView
from tests.operator.unit.op_planner import cond, ledger_for, make_spec, view, w
from tests.operator.unit.op_pods import GI, at

NOW = at(1000)


def auto_spec(**overrides: Any) -> ModelPoolSpec:
    """An autoscaled pool: 1..5 workers, target 10 per worker, 10 s burst, 60 s calm, 120 s delay."""
    policy = {"targetPerWorker": 10, "scaleUpWindowSeconds": 10, "stableWindowSeconds": 60}
    policy |= {"scaleDownDelaySeconds": 120, **overrides.pop("autoscaling", {})}
    body: dict[str, Any] = {"replicas": 1, "minReplicas": 1, "maxReplicas": 5, "autoscaling": policy}
    return make_spec(**(body | overrides))


def busy(name: str, load: int, **kw: Any) -> ObservedWorker:
    """A serving worker with ``load`` requests (in flight + queued)."""
    return w(name, "Processing" if load else "Ready", queue=max(0, load - 1), in_flight=min(load, 1), **kw)


def window(*points: tuple[float, int]) -> tuple[LoadSample, ...]:
    return tuple(LoadSample(at(t), load) for t, load in points)


def scaled(target: int, **autoscaling: Any) -> ModelPoolStatus:
    """A previous status at ``target`` workers (recorded for spec.replicas 1)."""
    return ModelPoolStatus(
        target_replicas=target, spec_replicas=1, autoscaling=AutoscalingStatus(**autoscaling)
    )


def run_until(phase: Any, pool: PoolView, workers: list[ObservedWorker], **kw: Any) -> Draft:
    """A draft on which every phase before ``phase`` has run."""
    draft = Draft(pool, workers, kw.pop("ledger", ledger_for(None, workers)), kw.pop("now", NOW), **kw)
    for earlier in PHASES:
        if earlier is phase:
            break
        earlier(draft)
    return draft


# ---- the load and its windows --------------------------------------------------------------------------


def test_load_is_in_flight_plus_queued_over_serving_workers_with_known_stats() -> None:
    workers = [busy("p-a", 7), busy("p-b", 3), w("p-c", "Loading"), w("p-d", "Evicting", queue=9)]
    assert observe_load(workers) == (10, True)
    unknown = replace(w("p-e", "Ready"), stats_known=False, queue_depth=None, in_flight=None)
    assert observe_load([*workers, unknown]) == (10, False)  # partial: no scale-down on it
    assert observe_load([unknown]) == (None, False)  # KWOK workers: nothing known, nothing decided
    assert observe_load([]) == (None, False)


def test_window_keeps_the_stable_span_plus_one_sample_and_merges_close_samples() -> None:
    kept = window((0, 1), (30, 2), (50, 3))
    out = record(kept, LoadSample(at(100), 4), keep_s=60)
    assert [s.at for s in out] == [at(30), at(50), at(100)]  # at(30) dates the first sample inside
    merged = record(out, LoadSample(at(100.2), 9), keep_s=60)
    assert merged[-1] == LoadSample(at(100.2), 9) and len(merged) == len(out)


def test_average_weighs_each_sample_by_the_time_since_the_one_before() -> None:
    samples = window((0, 0), (50, 0), (60, 30))  # 0 until 50 s, then 30 for the last 10 s
    assert average(samples, at(60), 60) == 5.0  # (50 x 0 + 10 x 30) / 60
    assert average(samples, at(60), 10) == 30.0  # a fresh burst counts at once in the short window
    assert average(window((60, 8)), at(60), 10) == 8.0  # one sample: its value
    assert average(window((0, 8)), at(60), 10) is None


# ---- the decision ---------------------------------------------------------------------------------------


def _decide(current: int, stable: float, burst: float, **kw: Any) -> Any:
    spec = kw.pop("spec", auto_spec())
    return decide(
        current,
        spec,
        kw.pop("now", NOW),
        stable_load=stable,
        burst_load=burst,
        complete=kw.pop("complete", True),
        down_since=kw.pop("down_since", None),
        down_to=kw.pop("down_to", None),
        loading=kw.pop("loading", False),
    )


def test_calm_load_above_target_scales_up_to_what_it_asks() -> None:
    d = _decide(2, stable=25, burst=25)
    assert (d.desired, d.recommended, d.burst) == (3, 3, False)


def test_a_burst_scales_up_at_once_and_never_down_while_it_lasts() -> None:
    d = _decide(1, stable=5, burst=41)  # 41 > 2 x 10 x 1: the short window asks for 5
    assert (d.desired, d.burst) == (5, True)
    d = _decide(4, stable=5, burst=81)  # 81 > 80: bursting, the stable load asks for 1: kept at 5 (max)
    assert (d.desired, d.down_since) == (5, None)


def test_scale_down_waits_for_the_delay_then_goes_to_the_most_asked_meanwhile() -> None:
    first = _decide(4, stable=5, burst=5)  # asks for 1
    assert (first.desired, first.down_since, first.down_to, first.down_in) == (4, NOW, 1, 120.0)
    later = _decide(4, stable=15, burst=15, now=at(1060), down_since=NOW, down_to=1)  # asks for 2
    assert (later.desired, later.down_to, later.down_in) == (4, 2, 60.0)
    done = _decide(4, stable=5, burst=5, now=at(1120), down_since=NOW, down_to=2)
    assert (done.desired, done.down_since, done.down_to) == (2, None, None)


def test_scale_down_needs_every_worker_known_and_a_countdown_for_the_current_count() -> None:
    unknown = _decide(4, stable=5, burst=5, now=at(1200), down_since=NOW, down_to=1, complete=False)
    assert (unknown.desired, unknown.down_since) == (4, NOW)  # the countdown goes on
    stale = _decide(2, stable=5, burst=5, now=at(1200), down_since=NOW, down_to=3)  # the count fell to 2
    assert (stale.desired, stale.down_since, stale.down_to) == (2, at(1200), 1)


def test_the_count_stays_between_one_or_min_replicas_and_max_replicas() -> None:
    spec = auto_spec(minReplicas=0, maxReplicas=3)
    assert _decide(2, stable=0, burst=0, spec=spec, down_since=at(0), down_to=1).desired == 1
    assert _decide(1, stable=900, burst=900, spec=spec).desired == 3
    assert _decide(2, stable=0, burst=0, spec=auto_spec(minReplicas=2, replicas=2)).desired == 2


# ---- the phases -----------------------------------------------------------------------------------------


def test_autoscale_records_the_sample_and_scales_up_with_the_numbers() -> None:
    pool = view(auto_spec(), scaled(1))
    draft = run_until(autoscale, pool, [busy("p-a", 45)], load_window=window((990, 45)))
    autoscale(draft)
    assert draft.target == 5 and draft.scaling.window[-1] == LoadSample(NOW, 45)
    [event] = draft.events
    assert event.reason == "ScaledUp"
    assert event.message == "burst: load 45.0 over 10s (target 10 per worker): 1 -> 5 workers"


def test_autoscale_is_off_without_autoscaling_or_known_load_or_workers() -> None:
    fixed = view(make_spec(replicas=2, autoscaling={"enabled": False}), scaled(2))
    kwok = [replace(w("p-a", "Ready"), stats_known=False)]
    for pool, workers in ((fixed, [busy("p-a", 90)]), (view(auto_spec(), scaled(1)), kwok)):
        draft = run_until(autoscale, pool, workers)
        before = len(draft.events)
        autoscale(draft)
        assert draft.target == pool.status.target_replicas and len(draft.events) == before
    assert not autoscaling_enabled(make_spec(minReplicas=2, replicas=2, maxReplicas=2))  # off by default
    assert autoscaling_enabled(make_spec(minReplicas=2, replicas=2, maxReplicas=3))


def test_an_unknown_load_keeps_the_countdown_and_decides_nothing() -> None:
    countdown = scaled(3, scale_down_since=rfc3339(at(800)), scale_down_to=1)
    kwok = [replace(w(f"p-{i}", "Ready"), stats_known=False) for i in range(3)]
    out = plan(view(auto_spec(), countdown), kwok, ledger_for(None, kwok), now=NOW)
    assert out.status.target_replicas == 3 and not out.evict
    scaling = out.status.autoscaling
    assert (scaling.scale_down_since, scaling.scale_down_to, scaling.observed_load) == (
        rfc3339(at(800)),
        1,
        None,
    )


def test_wake_on_demand_once_for_demand_newer_than_zero() -> None:
    spec = auto_spec(minReplicas=0, replicas=0)
    zero = scaled(0, scaled_to_zero_at=rfc3339_ms(at(900)))
    woken = run_until(wake_on_demand, replace(view(spec, zero), demand=Demand(at(995.5))), [])
    wake_on_demand(woken)
    assert woken.target == 1
    [event] = woken.events
    assert event.reason == "WokenByDemand"
    assert event.message == "demand recorded at 2026-01-01T12:16:35.500Z (4.5s ago): 0 -> 1 worker"
    for demand in (at(899), at(900), NOW - timedelta(seconds=121)):  # before zero, or given up
        draft = run_until(wake_on_demand, replace(view(spec, zero), demand=Demand(demand)), [])
        wake_on_demand(draft)
        assert draft.target == 0 and not draft.events


def test_a_parked_pool_is_not_woken_and_a_new_one_counts_from_its_creation() -> None:
    parked = make_spec(replicas=0, maxReplicas=2, autoscaling={"enabled": False})
    draft = run_until(wake_on_demand, replace(view(parked, scaled(0)), demand=Demand(NOW)), [])
    wake_on_demand(draft)
    assert draft.target == 0
    new = replace(view(auto_spec(minReplicas=0, replicas=0)), created=at(990))
    for demand, target in ((at(980), 0), (at(995), 1)):
        draft = run_until(wake_on_demand, replace(new, demand=Demand(demand)), [])
        wake_on_demand(draft)
        assert draft.target == target


def test_demand_creates_the_worker_in_the_same_pass_and_wakes_once() -> None:
    spec = auto_spec(minReplicas=0, replicas=0)
    zero = scaled(0, scaled_to_zero_at=rfc3339_ms(at(900)))
    pool = replace(view(spec, zero), demand=Demand(at(999)))
    first = plan(pool, [], ledger_for(100 * GI), now=NOW)
    assert len(first.create) == 1 and first.status.target_replicas == 1
    assert first.status.autoscaling.last_scale_time == rfc3339(NOW)
    pending = [w(first.create[0].name, "Pending")]
    again = plan(replace(pool, status=first.status), pending, ledger_for(100 * GI, pending), now=at(1005))
    assert not again.create and "WokenByDemand" not in [e.reason for e in again.events]


def test_a_pool_at_zero_says_so_and_remembers_when_it_got_there() -> None:
    spec = auto_spec(minReplicas=0, replicas=0)
    out = plan(view(spec, scaled(1)), [], ledger_for(None), now=NOW)
    assert out.status.phase == "ScaledToZero" and out.status.ready_text == "0/0"
    assert cond(out, "Ready") == ("False", "ScaledToZero")
    ready = next(c for c in out.status.conditions if c.type == "Ready")
    assert "the gateway wakes the pool on its next request" in ready.message
    assert out.status.autoscaling.scaled_to_zero_at == rfc3339_ms(NOW)
    later = plan(view(spec, out.status), [], ledger_for(None), now=at(2000))
    assert later.status.autoscaling.scaled_to_zero_at == rfc3339_ms(NOW)
    parked = plan(view(make_spec(replicas=0, autoscaling={"enabled": False})), [], ledger_for(None), now=NOW)
    message = next(c.message for c in parked.status.conditions if c.type == "Ready")
    assert "spec.replicas is 0 and autoscaling is off" in message


def test_scale_down_takes_idle_workers_least_recently_used_never_processing() -> None:
    workers = [
        w("p-a", "Idle", last_request=500),
        w("p-b", "Processing", queue=0, in_flight=1),
        w("p-d", "Idle", last_request=100),
        w("p-e", "Ready", last_request=990),
    ]
    countdown = scaled(5, scale_down_since=rfc3339(at(800)), scale_down_to=1)
    out = plan(view(auto_spec(), countdown), workers, ledger_for(None, workers), now=NOW)
    assert out.status.target_replicas == 1
    assert [(e.name, e.reason) for e in out.evict] == [
        ("p-d", EVICT_SCALE_DOWN),
        ("p-a", EVICT_SCALE_DOWN),
        ("p-e", EVICT_SCALE_DOWN),
    ]
    assert [e.reason for e in out.events if e.reason.startswith("Scaled")] == ["ScaledDown"]


def test_scale_up_is_held_by_the_budget_with_preemption_then_budget_exceeded() -> None:
    mine = [busy("p-a", 50)]
    victim = w("q-a", "Idle", pool="q", last_request=0)
    others = [OtherPool("ns", "q", -1, 0, (victim,))]
    out = plan(view(auto_spec(), scaled(1)), mine, ledger_for(6 * GI, mine, [victim]), now=NOW, others=others)
    assert out.status.target_replicas == 5 and len(out.create) == 1  # 2Gi + 2Gi(q) + 2Gi: full
    assert [e.name for e in out.evict] == ["q-a"]  # preempted for the next one
    assert cond(out, "BudgetExceeded") == ("True", "WaitingForMemory")


def test_without_autoscaling_replicas_is_the_count_whatever_the_load() -> None:
    spec = make_spec(replicas=2, maxReplicas=5, autoscaling={"enabled": False})
    workers = [busy("p-a", 40), busy("p-b", 40)]
    out = plan(view(spec, scaled(2)), workers, ledger_for(None, workers), now=NOW)
    assert out.status.target_replicas == 2 and not out.create
    assert out.status.autoscaling.enabled is False and out.status.autoscaling.observed_load == 80


# ---- properties ------------------------------------------------------------------------------------------

_STATES: list[WorkerState] = ["Pending", "Loading", "Ready", "Processing", "Idle", "Evicting", "Failed"]


@settings(max_examples=200, deadline=None)
@given(
    states=st.lists(st.tuples(st.sampled_from(_STATES), st.integers(0, 60)), max_size=8),
    bounds=st.tuples(st.integers(0, 4), st.integers(1, 8)),
    previous=st.integers(0, 8),
    history=st.lists(st.tuples(st.floats(0, 999), st.integers(0, 200)), max_size=6),
    total=st.integers(0, 30),
    countdown=st.one_of(st.none(), st.tuples(st.integers(0, 999), st.integers(0, 8))),
)
def test_plans_stay_within_bounds_and_budget_and_never_take_busy_workers(  # noqa: PLR0917
    states: list[tuple[WorkerState, int]],
    bounds: tuple[int, int],
    previous: int,
    history: list[tuple[float, int]],
    total: int,
    countdown: tuple[int, int] | None,
) -> None:
    low, high = min(bounds), max(bounds[1], bounds[0] + 1)
    spec = auto_spec(minReplicas=low, replicas=low, maxReplicas=high)
    workers = [
        busy(f"p-{i}", load) if state == "Processing" else w(f"p-{i}", state)
        for i, (state, load) in enumerate(states)
    ]
    since, to = (rfc3339(at(countdown[0])), countdown[1]) if countdown else (None, None)
    status = scaled(previous, scale_down_since=since, scale_down_to=to)
    ledger = ledger_for(total * GI, workers)
    out = plan(view(spec, status), workers, ledger, now=NOW, load_window=window(*sorted(history)))
    assert low <= out.status.target_replicas <= high  # type: ignore[operator]
    by_name = {x.name: x for x in workers}
    for e in out.evict:
        assert by_name[e.name].state in ("Ready", "Idle")
    for d in out.delete:
        assert by_name[d.name].state not in ("Loading", "Processing", "Ready", "Idle")
    if ledger.used + ledger.reserved <= total * GI:
        assert ledger.used + ledger.reserved + sum(c.memory for c in out.create) <= total * GI
    else:
        assert not out.create


def _cluster_pass(
    spec: ModelPoolSpec, status: ModelPoolStatus, names: list[str], *, load: int, now: datetime, win: Any
) -> Plan:
    """One pass over a pool whose ``names`` workers serve ``load`` requests between them."""
    share = [load // len(names) + (1 if i < load % len(names) else 0) for i in range(len(names))]
    workers = [busy(name, n) for name, n in zip(names, share, strict=True)]
    return plan(view(spec, status), workers, ledger_for(None, workers), now=now, load_window=win)


@settings(max_examples=100, deadline=None)
@given(
    load=st.integers(0, 120),
    start=st.integers(1, 8),
    gaps=st.lists(st.floats(0.3, 30), min_size=20, max_size=80),
)
def test_under_a_constant_load_the_count_changes_at_most_once(
    load: int, start: int, gaps: list[float]
) -> None:
    """The cluster does what each plan says at once (new workers serve, surplus ones are gone); passes
    come at random times; the load does not change.  The count moves once, to what the load asks for."""
    spec = auto_spec(minReplicas=1, replicas=start, maxReplicas=8)
    win: tuple[LoadSample, ...] = ()
    counts: list[int] = []
    status, now = ModelPoolStatus(), at(0)
    names = [f"p-{i}" for i in range(start)]
    for gap in gaps:
        now += timedelta(seconds=gap)
        out = _cluster_pass(spec, status, names, load=load, now=now, win=win)
        status, win = out.status, out.load_window
        target = status.target_replicas or 0
        names = [f"p-{i}" for i in range(target)]
        counts.append(target)
    changes = sum(1 for a, b in itertools.pairwise(counts) if a != b) + (counts[0] != start)
    assert changes <= 1, counts


@settings(max_examples=60, deadline=None)
@given(
    loads=st.lists(st.integers(0, 80), min_size=10, max_size=60),
    total=st.integers(2, 12),
)
def test_a_fluctuating_load_never_over_admits_and_changes_the_count_once_per_delay_going_down(
    loads: list[int], total: int
) -> None:
    """Passes every 5 s with a load that jumps around; pods appear a pass after their creation and serve
    the next; evicted ones are gone a pass later.  Memory held plus reserved never exceeds the budget,
    and two scale-downs are always at least the delay apart."""
    spec = auto_spec(minReplicas=1, replicas=1, maxReplicas=6, autoscaling={"scaleDownDelaySeconds": 30})
    status = ModelPoolStatus()
    win: tuple[LoadSample, ...] = ()
    serving: list[str] = []
    starting: list[str] = []
    book = ReservationBook()
    downs: list[datetime] = []
    for step, load in enumerate(loads):
        now = at(5 * step)
        share = [load // max(1, len(serving))] * len(serving)
        workers = [busy(n, s) for n, s in zip(serving, share, strict=True)] + [
            w(n, "Loading") for n in starting
        ]
        live = book.prune([x.key for x in workers])
        ledger = build_ledger(total * GI, workers, live)
        assert ledger.used + ledger.reserved <= total * GI
        out = plan(view(spec, status), workers, ledger, now=now, load_window=win)
        status, win = out.status, out.load_window
        for c in out.create:
            book.reserve("ns", "p", c.name, c.memory, now)
        gone = {e.name for e in out.evict} | {d.name for d in out.delete}
        serving = [n for n in [*serving, *starting] if n not in gone]
        starting = [c.name for c in out.create]
        if any(e.reason == "ScaledDown" for e in out.events):
            downs.append(now)
    assert all((b - a).total_seconds() >= 30 for a, b in itertools.pairwise(downs)), downs


# ---- what the workers' queues do not show: refusals, held requests (issue 19) --------------------------


def counting(worker: ObservedWorker, requests: int, rejected: int, time: float, **kw: Any) -> ObservedWorker:
    """``worker`` with its /stats counters at the server's clock ``time``."""
    return replace(
        worker, requests_total=requests, rejected_total=rejected, stats_time=time, uid=kw.get("uid", "u-1")
    )


def test_refusals_become_a_rate_between_scrapes_of_one_worker_process() -> None:
    first = count_refusals(counting(busy("p-a", 10), 100, 50, 1000.0), None)
    assert first is not None and (first.refused_per_s, first.refused_ratio) == (0.0, 0.0)  # a baseline
    later = count_refusals(counting(busy("p-a", 10), 120, 90, 1002.0), first)
    assert later is not None and (later.refused_per_s, later.refused_ratio) == (20.0, 2.0)
    assert count_refusals(counting(busy("p-a", 10), 120, 90, 1002.0), later) is later  # the same scrape
    idle = count_refusals(counting(busy("p-a", 0), 120, 95, 1007.0), later)
    assert idle is not None and (idle.refused_per_s, idle.refused_ratio) == (1.0, 5.0)  # admitted: 1 at least
    # A restarted container, a new pod under the name, counters that went back: a new baseline, no rate.
    restarted = replace(counting(busy("p-a", 10), 500, 400, 1010.0), restarts=1)
    reset = counting(busy("p-a", 10), 3, 1, 1010.0)
    for worker in (restarted, counting(busy("p-a", 10), 500, 400, 1010.0, uid="u-2"), reset):
        sample = count_refusals(worker, later)
        assert sample is not None and sample.refused_per_s == 0.0 and sample.at == 1010.0
    assert count_refusals(busy("p-a", 10), later) is None  # no counters in its stats (an older server)


def test_refused_requests_count_as_load_and_scale_a_full_pool_up() -> None:
    """Issue 19: a worker at its target (10 per worker) that refuses as many requests as it admits shows a
    load of 10 in its queue: without the refusals the pool never grows."""
    spec = auto_spec(queue={"capacity": 10})
    status = scaled(1)
    before = [counting(busy("p-a", 10), 1000, 0, 980.0)]
    first = plan(view(spec, status), before, ledger_for(None, before), now=at(980))
    assert first.status.target_replicas == 1
    full = [counting(busy("p-a", 10), 1100, 100, 990.0)]  # 10 refused/s, one per admitted request
    out = plan(
        view(spec, first.status),
        full,
        ledger_for(None, full),
        now=at(990),
        load_window=first.load_window,
        counters=first.counters,
    )
    assert out.status.target_replicas == 2 and out.status.autoscaling.observed_load == 20
    [event] = [e for e in out.events if e.reason == "ScaledUp"]
    assert "10.0 refused/s counted as 10.0" in event.message


def test_requests_held_at_the_gateway_count_while_no_worker_serves() -> None:
    """Issue 19: a pool whose only worker is loading while the gateway holds 35 requests aims for 4 workers
    at once; the count is stale after the Lease's duration, and once a worker serves its /stats counts."""
    spec = auto_spec()
    loading = [w("p-a", "Loading")]
    fresh = Demand.one(at(995), 10, held=35)
    draft = run_until(autoscale, replace(view(spec, scaled(1)), demand=fresh), loading)
    autoscale(draft)
    assert draft.target == 4 and draft.scaling.held == 35
    [event] = draft.events
    assert event.reason == "ScaledUp" and "35 held at the gateway" in event.message
    stale = Demand.one(at(989), 10, held=35)
    serving = [busy("p-a", 3)]
    for pool, workers in ((replace(view(spec, scaled(1)), demand=stale), loading), (draft.pool, serving)):
        again = run_until(autoscale, pool, workers)
        autoscale(again)
        assert again.target == 1 and again.scaling.held is None


def test_requests_refused_at_the_gateway_count_as_load_while_fresh() -> None:
    """Follow-up of issue 19: the gateway's 429s for a full hold count as load like a worker's refusals
    (they reached no worker, so they count beside the serving worker's own load); stale, they do not."""
    spec = auto_spec()
    serving = [busy("p-a", 3)]
    fresh = Demand.one(at(995), 10, held=0, refused=40)
    draft = run_until(autoscale, replace(view(spec, scaled(1)), demand=fresh), serving)
    autoscale(draft)
    assert draft.target == 5 and draft.scaling.observed_load == 43  # (3 + 40) / 10 per worker
    [event] = draft.events
    assert event.reason == "ScaledUp" and "40 refused at the gateway (hold full)" in event.message
    stale = Demand.one(at(989), 10, held=0, refused=40)
    again = run_until(autoscale, replace(view(spec, scaled(1)), demand=stale), serving)
    autoscale(again)
    assert again.target == 1 and again.scaling.observed_load == 3


def test_gateway_refusals_alone_make_the_load_known() -> None:
    """With no worker reporting (all loading), refusals at the gateway are still load, not unknown."""
    loading = [w("p-a", "Loading")]
    measured = pool_load(loading, {}, held=None, gateway_refused=12)
    assert (measured.load, measured.complete, measured.gateway_refused) == (12, False, 12)
    assert pool_load(loading, {}, held=None, gateway_refused=0).load is None


def test_a_pool_woken_with_many_requests_held_gets_the_workers_they_ask_for_at_once() -> None:
    spec = auto_spec(minReplicas=0, replicas=0)
    zero = scaled(0, scaled_to_zero_at=rfc3339_ms(at(900)))
    pool = replace(view(spec, zero), demand=Demand.one(at(999), 10, held=25))
    out = plan(pool, [], ledger_for(100 * GI), now=NOW)
    assert [e.reason for e in out.events if e.reason in ("WokenByDemand", "ScaledUp")] == [
        "WokenByDemand",
        "ScaledUp",
    ]
    assert out.status.target_replicas == 3 and len(out.create) == 3
    assert out.status.autoscaling.held_requests == 25


def test_no_scale_down_countdown_completes_while_a_worker_is_loading() -> None:
    """Issue 19: the countdown (since 800, 120 s) would end now; a worker still loading would be evicted
    the moment it is ready.  No countdown runs while one loads; it starts afresh once every worker is up."""
    workers = [w("p-a", "Idle", last_request=500), w("p-b", "Idle", last_request=600), w("p-c", "Loading")]
    countdown = scaled(3, scale_down_since=rfc3339(at(800)), scale_down_to=1)
    spec = auto_spec(idleTimeoutSeconds=0)
    out = plan(view(spec, countdown), workers, ledger_for(None, workers), now=NOW)
    assert out.status.target_replicas == 3 and not out.evict
    assert out.status.autoscaling.scale_down_since is None
    ready = [*workers[:2], w("p-c", "Ready")]
    later = plan(view(spec, out.status), ready, ledger_for(None, ready), now=at(1100))
    assert later.status.target_replicas == 3 and not later.evict
    assert later.status.autoscaling.scale_down_since == rfc3339(at(1100))  # a whole delay from now
    assert _decide(3, stable=0, burst=0, down_since=at(0), down_to=1, loading=True).down_since is None


def test_a_wake_held_back_by_the_budget_is_dropped_once_its_demand_has_expired() -> None:
    """Issue 19: a wake the full budget held back must not create a worker later for requests long gone:
    once the demand is older than activationTimeoutSeconds (120 s) with no worker made, back to zero."""
    spec = auto_spec(minReplicas=0, replicas=0)
    zero = scaled(0, scaled_to_zero_at=rfc3339_ms(at(900)))
    pool = replace(view(spec, zero), demand=Demand(at(999)))
    blocked = plan(pool, [], ledger_for(1 * GI), now=NOW)  # a worker needs 2Gi
    assert blocked.status.target_replicas == 1 and not blocked.create
    assert blocked.status.autoscaling.woken_by_demand_at == rfc3339_ms(at(999))
    # The gateway still holds requests: the demand is renewed, the wake stands (and creates once it fits).
    renewed = replace(pool, status=blocked.status, demand=Demand(at(1100)))
    waiting = plan(renewed, [], ledger_for(1 * GI), now=at(1110))
    assert waiting.status.target_replicas == 1
    fits = plan(replace(renewed, status=waiting.status), [], ledger_for(100 * GI), now=at(1115))
    assert len(fits.create) == 1
    # The requests gave up: the budget frees after the demand expired, and nothing is created.
    expired = plan(replace(pool, status=blocked.status), [], ledger_for(100 * GI), now=at(1120))
    assert expired.status.target_replicas == 0 and not expired.create
    assert [e.reason for e in expired.events] == ["WakeExpired"]
    assert expired.status.autoscaling.woken_by_demand_at is None
    # A count set by hand (kubectl scale) is not a wake: it stands.
    scaled_by_hand = replace(
        view(auto_spec(minReplicas=0, replicas=2), blocked.status), demand=Demand(at(999))
    )
    kept = plan(scaled_by_hand, [], ledger_for(100 * GI), now=at(1120))
    assert kept.status.target_replicas == 2 and len(kept.create) == 2
