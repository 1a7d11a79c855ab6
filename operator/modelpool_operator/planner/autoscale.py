"""Autoscaling and waking from zero: the pure decisions, and the two planner phases that apply them.

**The load** is what waits to be served, in the unit ``spec.autoscaling.metric`` chooses (``pool_load``;
each serving worker's share is ``worker_load``, the target one worker carries ``per_worker_target``):

* requests in flight plus queued (metric ``requests``), or the KV-cache tokens the running generations
  reserve (``tokens``), or the share of the worker's KV cache they reserve, in percent (``kvCache``: the
  pool wants ceil(sum of the shares / target), the mean share brought to the target), summed over the
  pool's serving workers whose figures are known (``observe_load``; a worker without KV-cache figures, a
  serial engine, has an unknown load under ``tokens`` and ``kvCache``);
* plus the requests those workers refused (``rejected_total`` in ``/stats``, a counter: 429 when the
  queue is full, and every other refusal or give-up), turned into a rate between two scrapes of the same
  worker process (``count_refusals``: a new pod or a restarted container, or counters that went back,
  start a new baseline).  A refused request would have spent in the worker about as long as an admitted
  one, so by Little's law it adds the worker's load times refused per admitted request over the interval;
* plus, with metric ``requests`` and while the pool has no serving worker at all, the requests the
  gateway replicas hold for it (their held counts on its demand Lease, each while live, summed:
  ``Demand.held_at``;
  their size in tokens is unknown, so the other metrics leave them to the wake from zero).  The gateway
  holds requests only for a pool without a routable worker, so once one serves they are on their way to
  it and its ``/stats`` counts them; counting both would count them twice;
* plus, with metric ``requests``, the requests the gateway replicas refused (429) because their hold for
  the pool was full, each in the window before its last demand write (the refused counts on the demand
  Lease, each while live, summed: ``Demand.refused_at``), whether or not a worker serves: they reached
  no worker, so no ``/stats`` counts them, and each is a request that would have waited had there been room.

Unknown load (no serving worker reports and nothing is held or refused at the gateway: a pool at zero,
workers still loading, KWOK nodes) never changes the count.

**The windows** (as Knative's autoscaler has them).  Every pass adds one sample of the load to a window
that the pool's loop keeps in memory (``Plan.load_window``, and the workers' counters in
``Plan.counters``): after an operator restart the averages are re-learned within one stable window,
while the scale-down countdown, which lives in ``status.autoscaling``, survives.  Each sample stands for
the time since the sample before it.

* Burst: when the load averaged over ``scaleUpWindowSeconds`` asks for more than ``BURST_FACTOR`` times
  the current count, the count rises to what it asks at once, and does not fall while the burst lasts.
* Calm: otherwise the count follows the load averaged over ``stableWindowSeconds``: up at once; down only
  once the load has asked for fewer workers for ``scaleDownDelaySeconds``, and then to the most it asked
  for meanwhile (so under a constant load the count changes at most once).  No countdown runs while a
  worker is Loading: it starts once every worker is up, so a worker is never evicted the moment it is
  ready because the count fell while it loaded.  The autoscaler never goes below ``max(minReplicas,
  1)``: taking the last workers is ``idleTimeoutSeconds``' job, and a pool at zero is woken only by
  demand.

Scaling up only raises the target; ``admit`` creates the workers within the budget (preempting idle
lower-priority workers, else BudgetExceeded).  Scaling down only lowers it; ``retire`` removes the
surplus through the usual eviction, never a Loading or Processing worker.

**Waking from zero.**  A gateway that holds a request for a pool records the time in the pool's demand
Lease (``modelpool_contract.demand``; the operator indexes those Leases).  A pool at zero whose demand is
newer than the moment it reached zero (``status.autoscaling.scaledToZeroAt``, else its creation) and
not older than the pool's ``activationTimeoutSeconds`` (the longest a gateway holds a request: an older
demand's requests have all given up) gets one worker in the same pass, with one ``WokenByDemand``
Event.  Until a worker exists the wake is recorded (``status.autoscaling.wokenByDemandAt``): when the
budget holds the creation back until the demand is older than that bound, the wake is dropped
(``WakeExpired``, back to zero) instead of creating a worker later for requests long gone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from modelpool_contract.api import (
    AutoscalingMetric,
    AutoscalingSpec,
    ModelPoolSpec,
    autoscaling_enabled,
    replica_ceiling,
)
from modelpool_contract.times import parse_time, rfc3339, rfc3339_ms
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.draft import CounterSample, Draft, Event, LoadSample

#: A burst: the short window asks for more than this many times the current count (Knative's default).
BURST_FACTOR = 2.0
#: A sample this close to the previous one replaces it (passes come in bursts of events).
MIN_SAMPLE_GAP_S = 0.5


# ---- the load and its windows ---------------------------------------------------------------------------


def worker_load(worker: ObservedWorker, metric: AutoscalingMetric = "requests") -> float | None:
    """One worker's load in the unit of ``metric`` (None: its figures are unknown): requests in flight
    plus queued, the KV-cache tokens its generations reserve, or the share of its KV cache they reserve
    in percent."""
    if not worker.stats_known:
        return None
    if metric == "requests":
        return (worker.in_flight or 0) + (worker.queue_depth or 0)
    if metric == "tokens":
        return None if worker.kv_cache_reserved is None else float(worker.kv_cache_reserved)
    use = worker.kv_cache_use
    return None if use is None else 100.0 * use


def per_worker_target(policy: AutoscalingSpec) -> float:
    """The load one worker should carry, in the unit of ``worker_load`` for the policy's metric."""
    if policy.metric == "tokens" and policy.target_tokens_per_worker is not None:
        return float(policy.target_tokens_per_worker)
    if policy.metric == "kvCache" and policy.target_kv_cache is not None:
        return 100.0 * policy.target_kv_cache
    return float(policy.target_per_worker)


