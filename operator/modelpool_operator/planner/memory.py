"""Declared against measured memory, for the status and Events of a planning pass.

Each worker is charged ``spec.resources.memory`` against the ModelBudget; on GPU pools its server reports
the accelerator memory it actually holds (``/stats``: reserved now, and the peak of its CUDA caching
allocator).  A worker whose peak is above its charge makes the budget under-count what the cluster's
accelerators carry, so the pool says so: the condition ``MemoryExceedsCharge`` names the workers and the
numbers, and a Warning Event is posted when a worker first goes over.  Pools whose workers report no
accelerator memory (CPU pools, or stats not known yet) get the condition False with reason NotMeasured.

Pure functions of the ``Draft`` and this pass's ``status.workers`` entries; ``planner.status`` calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from modelpool_contract.api import WorkerStatus
from modelpool_contract.quantity import QuantityError, format_quantity, humanize_bytes, parse_quantity
from modelpool_contract.states import CHARGED_STATES
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner.draft import Draft, Event

MEMORY_CONDITION = "MemoryExceedsCharge"
# At most this many workers are named in the condition's message (the rest are counted).
_NAMED = 3


@dataclass(frozen=True)
class MemoryFinding:
    """The condition's status, reason and message."""

    over: bool
    reason: str
    message: str


def keep_last_measurement(
    entry: WorkerStatus, worker: ObservedWorker, before: WorkerStatus | None
) -> WorkerStatus:
    """A worker whose ``/stats`` is unknown this pass (a scrape timed out) keeps the measurement it last
    reported: a peak does not go away with one missed scrape, and the condition must not flap."""
    if entry.accelerator_memory is not None or worker.stats_known or before is None:
        return entry
    return entry.model_copy(update={"accelerator_memory": before.accelerator_memory})


def over_charge(entry: WorkerStatus) -> bool:
    """The worker holds its charge and has needed more accelerator memory than that (its peak, or what it
    holds now when it reports no peak)."""
    if entry.state not in CHARGED_STATES or entry.accelerator_memory is None:
        return False
    try:
        return entry.accelerator_memory.highest > parse_quantity(entry.memory)
    except QuantityError:
        return False


def _describe(entry: WorkerStatus) -> str:
    measured = entry.accelerator_memory.highest if entry.accelerator_memory else 0
    return (
        f"worker {entry.name} needed {humanize_bytes(measured)} of accelerator memory "
        f"but is charged {humanize_bytes(parse_quantity(entry.memory))}"
    )


def tell_memory_over_charge(draft: Draft, entries: Sequence[WorkerStatus]) -> None:
    """A Warning Event for each worker that went over its charge since the last status."""
    for entry in entries:
        before = draft.before(entry.name)
        if over_charge(entry) and not (before is not None and over_charge(before)):
            message = f"{_describe(entry)} (spec.resources.memory): the budget under-counts it"
            draft.events.append(Event("Warning", MEMORY_CONDITION, message))


def memory_finding(entries: Sequence[WorkerStatus]) -> MemoryFinding:
    """The condition's verdict over the pool's workers as this pass's status shows them."""
    over = [e for e in entries if over_charge(e)]
    if over:
        named = "; ".join(_describe(e) for e in over[:_NAMED])
        more = f"; and {len(over) - _NAMED} more" if len(over) > _NAMED else ""
        needed = max(e.accelerator_memory.highest for e in over if e.accelerator_memory)
        return MemoryFinding(
            True,
            "MeasuredAboveCharge",
            f"{named}{more}: raise spec.resources.memory to at least {humanize_bytes(needed)}",
        )
    if any(e.accelerator_memory is not None for e in entries):
        return MemoryFinding(False, "WithinCharge", "every worker's accelerator memory is within its charge")
    return MemoryFinding(False, "NotMeasured", "no worker reports accelerator memory")


def memory_figures(draft: Draft, entries: Sequence[WorkerStatus]) -> dict[str, Any]:
    """``status.memory``'s declared and measured fields: the per-worker charge, and the highest peak any
    current worker reports (for ``kubectl get modelpools -o wide``)."""
    peaks = [
        e.accelerator_memory.highest
        for e in entries
        if e.state in CHARGED_STATES and e.accelerator_memory is not None
    ]
    peak = max(peaks) if peaks else None
    return {
        "declared": format_quantity(draft.pool.spec.resources.memory_bytes),
        "measured_peak": format_quantity(peak) if peak is not None else None,
        "measured_peak_bytes": peak,
    }
