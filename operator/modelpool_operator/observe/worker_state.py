"""A worker's state: one pure function from a pod (a plain dict) and its last ``/stats`` to a state.

``observe_worker`` is the only place that decides which of the worker states a worker is in, with a
reason a user can act on.  It covers every pod shape the kubelet (or KWOK's chaos stages) can produce:

* Pending: not started yet (scheduling, image pull, container creation); reason Unschedulable once the
  scheduler has failed to place it for longer than ``unschedulable_timeout_s``.
* Loading / Ready / Processing / Idle: the server's own state from ``/stats`` (one writer per fact);
  without stats, the container's readiness decides between Loading and Ready.
* Evicting: the pod is being deleted, or the operator annotated it for eviction, or the server drains.
* Dead: the pod is gone or its server exited cleanly.
* Failed: LoadFailed (exit code ``EXIT_LOAD_FAILED``, the termination message), InferenceWedged and
  DrainTimedOut (the server's exits 7 and 6, the termination message), OOMKilled,
  CrashLoopBackOff, ImagePullBackOff/ErrImagePull, other non-zero exits, kubelet eviction, Unresponsive
  (only when the node/kubelet says so).

An unreachable ``/stats`` (``stats is None``) never makes a worker Failed: liveness is the kubelet's call,
and KWOK pods have no server behind their IP.  A Failed or Dead worker is charged no memory.

The accelerator memory a worker reports (reserved now, and its peak) is read only for pods that request an
accelerator: a CPU worker has none to report, whatever its ``/stats`` says.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from modelpool_contract.api import MeasuredMemory, WorkerGeneration, WorkerStatus
from modelpool_contract.exits import EXIT_DRAIN_TIMED_OUT, EXIT_INFERENCE_WEDGED, EXIT_LOAD_FAILED
from modelpool_contract.labels import (
    ANNOTATION_EVICTING,
    ANNOTATION_EVICTING_SINCE,
    LABEL_POOL,
    LABEL_SERVING,
    LABEL_TEMPLATE_HASH,
    SERVER_CONTAINER,
)
from modelpool_contract.messages import fit_message
from modelpool_contract.quantity import QuantityError, format_quantity, parse_quantity
from modelpool_contract.states import (
    ACTIVE_STATES,
    CHARGED_STATES,
    EVICTABLE_STATES,
    SERVING_STATES,
    WorkerState,
)
from modelpool_contract.stats import WorkerStats
from modelpool_contract.times import parse_time, rfc3339
from modelpool_operator.settings import DEFAULT_UNSCHEDULABLE_TIMEOUT_S

# Waiting reasons that mean the container will not start without someone changing something.
_FAILED_WAITING = {
    "CrashLoopBackOff": "CrashLoopBackOff",
    "ImagePullBackOff": "ImagePullBackOff",
    "ErrImagePull": "ImagePullBackOff",
    "ErrImageNeverPull": "ImagePullBackOff",
    "InvalidImageName": "InvalidImageName",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerError",
    "RunContainerError": "RunContainerError",
}
# Pod/condition reasons by which the node lifecycle controller says the kubelet stopped answering.
_UNRESPONSIVE_REASONS = {"NodeLost", "NodeNotReady", "Unreachable"}
# Server states the operator takes from /stats; Pending and Dead are the cluster's word, not the server's.
_FROM_SERVER: frozenset[WorkerState] = frozenset(
    {"Loading", "Ready", "Processing", "Idle", "Sleeping", "Waking", "Evicting", "Failed"}
)
#: The reasons a Failed worker can carry (``_terminated_failure``, ``_FAILED_WAITING``, the server's own,
#: the node's): a bounded set, so a metric may be labelled by them.
FAILURE_REASONS: frozenset[str] = frozenset(
    {
        "OOMKilled",
        "LoadFailed",
        "InferenceWedged",
        "DrainTimedOut",
        "ContainerCannotRun",
        "StartError",
        "Error",
        "Evicted",
        "Failed",
        "Unresponsive",
        "ServerFailed",
        *_FAILED_WAITING.values(),
    }
)


@dataclass(frozen=True)
class LifecycleSettings:
    """Tunables of the state decision (the operator maps its configuration onto this)."""

    # A pod the scheduler cannot place for this long is reported with reason Unschedulable.
    unschedulable_timeout_s: float = DEFAULT_UNSCHEDULABLE_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class ObservedWorker:
    """A worker as observed in one pass: its state and everything the planner and status need."""

    name: str
    namespace: str
    pool: str
    state: WorkerState
    reason: str | None = None
    message: str | None = None
    since: datetime | None = None
    node: str | None = None
    # Bytes charged against the budget now (0 when Failed/Dead); ``requested`` is what it would be.
    memory: int = 0
    requested_memory: int = 0
    queue_depth: int | None = None
    in_flight: int | None = None
    last_request_time: datetime | None = None
    restarts: int = 0
    load_progress: float | None = None
    # While Loading an hf:// model: bytes of its files in the cache so far, and of all of them.
    downloaded_bytes: int | None = None
    download_total_bytes: int | None = None
    template_hash: str | None = None
    # Carries the serving label (the pool's Service routes to it when ready).
    serving: bool = True
    # The operator's eviction annotation (reason), and when it was set.
    evicting_reason: str | None = None
    evicting_since: datetime | None = None
    deleting: bool = False
    created: datetime | None = None
    stats_known: bool = False
    uid: str | None = None
    # When the pod's Ready condition last became True (None while not ready).
    ready_since: datetime | None = None
    # Accelerator memory the server reports (bytes): reserved now and the most it ever reserved; None on
    # CPU pods and while unknown.
    accelerator_reserved: int | None = None
    accelerator_peak: int | None = None
    # The server's counters of admitted and refused requests, and its clock when it answered (Unix
    # seconds): the autoscaler turns the refusals into a rate between passes.
    requests_total: int | None = None
    rejected_total: int | None = None
    stats_time: float | None = None
    # A text-generation worker's engine (None: not a generating model, or unknown), its running
    # generations, the KV-cache tokens they reserve and the cache's size (None without the figures).
    generation_engine: str | None = None
    generations_running: int | None = None
    kv_cache_reserved: int | None = None
    kv_cache_tokens: int | None = None
    # The LoRA adapters it holds in memory (None: it declares none, or unknown).
    adapters: tuple[str, ...] | None = None
    # Its claim of work (Processing, requests in flight or queued) has outlasted what the operator believes
    # (``observe.claims``): counted as Idle, and its figures no longer keep it from eviction.
    claim_expired: bool = False
    # A shared pool's replica (``observe.hosts.hosted_workers``): the index of its host pod's device that
    # holds the model, as the host reports it.
    device: int | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, pod name)."""
        return (self.namespace, self.name)

    @property
    def pool_key(self) -> tuple[str, str]:
        """(namespace, pool name)."""
        return (self.namespace, self.pool)

    @property
    def active(self) -> bool:
        """Counts towards the pool's workers: exists, not failed, not on its way out."""
        return self.state in ACTIVE_STATES

    @property
    def serving_state(self) -> bool:
        """Can answer requests (Ready, Processing, Idle)."""
        return self.state in SERVING_STATES

    @property
    def evictable(self) -> bool:
        """May be chosen for eviction: never Loading or Processing (their work would be lost), nor with
        requests in flight or queued, unless that claim is no longer believed (``observe.claims``)."""
        if self.state not in EVICTABLE_STATES:
            return False
        return self.claim_expired or (not (self.in_flight or 0) and not (self.queue_depth or 0))

    @property
    def kv_cache_use(self) -> float | None:
        """The share of the worker's KV cache its running generations reserve (None: not reported)."""
        if self.kv_cache_reserved is None or not self.kv_cache_tokens:
            return None
        return min(1.0, max(0.0, self.kv_cache_reserved / self.kv_cache_tokens))

    def idle_since(self) -> datetime | None:
        """Since when the worker has been able to serve but got no request: the later of its last request
        and the moment its pod became ready (a worker that never served is idle from when it became
        ready, not from its creation, which would count the model load as idle time).  Without either,
        the state's ``since`` (conservative: the clock restarts, never an early eviction)."""
        known = [t for t in (self.last_request_time, self.ready_since) if t is not None]
        return max(known) if known else (self.since or self.created)

    def to_status(self) -> WorkerStatus:
        """The ``status.workers[]`` entry."""
        return WorkerStatus(
            name=self.name,
            state=self.state,
            since=rfc3339(self.since),
            node=self.node,
            memory=format_quantity(self.memory),
            queue_depth=self.queue_depth,
            last_request_time=rfc3339(self.last_request_time),
            restarts=self.restarts,
            reason=self.reason,
            message=self.message,
            load_progress=self.load_progress,
            downloaded_bytes=self.downloaded_bytes,
            download_total_bytes=self.download_total_bytes,
            template_hash=self.template_hash,
            accelerator_memory=self.measured_memory(),
            generation=self.generation_status(),
            adapters=list(self.adapters) if self.adapters is not None else None,
        )

    def generation_status(self) -> WorkerGeneration | None:
        """The engine figures for the worker's status entry (None: not a generating model, or unknown)."""
        if self.generation_engine is None:
            return None
        use = self.kv_cache_use
        return WorkerGeneration(
            engine=self.generation_engine,
            running=self.generations_running,
            tokens_in_flight=self.kv_cache_reserved,
            kv_cache_tokens=self.kv_cache_tokens,
            kv_cache_use=round(use, 4) if use is not None else None,
        )

    def measured_memory(self) -> MeasuredMemory | None:
        """The accelerator memory the worker reports, for its status entry (None: not measured)."""
        if self.accelerator_reserved is None:
            return None
        peak = self.accelerator_peak
        return MeasuredMemory(
            reserved=format_quantity(self.accelerator_reserved),
            reserved_bytes=self.accelerator_reserved,
            peak=format_quantity(peak) if peak is not None else None,
            peak_bytes=peak,
        )


