"""Why a pool gets no ordinary pass, and what it is told (pure: the status patch and Event of each, once
per generation; ``effects.apply.refuse`` writes them): a spec the operator cannot parse (``InvalidSpec``),
one its policy refuses (``PolicyViolation``), and a shared pool waiting for its ModelHost to place it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from modelpool_contract.api import Condition, parse_pool_status
from modelpool_operator.bookkeeping import PoolRun
from modelpool_operator.effects.apply import Refusal
from modelpool_operator.planner import Event
from modelpool_operator.planner.shared import HostWait, host_wait_event, host_wait_status, shared_wire
from modelpool_operator.planner.status import Setting, condition, with_conditions
from modelpool_operator.policy import Violation
from modelpool_operator.pool import PoolView


def invalid_spec_refusal(run: PoolRun, body: Mapping[str, Any], exc: Exception) -> Refusal | None:
    """An unparseable spec: a Warning Event, phase Failed and condition Ready False (reason InvalidSpec,
    naming the field), once per generation (None: told already); no workers are touched."""
    generation = int((body.get("metadata") or {}).get("generation") or 0)
    if run.invalid_generation == generation:
        return None
    run.invalid_generation = generation
    previous = parse_pool_status(body.get("status")).conditions
    return Refusal(
        status=invalid_spec_status(previous, generation, invalid_spec_message(exc), datetime.now(UTC)),
        event=Event("Warning", INVALID_SPEC, f"invalid spec: {exc}"),
    )


#: The Event and condition reason of a spec the operator cannot parse.
INVALID_SPEC = "InvalidSpec"


def invalid_spec_message(exc: Exception) -> str:
    """Why a spec does not parse, in one line: each pydantic error's field and reason (the CRD is looser
    than the model in places, e.g. it admits ``resources.memory: 0``)."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    reasons = []
    for error in errors:
        where = ".".join(str(part) for part in error.get("loc", ()))
        reason = str(error.get("msg", "")).removeprefix("Value error, ")
        if reason.startswith("spec.") or not where:
            reasons.append(reason)
        else:  # the model's own messages name the field already ("resources.memory must be ...")
            reasons.append(f"spec.{reason}" if reason.startswith(where) else f"spec.{where}: {reason}")
    return "invalid spec: " + "; ".join(reasons or [str(exc)])


def invalid_spec_status(
    previous: Iterable[Condition], generation: int, message: str, now: datetime
) -> dict[str, Any]:
    """The status patch of a pool whose spec does not parse: phase Failed and condition Ready False with
    reason InvalidSpec and the message (other conditions are replaced: they described a spec that is
    gone)."""
    ready = condition(
        previous,
        "Ready",
        status="False",
        reason=INVALID_SPEC,
        message=message,
        now=now,
        generation=generation,
    )
    return {
        "phase": "Failed",
        "observedGeneration": generation,
        "conditions": [ready.model_dump(mode="json", by_alias=True, exclude_none=True)],
    }


#: The condition type and Event reason of a pool the operator's policy refuses.
POLICY_VIOLATION = "PolicyViolation"


def policy_refusal(
    run: PoolRun, pool: PoolView, body: Mapping[str, Any], refused: list[Violation]
) -> Refusal | None:
    """A spec the operator's policy refuses: condition PolicyViolation (naming each field), phase Failed
    and a Warning Event, once per generation (None: told already); no worker is created, deleted or
    evicted. Workers that already exist (an allowed spec before, or the policy narrowed since) are left as
    they are."""
    message = policy_message(refused)
    if run.forbidden == (pool.generation, message):
        return None
    run.forbidden = (pool.generation, message)
    status = policy_status(pool, message, datetime.now(UTC))
    # What the status is then, so that the pass after the spec is allowed again removes the condition even
    # before the watch shows this write.
    written = {**(body.get("status") or {}), **status}
    return Refusal(status=status, event=Event("Warning", POLICY_VIOLATION, message), written=written)


def policy_message(refused: list[Violation]) -> str:
    """The refusal in one message: every field's reason, then what the operator does about it."""
    reasons = "; ".join(v.message for v in refused)
    return f"{reasons}; no worker is created or changed until the spec is allowed"


def policy_status(pool: PoolView, message: str, now: datetime) -> dict[str, Any]:
    """The status patch of a refused pool: phase Failed and the PolicyViolation condition, the pool's
    other conditions kept (they describe its existing workers, which are left alone)."""
    forbidden: Setting = ("True", "Forbidden", message)
    made = with_conditions(
        pool.status.conditions, {POLICY_VIOLATION: forbidden}, now=now, generation=pool.generation
    )
    conditions = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in made]
    return {"phase": "Failed", "observedGeneration": pool.generation, "conditions": conditions}


def host_wait_refusal(
    run: PoolRun, pool: PoolView, body: Mapping[str, Any], wait: HostWait
) -> Refusal | None:
    """The status and Event of a shared pool that waits for placement, when the reason is new for this
    generation (None: told already; the pool's loop looks again at its host's next change)."""
    told = (pool.generation, wait.reason, wait.message)
    if run.host_wait == told:
        return None
    run.host_wait = told
    status = shared_wire(host_wait_status(pool, wait, datetime.now(UTC)), patch=True)
    written = {**(body.get("status") or {}), **status}
    return Refusal(status=status, event=host_wait_event(wait), written=written)
