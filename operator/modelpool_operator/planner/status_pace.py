"""When a pool's status is written (issue 36: creation at the cluster's pace), pure.

A status is written only when it changed (``effects.apply``: a merge patch against the last write). While a
pool is only *being created* (``creating``: some workers still Pending, waiting to be scheduled and
started, and every other one serving) its workers' progress is coalesced: at most one write every
``interval`` seconds (``status_delay``; the operator's setting ``creating_status_interval_seconds``, 5 s),
so a pool of ten workers whose pods are bound and made Ready one event at a time costs a few status
writes, not one a pass, while the scheduler and the kubelets (or KWOK) are busiest. Anything else is
written at once: the first status, a worker Loading, failing or gone, the pool settled (nothing Pending
any more), so no state a user or a test waits for is held back.

Within a creation, two more things wait, both bounded:

* **Progress is gathered.** A change is written no sooner than ``GATHER_S`` after the first pass that held
  it (``status_delay``'s ``since_change``): a pool's ten pods are bound in one burst and made Ready within
  a second or two, so the first Ready worker no longer costs a write of its own a second before the write
  that settles the pool.
* **Routine details wait longer** (``routine``: what differs from the last write is only a detail, no
  headline): Pending workers on their ordinary way to starting (Scheduling, Scheduled, ContainerCreating:
  the workers appearing, a node, their messages), the counts that follow them (``replicas``, the memory
  charged, the generations). They go with the next write that says more (a worker serving, the pool
  settled), or after ``ROUTINE_HOLD_S``. A reason out of that way (Unschedulable, an image that cannot be
  pulled), a condition's status or reason, the phase, the ready count, the target and the observed
  generation are headlines, paced as any progress.

At 100 pools x 10 workers the pods waited for the scheduler up to 18 s after their pool's first status:
each pool wrote about three statuses during its creation (the first, its workers appearing, a first Ready
worker) before the one that settled it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from modelpool_contract.api import ModelPoolStatus
from modelpool_contract.states import SERVING_STATES
from modelpool_operator.planner.draft import Event
from modelpool_operator.planner.status import coalesce

#: While a pool is being created, its Normal Events are held at most this long (seconds).
CREATING_EVENTS_HOLD_S = 60.0
#: A creating pool's routine details (``routine``) are held at most this long after the last write.
ROUTINE_HOLD_S = 30.0
#: A creating pool's change is written no sooner than this after the first pass that held it (seconds).
GATHER_S = 2.0
#: The status fields that are headlines (on the wire); the workers' and the conditions' are ``_headline``'s.
HEADLINE_FIELDS = (
    "phase",
    "readyReplicas",
    "targetReplicas",
    "specReplicas",
    "observedGeneration",
    "backoff",
    "rollout",
)
#: The reasons of a Pending worker on its ordinary way to starting (``observe.worker_state``; None: not yet
#: observed, a creation the pass has just planned).
ROUTINE_PENDING_REASONS = frozenset({None, "Scheduling", "Scheduled", "ContainerCreating", "PodInitializing"})


def creating(status: ModelPoolStatus) -> bool:
    """Pure: some workers are Pending and every other one serves: the pool only waits for pods to be
    scheduled and started."""
    states = [w.state for w in status.workers]
    return "Pending" in states and all(s == "Pending" or s in SERVING_STATES for s in states)


def _headline(wire: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: what of a status on the wire is a headline: ``HEADLINE_FIELDS``, each condition's type, status
    and reason, and every worker but a routinely Pending one (``ROUTINE_PENDING_REASONS``), whole."""
    return {
        **{name: wire.get(name) for name in HEADLINE_FIELDS},
        "conditions": [
            (c.get("type"), c.get("status"), c.get("reason")) for c in wire.get("conditions") or []
        ],
        "workers": [
            w
            for w in wire.get("workers") or []
            if not (w.get("state") == "Pending" and w.get("reason") in ROUTINE_PENDING_REASONS)
        ],
    }


def routine(previous: Mapping[str, Any] | None, wire: Mapping[str, Any]) -> bool:
    """Pure: ``wire`` differs from the status last written (``previous``, on the wire) only in details, not
    in a headline (``_headline``)."""
    return previous is not None and previous != wire and _headline(previous) == _headline(wire)


def status_delay(
    *,
    changed: bool,
    creating: bool,
    since_write: float | None,
    interval: float,
    routine: bool = False,
    since_change: float | None = None,
) -> float | None:
    """Pure: None: nothing to write; 0: write now; else the seconds until the change may be written (a
    creating pool's status written ``since_write`` seconds ago, None: never by this process; its first
    unwritten change held ``since_change`` seconds ago, None: this pass's). While creating, a change waits
    ``interval`` after the last write (a ``routine`` one ``ROUTINE_HOLD_S``) and ``GATHER_S`` after it was
    first held; pacing off (``interval`` 0), everything goes at once."""
    if not changed:
        return None
    if not creating or since_write is None or interval <= 0:
        return 0.0
    held = since_change or 0.0
    wait = max((ROUTINE_HOLD_S if routine else interval) - since_write, GATHER_S - held)
    return max(wait, 0.0)


def hold_events(
    *,
    deferred: bool,
    creating: bool,
    was_creating: bool,
    held_for: float | None,
    limit: float = CREATING_EVENTS_HOLD_S,
) -> bool:
    """Pure: whether this pass's Normal Events are held: its status write was ``deferred``, or the pool was
    and still is being created (``was_creating``: the pass before; the pass that starts a creation tells
    it at once) and the oldest held Event waited less than ``limit`` (``held_for``; None: none held)."""
    if deferred:
        return True
    if not (creating and was_creating):
        return False
    return held_for is None or held_for < limit


def pace_events(
    held: Sequence[Event], new: Sequence[Event], *, hold: bool
) -> tuple[list[Event], list[Event]]:
    """Pure: the Events to post now and those to hold, given the ones ``held`` from earlier passes and this
    pass's ``new`` ones: to ``hold`` (``hold_events``), the Normal ones wait; else everything goes, one
    Event per Normal reason across the passes (``coalesce``)."""
    if hold:
        return [e for e in new if e.type != "Normal"], [*held, *(e for e in new if e.type == "Normal")]
    return coalesce([*held, *new]), []