def observe_load(
    workers: Iterable[ObservedWorker], metric: AutoscalingMetric = "requests"
) -> tuple[float | None, bool]:
    """(load, complete): ``worker_load`` summed over the active serving workers whose figures are known
    (None when none is), and whether every serving worker's are known."""
    serving = [w for w in workers if w.active and w.serving_state]
    loads = [load for load in (worker_load(w, metric) for w in serving) if load is not None]
    if not loads:
        return None, False
    return sum(loads), len(loads) == len(serving)


def count_refusals(worker: ObservedWorker, previous: CounterSample | None) -> CounterSample | None:
    """The worker's counters at this scrape, with the refusals since ``previous`` (the same worker's at an
    earlier scrape) as a rate; None when its stats carry no counters or no time.  The same scrape seen
    again keeps its rates; a new process (uid, restarts) or counters that went back start a baseline."""
    if worker.requests_total is None or worker.rejected_total is None or worker.stats_time is None:
        return None
    sample = CounterSample(
        worker.uid, worker.restarts, worker.stats_time, worker.requests_total, worker.rejected_total
    )
    if previous is None or (previous.uid, previous.restarts) != (sample.uid, sample.restarts):
        return sample
    if sample.at == previous.at:
        return previous
    seconds = sample.at - previous.at
    refused, admitted = sample.rejected - previous.rejected, sample.requests - previous.requests
    if seconds < 0 or refused < 0 or admitted < 0:
        return sample  # the counters were reset (or the server's clock stepped back): a new baseline
    return replace(sample, refused_per_s=refused / seconds, refused_ratio=refused / max(admitted, 1))


@dataclass(frozen=True)
class PoolLoad:
    """One pass's load (``pool_load``): the total (None: unknown), whether every serving worker's stats
    are known (a scale-down needs it), what of it the refusals, the gateway's held requests and its
    hold-full refusals are, and the workers' counters for the next pass."""

    load: float | None
    complete: bool
    refused_per_s: float
    refused: float
    held: int | None
    counters: dict[str, CounterSample]
    gateway_refused: int | None = None


def pool_load(
    workers: Iterable[ObservedWorker],
    counters: Mapping[str, CounterSample],
    held: int | None,
    metric: AutoscalingMetric = "requests",
    gateway_refused: int | None = None,
) -> PoolLoad:
    """The pool's load in the unit of ``metric``: ``worker_load`` over the serving workers with known
    figures, plus their refusals (Little's law: each worker's load times its refused per admitted request
    since the last scrape), plus (metric requests only) ``held`` (the gateway's count, fresh) while no
    worker serves at all and ``gateway_refused`` (the gateway's hold-full refusals, fresh) always."""
    workers = list(workers)
    base, complete = observe_load(workers, metric)
    serving = [w for w in workers if w.active and w.serving_state and w.stats_known]
    seen: dict[str, CounterSample] = {}
    refused = per_s = 0.0
    for worker in serving:
        sample = count_refusals(worker, counters.get(worker.name))
        if sample is None:
            continue
        seen[worker.name] = sample
        refused += (worker_load(worker, metric) or 0.0) * sample.refused_ratio
        per_s += sample.refused_per_s
    no_server = not any(w.active and w.serving_state for w in workers)
    counted_held = held if held and no_server and metric == "requests" else None
    turned_away = (gateway_refused or None) if metric == "requests" else None
    if base is None and counted_held is None and turned_away is None:
        return PoolLoad(None, False, per_s, refused, None, seen)
    load = (base or 0) + refused + (counted_held or 0) + (turned_away or 0)
    complete = complete and base is not None
    return PoolLoad(load, complete, per_s, refused, counted_held, seen, turned_away)