# ---- reading the pod -----------------------------------------------------------------------------------


def _server_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == SERVER_CONTAINER:
            return dict(status)
    return dict(statuses[0]) if statuses else {}


def requested_memory(pod: Mapping[str, Any]) -> int:
    """Bytes a worker is charged when its owner tells nothing (``budget.worker_charge``): the server
    container's memory limit (or request). Never the ``modelpool.dev/memory-bytes`` annotation: anyone who
    may patch the pod may write that."""
    containers = (pod.get("spec") or {}).get("containers") or []
    chosen = next((c for c in containers if c.get("name") == SERVER_CONTAINER), None)
    if chosen is None and containers:
        chosen = containers[0]
    resources = (chosen or {}).get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get("memory")
        if value is not None:
            try:
                return parse_quantity(value)
            except QuantityError:
                continue
    return 0


def requests_accelerator(pod: Mapping[str, Any]) -> bool:
    """The pod asks for an accelerator (``nvidia.com/gpu`` or another ``*/gpu`` extended resource)."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for kind in ("limits", "requests"):
            for name, value in (resources.get(kind) or {}).items():
                if str(name).endswith("/gpu") and str(value) not in ("0", ""):
                    return True
    return False


def _accelerator_memory(pod: Mapping[str, Any], report: WorkerStats | None) -> tuple[int | None, int | None]:
    """(reserved, peak) accelerator bytes the server reports; (None, None) on CPU pods or when unknown."""
    if report is None or report.memory is None or not requests_accelerator(pod):
        return None, None
    return report.memory.gpu_reserved_bytes, report.memory.gpu_peak_reserved_bytes


def _clip(message: Any) -> str | None:
    if message is None:
        return None
    text = str(message).strip()
    if not text:
        return None
    return fit_message(text)


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class _PodFacts:
    """What the state decision reads from one pod."""

    phase: str
    created: datetime | None
    deletion: datetime | None
    terminated: Mapping[str, Any] | None
    waiting: Mapping[str, Any] | None
    running: Mapping[str, Any] | None
    last_terminated: Mapping[str, Any] | None
    container_ready: bool
    ready: Mapping[str, Any] | None
    scheduled: Mapping[str, Any] | None
    pod_reason: str | None
    pod_message: str | None
    node: str | None
    evicting_reason: str | None
    evicting_since: datetime | None

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> _PodFacts:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        status = pod.get("status") or {}
        container = _server_container(pod)
        state = container.get("state") or {}
        return cls(
            phase=status.get("phase") or "Pending",
            created=parse_time(meta.get("creationTimestamp")),
            deletion=parse_time(meta.get("deletionTimestamp")),
            terminated=state.get("terminated"),
            waiting=state.get("waiting"),
            running=state.get("running"),
            last_terminated=(container.get("lastState") or {}).get("terminated"),
            container_ready=container.get("ready") is True,
            ready=_condition(pod, "Ready"),
            scheduled=_condition(pod, "PodScheduled"),
            pod_reason=status.get("reason"),
            pod_message=status.get("message"),
            node=(pod.get("spec") or {}).get("nodeName") or None,
            evicting_reason=annotations.get(ANNOTATION_EVICTING) or None,
            evicting_since=parse_time(annotations.get(ANNOTATION_EVICTING_SINCE)),
        )

    @property
    def ready_true(self) -> bool:
        return self.ready is not None and self.ready.get("status") == "True"

    @property
    def ready_since(self) -> datetime | None:
        """When the pod's Ready condition last became True (None while not ready)."""
        return parse_time(self.ready.get("lastTransitionTime")) if self.ready and self.ready_true else None


