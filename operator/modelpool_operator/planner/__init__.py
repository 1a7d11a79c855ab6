"""The pool planner: one pure function from what exists to what to do.

``plan(pool, workers, ledger, others, now, load_window)`` looks at a ModelPool (spec, generation, template
hash, last status, recorded demand), its observed workers, the cluster memory ledger, the other pools'
workers and the load samples of earlier passes, and returns a ``Plan``: workers to create (deterministic
names), pods to delete, workers to evict (possibly of other pools, for the budget), the status to write,
the Events to post, when to look again, and the load window for the next pass.  The handlers apply it;
nothing here does I/O or reads the clock.

``plan`` runs a fixed sequence of phases over one accumulator, the ``Draft`` (``planner.draft``;
docs/design.md, "The planner"); each phase is a function of the draft (``planner.phases``,
``planner.autoscale``, ``planner.status``) and has its own unit tests:

1. ``tell_transitions``: Events for workers that became Ready, failed, went away or turned Unschedulable.
2. ``set_target``: ``status.targetReplicas`` is what the pool aims for: ``spec.replicas``, lowered by idle
   scale-down and by evictions that shrink the pool (never below ``minReplicas``), reset when
   ``spec.replicas`` changes, within ``[minReplicas, replicas]`` (``[minReplicas, maxReplicas]`` while
   autoscaling).
3. ``wake_on_demand``: a pool at zero whose recorded demand (its demand Lease's ``renewTime``) is newer than
   the moment it reached zero, and at most ``activationTimeoutSeconds`` old, aims for one worker
   (WokenByDemand); a wake the budget held back until its demand expired is dropped (WakeExpired).
4. ``autoscale``: the load sample of this pass (in flight plus queued, plus the refused requests' share,
   plus the requests held at the gateway while no worker serves) joins the window; while autoscaling,
   the target follows the load between ``max(minReplicas, 1)`` and ``maxReplicas``: up at once on a burst
   or a higher stable load, down only after ``scaleDownDelaySeconds`` of lower load, with no countdown
   while a worker is Loading (ScaledUp, ScaledDown).
5. ``handle_failures``: failed workers are charged nothing, counted once (on the pass that first sees
   them), kept while the per-pool exponential backoff (``status.backoff``) runs, then deleted in the pass
   that replaces them.
6. ``retire``: finish evictions whose drain grace is over, delete exited pods, scale down to the target
   (not started first, then outdated, then least recently used), and evict workers the server reports
   Idle for longer than ``idleTimeoutSeconds`` (recorded demand counts as use) towards ``minReplicas``,
   least recently used first.
   Eviction = drop the serving label (the Service stops routing), wait ``drain_grace_s``, delete
   (SIGTERM: the server drains).  Loading and Processing workers are never evicted.
7. ``scale_up_under_load`` (autoscaling off): while every serving worker's queue is at least half full,
   the target rises by one (up to ``spec.replicas``), one step at a time.
8. ``admit``: outdated workers that never started are dropped, then creations fill the target within the
   roll-over surge, the backoff and the budget: a worker is created only while used + reserved + its
   memory <= total.  Otherwise idle workers of other pools with lower priority (or equal priority, above
   their minReplicas) are evicted, lowest priority first, then least recently used; else condition
   BudgetExceeded with the numbers.
9. ``roll_over``: on a template-hash change, an old worker is evicted only while the ready count stays at
   or above the target; when the budget leaves no room for a surge, one by one within
   ``spec.disruption.maxUnavailable``, never below the serving count when the roll-over began
   (``status.rollout``) minus that (with 0: it waits).  It runs after ``admit`` because whether an old
   worker may go depends on the replacements admitted in this pass.
10. ``conclude``: the status (workers, phase, conditions, backoff, autoscaling), the closing Events, the
    requeue delay.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

from modelpool_operator.budget import Ledger
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.autoscale import autoscale, wake_on_demand
from modelpool_operator.planner.draft import (
    EVICT_IDLE,
    EVICT_PREEMPTED,
    EVICT_ROLLOVER,
    EVICT_SCALE_DOWN,
    CounterSample,
    Create,
    Delete,
    Draft,
    Event,
    Evict,
    LoadSample,
    Plan,
    PlannerSettings,
)
from modelpool_operator.planner.phases import (
    admit,
    backoff_delay,
    handle_failures,
    idle_for,
    preemption_candidates,
    retire,
    roll_over,
    scale_up_under_load,
    set_target,
    tell_transitions,
)
from modelpool_operator.planner.status import conclude, condition
from modelpool_operator.pool import OtherPool, PoolView

#: The phases, in the order ``plan`` runs them (``conclude`` then turns the draft into the plan).
PHASES: tuple[Callable[[Draft], None], ...] = (
    tell_transitions,
    set_target,
    wake_on_demand,
    autoscale,
    handle_failures,
    retire,
    scale_up_under_load,
    admit,
    roll_over,
)


def plan(
    pool: PoolView,
    workers: Sequence[ObservedWorker],
    ledger: Ledger,
    *,
    now: datetime,
    others: Sequence[OtherPool] = (),
    settings: PlannerSettings | None = None,
    load_window: Sequence[LoadSample] = (),
    counters: Mapping[str, CounterSample] | None = None,
    taken: frozenset[str] = frozenset(),
) -> Plan:
    """Decide one pass for ``pool``.  ``workers`` are this pool's observed workers; ``ledger`` covers every
    pool (this one included) and carries the live reservations; ``others`` are the other pools;
    ``load_window`` and ``counters`` are the previous plan's (empty at first: the windows and the
    refusal rates are re-learned); ``taken``: worker names someone else's pod, or a drain's eviction,
    holds (never planned)."""
    draft = Draft(
        pool,
        list(workers),
        ledger,
        now,
        others,
        settings or PlannerSettings(),
        load_window,
        counters or {},
        taken,
    )
    for phase in PHASES:
        phase(draft)
    return conclude(draft)


__all__ = [
    "EVICT_IDLE",
    "EVICT_PREEMPTED",
    "EVICT_ROLLOVER",
    "EVICT_SCALE_DOWN",
    "PHASES",
    "CounterSample",
    "Create",
    "Delete",
    "Draft",
    "Event",
    "Evict",
    "LoadSample",
    "Plan",
    "PlannerSettings",
    "admit",
    "autoscale",
    "backoff_delay",
    "conclude",
    "condition",
    "handle_failures",
    "idle_for",
    "plan",
    "preemption_candidates",
    "retire",
    "roll_over",
    "scale_up_under_load",
    "set_target",
    "tell_transitions",
    "wake_on_demand",
]
