"""The last phase of a planning pass: the pool's status (workers, phase, conditions, backoff,
autoscaling, declared against measured memory), the closing Events, and the ``Plan`` itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from modelpool_contract.api import (
    AutoscalingStatus,
    BackoffStatus,
    Condition,
    ConditionStatus,
    MemoryStatus,
    ModelPoolStatus,
    PoolGeneration,
    PoolPhase,
    RolloutStatus,
    WorkerStatus,
    autoscaling_enabled,
)
from modelpool_contract.labels import LABEL_POOL
from modelpool_contract.quantity import format_quantity
from modelpool_contract.states import ACTIVE_STATES, SERVING_STATES, STARTING_STATES, WorkerState
from modelpool_contract.times import rfc3339
from modelpool_operator.budget import BUDGET_INVALID, BUDGET_MISSING
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.autoscale import last_scale_time, scaled_to_zero_at, woken_by_demand_at
from modelpool_operator.planner.draft import EVICT_ROLLOVER, Delete, Draft, Event, Plan
from modelpool_operator.planner.memory import (
    MEMORY_CONDITION,
    keep_last_measurement,
    memory_figures,
    memory_finding,
    tell_memory_over_charge,
)

#: The BudgetExceeded condition's reasons (and the Warning Events') while nothing is admitted: the
#: ModelBudget is invalid, or missing under missing_budget=refuse (defined with the ledger, in ``budget``).
CLOSED_REASONS = frozenset({BUDGET_INVALID, BUDGET_MISSING})

#: The Progressing condition's reason while a roll-over stuck on the budget retires no worker (its message
#: says why: ``phases.roll_wait_message``).
ROLL_OVER_WAITING = "RollOverWaiting"


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


#: A condition to set: its status, reason and message.
Setting = tuple[ConditionStatus, str, str]


def with_conditions(
    previous: Sequence[Condition], settings: Mapping[str, Setting], *, now: datetime, generation: int
) -> list[Condition]:
    """``previous`` with each condition of ``settings`` (by type) set (``condition``), after the others,
    which are kept as they are."""
    kept = [c for c in previous if c.type not in settings]
    return kept + [
        condition(previous, kind, status=state, reason=why, message=text, now=now, generation=generation)
        for kind, (state, why, text) in settings.items()
    ]


def _worker_statuses(draft: Draft) -> list[WorkerStatus]:
    """``status.workers``: as observed, with this pass's evictions, keeping ``since`` while unchanged."""
    entries: list[WorkerStatus] = []
    for w in draft.workers:
        entry = w.to_status()
        before = draft.before(w.name)
        if w.name in draft.evicting_now:
            entry = entry.model_copy(
                update={
                    "state": "Evicting",
                    "reason": draft.evicting_now[w.name],
                    "since": rfc3339(draft.now),
                    "message": "the operator is draining this worker",
                }
            )
        elif before is not None and before.state == entry.state and before.since:
            entry = entry.model_copy(update={"since": before.since})
        entries.append(keep_last_measurement(entry, w, before))
    return entries


def settle_backoff(draft: Draft, ready: int) -> None:
    """Healthy again for a while: the next failure starts from the base delay (the last failure stays on
    record)."""
    reset_after = draft.settings.backoff_reset_after_s
    stable = all(
        (draft.now - (w.ready_since or w.since or draft.now)).total_seconds() >= reset_after
        for w in draft.workers
        if w.state in SERVING_STATES
    )
    if draft.backoff.failures and not draft.failed and ready >= draft.target and stable:
        draft.backoff.failures, draft.backoff.next_attempt = 0, None


def _pool_phase(draft: Draft, states: list[WorkerState]) -> PoolPhase:
    ready = sum(1 for s in states if s in SERVING_STATES)
    backoff = draft.backoff
    if ready and ready >= draft.target:
        return "Idle" if all(s == "Idle" for s in states if s in SERVING_STATES) else "Ready"
    if draft.target == 0 and not any(s in ACTIVE_STATES for s in states):
        return "ScaledToZero"
    if ready:
        return "Degraded"
    if draft.failed or (backoff.failures and not backoff.due(draft.now)):
        return "Failed"
    if "Loading" in states:
        return "Loading"
    return "Pending"


