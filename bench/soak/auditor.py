"""The soak's auditor: its own watches on pods, ModelPools and the ModelBudget, and the invariants it checks
at every event they deliver.

Watches: ``testkit.loopback.PodIPWatch`` (list, then watch; a fresh list after any failure, so an API
server restart loses nothing that exists at the next list), extended here to hand every pod to the
auditor (``PodEvents``, which keeps the guard's loopback record too) and, for the custom resources, to
list and watch them instead (``ObjectEvents``).

Invariants (each violation is kept with the time, the rule, what broke it and the event that showed it):

* budget: when a pod appears, the memory charged by the pods that hold memory (the operator's contract:
  annotation ``modelpool.dev/memory-bytes``; a pod whose phase ended or whose container terminated is
  charged nothing, as the operator charges a Failed or Dead worker) is at most the budget.  Right after the
  soak shrinks the budget the pods admitted before still count, so the limit is the largest budget in
  force during the last ``BUDGET_LAG_S`` seconds: what a new admission can have been judged against.
* eviction: when the operator marks a pod for eviction (annotation ``modelpool.dev/evicting``), the state
  it recorded in the same patch (``modelpool.dev/evicted-in-state``: what its own last ``/stats`` scrape
  and the pod showed when it decided) is present and is neither Loading nor Processing.  This is exact:
  the published ``status.workers`` lags the server (a loaded worker flips between Ready and Processing
  many times a second), the annotation is the operator's own observation.  The report notes the
  recorded states of the evictions it judged.  A deletion that no eviction mark preceded (the operator
  deletes workers that never started, and ended ones, directly) is judged on the pod's last state in its
  pool's ``status.workers``: not Loading; a pod whose pool the soak deleted (garbage collection) is not
  the operator's doing and is left out.
* requests: every request ended within its deadline plus ``GRACE_S`` with an answer (any status), or a
  client that hung up on purpose, or a connection error while a gateway kill was active.
* convergence, orphans, finalizers and RSS are judged at the end (``bench.soak.__main__``) through
  ``converged`` and ``rss_grew``, the pure checks below.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak.clients import Sent
from bench.soak.faults import FaultLog
from bench.soak.schedule import GATEWAY_KILL, WORKER_KILL
from modelpool_contract.labels import (
    ANNOTATION_EVICTED_IN_STATE,
    ANNOTATION_EVICTING,
    ANNOTATION_MEMORY,
    GROUP,
    LABEL_POOL,
)
from modelpool_contract.quantity import QuantityError, parse_quantity
from modelpool_contract.states import SERVING_STATES
from testkit.loopback import PodIPWatch
from testkit.watch import ListWatch

BUDGET_LAG_S = 10.0
GRACE_S = 5.0
#: Slack around a gateway kill's window: a client may have read the old address just before it closed.
CONNECTION_SLACK_S = 1.0
#: States the operator never evicts a worker in (judged on the state it recorded with the eviction).
NEVER_EVICTED = frozenset({"Loading", "Processing"})
#: States an unmarked deletion is judged against, on the published status (which lags: Loading only, a
#: state a worker stays in for seconds, unlike Processing).
NEVER_DELETED = frozenset({"Loading"})

Obj = Mapping[str, Any]


# ---- the decisions (pure) ----------------------------------------------------------------------------
def ended(pod: Obj) -> bool:
    """The pod's phase ended or a container terminated: the operator charges it nothing (Failed/Dead)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    return any((cs.get("state") or {}).get("terminated") for cs in status.get("containerStatuses") or [])


def charge(pod: Obj) -> int:
    """Bytes a worker pod is charged against the budget (the operator's annotation), 0 once it ended."""
    if ended(pod):
        return 0
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_MEMORY, "0")
    try:
        return parse_quantity(str(raw))
    except QuantityError:
        return 0