# ---- the decision --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Verdict:
    state: WorkerState
    reason: str | None
    message: str | None
    since: datetime | None


#: The server's own exits that name their failure (the termination message says the rest).
_SERVER_EXIT_REASONS: dict[int, str] = {
    EXIT_INFERENCE_WEDGED: "InferenceWedged",
    EXIT_DRAIN_TIMED_OUT: "DrainTimedOut",
}


def _terminated_failure(terminated: Mapping[str, Any]) -> tuple[str, str | None]:
    """(reason, message) for a container that terminated with a failure."""
    code = _int_or_none(terminated.get("exitCode"))
    kubelet_reason = terminated.get("reason") or ""
    message = _clip(terminated.get("message"))
    if kubelet_reason == "OOMKilled":
        return (
            "OOMKilled",
            message or f"the server was killed for exceeding its memory limit (exit code {code})",
        )
    if code == EXIT_LOAD_FAILED:
        return "LoadFailed", message or f"the model failed to load (exit code {code}); see the worker's logs"
    if code in _SERVER_EXIT_REASONS:
        reason = _SERVER_EXIT_REASONS[code]
        return reason, message or f"the server exited with {code} ({reason}); see the worker's logs"
    if kubelet_reason in ("ContainerCannotRun", "StartError"):
        return kubelet_reason, message or f"the container could not start (exit code {code})"
    detail = f"exit code {code}" + (f" ({kubelet_reason})" if kubelet_reason else "")
    return "Error", f"{detail}: {message}" if message else f"the server exited with {detail}"


