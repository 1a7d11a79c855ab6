"""The phases of a planning pass besides autoscaling (``planner.autoscale``) and the status
(``planner.status``), each a function of the ``Draft`` (see ``planner`` for the sequence), and the pure
helpers they share (backoff delay, idle time, preemption order).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from modelpool_contract.api import autoscaling_enabled
from modelpool_contract.quantity import humanize_bytes
from modelpool_contract.states import STARTING_STATES
from modelpool_contract.times import parse_time
from modelpool_operator.budget import Ledger, admits
from modelpool_operator.observe.claims import REASON_NOT_BELIEVED
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.draft import (
    EVICT_IDLE,
    EVICT_PREEMPTED,
    EVICT_ROLLOVER,
    EVICT_SCALE_DOWN,
    SHRINKING_EVICTIONS,
    Backoff,
    Create,
    Delete,
    Draft,
    Event,
    Evict,
)
from modelpool_operator.pool import OtherPool


def backoff_delay(failures: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before the next creation after ``failures`` consecutive failures (0 → none)."""
    if failures <= 0:
        return 0.0
    # min() before the power keeps huge failure counts from overflowing.
    exponent = min(failures - 1, 62)
    return float(min(cap_s, base_s * (2**exponent)))


def _lru_key(worker: ObservedWorker) -> tuple[float, str]:
    since = worker.idle_since()
    return (since.timestamp() if since else float("-inf"), worker.name)


def idle_for(worker: ObservedWorker, now: datetime) -> float:
    """Seconds since the worker last had a request (0 when unknown)."""
    since = worker.idle_since()
    return max(0.0, (now - since).total_seconds()) if since else 0.0


def preemption_candidates(
    own_priority: int, own_key: tuple[str, str], others: Sequence[OtherPool]
) -> list[ObservedWorker]:
    """Idle workers of other pools that may be evicted for this pool, in eviction order: lowest
    priority first, then least recently used.  Lower-priority pools may lose every idle worker;
    equal-priority pools only those above their minReplicas; higher-priority pools none."""
    ranked: list[tuple[int, float, str, ObservedWorker]] = []
    for other in others:
        if other.key == own_key or other.priority > own_priority:
            continue
        idle = sorted((w for w in other.workers if w.state == "Idle" and w.evictable), key=_lru_key)
        if other.priority == own_priority:
            active = sum(1 for w in other.workers if w.active)
            idle = idle[: max(0, active - other.min_replicas)]
        for worker in idle:
            ranked.append((other.priority, _lru_key(worker)[0], worker.name, worker))
    ranked.sort(key=lambda item: item[:3])
    return [item[3] for item in ranked]


# ---- transitions, target, failures --------------------------------------------------------


def tell_transitions(draft: Draft) -> None:
    """Phase 1: an Event for each transition worth one (Ready, Failed, Unschedulable, gone, a claim of
    work no longer believed)."""
    for w in draft.workers:
        before = draft.before(w.name)
        if w.state == "Pending" and w.reason == "Unschedulable":
            # Pending -> Pending: only the reason changes when the scheduler's verdict outlasts the
            # timeout, so this transition is told by the reason, not by the state.
            if before is not None and before.reason != "Unschedulable":
                message = f"worker {w.name} cannot be scheduled: {w.message}"
                draft.events.append(Event("Warning", "Unschedulable", message))
            continue
        if w.reason == REASON_NOT_BELIEVED and (before is None or before.reason != REASON_NOT_BELIEVED):
            # Told by the reason: the state may have been Idle already (requests claimed in flight).
            draft.events.append(Event("Warning", REASON_NOT_BELIEVED, f"worker {w.name}: {w.message}"))
            continue
        if before is not None and before.state == w.state:
            continue
        if w.state == "Failed":
            message = f"worker {w.name} failed: {w.message or w.reason}"
            draft.events.append(Event("Warning", w.reason or "WorkerFailed", message))
        elif w.state == "Ready" and (before is None or before.state in STARTING_STATES):
            draft.events.append(Event("Normal", "WorkerReady", f"worker {w.name} is ready"))
    seen = {w.name for w in draft.workers} | {r.worker for r in draft.in_flight}
    for gone in draft.pool.status.workers:
        if gone.name not in seen and gone.state != "Dead":
            draft.events.append(Event("Normal", "WorkerRemoved", f"worker {gone.name} is gone"))