def _degraded(draft: Draft) -> tuple[str, str]:
    """The Degraded condition's reason and message ("AsExpected" when healthy)."""
    backoff = draft.backoff
    if draft.failed:
        first = draft.failed[0]
        return first.reason or "WorkerFailed", f"worker {first.name}: {first.message or first.reason}"
    if draft.admission.backoff_wait:
        message = (
            f"replacing failed workers in {draft.admission.backoff_wait:.0f}s (failures: {backoff.failures})"
        )
        if backoff.last_worker:
            message += f"; last: worker {backoff.last_worker}: {backoff.last_message or backoff.last_reason}"
        return "BackOff", message
    unschedulable = [w for w in draft.workers if w.state == "Pending" and w.reason == "Unschedulable"]
    if unschedulable:
        return (
            "Unschedulable",
            f"worker {unschedulable[0].name}: {unschedulable[0].message or 'cannot be scheduled'}",
        )
    return "AsExpected", "all workers healthy"


def _conditions(draft: Draft, ready: int, loading: int) -> list[Condition]:
    target, admission = draft.target, draft.admission
    rolling = bool(draft.outdated) or any(e.reason == EVICT_ROLLOVER for e in draft.evicts)
    starting = any(w.state in STARTING_STATES for w in draft.active)
    progressing = bool(
        draft.creates or draft.in_flight or starting or rolling or draft.evicts or draft.deletes
    )
    progress_reason, progress_message = "Stable", "no changes in flight"
    if progressing:
        progress_reason = "RollingOver" if rolling else "Scaling"
        progress_message = (
            f"{len(draft.creates)} creating, {len(draft.evicts)} evicting, {len(draft.deletes)} deleting, "
            f"{loading} loading"
        )
    if draft.roll_wait:
        progress_reason, progress_message = ROLL_OVER_WAITING, draft.roll_wait
    budget_reason = "WithinBudget"
    if admission.budget_invalid:
        budget_reason = admission.closed_reason or BUDGET_INVALID
    elif admission.blocked:
        budget_reason = "WaitingForMemory" if admission.waiting_for_memory else "InsufficientMemory"
    degraded_reason, degraded_message = _degraded(draft)

    def cond(type_: str, ok: bool, reason: str, message: str) -> Condition:
        status: ConditionStatus = "True" if ok else "False"
        return condition(
            draft.pool.status.conditions,
            type_,
            status=status,
            reason=reason,
            message=message,
            now=draft.now,
            generation=draft.pool.generation,
        )

    ready_reason = "WorkersReady" if ready >= target else "WorkersNotReady"
    ready_message = f"{ready}/{target} workers ready"
    at_zero = target == 0 and ready == 0
    if at_zero:
        ready_reason, ready_message = "ScaledToZero", _zero_message(draft)
    budget_message = admission.message or "workers fit the budget"
    if draft.ledger.invalid is not None and not admission.blocked:
        # Nothing wanted now, but nothing would be admitted either: say so before it matters.
        budget_reason = draft.ledger.closed_reason
        budget_message = f"{draft.ledger.invalid}; no new worker is admitted until it is fixed"
    return [
        cond("Ready", ready >= target and not at_zero, ready_reason, ready_message),
        cond("Progressing", progressing, progress_reason, progress_message),
        cond("Degraded", degraded_reason != "AsExpected", degraded_reason, degraded_message),
        cond("BudgetExceeded", admission.blocked, budget_reason, budget_message),
    ]