def _leaving(pod: _PodFacts, now: datetime) -> _Verdict | None:
    """1. The pod is on its way out (deleted) or already finished cleanly."""
    if pod.deletion is not None:
        if pod.terminated is not None or pod.phase in ("Succeeded", "Failed"):
            return _Verdict("Dead", "Deleted", "the worker pod is being removed", pod.deletion)
        reason = pod.evicting_reason or "Deleting"
        return _Verdict("Evicting", reason, "the worker pod is being deleted", pod.deletion)
    exited_cleanly = pod.terminated is not None and _int_or_none(pod.terminated.get("exitCode")) == 0
    if pod.phase == "Succeeded" or exited_cleanly:
        finished = parse_time((pod.terminated or {}).get("finishedAt")) or now
        return _Verdict("Dead", "Completed", "the server exited cleanly", finished)
    return None


def _kubelet_failure(pod: _PodFacts, now: datetime) -> _Verdict | None:
    """2. Failures the kubelet (or the node lifecycle controller) reports."""
    if pod.terminated is not None:
        reason, message = _terminated_failure(pod.terminated)
        return _Verdict("Failed", reason, message, parse_time(pod.terminated.get("finishedAt")) or now)
    if pod.waiting is not None and pod.waiting.get("reason") in _FAILED_WAITING:
        reason = _FAILED_WAITING[str(pod.waiting["reason"])]
        message = _clip(pod.waiting.get("message"))
        previous = pod.last_terminated
        if reason == "CrashLoopBackOff" and previous is not None:
            prev_reason, prev_message = _terminated_failure(previous)
            message = f"{prev_reason}: {prev_message}" if prev_message else prev_reason
        since = parse_time(previous and previous.get("finishedAt")) or now
        return _Verdict("Failed", reason, message, since)
    if pod.phase == "Failed":
        reason = pod.pod_reason or "Failed"
        if reason in _UNRESPONSIVE_REASONS:
            reason = "Unresponsive"
        return _Verdict("Failed", reason, pod.pod_message or "the pod failed", now)
    ready = pod.ready
    if (
        pod.phase == "Running"
        and ready is not None
        and ready.get("status") != "True"
        and (ready.get("reason") in _UNRESPONSIVE_REASONS or pod.pod_reason in _UNRESPONSIVE_REASONS)
    ):
        message = ready.get("message") or "the node stopped reporting the worker's status"
        return _Verdict("Failed", "Unresponsive", message, parse_time(ready.get("lastTransitionTime")) or now)
    return None


