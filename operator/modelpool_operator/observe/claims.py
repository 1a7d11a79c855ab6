"""What the operator believes of a worker's word about its own work (its ``/stats``), and for how long.

A worker's ``/stats`` is the worker's own claim: a server that is wedged, or one that lies, can say what
it likes. Two of its claims weigh on other pools and on the budget, so they are bounded here:

* **Busy** (state Processing, or requests in flight or queued): a busy worker is never chosen for
  eviction. The claim is believed for at most the pool's ``spec.queue.requestTimeoutSeconds`` plus
  ``PROCESSING_GRACE_S`` **without progress**, as the operator measured it (never the worker's own
  ``state_since``, unless that is older): no request of the pool may run longer, so a worker busy that
  long without finishing one is wedged (or lying), and counts as Idle for eviction (state Idle, reason
  ``ProcessingNotBelieved``, ``since`` when the claim began). It still serves, and its eviction drains it
  like any other. Progress is its ``requests_total`` (the requests it admitted) growing between two
  passes: a worker whose queue moves takes new requests, and each starts the clock again, so an honest
  worker busy for hours under steady traffic stays Processing and unevictable; one whose queue is stuck
  full admits none. A worker without the counter (an older server) is bounded from its first claim. (A
  wedged forward pass is the server's own to detect: it fails the worker.)
* **Load** (queued and in-flight requests): each is counted at most the pool's ``spec.queue.capacity``
  (a worker refuses the request past its queue's capacity, and what it computes came through that
  queue), so a made-up queue depth moves its own pool's autoscaler no further than that many requests
  per worker.

``believe`` is pure: it takes the previous pass's record of busy claims (``BusyClaim`` by worker name; on
a restart, the last status's Processing and ``ProcessingNotBelieved`` entries) and returns the workers as
the planner should see them, with the record for the next pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from modelpool_contract.api import ModelPoolSpec, WorkerStatus
from modelpool_contract.states import SERVING_STATES
from modelpool_contract.times import parse_time
from modelpool_operator.observe.worker_state import ObservedWorker

#: Added to the pool's request timeout before a busy claim stops being believed: a few scrape intervals
#: (the operator sees the end of a request only at the next scrape) and the server's own answer time.
PROCESSING_GRACE_S: Final = 30.0
#: The reason of a worker whose busy claim has outlasted its bound (``status.workers[].reason``).
REASON_NOT_BELIEVED: Final = "ProcessingNotBelieved"


@dataclass(frozen=True)
class BusyClaim:
    """Since when the worker (this pod: ``uid``) has claimed to be busy at every pass without progress, and
    its ``requests_total`` then (None: it reports none)."""

    uid: str | None
    since: datetime
    requests: int | None = None


def claim_bound_s(spec: ModelPoolSpec, grace_s: float = PROCESSING_GRACE_S) -> float:
    """Seconds a busy claim is believed: the pool's request timeout plus the grace (the operator's
    ``processingGraceSeconds``, ``PROCESSING_GRACE_S`` by default)."""
    return float(spec.queue.request_timeout_seconds) + grace_s


def claim_believed(since: datetime, now: datetime, bound_s: float) -> bool:
    """Whether a claim made continuously since ``since`` is still believed at ``now``."""
    return (now - since).total_seconds() <= bound_s


def claims_busy(worker: ObservedWorker) -> bool:
    """The worker says it is working: Processing, or serving with requests in flight or queued."""
    if worker.state == "Processing":
        return True
    working = (worker.in_flight or 0) > 0 or (worker.queue_depth or 0) > 0
    return worker.state in SERVING_STATES and working


def progressed(worker: ObservedWorker, recorded: BusyClaim) -> bool:
    """Whether the worker took requests since the recorded pass (its ``requests_total`` grew)."""
    now, then = worker.requests_total, recorded.requests
    return now is not None and then is not None and now > then


def busy_since(
    worker: ObservedWorker, recorded: BusyClaim | None, entry: WorkerStatus | None, now: datetime
) -> datetime:
    """Since when the busy ``worker`` has claimed to be without progress: the record of earlier passes
    (same pod; now when it progressed since). At first sight (a new pod, or after a restart): the last
    status's ``since`` when it was already not believed, else now; for a worker that reports no
    ``requests_total`` (no progress to judge by) also a Processing entry's ``since`` and its own, when
    older (a worker may only shorten its benefit of doubt). A worker that reports progress is not judged
    by how long it has been Processing: under steady traffic that is hours, and says nothing."""
    if recorded is not None and recorded.uid == worker.uid:
        return now if progressed(worker, recorded) else recorded.since
    start = now
    if entry is not None and entry.reason == REASON_NOT_BELIEVED:
        start = min(start, parse_time(entry.since) or now)
    if worker.requests_total is None:
        if entry is not None and entry.state == "Processing":
            start = min(start, parse_time(entry.since) or now)
        if worker.state == "Processing" and worker.since is not None:
            start = min(start, worker.since)
    return start


def bounded_load(worker: ObservedWorker, capacity: int) -> ObservedWorker:
    """``worker`` with its queued and in-flight requests each counted at most ``capacity`` (and never
    below zero)."""
    queued, flying = worker.queue_depth, worker.in_flight
    bounded_queued = None if queued is None else max(0, min(queued, capacity))
    bounded_flying = None if flying is None else max(0, min(flying, capacity))
    if (bounded_queued, bounded_flying) == (queued, flying):
        return worker
    return replace(worker, queue_depth=bounded_queued, in_flight=bounded_flying)


def believe(
    workers: Sequence[ObservedWorker],
    *,
    spec: ModelPoolSpec,
    claims: Mapping[str, BusyClaim],
    previous: Sequence[WorkerStatus],
    now: datetime,
    grace_s: float = PROCESSING_GRACE_S,
) -> tuple[list[ObservedWorker], dict[str, BusyClaim]]:
    """The pool's ``workers`` as the operator believes them (module doc), and the busy claims to carry to
    the next pass."""
    bound = claim_bound_s(spec, grace_s)
    entries = {entry.name: entry for entry in previous}
    believed: list[ObservedWorker] = []
    record: dict[str, BusyClaim] = {}
    for observed in workers:
        worker = bounded_load(observed, spec.queue.capacity)
        if claims_busy(worker):
            since = busy_since(worker, claims.get(worker.name), entries.get(worker.name), now)
            record[worker.name] = BusyClaim(worker.uid, since, worker.requests_total)
            if not claim_believed(since, now, bound):
                worker = not_believed(worker, since, now, bound, grace_s)
        believed.append(worker)
    return believed, record


def not_believed(
    worker: ObservedWorker,
    since: datetime,
    now: datetime,
    bound_s: float,
    grace_s: float = PROCESSING_GRACE_S,
) -> ObservedWorker:
    """The worker counted as Idle for eviction, with the reason (its figures kept for the load)."""
    busy_for = (now - since).total_seconds()
    message = (
        f"the worker has reported work (Processing, or requests in flight or queued) for {busy_for:.0f}s, "
        f"longer than any request may take (spec.queue.requestTimeoutSeconds plus {grace_s:g}s: "
        f"{bound_s:g}s): counted as Idle, so it may be evicted (it drains first)"
    )
    return replace(
        worker, state="Idle", reason=REASON_NOT_BELIEVED, message=message, since=since, claim_expired=True
    )