def set_target(draft: Draft) -> None:
    """Phase 2: the target from the last status, reset by a new ``spec.replicas``, lowered by evictions
    that shrink the pool, within [minReplicas, replicas] (with autoscaling: [minReplicas, maxReplicas])."""
    spec, previous = draft.pool.spec, draft.pool.status
    target = previous.target_replicas if previous.target_replicas is not None else spec.replicas
    if previous.spec_replicas is None or previous.spec_replicas != spec.replicas:
        target = spec.replicas
    for w in draft.workers:
        # Another pool's planner (or a previous pass of ours that failed to record it) started an eviction
        # that shrinks this pool: do not bring the worker straight back.
        before = draft.state_before(w.name)
        if (
            w.state == "Evicting"
            and w.evicting_reason in SHRINKING_EVICTIONS
            and before is not None
            and before != "Evicting"
        ):
            target -= 1
    ceiling = spec.max_replicas if autoscaling_enabled(spec) else spec.replicas
    draft.target = max(spec.min_replicas, min(target, ceiling))


def restore_backoff(draft: Draft) -> Backoff:
    """The pool's backoff record as its status last wrote it, now the draft's to extend."""
    last = draft.pool.status.backoff
    draft.backoff = Backoff(
        failures=last.failures,
        next_attempt=parse_time(last.next_attempt_after),
        last_worker=last.last_worker,
        last_reason=last.last_reason,
        last_message=last.last_message,
    )
    return draft.backoff


def extend_backoff(draft: Draft, new: Sequence[ObservedWorker], reason: str | None = None) -> float:
    """Count the ``new`` failures once in the draft's backoff: the next attempt after the exponential delay
    (returned), the newest one's name, reason (else ``reason``) and message recorded."""
    backoff = draft.backoff
    backoff.failures += len(new)
    delay = backoff_delay(backoff.failures, draft.settings.backoff_base_s, draft.settings.backoff_cap_s)
    backoff.next_attempt = draft.now + timedelta(seconds=delay)
    newest = new[-1]
    backoff.last_worker, backoff.last_reason = newest.name, newest.reason or reason
    backoff.last_message = newest.message
    return delay


def handle_failures(draft: Draft) -> None:
    """Phase 5: count new failures once, start or extend the backoff, and delete failed pods once their
    replacement is due."""
    backoff = restore_backoff(draft)
    draft.failed = [w for w in draft.workers if w.state == "Failed"]
    new_failures = [w for w in draft.failed if draft.state_before(w.name) != "Failed"]
    if new_failures:
        delay = extend_backoff(draft, new_failures)
        names = ", ".join(w.name for w in new_failures)
        message = f"replacing failed worker(s) {names} after {delay:.0f}s (failure {backoff.failures})"
        draft.events.append(Event("Warning", "BackOff", message))
    # A failed pod charges nothing, so it is kept (kubectl logs/describe still work, status shows its
    # reason) until its replacement is due, then deleted in the pass that creates the replacement.
    for w in draft.failed:
        if w.deleting:
            continue
        if backoff.due(draft.now):
            draft.deletes.append(Delete(w.name, w.reason or "Failed"))
        elif backoff.next_attempt is not None:
            draft.requeue.append((backoff.next_attempt - draft.now).total_seconds())


# ---- retire, scale up ---------------------------------------------------------------------


def _finish_evictions(draft: Draft) -> None:
    """Delete workers whose drain grace is over, and pods whose server exited."""
    for w in draft.workers:
        if w.state == "Evicting" and w.evicting_reason and not w.deleting:
            started = w.evicting_since or w.since or draft.now
            remaining = draft.settings.drain_grace_s - (draft.now - started).total_seconds()
            if remaining <= 0:
                draft.deletes.append(Delete(w.name, w.evicting_reason))
            else:
                draft.requeue.append(remaining)
        elif w.state == "Dead" and not w.deleting:
            draft.deletes.append(Delete(w.name, w.reason or "Completed"))


def _scale_down(draft: Draft) -> None:
    """Remove workers beyond the target: not started first (newest first), then outdated, then least
    recently used; never Loading or Processing.  During a roll-over only current workers count as
    surplus (the outdated ones are retired by ``roll_over``, which keeps the ready minimum)."""
    rolling = bool(draft.outdated)
    surplus = (len(draft.current) if rolling else len(draft.active)) + len(draft.in_flight) - draft.target
    if surplus <= 0:
        return
    candidates = draft.current if rolling else draft.active
    pending = sorted((w for w in draft.active if w.state == "Pending"), key=lambda w: w.name, reverse=True)
    pending = [w for w in pending if w in candidates]
    rest = sorted(
        (w for w in candidates if w.state != "Pending" and w.evictable),
        key=lambda w: (w.template_hash == draft.pool.template_hash, w.state != "Idle", _lru_key(w)),
    )
    for w in [*pending, *rest][:surplus]:
        draft.remove(w, EVICT_SCALE_DOWN)


