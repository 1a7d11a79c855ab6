"""What one planning pass produces (``Plan`` and its effects) and the accumulator it is built in (``Draft``).

The phases (``planner.phases``, ``planner.status``) read the draft's inputs and add to its lists; only
``Draft.remove`` takes a worker out of the active sets, so every removal is recorded the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from modelpool_contract.api import ModelPoolStatus, WorkerStatus
from modelpool_contract.states import WorkerState
from modelpool_operator.budget import Ledger, Reservation
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.pool import OtherPool, PoolView, worker_name
from modelpool_operator.settings import DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_CAP_S

# Eviction reasons (the value of the modelpool.dev/evicting annotation).
EVICT_IDLE = "IdleTimeout"
EVICT_PREEMPTED = "Preempted"
EVICT_ROLLOVER = "RollOver"
EVICT_SCALE_DOWN = "ScaleDown"
# Evictions after which the pool should not bring the worker back by itself.
SHRINKING_EVICTIONS = (EVICT_IDLE, EVICT_PREEMPTED)


EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the pool."""

    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class PlannerSettings:
    """Tunables of the planner (the operator maps its configuration onto this)."""

    backoff_base_s: float = DEFAULT_BACKOFF_BASE_S
    backoff_cap_s: float = DEFAULT_BACKOFF_CAP_S
    # The failure count resets only once every serving worker has served this long (as the kubelet
    # resets CrashLoopBackOff only after a container ran for a while): a worker that becomes Ready and
    # then crashes at once must still back off longer each time, not restart at the base delay forever.
    backoff_reset_after_s: float = 60.0
    # After an eviction drops the serving label, wait this long (endpoints propagate) before deleting.
    drain_grace_s: float = 5.0
    # Roll-over creates at most this many workers above the target.
    max_surge: int = 1


@dataclass(frozen=True)
class LoadSample:
    """The pool's load at one pass, in the unit of ``spec.autoscaling.metric`` (``planner.autoscale``):
    requests in flight plus queued over its serving workers (or their reserved KV-cache tokens, or their
    KV-cache use in percent), plus the refused ones' estimated share and the requests held at the
    gateway."""

    at: datetime
    load: float
    metric: str = "requests"


@dataclass(frozen=True)
class CounterSample:
    """A serving worker's ``/stats`` counters at one scrape, and the refusals measured over the interval
    that ended at it (zero for the first scrape of a worker process: a baseline).

    ``uid`` and ``restarts`` tell a new process (a new pod under the same name, a restarted container),
    whose counters start again from zero; ``at`` is the server's clock when it answered, so two passes
    that see the same scrape see the same rates."""

    uid: str | None
    restarts: int
    at: float
    requests: int
    rejected: int
    # Requests refused per second over the interval, and refused per admitted request (admitted counted
    # as at least one).
    refused_per_s: float = 0.0
    refused_ratio: float = 0.0


@dataclass(frozen=True)
class Create:
    """Create this worker pod (``build_worker_pod`` of the planned pool); reserve ``memory``."""

    name: str
    memory: int


@dataclass(frozen=True)
class Delete:
    """Delete this pod of the planned pool now."""

    name: str
    reason: str


@dataclass(frozen=True)
class Evict:
    """Start evicting a worker (possibly of another pool): ``resources.eviction_patch(reason, now, state)``;
    ``state`` is the worker's state as this pass observed it (recorded on the pod, for audits)."""

    namespace: str
    pool: str
    name: str
    reason: str
    state: WorkerState


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
    # The load samples of the autoscaler's windows, for the next pass (the pool's loop keeps them).
    load_window: tuple[LoadSample, ...] = ()
    # The serving workers' counters at this pass, by worker name, for the next pass's refusal rates.
    counters: Mapping[str, CounterSample] = field(default_factory=dict)

    @property
    def idle(self) -> bool:
        """Nothing to do this pass."""
        return not (self.create or self.delete or self.evict)


# ---- the accumulator ----------------------------------------------------------------------------------


@dataclass
class Backoff:
    """The failure backoff as it stands in this pass (starts from ``status.backoff``)."""

    failures: int = 0
    next_attempt: datetime | None = None
    last_worker: str | None = None
    last_reason: str | None = None
    last_message: str | None = None

    def due(self, now: datetime) -> bool:
        """No backoff is running: a replacement may be created now."""
        return self.next_attempt is None or self.next_attempt <= now


@dataclass
class Admission:
    """What ``admit`` found about the budget."""

    blocked: bool = False
    # Blocked, but memory is on its way (draining or preempted workers): the pool only has to wait.
    waiting_for_memory: bool = False
    # Blocked because the ModelBudget is invalid, or missing under missing_budget=refuse: nothing is
    # admitted (nor preempted, nor rolled over to make room) until it is fixed; ``closed_reason`` says which
    # (``budget.BUDGET_INVALID`` or ``BUDGET_MISSING``).
    budget_invalid: bool = False
    closed_reason: str = ""
    # Bytes the pool wants but could not get (its status.memory.waitingBytes).
    waiting_bytes: int = 0
    message: str = ""
    # Seconds until the backoff allows a creation (0: creations were not held back by it).
    backoff_wait: float = 0.0