def record(window: Sequence[LoadSample], sample: LoadSample, keep_s: float) -> tuple[LoadSample, ...]:
    """``window`` with ``sample`` added: samples within ``MIN_SAMPLE_GAP_S`` before it are replaced, and
    only the last ``keep_s`` seconds are kept, plus the one sample before them (it dates the first)."""
    # Samples in another unit (the metric was changed) are dropped, not averaged with this one.
    kept = [s for s in window if s.at < sample.at and s.metric == sample.metric]
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
    inside: list[float] = []
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
    return math.ceil(round(load / per_worker_target(policy), 6))


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
    loading: bool = False,
) -> Decision:
    """The count to aim for, from ``current`` and the load averaged over the stable and burst windows.
    ``complete``: every serving worker's load is known (a scale-down needs it); ``down_since`` and
    ``down_to``: the scale-down countdown so far; ``loading``: a worker is Loading (no countdown runs: it
    starts once every worker is up, so a worker that was loading gets a whole delay to take load).
    Pure."""
    policy = spec.autoscaling
    floor, ceiling = max(spec.min_replicas, 1), spec.max_replicas
    recommended = min(ceiling, max(floor, _wanted(stable_load, policy)))
    burst = burst_load > BURST_FACTOR * per_worker_target(policy) * current
    desired = current
    since: datetime | None = None
    most: int | None = None
    if burst:
        desired = max(current, min(ceiling, _wanted(burst_load, policy)))
    elif recommended > current:
        desired = recommended
    elif recommended < current and not loading:
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


def demand_age(draft: Draft) -> float | None:
    """Seconds since the pool's recorded demand (None: none recorded)."""
    demand = draft.pool.demanded_at
    return None if demand is None else (draft.now - demand).total_seconds()


def demand_fresh(draft: Draft) -> bool:
    """The recorded demand may still have requests waiting: it is at most the pool's
    ``activationTimeoutSeconds`` old (a gateway holds a request no longer; either side, for clocks that
    differ)."""
    age = demand_age(draft)
    return age is not None and abs(age) <= draft.pool.spec.activation_timeout_seconds


def pending_wake(draft: Draft) -> datetime | None:
    """The demand that woke the pool, as the last status recorded it, while the wake is still pending: no
    worker of the pool exists and ``spec.replicas`` has not been changed since (that sets the count)."""
    previous = draft.pool.status
    if previous.spec_replicas != draft.pool.spec.replicas or any(w.active for w in draft.workers):
        return None
    return parse_time(previous.autoscaling.woken_by_demand_at)


def _drop_expired_wake(draft: Draft) -> None:
    """A pending wake whose demand is no longer fresh and for which nothing is being created (the budget
    held it back) goes back to zero: its requests have given up."""
    woken = pending_wake(draft)
    draft.scaling.woken_by = woken if draft.target > 0 else None
    if woken is None or draft.target == 0 or draft.in_flight or demand_fresh(draft):
        return
    floor = draft.pool.spec.min_replicas
    age = demand_age(draft)
    recorded = f"the demand recorded at {rfc3339_ms(draft.pool.demanded_at or woken)}"
    message = (
        f"{recorded} ({age or 0:.1f}s ago) is older than activationTimeoutSeconds "
        f"({draft.pool.spec.activation_timeout_seconds}s) and no worker was created for it: its requests "
        f"have given up: {draft.target} -> {floor} workers"
    )
    draft.events.append(Event("Normal", "WakeExpired", message))
    draft.target, draft.scaling.woken_by = floor, None
    draft.scaling.last_scale_time = draft.now


