"""Autoscaling and waking from zero: the pure decisions, and the two planner phases that apply them.

**The load** is what the workers report in ``/stats``: requests in flight plus queued, summed over the
pool's serving workers whose stats are known (``observe_load``).  Unknown load (no serving worker
reports: a pool at zero, workers still loading, KWOK nodes) never changes the count.

**The windows** (as Knative's autoscaler has them).  Every pass adds one sample of the load to a window
that the pool's loop keeps in memory (``Plan.load_window``): after an operator restart the averages are
re-learned within one stable window, while the scale-down countdown, which lives in
``status.autoscaling``, survives.  Each sample stands for the time since the sample before it.

* Burst: when the load averaged over ``scaleUpWindowSeconds`` asks for more than ``BURST_FACTOR`` times
  the current count, the count rises to what it asks at once, and does not fall while the burst lasts.
* Calm: otherwise the count follows the load averaged over ``stableWindowSeconds``: up at once; down only
  once the load has asked for fewer workers for ``scaleDownDelaySeconds``, and then to the most it asked
  for meanwhile (so under a constant load the count changes at most once).  The autoscaler never goes
  below ``max(minReplicas, 1)``: taking the last workers is ``idleTimeoutSeconds``' job, and a pool at
  zero is woken only by demand.

Scaling up only raises the target; ``admit`` creates the workers within the budget (preempting idle
lower-priority workers, else BudgetExceeded).  Scaling down only lowers it; ``retire`` removes the
surplus through the usual eviction, never a Loading or Processing worker.

**Waking from zero.**  A gateway that holds a request for a pool records the time in the pool's demand
Lease (``modelpool_contract.demand``; the operator indexes those Leases).  A pool at zero whose demand is
newer than the moment it reached zero (``status.autoscaling.scaledToZeroAt``, else its creation) and
not older than ``PlannerSettings.demand_max_age_s`` gets one worker in the same pass, with one
``WokenByDemand`` Event.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from modelpool_contract.api import AutoscalingSpec, ModelPoolSpec, autoscaling_enabled, replica_ceiling
from modelpool_operator.events import Event
from modelpool_operator.planner.draft import Draft, LoadSample
from modelpool_operator.times import parse_time, rfc3339, rfc3339_ms
from modelpool_operator.worker_state import ObservedWorker

#: A burst: the short window asks for more than this many times the current count (Knative's default).
BURST_FACTOR = 2.0
#: A sample this close to the previous one replaces it (passes come in bursts of events).
MIN_SAMPLE_GAP_S = 0.5


# ---- the load and its windows ---------------------------------------------------------------------------


def observe_load(workers: Iterable[ObservedWorker]) -> tuple[int | None, bool]:
    """(load, complete): requests in flight plus queued over the active serving workers whose stats are
    known (None when none is), and whether every serving worker's stats are known."""
    serving = [w for w in workers if w.active and w.serving_state]
    known = [w for w in serving if w.stats_known]
    if not known:
        return None, False
    load = sum((w.in_flight or 0) + (w.queue_depth or 0) for w in known)
    return load, len(known) == len(serving)


def record(window: Sequence[LoadSample], sample: LoadSample, keep_s: float) -> tuple[LoadSample, ...]:
    """``window`` with ``sample`` added: samples within ``MIN_SAMPLE_GAP_S`` before it are replaced, and
    only the last ``keep_s`` seconds are kept, plus the one sample before them (it dates the first)."""
    kept = [s for s in window if s.at < sample.at]
    while kept and (sample.at - kept[-1].at).total_seconds() < MIN_SAMPLE_GAP_S:
        kept.pop()
    kept.append(sample)
    start = sample.at - timedelta(seconds=keep_s)
    first = next(i for i, s in enumerate(kept) if s.at > start)
    return tuple(kept[max(0, first - 1) :])


def average(window: Sequence[LoadSample], now: datetime, seconds: float) -> float | None:
    """The load averaged over the last ``seconds`` before ``now``: each sample stands for the time since
    the sample before it; None when no sample falls in the window."""
    start = now - timedelta(seconds=seconds)
    weighted = span = 0.0
    inside: list[int] = []
    previous: LoadSample | None = None
    for sample in window:
        if start < sample.at <= now:
            since = max(start, previous.at) if previous is not None else sample.at
            weight = (sample.at - since).total_seconds()
            weighted += sample.load * weight
            span += weight
            inside.append(sample.load)
        previous = sample
    if not inside:
        return None
    return weighted / span if span > 0 else sum(inside) / len(inside)


# ---- the decision ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What the autoscaler decided for one pass, from the count it started at."""

    desired: int
    recommended: int
    burst: bool
    stable_load: float
    burst_load: float
    # The scale-down countdown after this pass: since when fewer workers were asked for, and the most.
    down_since: datetime | None
    down_to: int | None
    # Seconds until the countdown ends (None: no countdown), so the pool is looked at again then.
    down_in: float | None


def _wanted(load: float, policy: AutoscalingSpec) -> int:
    # A hair over a whole number (float noise of the average) must not ask for one more worker.
    return math.ceil(round(load / policy.target_per_worker, 6))


