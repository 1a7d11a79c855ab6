"""Declared against measured memory, for the status and Events of a planning pass.

Each worker is charged ``spec.resources.memory`` against the ModelBudget; on GPU pools its server reports
the accelerator memory it actually holds (``/stats``: reserved now, and the peak of its CUDA caching
allocator).  A worker whose peak is above its charge makes the budget under-count what the cluster's
accelerators carry, so the pool says so: the condition ``MemoryExceedsCharge`` names the workers and the
numbers, and a Warning Event is posted when a worker first goes over.  Pools whose workers report no
accelerator memory (CPU pools, or stats not known yet) get the condition False with reason NotMeasured.

Pure functions of the ``Draft``; ``planner.status.conclude`` calls them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelpool_contract.states import CHARGED_STATES
from modelpool_operator.api import WorkerStatus
from modelpool_operator.events import Event
from modelpool_operator.planner.draft import Draft
from modelpool_operator.quantity import QuantityError, format_quantity, humanize_bytes, parse_quantity
from modelpool_operator.worker_state import ObservedWorker

MEMORY_CONDITION = "MemoryExceedsCharge"
# At most this many workers are named in the condition's message (the rest are counted).
_NAMED = 3


@dataclass(frozen=True)
class MemoryFinding:
    """The condition's status, reason and message."""

    over: bool
    reason: str
    message: str


def measured(worker: ObservedWorker) -> int | None:
    """The accelerator memory the worker has needed: its peak when reported, else what it holds now."""
    return worker.accelerator_peak if worker.accelerator_peak is not None else worker.accelerator_reserved


def over_charge(worker: ObservedWorker) -> bool:
    """The worker holds its charge and has needed more accelerator memory than that."""
    used = measured(worker)
    return worker.state in CHARGED_STATES and used is not None and used > worker.memory


def _was_over(entry: WorkerStatus | None) -> bool:
    if entry is None or entry.accelerator_memory is None:
        return False
    try:
        return entry.accelerator_memory.highest > parse_quantity(entry.memory)
    except QuantityError:
        return False


def _describe(worker: ObservedWorker) -> str:
    return (
        f"worker {worker.name} needed {humanize_bytes(measured(worker) or 0)} of accelerator memory "
        f"but is charged {humanize_bytes(worker.memory)}"
    )


def tell_memory_over_charge(draft: Draft) -> None:
    """A Warning Event for each worker that went over its charge since the last pass."""
    for worker in draft.workers:
        if over_charge(worker) and not _was_over(draft.before(worker.name)):
            message = f"{_describe(worker)} (spec.resources.memory): the budget under-counts it"
            draft.events.append(Event("Warning", MEMORY_CONDITION, message))


def memory_finding(draft: Draft) -> MemoryFinding:
    """The condition's verdict over the pool's current workers."""
    over = [w for w in draft.workers if over_charge(w)]
    if over:
        named = "; ".join(_describe(w) for w in over[:_NAMED])
        more = f"; and {len(over) - _NAMED} more" if len(over) > _NAMED else ""
        return MemoryFinding(
            True,
            "MeasuredAboveCharge",
            f"{named}{more}: raise spec.resources.memory to at least "
            f"{humanize_bytes(max(measured(w) or 0 for w in over))}",
        )
    if any(measured(w) is not None for w in draft.workers):
        return MemoryFinding(False, "WithinCharge", "every worker's accelerator memory is within its charge")
    return MemoryFinding(False, "NotMeasured", "no worker reports accelerator memory")


def memory_figures(draft: Draft) -> dict[str, Any]:
    """``status.memory``'s declared and measured fields: the per-worker charge, and the highest peak any
    current worker reports (for ``kubectl get modelpools -o wide``)."""
    peaks = [m for w in draft.workers if w.state in CHARGED_STATES and (m := measured(w)) is not None]
    peak = max(peaks) if peaks else None
    return {
        "declared": format_quantity(draft.pool.spec.resources.memory_bytes),
        "measured_peak": format_quantity(peak) if peak is not None else None,
        "measured_peak_bytes": peak,
    }