def _evict_idle(draft: Draft) -> None:
    """Evict workers idle longer than ``idleTimeoutSeconds`` (least recently used first) towards
    ``minReplicas``, lowering the target with each; look again when the next one would time out.

    Recorded demand counts as use: a gateway records it while it holds requests because no worker is
    routable yet (e.g. the pod is not Ready while the server already reports Idle), so a worker is idle only
    ``idleTimeoutSeconds`` after the later of its last request and the pool's demand.  Otherwise a short
    idle timeout would evict the worker that demand woke before the held requests reach it."""
    spec = draft.pool.spec
    timeout = spec.idle_timeout_seconds
    if timeout <= 0:
        return
    idle = sorted((w for w in draft.active if w.state == "Idle" and w.evictable), key=_lru_key)
    room = len(draft.active) + len(draft.in_flight) - spec.min_replicas
    demand = draft.pool.demanded_at
    since_demand = max(0.0, (draft.now - demand).total_seconds()) if demand else float("inf")
    for w in idle:
        waited = min(idle_for(w, draft.now), since_demand)
        if waited >= timeout and room > 0:
            draft.remove(w, EVICT_IDLE)
            draft.target = max(spec.min_replicas, draft.target - 1)
            room -= 1
        elif waited < timeout:
            draft.requeue.append(timeout - waited)


def retire(draft: Draft) -> None:
    """Phase 6: finish evictions and clean up exited pods, scale down to the target, evict idle workers."""
    _finish_evictions(draft)
    _scale_down(draft)
    _evict_idle(draft)


def scale_up_under_load(draft: Draft) -> None:
    """Phase 7 (autoscaling off): raise the target by one (up to ``spec.replicas``) while every serving
    worker's queue is at least half full, and nothing else is changing (no eviction, no worker starting
    or draining).  With autoscaling on, ``autoscale`` moves the count instead."""
    spec = draft.pool.spec
    if autoscaling_enabled(spec):
        return
    # Judged on the workers before this pass removed any: a single snapshot of "Processing" is too noisy
    # a signal, a queue at least half full on every serving worker is not.
    serving = [w for w in draft.workers if w.active and w.serving_state]
    all_busy = bool(serving) and all(2 * (w.queue_depth or 0) >= spec.queue.capacity for w in serving)
    starting = any(w.state in STARTING_STATES for w in draft.active)
    draining = any(w.state == "Evicting" for w in draft.workers)
    quiet = not draft.evicts and not draining and not starting and not draft.in_flight
    if all_busy and quiet and draft.target < spec.replicas:
        draft.target += 1
        message = f"the queues of all {len(serving)} serving workers are half full"
        draft.events.append(Event("Normal", "ScalingUp", message))


# ---- admit, roll over ---------------------------------------------------------------------


def _preempt(draft: Draft, shortfall: int, draining: int) -> bool:
    """Evict idle workers of other pools (in ``preemption_candidates`` order) when together with the
    memory already draining they cover ``shortfall``; True when they do."""
    spec = draft.pool.spec
    chosen: list[ObservedWorker] = []
    freed = draining
    for candidate in preemption_candidates(spec.priority, draft.pool.key, draft.others):
        if freed >= shortfall:
            break
        chosen.append(candidate)
        freed += candidate.memory
    if freed < shortfall or not chosen:
        return False
    for victim in chosen:
        draft.evicts.append(Evict(victim.namespace, victim.pool, victim.name, EVICT_PREEMPTED, victim.state))
        message = (
            f"evicting idle worker {victim.namespace}/{victim.name} "
            f"(pool {victim.pool}) to free {humanize_bytes(victim.memory)}"
        )
        draft.events.append(Event("Normal", "Preempting", message))
    return True


def _block(draft: Draft, view: Ledger, yielded: int, missing: int) -> None:
    """The budget cannot take the next worker: wait for draining memory, preempt, or report the numbers."""
    memory = draft.pool.spec.resources.memory_bytes
    admission = draft.admission
    admission.blocked = True
    admission.waiting_bytes = missing * memory
    if view.invalid is not None:  # fail closed: no number to compare with, nothing to preempt for
        admission.budget_invalid = True
        admission.closed_reason = view.closed_reason
        admission.message = f"{view.invalid}; no worker is admitted until it is fixed"
        return
    total = view.total or 0
    shortfall = view.used + view.reserved + yielded + memory - total
    # Memory already on its way out (other workers draining) counts before evicting more.
    draining = sum(w.memory for o in draft.others for w in o.workers if w.state == "Evicting")
    draining += sum(w.memory for w in draft.workers if w.state == "Evicting")
    admission.waiting_for_memory = draining >= shortfall or _preempt(draft, shortfall, draining)
    admission.message = (
        f"a worker needs {humanize_bytes(memory)} but the budget has "
        f"{humanize_bytes(max(0, (view.free or 0) - yielded))} free "
        f"(total {humanize_bytes(total)}, used {humanize_bytes(view.used)}, "
        f"reserved {humanize_bytes(view.reserved)}"
        + (f", left to higher-priority pools {humanize_bytes(yielded)})" if yielded else ")")
        + ("; waiting for evicted workers to drain" if admission.waiting_for_memory else "")
    )