def decide(
    current: int,
    spec: ModelPoolSpec,
    now: datetime,
    *,
    stable_load: float,
    burst_load: float,
    complete: bool,
    down_since: datetime | None,
    down_to: int | None,
) -> Decision:
    """The count to aim for, from ``current`` and the load averaged over the stable and burst windows.
    ``complete``: every serving worker's load is known (a scale-down needs it); ``down_since`` and
    ``down_to``: the scale-down countdown so far.  Pure."""
    policy = spec.autoscaling
    floor, ceiling = max(spec.min_replicas, 1), spec.max_replicas
    recommended = min(ceiling, max(floor, _wanted(stable_load, policy)))
    burst = burst_load > BURST_FACTOR * policy.target_per_worker * current
    desired = current
    since: datetime | None = None
    most: int | None = None
    if burst:
        desired = max(current, min(ceiling, _wanted(burst_load, policy)))
    elif recommended > current:
        desired = recommended
    elif recommended < current:
        if down_since is not None and down_to is not None and down_to < current:
            since, most = down_since, max(down_to, recommended)
        else:  # no countdown yet, or one for a higher count than there is now (it fell meanwhile)
            since, most = now, recommended
        # With a worker's load unknown the countdown goes on, but nothing is decided yet.
        if complete and (now - since).total_seconds() >= policy.scale_down_delay_seconds:
            desired, since, most = max(floor, most), None, None
    remaining = None
    if since is not None:
        remaining = max(0.0, policy.scale_down_delay_seconds - (now - since).total_seconds())
    return Decision(desired, recommended, burst, stable_load, burst_load, since, most, remaining)


# ---- the phases ------------------------------------------------------------------------------------------


def zero_since(draft: Draft) -> datetime | None:
    """Since when the pool has been at zero as the last status recorded it, else when it was created."""
    recorded = parse_time(draft.pool.status.autoscaling.scaled_to_zero_at)
    return recorded or draft.pool.created


def wake_on_demand(draft: Draft) -> None:
    """Phase 3: a pool at zero with fresh demand aims for one worker (``admit`` creates it this pass)."""
    demand = draft.pool.demanded_at
    if draft.target > 0 or demand is None or replica_ceiling(draft.pool.spec) < 1:
        return
    baseline = zero_since(draft)
    if baseline is not None and demand <= baseline:
        return  # recorded before the pool reached zero: already served
    age = (draft.now - demand).total_seconds()
    if abs(age) > draft.settings.demand_max_age_s:
        return  # the requests that recorded it have given up (or a clock is far off)
    draft.target = 1
    draft.scaling.last_scale_time = draft.now
    message = f"demand recorded at {rfc3339_ms(demand)} ({age:.1f}s ago): 0 -> 1 worker"
    draft.events.append(Event("Normal", "WokenByDemand", message))


def autoscale(draft: Draft) -> None:
    """Phase 4: add this pass's load sample to the window; while autoscaling is on and the load is known,
    move the target (``decide``), with a ScaledUp or ScaledDown Event that carries the numbers.  At zero
    it does nothing (only demand wakes a pool); with the load unknown it keeps the countdown as it was."""
    spec, scaling, now = draft.pool.spec, draft.scaling, draft.now
    policy = spec.autoscaling
    load, complete = observe_load(draft.workers)
    scaling.observed_load = load
    if load is not None:
        scaling.window = record(draft.load_window, LoadSample(now, load), policy.stable_window_seconds)
    if not autoscaling_enabled(spec) or draft.target == 0:
        return
    previous = draft.pool.status.autoscaling
    scaling.down_since, scaling.down_to = parse_time(previous.scale_down_since), previous.scale_down_to
    if load is None:
        return
    decision = decide(
        draft.target,
        spec,
        now,
        stable_load=average(scaling.window, now, policy.stable_window_seconds) or 0.0,
        burst_load=average(scaling.window, now, policy.scale_up_window_seconds) or 0.0,
        complete=complete,
        down_since=scaling.down_since,
        down_to=scaling.down_to,
    )
    scaling.recommended = decision.recommended
    scaling.down_since, scaling.down_to = decision.down_since, decision.down_to
    if decision.down_in is not None:
        draft.requeue.append(decision.down_in)
    if decision.desired != draft.target:
        draft.events.append(_scaled_event(draft.target, decision, policy))
        draft.target = decision.desired
        scaling.last_scale_time = now


def _scaled_event(current: int, decision: Decision, policy: AutoscalingSpec) -> Event:
    change = f"{current} -> {decision.desired} workers"
    target = f"target {policy.target_per_worker} per worker"
    if decision.desired < current:
        return Event(
            "Normal",
            "ScaledDown",
            f"the load asked for at most {decision.desired} for {policy.scale_down_delay_seconds}s "
            f"(now {decision.stable_load:.1f} over {policy.stable_window_seconds}s, {target}): {change}",
        )
    if decision.burst:
        load = f"burst: load {decision.burst_load:.1f} over {policy.scale_up_window_seconds}s"
    else:
        load = f"load {decision.stable_load:.1f} over {policy.stable_window_seconds}s"
    return Event("Normal", "ScaledUp", f"{load} ({target}): {change}")


def scaled_to_zero_at(draft: Draft) -> str | None:
    """``status.autoscaling.scaledToZeroAt`` after this pass: now when the pool reaches zero, kept while
    it stays there (and afterwards, as the last time it did)."""
    previous = draft.pool.status
    recorded = previous.autoscaling.scaled_to_zero_at
    if draft.target == 0 and (previous.target_replicas != 0 or recorded is None):
        return rfc3339_ms(draft.now)
    return recorded


def last_scale_time(draft: Draft) -> str | None:
    """``status.autoscaling.lastScaleTime`` after this pass."""
    if draft.scaling.last_scale_time is not None:
        return rfc3339(draft.scaling.last_scale_time)
    return draft.pool.status.autoscaling.last_scale_time
