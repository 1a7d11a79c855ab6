"""A shared pool's count and retries (pure): how many host pods should hold its model, and which of its
Failed replicas are due for another try. The dedicated pools' decisions, over the host pods' per-model
figures.

A shared pool's own pass (``reconcile_shared.shared_pass``) runs ``scale_shared`` over its replicas as workers
(``observe.hosts.hosted_workers``: each host pod holding the model, with the model's own ``/stats`` there);
the ModelHost's pass places ``SharedCount.target`` replicas and unloads the failed ones in
``SharedCount.retry`` (``planner.host_models``). The phases are the dedicated pools' own, on a ``Draft`` of
the replicas:

* ``set_target``: ``spec.replicas``, reset when it changes, within ``[minReplicas, replicas]``
  (``[minReplicas, maxReplicas]`` while autoscaling);
* ``wake_on_demand``: a pool at zero with fresh gateway demand aims for one replica (the gateway holds a
  request for a shared pool placed nowhere and records it on the pool's demand Lease);
* ``autoscale``: the load is each replica's in flight plus queued (its host's ``models.<pool>``), its
  refusals, and the requests the gateway holds while none serves;
* ``unload_idle``: scale-down by idleness is sleep first, then unload. The host puts a model idle for
  ``idleTimeoutSeconds`` to sleep (its weights parked in host RAM, its device memory returned; a request
  wakes it in about a second), and the operator lowers the count by one for each replica idle (Idle or
  Sleeping, nothing queued) for twice ``idleTimeoutSeconds`` (the later of its last request and the
  gateway's demand; none while the gateway holds requests for the pool), towards ``minReplicas``. A
  sleeping model costs no device memory, so keeping it a while makes the next request a wake rather than
  a cold load; it still holds host RAM, so a pool nobody uses gives it back (and host RAM short unloads
  sleepers sooner: ``placement.unload_candidates``);
* ``count_failures``: a replica newly Failed (its state, or its failure time, not as the last status
  recorded it) counts once in the pool's backoff (``status.backoff``, ``backoff_delay`` as for workers);
  once the backoff is due, the host pods where it failed are in ``retry`` (the ModelHost's pass unloads it
  there and places it again). Meanwhile the ModelHost's pass places the pool on other host pods at once (a
  failed model is not a replica): a host that failed takes no model down with it, and a model that fails
  everywhere fails once on each host pod, then is retried with the backoff.

A lower count unloads the surplus replicas (the ModelHost's pass picks them: sleeping first, then loading,
then the least recently used). ``SharedCount.target`` is at most the ModelHost's host pods; the status keeps
what the pool asks for (``targetReplicas``), so a ModelHost scaled up later gets the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from modelpool_contract.api import AutoscalingStatus, BackoffStatus
from modelpool_contract.states import SERVING_STATES
from modelpool_contract.times import parse_time
from modelpool_operator.budget import Ledger
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.autoscale import autoscale, wake_on_demand
from modelpool_operator.planner.draft import CounterSample, Draft, Event, LoadSample, PlannerSettings
from modelpool_operator.planner.phases import extend_backoff, idle_for, restore_backoff, set_target
from modelpool_operator.planner.status import (
    autoscaling_status,
    backoff_status,
    requeue_after,
    settle_backoff,
)
from modelpool_operator.pool import PoolView

#: The reason of the Ready condition of a shared pool whose model failed as often in a row as its
#: ModelHost has host pods, and serves nowhere.
FAILING_EVERYWHERE = "FailingOnEveryHost"
#: A replica idle this many times ``idleTimeoutSeconds`` is unloaded (it slept for the second one).
IDLE_UNLOAD_FACTOR = 2
_NO_BUDGET = Ledger(total=None, used=0, reserved=0)


@dataclass(frozen=True)
class SharedCount:
    """What a shared pool's pass decided for its ModelHost's pass: how many host pods should hold the model
    (at most the ModelHost's), and the host pods where its Failed model is due for a retry (unloaded, then
    placed again)."""

    target: int
    retry: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SharedScale:
    """One shared pool pass's decisions: the count, the status fields they write (``target``,
    ``autoscaling``, ``backoff``: ``planner.shared.shared_status``), the Events, when to look again, and the
    autoscaler's window and counters for the next pass."""

    count: SharedCount
    target: int
    autoscaling: AutoscalingStatus
    backoff: BackoffStatus
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None
    load_window: tuple[LoadSample, ...] = ()
    counters: Mapping[str, CounterSample] = field(default_factory=dict)
    # Why the model serves nowhere after failing on host pod after host pod (None: it does not).
    failing_everywhere: str | None = None
    # Seconds until the next retry of a failed replica (0: none waits).
    retry_in: float = 0.0


def _new_failure(draft: Draft, worker: ObservedWorker) -> bool:
    """Failed, and not as the last status recorded it: another state then, or another failure time."""
    before = draft.before(worker.name)
    if before is None or before.state != "Failed":
        return True
    return worker.since is not None and parse_time(before.since) != worker.since