def _not_started(pod: _PodFacts, now: datetime, settings: LifecycleSettings) -> _Verdict | None:
    """3. Not started yet: scheduling, image pull, container creation."""
    if pod.phase != "Pending" and pod.running is not None:
        return None
    scheduled = pod.scheduled
    if scheduled is not None and scheduled.get("status") == "False":
        waited = (now - pod.created).total_seconds() if pod.created else 0.0
        if scheduled.get("reason") == "Unschedulable" and waited >= settings.unschedulable_timeout_s:
            return _Verdict("Pending", "Unschedulable", scheduled.get("message"), pod.created)
        return _Verdict("Pending", "Scheduling", scheduled.get("message"), pod.created)
    if pod.waiting is not None:
        reason = pod.waiting.get("reason") or "ContainerCreating"
        return _Verdict("Pending", reason, pod.waiting.get("message"), pod.created)
    return _Verdict("Pending", "Scheduled" if pod.node else "Scheduling", None, pod.created)


def _running(pod: _PodFacts, stats: WorkerStats | None, now: datetime) -> _Verdict:
    """4. Running: evicted by the operator, else the server's own state when known (one writer per fact),
    else the container's readiness."""
    started = parse_time((pod.running or {}).get("startedAt")) or pod.created
    if pod.evicting_reason is not None:
        evicting_since = pod.evicting_since or now
        return _Verdict(
            "Evicting", pod.evicting_reason, "the operator is draining this worker", evicting_since
        )
    if stats is not None:
        server_state = stats.state if stats.state in _FROM_SERVER else None
        since = parse_time(stats.state_since)
        if server_state == "Failed":
            reason = "LoadFailed" if stats.load_error else "ServerFailed"
            return _Verdict("Failed", reason, stats.load_error or "the server reports Failed", since or now)
        if server_state == "Evicting":
            return _Verdict("Evicting", "Draining", "the server is draining", since or now)
        if server_state == "Loading":
            return _Verdict("Loading", "LoadingModel", None, since or started)
        if server_state is not None:
            return _Verdict(server_state, None, None, since or started)
    if pod.container_ready or pod.ready_true:
        ready_at = parse_time(pod.ready.get("lastTransitionTime")) if pod.ready else None
        return _Verdict("Ready", None, None, ready_at or started)
    return _Verdict("Loading", "Starting", None, started)