@dataclass
class Scaling:
    """What the autoscaling phases found and decided (``status.autoscaling`` is built from it)."""

    window: tuple[LoadSample, ...] = ()
    observed_load: float | None = None
    # What the load counted besides the workers' queues: refused requests per second, and the requests
    # held at the gateway (None: not counted this pass).
    refused_per_s: float = 0.0
    held: int | None = None
    counters: dict[str, CounterSample] = field(default_factory=dict)
    recommended: int | None = None
    # The scale-down countdown: since when fewer workers were asked for, and the most asked meanwhile.
    down_since: datetime | None = None
    down_to: int | None = None
    # Set when this pass changed the count by load or by demand.
    last_scale_time: datetime | None = None
    # The demand that woke the pool from zero, while no worker it asked for exists yet.
    woken_by: datetime | None = None


@dataclass
class Draft:
    """One pass's plan while the phases build it.

    Built from the inputs (the pool, the observed workers, the ledger, the clock, the other pools, the
    settings, the load window and the workers' counters of earlier passes), which stay read-only:
    ``workers`` becomes this pool's workers sorted by name, ``in_flight`` its reservations.
    ``active``/``current``/``outdated`` start as the pool's active workers (current = built from the
    present template hash) and shrink as workers are removed; the lists of effects only grow.
    """

    pool: PoolView
    workers: list[ObservedWorker]
    ledger: Ledger
    now: datetime
    others: Sequence[OtherPool] = ()
    settings: PlannerSettings = field(default_factory=PlannerSettings)
    load_window: Sequence[LoadSample] = ()
    counters: Mapping[str, CounterSample] = field(default_factory=dict)
    # Worker names an object of someone else's holds (a create met it: ``effects.kube.create_pod``), or a
    # drain's eviction still holds in the pool's PodDisruptionBudget (``planner.disrupted``): never given to
    # a new worker, so the pool makes its workers under other names.
    taken: frozenset[str] = frozenset()
    # Reservations of this pool whose pods are not observed yet: creations in flight, counted as Pending.
    in_flight: list[Reservation] = field(init=False)
    target: int = field(init=False, default=0)
    active: list[ObservedWorker] = field(init=False)
    current: list[ObservedWorker] = field(init=False)
    outdated: list[ObservedWorker] = field(init=False)
    used_names: set[str] = field(init=False)
    events: list[Event] = field(init=False, default_factory=list)
    creates: list[Create] = field(init=False, default_factory=list)
    deletes: list[Delete] = field(init=False, default_factory=list)
    evicts: list[Evict] = field(init=False, default_factory=list)
    # Own workers whose eviction this pass decided -> the reason.
    evicting_now: dict[str, str] = field(init=False, default_factory=dict)
    requeue: list[float] = field(init=False, default_factory=list)
    failed: list[ObservedWorker] = field(init=False, default_factory=list)
    backoff: Backoff = field(init=False, default_factory=Backoff)
    admission: Admission = field(init=False, default_factory=Admission)
    scaling: Scaling = field(init=False, default_factory=Scaling)
    # The serving count when the roll-over in progress began (None: no roll-over), for status.rollout.
    ready_before_roll: int | None = field(init=False, default=None)
    # Why the roll-over cannot retire an outdated worker this pass (empty: it can, or none is left).
    roll_wait: str = field(init=False, default="")

    def __post_init__(self) -> None:
        pool = self.pool
        self.workers = sorted((w for w in self.workers if w.pool in (pool.name, "")), key=lambda w: w.name)
        self.in_flight = list(self.ledger.reservations_of(pool.key))
        self.active = [w for w in self.workers if w.active]
        self.current = [w for w in self.active if w.template_hash == pool.template_hash]
        self.outdated = [w for w in self.active if w.template_hash != pool.template_hash]
        self.used_names = {w.name for w in self.workers} | {r.worker for r in self.in_flight} | self.taken
        self.scaling.window = tuple(self.load_window)

    def before(self, name: str) -> WorkerStatus | None:
        """The worker as the last status recorded it."""
        return next((w for w in self.pool.status.workers if w.name == name), None)

    def state_before(self, name: str) -> WorkerState | None:
        entry = self.before(name)
        return entry.state if entry is not None else None

    def remove(self, worker: ObservedWorker, reason: str) -> None:
        """Take an active worker out: a worker that has not started serves nothing and is deleted; others
        are evicted (they drain first)."""
        if worker.state == "Pending":
            self.deletes.append(Delete(worker.name, reason))
        else:
            self.evicts.append(Evict(self.pool.namespace, self.pool.name, worker.name, reason, worker.state))
            self.evicting_now[worker.name] = reason
        self.active.remove(worker)
        (self.current if worker in self.current else self.outdated).remove(worker)

    def next_name(self) -> str:
        """The first free deterministic worker name of the current template (one held by someone else's pod,
        ``taken``, is not free)."""
        index = 0
        while True:
            candidate = worker_name(self.pool.name, self.pool.template_hash, index)
            if candidate not in self.used_names:
                self.used_names.add(candidate)
                return candidate
            index += 1