def count_failures(draft: Draft) -> frozenset[str]:
    """Count the replicas newly Failed once in the pool's backoff (a BackOff Warning saying when the model is
    tried again); the host pods where it failed once the backoff is due (else look again then)."""
    backoff = restore_backoff(draft)
    draft.failed = [w for w in draft.workers if w.state == "Failed"]
    new = [w for w in draft.failed if _new_failure(draft, w)]
    if new:
        delay = extend_backoff(draft, new, "Failed")
        said = "; ".join(f"host pod {w.name}: {w.message or 'the model failed'}" for w in new)
        message = f"the model failed ({said}); unloading and loading it again after {delay:.0f}s"
        draft.events.append(Event("Warning", "BackOff", f"{message} (failure {backoff.failures})"))
    if not draft.failed:
        return frozenset()
    if backoff.due(draft.now):
        return frozenset(w.name for w in draft.failed)
    if backoff.next_attempt is not None:
        draft.requeue.append((backoff.next_attempt - draft.now).total_seconds())
    return frozenset()


def unload_idle(draft: Draft) -> None:
    """Lower the count by one for each replica idle (Idle or Sleeping, nothing queued or in flight) for
    ``IDLE_UNLOAD_FACTOR`` times ``idleTimeoutSeconds`` (the later of its last request and the pool's
    demand), towards ``minReplicas``; look again when the next one would be."""
    spec = draft.pool.spec
    grace = IDLE_UNLOAD_FACTOR * spec.idle_timeout_seconds
    if grace <= 0:
        return
    held = draft.pool.demand.held_at(draft.now) if draft.pool.demand is not None else None
    if held:
        # The gateway holds requests for the pool (released once the host pod's annotation shows the model
        # awake, a pass after it is): none of its replicas is idle.
        draft.requeue.append(float(spec.idle_timeout_seconds))
        return
    demand = draft.pool.demanded_at
    since_demand = max(0.0, (draft.now - demand).total_seconds()) if demand else float("inf")
    idle = [w for w in draft.active if w.state in ("Idle", "Sleeping") and w.evictable]
    room = len(draft.active) - spec.min_replicas
    for worker in sorted(idle, key=lambda w: (-idle_for(w, draft.now), w.name)):
        waited = min(idle_for(worker, draft.now), since_demand)
        if waited < grace:
            draft.requeue.append(grace - waited)
        elif room > 0 and draft.target > spec.min_replicas:
            before, draft.target = draft.target, draft.target - 1
            room -= 1
            draft.scaling.last_scale_time = draft.now
            message = (
                f"the model on host pod {worker.name} ({worker.state}) had no request for {waited:.0f}s "
                f"(twice idleTimeoutSeconds, {spec.idle_timeout_seconds}s): {before} -> {draft.target} "
                "replicas"
            )
            draft.events.append(Event("Normal", "IdleUnload", message))


def _failing_everywhere(draft: Draft, host_pods: int) -> str | None:
    """Why the model serves nowhere after failing as often in a row as the ModelHost has host pods."""
    backoff = draft.backoff
    serving = any(w.state in SERVING_STATES or w.state in ("Sleeping", "Waking") for w in draft.workers)
    if serving or not draft.failed or backoff.failures < max(host_pods, 1):
        return None
    return (
        f"the model failed {backoff.failures} times in a row, as many as ModelHost {draft.pool.spec.host} "
        f"has host pods (a failed model is placed on another host pod at once); last: host pod "
        f"{backoff.last_worker}: {backoff.last_message or backoff.last_reason}; fix the model or its "
        "settings (spec.model, resources.memory)"
    )


def scale_shared(
    pool: PoolView,
    workers: Sequence[ObservedWorker],
    *,
    host_pods: int,
    now: datetime,
    settings: PlannerSettings | None = None,
    load_window: Sequence[LoadSample] = (),
    counters: Mapping[str, CounterSample] | None = None,
) -> SharedScale:
    """One shared pool pass's count, retries and status fields (see the module doc). ``pool.status`` is
    the status as last written; ``host_pods``: the ModelHost's ``replicas``."""
    draft = Draft(
        pool, list(workers), _NO_BUDGET, now, (), settings or PlannerSettings(), load_window, counters or {}
    )
    set_target(draft)
    wake_on_demand(draft)
    autoscale(draft)
    retry = count_failures(draft)
    unload_idle(draft)
    settle_backoff(draft, sum(1 for w in draft.workers if w.state in SERVING_STATES))
    next_attempt = draft.backoff.next_attempt
    waiting = (next_attempt - now).total_seconds() if draft.failed and next_attempt is not None else 0.0
    return SharedScale(
        count=SharedCount(min(draft.target, max(host_pods, 0)), retry),
        target=draft.target,
        autoscaling=autoscaling_status(draft),
        backoff=backoff_status(draft),
        events=tuple(draft.events),
        requeue_after=requeue_after(draft),
        load_window=draft.scaling.window,
        counters=draft.scaling.counters,
        failing_everywhere=_failing_everywhere(draft, host_pods),
        retry_in=max(waiting, 0.0),
    )