def _decide(
    pod: _PodFacts, stats: WorkerStats | None, now: datetime, settings: LifecycleSettings
) -> _Verdict:
    return (
        _leaving(pod, now)
        or _kubelet_failure(pod, now)
        or _not_started(pod, now, settings)
        or _running(pod, stats, now)
    )


def _load_progress(state: WorkerState, stats: WorkerStats | None) -> float | None:
    if state != "Loading" or stats is None or stats.load_progress is None:
        return None
    return min(1.0, max(0.0, stats.load_progress))


def _download(state: WorkerState, stats: WorkerStats | None) -> tuple[int | None, int | None]:
    """(downloaded, total) bytes while Loading, once the server knows what its download needs."""
    download = stats.download if stats is not None else None
    if state != "Loading" or download is None or download.total_bytes is None:
        return None, None
    return download.downloaded_bytes, download.total_bytes


def observe_worker(
    pod: Mapping[str, Any],
    stats: Mapping[str, Any] | None,
    now: datetime,
    settings: LifecycleSettings | None = None,
    charge: int | None = None,
) -> ObservedWorker:
    """The worker behind ``pod`` as of ``now``.

    ``pod`` is the Pod as a plain dict (API JSON, camelCase); ``stats`` the worker's last ``/stats`` JSON,
    or None when unknown (never scraped, unreachable, KWOK); ``charge`` the bytes its owner says it is
    charged while it holds memory (``budget.worker_charge``; None: its container's, ``requested_memory``).
    Pure: no I/O, no clock.
    """
    facts = _PodFacts.of(pod)
    report = WorkerStats.parse(stats)
    verdict = _decide(facts, report, now, settings or LifecycleSettings())
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    requested = charge if charge is not None else requested_memory(pod)
    reserved, peak = _accelerator_memory(pod, report)
    downloaded, download_total = _download(verdict.state, report)
    return ObservedWorker(
        name=str(meta.get("name") or ""),
        namespace=str(meta.get("namespace") or ""),
        pool=str(labels.get(LABEL_POOL) or ""),
        state=verdict.state,
        reason=verdict.reason,
        message=_clip(verdict.message),
        since=verdict.since,
        node=facts.node,
        memory=requested if verdict.state in CHARGED_STATES else 0,
        requested_memory=requested,
        queue_depth=report.queue_depth if report else None,
        in_flight=report.in_flight if report else None,
        last_request_time=parse_time(report.last_request_time) if report else None,
        restarts=_int_or_none(_server_container(pod).get("restartCount")) or 0,
        load_progress=_load_progress(verdict.state, report),
        downloaded_bytes=downloaded,
        download_total_bytes=download_total,
        template_hash=labels.get(LABEL_TEMPLATE_HASH),
        serving=str(labels.get(LABEL_SERVING, "")).lower() == "true",
        evicting_reason=facts.evicting_reason,
        evicting_since=facts.evicting_since,
        deleting=facts.deletion is not None,
        created=facts.created,
        stats_known=report is not None,
        uid=meta.get("uid"),
        ready_since=facts.ready_since,
        accelerator_reserved=reserved,
        accelerator_peak=peak,
        requests_total=report.requests_total if report else None,
        rejected_total=report.rejected_total if report else None,
        stats_time=report.time if report else None,
        **_generation(report),
    )


def _generation(report: WorkerStats | None) -> dict[str, Any]:
    """The ``ObservedWorker`` fields of the server's ``generation`` figures (all None without them)."""
    figures = report.generation if report is not None else None
    if figures is None or figures.engine is None:
        return {}
    return {
        "generation_engine": figures.engine,
        "generations_running": figures.running,
        "kv_cache_reserved": figures.kv_cache_reserved_tokens,
        "kv_cache_tokens": figures.kv_cache_tokens,
        "adapters": figures.adapters,
    }