def budget_limit(history: Iterable[tuple[float, int]], now: float, lag: float = BUDGET_LAG_S) -> int | None:
    """The largest budget in force during [now - lag, now] (history: (time set, bytes), any order)."""
    entries = sorted(history)
    before = [b for t, b in entries if t <= now - lag]
    recent = [b for t, b in entries if now - lag < t <= now]
    candidates = ([before[-1]] if before else []) + recent
    return max(candidates) if candidates else None


def eviction_begins(before: Obj | None, after: Obj | None) -> str | None:
    """What the operator did between two versions of a pod (None: no eviction or deletion began)."""
    if after is None:  # deleted
        if before is not None and not before["metadata"].get("deletionTimestamp"):
            return "deleted"
        return None
    was = (before or {}).get("metadata") or {}
    now = after["metadata"]
    if now.get("deletionTimestamp") and not was.get("deletionTimestamp"):
        return "deletion began"
    if (now.get("annotations") or {}).get(ANNOTATION_EVICTING) and not (was.get("annotations") or {}).get(
        ANNOTATION_EVICTING
    ):
        return f"marked for eviction ({now['annotations'][ANNOTATION_EVICTING]})"
    return None


def eviction_fault(pod: Obj) -> str | None:
    """What is wrong with the eviction marked on ``pod`` (None: nothing): the state the operator recorded
    when it decided is missing, or is one it never evicts in."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    reason = annotations.get(ANNOTATION_EVICTING)
    state = annotations.get(ANNOTATION_EVICTED_IN_STATE)
    if not state:
        return f"evicted ({reason}) without {ANNOTATION_EVICTED_IN_STATE}"
    if state in NEVER_EVICTED:
        return f"evicted ({reason}) while {state} (the operator's own observation)"
    return None


def request_outcome(sent: Sent, faults: FaultLog) -> tuple[str, str | None]:
    """(outcome, violation or None) of one ended request."""
    took = sent.end - sent.start
    if took > sent.deadline + GRACE_S:
        return (
            "late",
            f"{sent.client} -> {sent.pool}: ended after {took:.1f}s (deadline {sent.deadline:.0f}s)",
        )
    if sent.status is not None:
        return f"answered {sent.status}", None
    if sent.hung_up:
        return "client hung up", None
    if "no answer within" in sent.error:
        return "unanswered", f"{sent.client} -> {sent.pool}: {sent.error}"
    named = faults.active(sent.start - CONNECTION_SLACK_S, sent.end + CONNECTION_SLACK_S, (GATEWAY_KILL,))
    if named:
        return f"connection error ({GATEWAY_KILL})", None
    # A worker killed after the gateway relayed its answer's headers cuts the body: nothing is left to send
    # a status with, so the client sees the connection close (the gateway counts it as a relay error).
    cut = "without sending complete message body" in sent.error
    if cut and faults.active(sent.start - CONNECTION_SLACK_S, sent.end + CONNECTION_SLACK_S, (WORKER_KILL,)):
        return f"connection error ({WORKER_KILL})", None
    return (
        "connection error (no fault)",
        f"{sent.client} -> {sent.pool}: {sent.error} with no gateway fault active",
    )


def converged(pools: list[dict[str, Any]], pods: list[dict[str, Any]]) -> list[str]:
    """What keeps the soak's pools from having converged (empty: converged): each pool has exactly
    ``spec.replicas`` serving workers and pods, no pod is orphaned, no pool is stuck deleting."""
    problems = []
    names = {p["metadata"]["name"] for p in pools}
    for pool in pools:
        name, spec, status = pool["metadata"]["name"], pool["spec"], pool.get("status") or {}
        if pool["metadata"].get("deletionTimestamp"):
            problems.append(f"{name}: deleting, finalizers {pool['metadata'].get('finalizers')}")
            continue
        want = spec.get("replicas", 1)
        workers = status.get("workers") or []
        serving = [w for w in workers if w.get("state") in SERVING_STATES]
        own = [p for p in pods if p["metadata"]["labels"].get(LABEL_POOL) == name]
        if (
            len(serving) != want
            or len(workers) != want
            or len(own) != want
            or status.get("readyReplicas") != want
        ):
            states = sorted(str(w.get("state")) for w in workers)
            problems.append(f"{name}: want {want}, workers {states}, pods {len(own)}")
    for pod in pods:
        if pod["metadata"]["labels"].get(LABEL_POOL) not in names:
            problems.append(f"orphan pod {pod['metadata']['name']}")
    return problems


def rss_grew(start: int, end: int) -> bool:
    """RSS growth beyond noise: more than 64 MiB and more than half the start."""
    return end - start > max(64 * 2**20, start // 2)


# ---- the watches --------------------------------------------------------------------------------------
#: What Kopf logs when the API server refused one of the operator's Events (it is dropped, not retried).
LOST_EVENT = "Failed to post an event"


def lost_events(log: str) -> list[str]:
    """The operator log's lines telling of an Event the API server refused: each is one Event lost."""
    return [line for line in log.splitlines() if LOST_EVENT in line]


