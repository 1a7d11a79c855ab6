"""When a pool's status is written (issue 36: creation at the cluster's pace), pure.

A status is written only when it changed (``effects.apply``: a merge patch against the last write). While a
pool is only *being created* (``creating``: some workers still Pending, waiting to be scheduled and
started, and every other one serving) its workers' progress is coalesced: at most one write every
``interval`` seconds (``status_delay``; the operator's setting ``creating_status_interval_seconds``, 5 s),
so a pool of ten workers whose pods are bound and made Ready one event at a time costs a few status
writes, not one a pass, while the scheduler and the kubelets (or KWOK) are busiest. Anything else is
written at once: the first status, a worker Loading, failing or gone, the pool settled (nothing Pending
any more), so no state a user or a test waits for is held back.

A pass's Normal Events (``WorkerReady``, ...) wait while its status is held, and, once the pass that
started the creation has told its decision (``ScalingUp``, ``CreatingWorker``), for as long as the pool is
being created (``hold_events``): the creation's ``WorkerReady`` Events go as one, with the status write
that settles the pool, instead of one with each paced write. At most ``CREATING_EVENTS_HOLD_S`` (a pool
that stays Pending still tells its progress). Held Events go one per reason (``pace_events``); Warnings
are never held.
"""

from __future__ import annotations

from collections.abc import Sequence

from modelpool_contract.api import ModelPoolStatus
from modelpool_contract.states import SERVING_STATES
from modelpool_operator.planner.draft import Event
from modelpool_operator.planner.status import coalesce

#: While a pool is being created, its Normal Events are held at most this long (seconds).
CREATING_EVENTS_HOLD_S = 60.0


def creating(status: ModelPoolStatus) -> bool:
    """Pure: some workers are Pending and every other one serves: the pool only waits for pods to be
    scheduled and started."""
    states = [w.state for w in status.workers]
    return "Pending" in states and all(s == "Pending" or s in SERVING_STATES for s in states)


def status_delay(
    *, changed: bool, creating: bool, since_write: float | None, interval: float
) -> float | None:
    """Pure: None: nothing to write; 0: write now; else the seconds until the change may be written (a
    creating pool's status written ``since_write`` seconds ago; None: never by this process)."""
    if not changed:
        return None
    if not creating or since_write is None or since_write >= interval:
        return 0.0
    return interval - since_write


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