def admit(draft: Draft) -> None:
    """Phase 8: drop outdated workers that never started, then create current workers up to the target,
    within the roll-over surge, the backoff and the budget (preempting when the budget is short)."""
    for w in [w for w in draft.outdated if w.state == "Pending"]:
        draft.remove(w, EVICT_ROLLOVER)
    spec, now = draft.pool.spec, draft.now
    want = max(0, draft.target - len(draft.current) - len(draft.in_flight))
    if draft.outdated:
        room_for_surge = draft.target + draft.settings.max_surge - len(draft.active) - len(draft.in_flight)
        want = min(want, max(0, room_for_surge))
    next_attempt = draft.backoff.next_attempt
    if want and next_attempt is not None and next_attempt > now:
        draft.admission.backoff_wait = (next_attempt - now).total_seconds()
        draft.requeue.append(draft.admission.backoff_wait)
        want = 0
    if not want:  # nothing to admit: the other pools (a thousand, at scale) are not looked at
        return
    # Memory that higher-priority pools are waiting for is not ours to take (they may have preempted
    # for it); pools waiting for more than the whole budget are ignored (they can never fit). Without a
    # budget (no total) every worker fits: the other pools are not read (a thousand of them, at scale,
    # built for every pool's first pass of a scale-up: a fifth of the operator's time at 1,000 pools).
    total = draft.ledger.total
    yielded = (
        0
        if total is None
        else sum(
            o.waiting_memory for o in draft.others if o.priority > spec.priority and o.waiting_memory <= total
        )
    )
    memory = spec.resources.memory_bytes
    view = draft.ledger
    for index in range(want):
        if not admits(view.with_reserved(yielded), memory):
            _block(draft, view, yielded, want - index)
            break
        draft.creates.append(Create(draft.next_name(), memory))
        view = view.with_reserved(memory)


def roll_over(draft: Draft) -> None:
    """Phase 9: evict outdated workers (least recently used first).

    With room for a surge (or memory on its way) an outdated worker goes only while the ready count stays at
    the target: the new ones come first. Stuck on the budget (no surge fits, nothing draining), they give
    way one by one within the pool's disruption budget: at most ``spec.disruption.maxUnavailable`` of them
    on their way out at once, and the ready count never below the count when the roll-over began (kept in
    ``status.rollout``; the target when that is lower) minus ``maxUnavailable``. With ``maxUnavailable`` 0
    the roll-over waits for room, and the status says why. Not while the budget is invalid: nothing would
    be admitted in their place."""
    if not draft.outdated:
        return
    spec, admission = draft.pool.spec, draft.admission
    ready_total = sum(1 for w in draft.active if w.serving_state)
    last = draft.pool.status.rollout
    before = last.ready_before if last is not None else ready_total
    draft.ready_before_roll = before
    stuck = admission.blocked and not admission.waiting_for_memory and not admission.budget_invalid
    room = len(draft.outdated)  # outdated workers this pass may retire
    floor = draft.target
    if stuck:
        max_unavailable = spec.disruption.max_unavailable
        floor = max(0, min(before, draft.target) - max_unavailable)
        going = sum(1 for w in draft.workers if w.state == "Evicting" and w.evicting_reason == EVICT_ROLLOVER)
        room = max(0, max_unavailable - going)
    retired = 0
    for w in sorted((w for w in draft.outdated if w.evictable), key=_lru_key):
        replacing = (
            bool(draft.current or draft.creates or draft.in_flight) or len(draft.active) > draft.target
        )
        if retired < room and ready_total - 1 >= floor and (replacing or stuck):
            draft.remove(w, EVICT_ROLLOVER)
            ready_total -= 1
            retired += 1
    if stuck and not retired:
        draft.roll_wait = roll_wait_message(spec.disruption.max_unavailable, ready_total, floor, before)


def roll_wait_message(max_unavailable: int, ready: int, floor: int, before: int) -> str:
    """Why a roll-over stuck on the budget retires no outdated worker this pass (Progressing's message)."""
    if max_unavailable == 0:
        return (
            f"the roll-over waits for room: the budget has none for a new worker beside the {ready} serving, "
            "and spec.disruption.maxUnavailable 0 lets none of them go first; free memory in the ModelBudget "
            "or raise maxUnavailable"
        )
    return (
        f"the roll-over replaces workers one by one without room for a surge: {ready} serving, at least "
        f"{floor} must ({before} when it began, spec.disruption.maxUnavailable {max_unavailable}); waiting "
        "for a replacement to serve"
    )