def _zero_message(draft: Draft) -> str:
    """How a pool at zero wakes (the Ready condition's message)."""
    spec = draft.pool.spec
    if not autoscaling_enabled(spec) and spec.replicas == 0:
        return "no workers: spec.replicas is 0 and autoscaling is off; raise spec.replicas to serve"
    return (
        "no workers; the gateway wakes the pool on its next request, which waits while a worker loads "
        "(set minReplicas to keep workers warm)"
    )


def autoscaling_status(draft: Draft) -> AutoscalingStatus:
    """``status.autoscaling``: the count, the load as last observed, the countdown and the times.  The
    window averages stay out of it (they are in the scaling Events): they drift from pass to pass, and
    every status write wakes the pool for another pass."""
    scaling = draft.scaling
    return AutoscalingStatus(
        enabled=autoscaling_enabled(draft.pool.spec),
        desired_replicas=draft.target,
        recommended_replicas=scaling.recommended,
        observed_load=round(scaling.observed_load) if scaling.observed_load is not None else None,
        held_requests=scaling.held,
        last_scale_time=last_scale_time(draft),
        scale_down_since=rfc3339(scaling.down_since),
        scale_down_to=scaling.down_to,
        scaled_to_zero_at=scaled_to_zero_at(draft),
        woken_by_demand_at=woken_by_demand_at(draft),
    )


def generation_summary(workers: Iterable[ObservedWorker]) -> PoolGeneration | None:
    """``status.generation``: the engine figures summed over the serving workers that report them (the
    cache use is their mean); None when none does (other tasks, a serial engine, stats unknown)."""
    reporting = [
        w for w in workers if w.serving_state and w.generation_engine is not None and w.kv_cache_tokens
    ]
    if not reporting:
        return None
    uses = [use for use in (w.kv_cache_use for w in reporting) if use is not None]
    return PoolGeneration(
        running=sum(w.generations_running or 0 for w in reporting),
        tokens_in_flight=sum(w.kv_cache_reserved or 0 for w in reporting),
        kv_cache_use=round(sum(uses) / len(uses), 4) if uses else None,
    )


def _memory_condition(draft: Draft, workers: list[WorkerStatus]) -> Condition:
    """MemoryExceedsCharge: a worker needed more accelerator memory than it is charged."""
    finding = memory_finding(workers)
    return condition(
        draft.pool.status.conditions,
        MEMORY_CONDITION,
        status="True" if finding.over else "False",
        reason=finding.reason,
        message=finding.message,
        now=draft.now,
        generation=draft.pool.generation,
    )


def _closing_events(draft: Draft) -> None:
    """Events about this pass's own decisions: the budget turning, creations, own evictions."""
    blocked, invalid = draft.admission.blocked, draft.admission.budget_invalid
    reason = draft.admission.closed_reason or BUDGET_INVALID
    before = next((c for c in draft.pool.status.conditions if c.type == "BudgetExceeded"), None)
    was_blocked = before is not None and before.status == "True"
    was_invalid = was_blocked and before is not None and before.reason in CLOSED_REASONS
    if invalid and not (was_invalid and before is not None and before.reason == reason):
        draft.events.append(Event("Warning", reason, draft.admission.message))
    elif blocked and not invalid and (not was_blocked or was_invalid):
        draft.events.append(Event("Warning", "BudgetExceeded", draft.admission.message))
    elif not blocked and was_blocked and draft.creates:
        draft.events.append(Event("Normal", "BudgetAvailable", "memory freed: creating workers"))
    for c in draft.creates:
        draft.events.append(Event("Normal", "CreatingWorker", f"creating worker {c.name}"))
    for e in draft.evicts:
        if e.pool == draft.pool.name and e.namespace == draft.pool.namespace:
            draft.events.append(Event("Normal", "EvictingWorker", f"evicting worker {e.name} ({e.reason})"))


#: Kopf cuts a longer message in its middle; a coalesced one ends with how many it left out instead.
MAX_MESSAGE_CHARS = 1000


