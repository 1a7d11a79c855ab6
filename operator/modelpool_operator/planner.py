"""The pool planner: one pure function from what exists to what to do.

``plan(pool, workers, ledger, others, now)`` looks at a ModelPool (spec, generation, template hash, last
status), its observed workers, the cluster memory ledger and the other pools' workers, and returns a
``Plan``: workers to create (deterministic names), pods to delete, workers to evict (possibly of other
pools, for the budget), the status to write, the Events to post, and when to look again.  The handlers
apply it; nothing here does I/O or reads the clock.

Rules (issue 4):
* Failed workers are charged nothing, deleted at once, and replaced with per-pool exponential backoff
  (``status.backoff``); a failure is counted once, on the pass that first sees it.
* ``status.targetReplicas`` is what the pool aims for: ``spec.replicas``, lowered by idle scale-down
  (never below ``minReplicas``), raised again one at a time while every serving worker is busy, and reset
  when ``spec.replicas`` changes.
* Idle eviction: workers the server reports Idle for longer than ``idleTimeoutSeconds`` are evicted
  towards ``minReplicas``, least recently used first.  Eviction = drop the serving label (the Service stops
  routing), wait ``drain_grace_s``, delete (SIGTERM: the server drains).  Loading and Processing workers
  are never evicted.
* Roll-over on a template-hash change: new workers first (surge within the budget), an old worker is
  evicted only while the ready count stays at or above the target (or at ``minReplicas`` when the budget
  leaves no room for a surge).
* Budget: a worker is created only while used + reserved + its memory <= total.  Otherwise idle workers of
  other pools with lower priority (or equal priority, above their minReplicas) are evicted, lowest
  priority first, then least recently used; else condition BudgetExceeded with the numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from modelpool_operator.api import (
    BackoffStatus,
    Condition,
    ConditionStatus,
    MemoryStatus,
    ModelPoolSpec,
    ModelPoolStatus,
    PoolPhase,
    WorkerStatus,
    parse_pool_spec,
    parse_pool_status,
)
from modelpool_operator.budget import Ledger, admits
from modelpool_operator.lifecycle import LABEL_POOL, ObservedWorker, parse_time, rfc3339
from modelpool_operator.quantity import format_quantity, humanize_bytes
from modelpool_operator.resources import template_hash as compute_template_hash
from modelpool_operator.resources import worker_name

# Eviction reasons (the value of the modelpool.dev/evicting annotation).
EVICT_IDLE = "IdleTimeout"
EVICT_PREEMPTED = "Preempted"
EVICT_ROLLOVER = "RollOver"
EVICT_SCALE_DOWN = "ScaleDown"
# Evictions after which the pool should not bring the worker back by itself.
_SHRINKING_EVICTIONS = (EVICT_IDLE, EVICT_PREEMPTED)

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class PlannerSettings:
    """Tunables of the planner (the operator maps its configuration onto this)."""

    backoff_base_s: float = 5.0
    backoff_cap_s: float = 300.0
    # The failure count resets only once every serving worker has served this long (as the kubelet
    # resets CrashLoopBackOff only after a container ran for a while): a worker that becomes Ready and
    # then crashes at once must still back off longer each time, not restart at the base delay forever.
    backoff_reset_after_s: float = 60.0
    # After an eviction drops the serving label, wait this long (endpoints propagate) before deleting.
    drain_grace_s: float = 5.0
    # Roll-over creates at most this many workers above the target.
    max_surge: int = 1
    # A worker reporting Loading for longer than this is still never evicted; it only marks Progressing.
    # (Kept for symmetry; the startup probe bounds a load.)


@dataclass(frozen=True)
class PoolView:
    """The pool being planned: identity, spec, generation, last status and the current template hash."""

    namespace: str
    name: str
    spec: ModelPoolSpec
    generation: int = 0
    status: ModelPoolStatus = field(default_factory=ModelPoolStatus)
    template_hash: str = ""

    @classmethod
    def from_body(cls, body: Any) -> PoolView:
        """From a ModelPool object (dict-like with metadata, spec, status)."""
        meta = body.get("metadata") or {}
        spec = parse_pool_spec(body.get("spec") or {})
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            spec=spec,
            generation=int(meta.get("generation") or 0),
            status=parse_pool_status(body.get("status")),
            template_hash=compute_template_hash(spec),
        )

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class OtherPool:
    """Another pool, as far as budget preemption needs to know it."""

    namespace: str
    name: str
    priority: int
    min_replicas: int
    workers: tuple[ObservedWorker, ...] = ()
    # Memory this pool is blocked on (its status.memory.waitingBytes): a lower-priority pool leaves
    # that much of any freed memory to it, so a preemption is not undone by the victim's own pool.
    waiting_memory: int = 0

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @classmethod
    def from_body(cls, body: Any, workers: Sequence[ObservedWorker] = ()) -> OtherPool | None:
        """From a ModelPool object (metadata, spec, status); None when its spec does not parse."""
        meta = body.get("metadata") or {}
        try:
            spec = parse_pool_spec(body.get("spec") or {})
        except ValueError:
            return None
        status = parse_pool_status(body.get("status"))
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            priority=spec.priority,
            min_replicas=spec.min_replicas,
            workers=tuple(workers),
            waiting_memory=status.memory.waiting_bytes,
        )


@dataclass(frozen=True)
class Create:
    """Create this worker pod (``build_worker_pod`` with the plan's template hash); reserve ``memory``."""

    name: str
    memory: int


@dataclass(frozen=True)
class Delete:
    """Delete this pod of the planned pool now."""

    name: str
    reason: str


@dataclass(frozen=True)
class Evict:
    """Start evicting a worker (possibly of another pool): ``resources.eviction_patch(reason, now)``."""

    namespace: str
    pool: str
    name: str
    reason: str


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the pool."""

    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class Plan:
    """Everything one reconciliation pass should do for one pool."""

    template_hash: str
    create: tuple[Create, ...] = ()
    delete: tuple[Delete, ...] = ()
    evict: tuple[Evict, ...] = ()
    status: ModelPoolStatus = field(default_factory=ModelPoolStatus)
    events: tuple[Event, ...] = ()
    # Look at the pool again after this many seconds even without an event (None: only on events).
    requeue_after: float | None = None

    def status_patch(self) -> dict[str, Any]:
        """The status as a JSON merge-patch body (camelCase), lists replaced whole."""
        body = self.status.model_dump(mode="json", by_alias=True)
        # Keep explicit nulls for cleared optional fields so a merge patch removes stale values.
        return body

    @property
    def idle(self) -> bool:
        """Nothing to do this pass."""
        return not (self.create or self.delete or self.evict)


# ---- small pure helpers -------------------------------------------------------------------------------


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


def condition(
    previous: Iterable[Condition],
    type_: str,
    *,
    status: ConditionStatus,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> Condition:
    """A condition whose lastTransitionTime is kept while its status does not change."""
    before = next((c for c in previous if c.type == type_), None)
    changed = before is None or before.status != status
    return Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=rfc3339(now) if changed or before is None else before.last_transition_time,
        observed_generation=generation,
    )


def _next_name(pool: PoolView, used: set[str]) -> str:
    index = 0
    while True:
        candidate = worker_name(pool.name, pool.template_hash, index)
        if candidate not in used:
            used.add(candidate)
            return candidate
        index += 1


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


# ---- the plan -----------------------------------------------------------------------------------------


def plan(
    pool: PoolView,
    workers: Sequence[ObservedWorker],
    ledger: Ledger,
    *,
    now: datetime,
    others: Sequence[OtherPool] = (),
    settings: PlannerSettings | None = None,
) -> Plan:
    """Decide one pass for ``pool``.  ``workers`` are this pool's observed workers; ``ledger`` covers every
    pool (this one included) and carries the live reservations; ``others`` are the other pools."""
    settings = settings or PlannerSettings()
    spec, prev = pool.spec, pool.status
    memory = spec.resources.memory_bytes
    prev_states = {w.name: w.state for w in prev.workers}
    prev_reasons = {w.name: w.reason for w in prev.workers}
    prev_since = {w.name: w.since for w in prev.workers}
    workers = sorted((w for w in workers if w.pool in (pool.name, "")), key=lambda w: w.name)
    events: list[Event] = []
    creates: list[Create] = []
    deletes: list[Delete] = []
    evicts: list[Evict] = []
    evicting_now: dict[str, str] = {}  # own worker name -> eviction reason decided this pass
    requeue: list[float] = []

    # Reservations of this pool whose pods are not observed yet: creations in flight, counted as Pending.
    in_flight = [r for r in ledger.reservations if r.pool_key == pool.key]
    used_names = {w.name for w in workers} | {r.worker for r in in_flight}

    # -- transitions worth an Event --------------------------------------------------------------------
    for w in workers:
        before = prev_states.get(w.name)
        if w.state == "Pending" and w.reason == "Unschedulable":
            # Pending -> Pending: only the reason changes when the scheduler's verdict outlasts the
            # timeout, so this transition is told by the reason, not by the state.
            if before is not None and prev_reasons.get(w.name) != "Unschedulable":
                events.append(
                    Event("Warning", "Unschedulable", f"worker {w.name} cannot be scheduled: {w.message}")
                )
            continue
        if before == w.state:
            continue
        if w.state == "Failed":
            events.append(
                Event(
                    "Warning", w.reason or "WorkerFailed", f"worker {w.name} failed: {w.message or w.reason}"
                )
            )
        elif w.state == "Ready" and before in (None, "Pending", "Loading"):
            events.append(Event("Normal", "WorkerReady", f"worker {w.name} is ready"))
    seen = {w.name for w in workers}
    for gone in prev.workers:
        if (
            gone.name not in seen
            and gone.state not in ("Dead",)
            and gone.name not in {r.worker for r in in_flight}
        ):
            events.append(Event("Normal", "WorkerRemoved", f"worker {gone.name} is gone"))

    # -- the target ------------------------------------------------------------------------------------
    target = prev.target_replicas if prev.target_replicas is not None else spec.replicas
    if prev.spec_replicas is None or prev.spec_replicas != spec.replicas:
        target = spec.replicas
    for w in workers:
        # Another pool's planner (or a previous pass of ours that failed to record it) started an eviction
        # that shrinks this pool: do not bring the worker straight back.
        before = prev_states.get(w.name)
        if (
            w.state == "Evicting"
            and w.evicting_reason in _SHRINKING_EVICTIONS
            and before is not None
            and before != "Evicting"
        ):
            target -= 1
    target = max(spec.min_replicas, min(target, spec.replicas))

    # -- failures: delete, count once, back off ----------------------------------------------------------
    failed = [w for w in workers if w.state == "Failed"]
    new_failures = [w for w in failed if prev_states.get(w.name) != "Failed"]
    failures = prev.backoff.failures
    next_attempt = parse_time(prev.backoff.next_attempt_after)
    last = prev.backoff
    last_worker, last_reason, last_message = last.last_worker, last.last_reason, last.last_message
    if new_failures:
        failures += len(new_failures)
        delay = backoff_delay(failures, settings.backoff_base_s, settings.backoff_cap_s)
        next_attempt = now + timedelta(seconds=delay)
        newest = new_failures[-1]
        last_worker, last_reason, last_message = newest.name, newest.reason, newest.message
        events.append(
            Event(
                "Warning",
                "BackOff",
                f"replacing failed worker(s) {', '.join(w.name for w in new_failures)} after {delay:.0f}s "
                f"(failure {failures})",
            )
        )
    # A failed pod charges nothing, so it is kept (kubectl logs/describe still work, status shows its
    # reason) until its replacement is due, then deleted in the pass that creates the replacement.
    replacement_due = next_attempt is None or next_attempt <= now
    for w in failed:
        if w.deleting:
            continue
        if replacement_due:
            deletes.append(Delete(w.name, w.reason or "Failed"))
        elif next_attempt is not None:
            requeue.append((next_attempt - now).total_seconds())

    # -- workers on their way out: finish evictions, clean up exited pods -------------------------------
    for w in workers:
        if w.state == "Evicting" and w.evicting_reason and not w.deleting:
            started = w.evicting_since or w.since or now
            remaining = settings.drain_grace_s - (now - started).total_seconds()
            if remaining <= 0:
                deletes.append(Delete(w.name, w.evicting_reason))
            else:
                requeue.append(remaining)
        elif w.state == "Dead" and not w.deleting:
            deletes.append(Delete(w.name, w.reason or "Completed"))

    active = [w for w in workers if w.active]
    # Under pressure: every serving worker's queue is at least half full (a single snapshot of
    # "Processing" is too noisy a signal), judged before any removal in this pass.
    serving_before = [w for w in active if w.serving_state]
    all_busy = bool(serving_before) and all(
        2 * (w.queue_depth or 0) >= spec.queue.capacity for w in serving_before
    )
    current = [w for w in active if w.template_hash == pool.template_hash]
    outdated = [w for w in active if w.template_hash != pool.template_hash]

    def remove(worker: ObservedWorker, reason: str) -> None:
        # A worker that has not started serves nothing: delete it.  Others drain first.
        if worker.state == "Pending":
            deletes.append(Delete(worker.name, reason))
        else:
            evicts.append(Evict(pool.namespace, pool.name, worker.name, reason))
            evicting_now[worker.name] = reason
        active.remove(worker)
        (current if worker in current else outdated).remove(worker)

    # -- scale down to the target ------------------------------------------------------------------------
    # During a roll-over the outdated workers are retired by the roll-over rule below (which keeps the
    # ready minimum); here only current workers beyond the target count as surplus.
    surplus = (len(current) if outdated else len(active)) + len(in_flight) - target
    if surplus > 0:
        # Not started first (newest first), then outdated, then least recently used; never Loading/Processing.
        pending = sorted((w for w in active if w.state == "Pending"), key=lambda w: w.name, reverse=True)
        pool_of = current if outdated else active
        pending = [w for w in pending if w in pool_of]
        rest = sorted(
            (w for w in pool_of if w.state != "Pending" and w.evictable),
            key=lambda w: (w.template_hash == pool.template_hash, w.state != "Idle", _lru_key(w)),
        )
        for w in [*pending, *rest][:surplus]:
            remove(w, EVICT_SCALE_DOWN)

    # -- idle eviction towards minReplicas ----------------------------------------------------------------
    if spec.idle_timeout_seconds > 0:
        idle = sorted(
            (w for w in active if w.state == "Idle" and w.evictable),
            key=_lru_key,
        )
        room = len(active) + len(in_flight) - spec.min_replicas
        for w in idle:
            waited = idle_for(w, now)
            if waited >= spec.idle_timeout_seconds and room > 0:
                remove(w, EVICT_IDLE)
                target = max(spec.min_replicas, target - 1)
                room -= 1
            elif waited < spec.idle_timeout_seconds:
                requeue.append(spec.idle_timeout_seconds - waited)

    # -- scale up under load (one at a time, up to spec.replicas) ----------------------------------------
    starting = [w for w in active if w.state in ("Pending", "Loading")]
    draining_own = any(w.state == "Evicting" for w in workers)
    if (
        all_busy
        and not evicts
        and not draining_own
        and not starting
        and not in_flight
        and target < spec.replicas
    ):
        target += 1
        events.append(
            Event(
                "Normal",
                "ScalingUp",
                f"the queues of all {len(serving_before)} serving workers are half full",
            )
        )

    # -- roll-over: retire outdated workers while the ready count allows ---------------------------------
    for w in [w for w in outdated if w.state == "Pending"]:
        remove(w, EVICT_ROLLOVER)

    # -- creations: fill the target with current workers, within surge, backoff and budget ---------------
    want = max(0, target - len(current) - len(in_flight))
    room_for_surge = max(0, target + settings.max_surge - len(active) - len(in_flight))
    want = min(want, room_for_surge) if outdated else want
    budget_message = ""
    budget_blocked = False
    waiting_for_memory = False
    backoff_wait = 0.0
    if want and next_attempt is not None and next_attempt > now:
        backoff_wait = (next_attempt - now).total_seconds()
        requeue.append(backoff_wait)
        want = 0
    # Memory that higher-priority pools are waiting for is not ours to take (they may have preempted
    # for it); pools waiting for more than the whole budget are ignored (they can never fit).
    yielded = sum(
        o.waiting_memory
        for o in others
        if o.priority > spec.priority and (ledger.total is None or o.waiting_memory <= ledger.total)
    )
    view = ledger
    waiting = 0
    for index in range(want):
        if admits(view.with_reserved(yielded), memory):
            name = _next_name(pool, used_names)
            creates.append(Create(name, memory))
            view = view.with_reserved(memory)
            continue
        budget_blocked = True
        waiting = (want - index) * memory
        total = view.total or 0
        shortfall = view.used + view.reserved + yielded + memory - total
        # Memory already on its way out (other workers draining) counts before evicting more.
        draining = sum(w.memory for o in others for w in o.workers if w.state == "Evicting")
        draining += sum(w.memory for w in workers if w.state == "Evicting")
        if draining >= shortfall:
            waiting_for_memory = True
        else:
            chosen: list[ObservedWorker] = []
            freed = draining
            for candidate in preemption_candidates(spec.priority, pool.key, others):
                if freed >= shortfall:
                    break
                chosen.append(candidate)
                freed += candidate.memory
            if freed >= shortfall and chosen:
                waiting_for_memory = True
                for victim in chosen:
                    evicts.append(Evict(victim.namespace, victim.pool, victim.name, EVICT_PREEMPTED))
                    events.append(
                        Event(
                            "Normal",
                            "Preempting",
                            f"evicting idle worker {victim.namespace}/{victim.name} "
                            f"(pool {victim.pool}) to free {humanize_bytes(victim.memory)}",
                        )
                    )
        budget_message = (
            f"a worker needs {humanize_bytes(memory)} but the budget has "
            f"{humanize_bytes(max(0, (view.free or 0) - yielded))} free "
            f"(total {humanize_bytes(total)}, used {humanize_bytes(view.used)}, "
            f"reserved {humanize_bytes(view.reserved)}"
            + (f", left to higher-priority pools {humanize_bytes(yielded)})" if yielded else ")")
            + ("; waiting for evicted workers to drain" if waiting_for_memory else "")
        )
        break

    # Roll-over evictions: keep at least the target ready (or minReplicas when no surge fits the budget).
    ready_total = sum(1 for w in active if w.serving_state)
    stuck = budget_blocked and not waiting_for_memory
    floor = spec.min_replicas if stuck else target
    for w in sorted((w for w in outdated if w.evictable), key=_lru_key):
        replacing = bool(current or creates or in_flight) or len(active) > target
        if ready_total - 1 >= floor and (replacing or stuck):
            remove(w, EVICT_ROLLOVER)
            ready_total -= 1

    # -- status ---------------------------------------------------------------------------------------------
    worker_status: list[WorkerStatus] = []
    for w in workers:
        entry = w.to_status()
        if w.name in evicting_now:
            entry = entry.model_copy(
                update={
                    "state": "Evicting",
                    "reason": evicting_now[w.name],
                    "since": rfc3339(now),
                    "message": "the operator is draining this worker",
                }
            )
        elif prev_states.get(w.name) == entry.state and prev_since.get(w.name):
            entry = entry.model_copy(update={"since": prev_since[w.name]})
        worker_status.append(entry)
    states = [s.state for s in worker_status]
    ready = sum(1 for s in states if s in ("Ready", "Processing", "Idle"))
    loading = sum(1 for s in states if s == "Loading")
    replicas = sum(1 for s in states if s in ("Pending", "Loading", "Ready", "Processing", "Idle"))
    charged = sum(w.memory for w in workers)
    unschedulable = [w for w in workers if w.state == "Pending" and w.reason == "Unschedulable"]

    serving = [w for w in workers if w.state in ("Ready", "Processing", "Idle")]
    stable = all(
        (now - (w.ready_since or w.since or now)).total_seconds() >= settings.backoff_reset_after_s
        for w in serving
    )
    if failures and not failed and ready >= target and stable:
        # Healthy again for a while: the next failure starts from the base delay (the last failure stays
        # on record).
        failures, next_attempt = 0, None
    phase: PoolPhase
    if ready and ready >= target:
        phase = (
            "Idle" if all(s == "Idle" for s in states if s in ("Ready", "Processing", "Idle")) else "Ready"
        )
    elif target == 0 and not replicas:
        phase = "Idle"
    elif ready:
        phase = "Degraded"
    elif failed or (failures and next_attempt is not None and next_attempt > now):
        phase = "Failed"
    elif loading:
        phase = "Loading"
    else:
        phase = "Pending"

    gen = pool.generation
    conds = prev.conditions
    rolling = bool(outdated) or any(e.reason == EVICT_ROLLOVER for e in evicts)
    progressing = bool(creates or in_flight or starting or rolling or evicts or deletes)
    degraded_reason, degraded_message = "AsExpected", "all workers healthy"
    if failed:
        first = failed[0]
        degraded_reason = first.reason or "WorkerFailed"
        degraded_message = f"worker {first.name}: {first.message or first.reason}"
    elif backoff_wait:
        degraded_reason = "BackOff"
        degraded_message = f"replacing failed workers in {backoff_wait:.0f}s (failures: {failures})"
        if last_worker:
            degraded_message += f"; last: worker {last_worker}: {last_message or last_reason}"
    elif unschedulable:
        degraded_reason = "Unschedulable"
        degraded_message = (
            f"worker {unschedulable[0].name}: {unschedulable[0].message or 'cannot be scheduled'}"
        )
    budget_reason = "WithinBudget"
    if budget_blocked:
        budget_reason = "WaitingForMemory" if waiting_for_memory else "InsufficientMemory"
    progress_reason, progress_message = "Stable", "no changes in flight"
    if progressing:
        progress_reason = "RollingOver" if rolling else "Scaling"
        progress_message = (
            f"{len(creates)} creating, {len(evicts)} evicting, {len(deletes)} deleting, {loading} loading"
        )

    def cond(type_: str, ok: bool, reason: str, message: str) -> Condition:
        return condition(
            conds,
            type_,
            status="True" if ok else "False",
            reason=reason,
            message=message,
            now=now,
            generation=gen,
        )

    conditions = [
        cond("Ready", ready >= target, "WorkersReady" if ready >= target else "WorkersNotReady",
             f"{ready}/{target} workers ready"),
        cond("Progressing", progressing, progress_reason, progress_message),
        cond("Degraded", degraded_reason != "AsExpected", degraded_reason, degraded_message),
        cond("BudgetExceeded", budget_blocked, budget_reason, budget_message or "workers fit the budget"),
    ]  # fmt: skip
    before_budget = next((c for c in conds if c.type == "BudgetExceeded"), None)
    if budget_blocked and (before_budget is None or before_budget.status != "True"):
        events.append(Event("Warning", "BudgetExceeded", budget_message))
    elif not budget_blocked and before_budget is not None and before_budget.status == "True" and creates:
        events.append(Event("Normal", "BudgetAvailable", "memory freed: creating workers"))
    for c in creates:
        events.append(Event("Normal", "CreatingWorker", f"creating worker {c.name}"))
    for e in evicts:
        if e.pool == pool.name and e.namespace == pool.namespace:
            events.append(Event("Normal", "EvictingWorker", f"evicting worker {e.name} ({e.reason})"))

    status = ModelPoolStatus(
        phase=phase,
        replicas=replicas,
        ready_replicas=ready,
        target_replicas=target,
        spec_replicas=spec.replicas,
        ready_text=f"{ready}/{target}",
        workers=worker_status,
        memory=MemoryStatus(charged=format_quantity(charged), charged_bytes=charged, waiting_bytes=waiting),
        conditions=conditions,
        observed_generation=gen,
        backoff=BackoffStatus(
            failures=failures,
            next_attempt_after=rfc3339(next_attempt),
            last_worker=last_worker,
            last_reason=last_reason,
            last_message=last_message,
        ),
        selector=f"{LABEL_POOL}={pool.name}",
    )
    positive = [r for r in requeue if r > 0]
    return Plan(
        template_hash=pool.template_hash,
        create=tuple(creates),
        delete=tuple(_unique_deletes(deletes)),
        evict=tuple(evicts),
        status=status,
        events=tuple(events),
        requeue_after=min(positive) if positive else None,
    )


def _unique_deletes(deletes: Iterable[Delete]) -> list[Delete]:
    seen: set[str] = set()
    out: list[Delete] = []
    for d in deletes:
        if d.name not in seen:
            seen.add(d.name)
            out.append(d)
    return out