def object_watch(kubeconfig: Path, auditor: Auditor, plural: str) -> ListWatch:
    """List, then watch, a modelpool.dev resource (``plural``), every object to the auditor (a fresh list
    after any failure, so a control-plane restart loses nothing)."""
    return ListWatch(
        kubeconfig,
        "CustomObjectsApi",
        "list_cluster_custom_object",
        GROUP,
        "v1alpha1",
        plural,
        on_list=functools.partial(auditor.objects_listed, plural),
        on_event=functools.partial(auditor.object_event, plural),
        retry=True,
        watch_seconds=5,
        name=f"soak-{plural}",
    )


# ---- the auditor --------------------------------------------------------------------------------------
@dataclass
class Violation:
    at: float  # seconds since the soak began
    rule: str
    detail: str
    event: str


@dataclass
class Auditor:
    """Keeps what its watches saw and judges each event; thread-safe (three watch threads, the clients)."""

    faults: FaultLog
    budget_history: list[tuple[float, int]]
    began: float = field(default_factory=time.monotonic)
    violations: list[Violation] = field(default_factory=list)
    requests: Counter[str] = field(default_factory=Counter)
    events: Counter[str] = field(default_factory=Counter)
    noted: Counter[str] = field(default_factory=Counter)
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    states: dict[tuple[str, str], str] = field(default_factory=dict)
    deleted_pools: set[tuple[str, str]] = field(default_factory=set)
    # Unmarked deletions of Loading workers, confirmed at the end unless their pool was deleted.
    suspects: list[tuple[tuple[str, str], Violation]] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _watches: list[ListWatch] = field(default_factory=list)
    _pods: PodIPWatch | None = None

    def watch(self, kubeconfig: Path) -> None:
        self._watches = [object_watch(kubeconfig, self, p) for p in ("modelbudgets", "modelpools")]
        for w in self._watches:
            w.start(timeout=60)
        # The loopback guard's pod watch (its record kept), handing every pod to the auditor too.
        self._pods = PodIPWatch(kubeconfig, on_list=self.pods_listed, on_event=self.pod_event)
        self._pods.start(timeout=60)

    def stop(self) -> str:
        """Stop the watches; confirm the eviction suspects; returns the loopback guard's verdict."""
        for w in self._watches:
            w.stop()
        if self._pods is not None:
            self._pods.stop()
        with self._lock:
            for (namespace, pool), violation in self.suspects:
                if (namespace, pool) not in self.deleted_pools:
                    self.violations.append(violation)
        return self._pods.raise_for_violations() if self._pods is not None else ""

    def violate(self, rule: str, detail: str, event: str) -> None:
        with self._lock:
            self.violations.append(Violation(time.monotonic() - self.began, rule, detail, event))

    # ---- pods ----
    def pods_listed(self, pods: list[dict[str, Any]]) -> None:
        with self._lock:
            seen = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in pods}
            for key in [k for k in self.pods if k not in seen]:
                self.pod_event("DELETED", self.pods[key])
            for pod in pods:
                self.pod_event("LISTED", pod)

    def pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if LABEL_POOL not in (pod["metadata"].get("labels") or {}):
            return
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        with self._lock:
            self.events["pod"] += 1
            before = self.pods.get(key)
            after = None if kind == "DELETED" else pod
            if after is None:
                self.pods.pop(key, None)
            else:
                self.pods[key] = after
            what = f"pod {key[1]} {kind}"
            if before is None and after is not None:
                self._check_budget(what)
            began = eviction_begins(before, after)
            if began and before is not None:
                self._check_eviction(key, before, after, began, what)

    def _check_budget(self, what: str) -> None:
        now = time.monotonic()
        limit = budget_limit(self.budget_history, now)
        used = sum(charge(p) for p in self.pods.values())
        if limit is not None and used > limit:
            charged = sorted(f"{k[1]}={charge(p) / 2**30:g}Gi" for k, p in self.pods.items() if charge(p))
            self.violate(
                "budget", f"{used / 2**30:g} GiB charged > budget {limit / 2**30:g} GiB: {charged}", what
            )

    def _check_eviction(
        self,
        key: tuple[str, str],
        before: dict[str, Any],
        after: dict[str, Any] | None,
        began: str,
        what: str,
    ) -> None:
        if after is not None and began.startswith("marked for eviction"):
            self._check_marked(key, after, what)
            return
        if (before["metadata"].get("annotations") or {}).get(ANNOTATION_EVICTING):
            return  # the deletion that ends an eviction already judged when it was marked
        state = self.states.get(key)
        if ended(before) or state not in NEVER_DELETED:
            return
        pool = (key[0], before["metadata"]["labels"][LABEL_POOL])
        if pool in self.deleted_pools:
            return
        violation = Violation(
            time.monotonic() - self.began,
            "eviction",
            f"{key[1]} {began} while {state} (pool {pool[1]})",
            what,
        )
        self.suspects.append((pool, violation))

    def _check_marked(self, key: tuple[str, str], pod: dict[str, Any], what: str) -> None:
        """An eviction the operator marked: judged at once on the state it recorded with the mark."""
        fault = eviction_fault(pod)
        if fault:
            pool = pod["metadata"]["labels"][LABEL_POOL]
            self.violate("eviction", f"{key[1]} {fault} (pool {pool})", what)
        else:
            state = pod["metadata"]["annotations"][ANNOTATION_EVICTED_IN_STATE]
            self.noted[f"evictions judged, recorded state {state}"] += 1

    # ---- ModelPools and the ModelBudget ----
    def objects_listed(self, plural: str, objects: list[dict[str, Any]]) -> None:
        for obj in objects:
            self.object_event(plural, "LISTED", obj)

    def object_event(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        with self._lock:
            self.events[plural] += 1
            if plural == "modelbudgets":
                memory = (obj.get("spec") or {}).get("memory")
                if memory is not None and kind != "DELETED":
                    self._budget_seen(parse_quantity(str(memory)))
                return
            key = (str(meta.get("namespace")), str(meta.get("name")))
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                self.deleted_pools.add(key)
            for worker in (obj.get("status") or {}).get("workers") or []:
                self.states[(key[0], worker["name"])] = worker["state"]

    def _budget_seen(self, memory: int) -> None:
        latest = max(self.budget_history)[1] if self.budget_history else None
        if latest != memory:
            self.budget_history.append((time.monotonic(), memory))

    # ---- requests ----
    def judge_request(self, sent: Sent) -> None:
        outcome, violation = request_outcome(sent, self.faults)
        with self._lock:
            self.requests[outcome] += 1
        if violation:
            self.violate("request", violation, f"request {outcome}")