def coalesce(events: Iterable[Event], kinds: tuple[str, ...] = ("Normal",)) -> list[Event]:
    """One Event per reason for the Normal Events of one pass (of ``kinds``), their messages joined in order.

    A pass that creates ten workers told ten CreatingWorker Events, and a scale-up of 300 pools posted
    6,000 Events, one API request each, while the operator and the API server had the scale-up to do.
    Warnings are kept one by one: each failure is told on its own. Each coalesced Event stands where the
    first of its reason stood; its message stays within ``MAX_MESSAGE_CHARS``, saying how many it left out.
    """
    events = list(events)
    messages: dict[str, list[str]] = {}
    for event in events:
        if event.type in kinds:
            messages.setdefault(event.reason, []).append(event.message)
    out: list[Event] = []
    for event in events:
        if event.type not in kinds:
            out.append(event)
        elif event.reason in messages:
            out.append(Event(event.type, event.reason, _joined(messages.pop(event.reason))))
    return out


def _joined(messages: list[str]) -> str:
    text = messages[0]
    for count, message in enumerate(messages[1:], start=1):
        more = f"; and {len(messages) - count} more"
        if len(text) + 2 + len(message) + len(more) > MAX_MESSAGE_CHARS:
            return text + more
        text = f"{text}; {message}"
    return text


def conclude(draft: Draft) -> Plan:
    """Phase 10: the status to write, the closing Events, and the plan."""
    workers = _worker_statuses(draft)
    states = [s.state for s in workers]
    ready = sum(1 for s in states if s in SERVING_STATES)
    loading = states.count("Loading")
    settle_backoff(draft, ready)
    conditions = [*_conditions(draft, ready, loading), _memory_condition(draft, workers)]
    _closing_events(draft)
    tell_memory_over_charge(draft, workers)
    pool, target = draft.pool, draft.target
    charged = sum(w.memory for w in draft.workers)
    status = ModelPoolStatus(
        phase=_pool_phase(draft, states),
        replicas=sum(1 for s in states if s in ACTIVE_STATES),
        ready_replicas=ready,
        target_replicas=target,
        spec_replicas=pool.spec.replicas,
        ready_text=f"{ready}/{target}",
        workers=workers,
        memory=MemoryStatus(
            charged=format_quantity(charged),
            charged_bytes=charged,
            waiting_bytes=draft.admission.waiting_bytes,
            **memory_figures(draft, workers),
        ),
        conditions=conditions,
        observed_generation=pool.generation,
        backoff=backoff_status(draft),
        selector=f"{LABEL_POOL}={pool.name}",
        autoscaling=autoscaling_status(draft),
        generation=generation_summary(draft.workers),
        rollout=None
        if draft.ready_before_roll is None
        else RolloutStatus(ready_before=draft.ready_before_roll),
    )
    return Plan(
        template_hash=pool.template_hash,
        create=tuple(draft.creates),
        delete=tuple(_unique_deletes(draft.deletes)),
        evict=tuple(draft.evicts),
        status=status,
        events=tuple(coalesce(draft.events)),  # one Normal Event per reason and pass
        requeue_after=requeue_after(draft),
        load_window=draft.scaling.window,
        counters=draft.scaling.counters,
    )


def backoff_status(draft: Draft) -> BackoffStatus:
    """``status.backoff``: the failures counted and when the next attempt may come."""
    backoff = draft.backoff
    return BackoffStatus(
        failures=backoff.failures,
        next_attempt_after=rfc3339(backoff.next_attempt),
        last_worker=backoff.last_worker,
        last_reason=backoff.last_reason,
        last_message=backoff.last_message,
    )


def requeue_after(draft: Draft) -> float | None:
    """The soonest positive delay a phase asked for (None: nothing asks for a pass sooner than a resync)."""
    positive = [r for r in draft.requeue if r > 0]
    return min(positive) if positive else None


def _unique_deletes(deletes: Iterable[Delete]) -> list[Delete]:
    seen: set[str] = set()
    out: list[Delete] = []
    for d in deletes:
        if d.name not in seen:
            seen.add(d.name)
            out.append(d)
    return out