def wake_on_demand(draft: Draft) -> None:
    """Phase 3: a pool at zero with fresh demand aims for one worker (``admit`` creates it this pass); a
    pending wake whose demand expired before a worker could be created is dropped."""
    _drop_expired_wake(draft)
    demand = draft.pool.demanded_at
    if draft.target > 0 or demand is None or replica_ceiling(draft.pool.spec) < 1:
        return
    baseline = zero_since(draft)
    if baseline is not None and demand <= baseline:
        return  # recorded before the pool reached zero: already served
    if not demand_fresh(draft):
        return  # the requests that recorded it have given up (or a clock is far off)
    age = demand_age(draft) or 0.0
    draft.target = 1
    draft.scaling.last_scale_time, draft.scaling.woken_by = draft.now, demand
    message = f"demand recorded at {rfc3339_ms(demand)} ({age:.1f}s ago): 0 -> 1 worker"
    draft.events.append(Event("Normal", "WokenByDemand", message))


def autoscale(draft: Draft) -> None:
    """Phase 4: add this pass's load sample to the window; while autoscaling is on and the load is known,
    move the target (``decide``), with a ScaledUp or ScaledDown Event that carries the numbers.  At zero
    it does nothing (only demand wakes a pool); with the load unknown it keeps the countdown as it was."""
    spec, scaling, now = draft.pool.spec, draft.scaling, draft.now
    policy = spec.autoscaling
    demand = draft.pool.demand
    held, refused = (demand.held_at(now), demand.refused_at(now)) if demand else (None, None)
    measured = pool_load(draft.workers, draft.counters, held, policy.metric, refused)
    load = measured.load
    scaling.observed_load, scaling.counters = load, measured.counters
    scaling.refused_per_s, scaling.held = measured.refused_per_s, measured.held
    if load is not None:
        sample = LoadSample(now, load, policy.metric)
        scaling.window = record(draft.load_window, sample, policy.stable_window_seconds)
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
        complete=measured.complete,
        down_since=scaling.down_since,
        down_to=scaling.down_to,
        loading=any(w.state == "Loading" for w in draft.active),
    )
    scaling.recommended = decision.recommended
    scaling.down_since, scaling.down_to = decision.down_since, decision.down_to
    if decision.down_in is not None:
        draft.requeue.append(decision.down_in)
    if decision.desired != draft.target:
        draft.events.append(_scaled_event(draft.target, decision, policy, measured))
        draft.target = decision.desired
        scaling.last_scale_time = now


def _scaled_event(current: int, decision: Decision, policy: AutoscalingSpec, measured: PoolLoad) -> Event:
    change = f"{current} -> {decision.desired} workers"
    target = f"target {target_text(policy)} per worker"
    counted = []
    if measured.refused_per_s > 0:
        counted.append(f"{measured.refused_per_s:.1f} refused/s counted as {measured.refused:.1f}")
    if measured.held:
        counted.append(f"{measured.held} held at the gateway")
    if measured.gateway_refused:
        counted.append(f"{measured.gateway_refused} refused at the gateway (hold full)")
    if counted:
        target += "; now " + ", ".join(counted)
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


def target_text(policy: AutoscalingSpec) -> str:
    """The per-worker target in words, for the scaling Events."""
    if policy.metric == "tokens":
        return f"{policy.target_tokens_per_worker} tokens"
    if policy.metric == "kvCache":
        return f"{per_worker_target(policy):g}% KV cache"
    return str(policy.target_per_worker)


def scaled_to_zero_at(draft: Draft) -> str | None:
    """``status.autoscaling.scaledToZeroAt`` after this pass: now when the pool reaches zero, kept while
    it stays there (and afterwards, as the last time it did)."""
    previous = draft.pool.status
    recorded = previous.autoscaling.scaled_to_zero_at
    if draft.target == 0 and (previous.target_replicas != 0 or recorded is None):
        return rfc3339_ms(draft.now)
    return recorded


def woken_by_demand_at(draft: Draft) -> str | None:
    """``status.autoscaling.wokenByDemandAt`` after this pass: the demand of a pending wake, until a worker
    of the pool exists."""
    if draft.scaling.woken_by is None or any(w.active for w in draft.workers):
        return None
    return rfc3339_ms(draft.scaling.woken_by)


def last_scale_time(draft: Draft) -> str | None:
    """``status.autoscaling.lastScaleTime`` after this pass."""
    if draft.scaling.last_scale_time is not None:
        return rfc3339(draft.scaling.last_scale_time)
    return draft.pool.status.autoscaling.last_scale_time
