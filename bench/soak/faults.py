"""The soak's fault actions and the log of when each was active.

Each action does its damage and, where the soak itself must undo it (a killed operator or gateway, a
stopped control plane), brings the component back and waits until it serves again.  ``FaultLog`` keeps
one window per fault, from the moment it struck until it was undone (a killed gateway: until its
successor answered /readyz), so the auditor can name the fault behind a client's connection error.  A fault
with nothing to act on (no worker running yet) is logged as skipped, not silently dropped.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.soak import schedule as s
from bench.soak.rig import NAMESPACE, Rig, kwok_pool, wait_seconds
from modelpool_contract.labels import LABEL_POOL
from testkit.kubectl import apply, is_ready
from testkit.services import POOLS, OperatorProcess, worker_pids

CHAOS_LABEL = "kwok.modelpool.test/chaos"
CHAOS = {s.KWOK_OOM: "oom", s.KWOK_CRASH: "crash", s.KWOK_LOAD_FAILED: "load-failed"}
CHURN_PREFIX = "churn-"


@dataclass
class Window:
    """One fault: its kind, what it hit, when it struck and when it was over (None: still active)."""

    kind: str
    target: str
    start: float
    end: float | None = None
    skipped: bool = False
    error: str = ""


class FaultLog:
    """Every fault's window (monotonic seconds), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.windows: list[Window] = []

    def open(self, kind: str, target: str) -> Window:
        window = Window(kind, target, time.monotonic())
        with self._lock:
            self.windows.append(window)
        return window

    def close(self, window: Window) -> None:
        with self._lock:
            window.end = time.monotonic()

    def active(self, start: float, end: float, kinds: tuple[str, ...]) -> list[Window]:
        """The faults of ``kinds`` that were active at some moment of [start, end]."""
        with self._lock:
            return [
                w
                for w in self.windows
                if w.kind in kinds and not w.skipped and w.start <= end and (w.end is None or w.end >= start)
            ]

    def counts(self) -> dict[str, tuple[int, int]]:
        """Kind -> (applied, skipped)."""
        out: dict[str, tuple[int, int]] = {}
        with self._lock:
            for w in self.windows:
                done, skipped = out.get(w.kind, (0, 0))
                out[w.kind] = (done + (not w.skipped), skipped + w.skipped)
        return out


def apply_fault(rig: Rig, log: FaultLog, fault: s.Fault, budget_history: list[tuple[float, int]]) -> Window:
    """Apply one fault; returns its (closed) window.  An action that fails (a component that does not come
    back, a command refused) is kept in ``window.error`` for the auditor, and the run goes on."""
    action = ACTIONS[fault.kind]
    window = log.open(fault.kind, "")
    try:
        window.target = action(rig, fault.pick, budget_history) or ""
        window.skipped = window.target == ""
    except Exception as exc:
        window.error = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        log.close(window)
    return window


def _running(rig: Rig, pools_prefix: str) -> list[dict[str, Any]]:
    return sorted(
        (
            p
            for p in rig.worker_pods()
            if p["metadata"]["labels"].get(LABEL_POOL, "").startswith(pools_prefix)
            and not p["metadata"].get("deletionTimestamp")
            and is_ready(p)
        ),
        key=lambda p: str(p["metadata"]["name"]),
    )


def kill_worker(rig: Rig, pick: int, _: Any) -> str:
    """SIGKILL the server process of a ready MiniLM worker on the process node."""
    pids: dict[str, int] = {}
    for pool in sorted({p["metadata"]["labels"][LABEL_POOL] for p in _running(rig, "minilm-")}):
        pids.update(worker_pids(rig.cluster, NAMESPACE, pool))
    if not pids:
        return ""
    name = sorted(pids)[pick % len(pids)]
    try:
        os.kill(pids[name], signal.SIGKILL)
    except ProcessLookupError:
        return ""
    return name


def kwok_chaos(kind: str) -> Any:
    def act(rig: Rig, pick: int, _: Any) -> str:
        """Label a ready KWOK worker with a chaos stage (hack/kwok/stages/chaos.yaml): its container ends
        as an OOM kill, a crash or a load failure a second later."""
        pods = _running(rig, "kwok-") + _running(rig, CHURN_PREFIX)
        if not pods:
            return ""
        name = pods[pick % len(pods)]["metadata"]["name"]
        rig.cluster.kubectl(
            "label", "pod", name, "-n", NAMESPACE, f"{CHAOS_LABEL}={CHAOS[kind]}", "--overwrite", check=False
        )
        return str(name)

    return act


def kill_operator(rig: Rig, pick: int, _: Any) -> str:
    """SIGKILL the operator, wait a moment (0-3 s), start a new one and wait for its start-up."""
    return _kill_and_restart(rig.operator, pick % 4, rig.start_operator)


def kill_gateway(rig: Rig, pick: int, _: Any) -> str:
    """SIGKILL the gateway (requests in flight get a connection error), wait 0-2 s, start a new one until
    ready."""
    return _kill_and_restart(rig.gateway, pick % 3, rig.start_gateway)


def _kill_and_restart(process: OperatorProcess | None, outage_s: float, start: Callable[[], object]) -> str:
    """SIGKILL ``process``; ``outage_s`` seconds without one (a delay drawn from the seed); ``start``."""
    if process is None:
        return ""
    pid = process.proc.pid
    process.kill()
    time.sleep(outage_s)
    start()
    return f"pid {pid}"


def restart_control_plane(rig: Rig, pick: int, _: Any) -> str:
    """Stop etcd, the API server and the other components (``kwokctl stop cluster``), keep them down a few
    seconds, start them again, and wait until the API server answers and the fake nodes renew their
    leases (KWOK moves pods again)."""
    since = rig.cluster.restart_control_plane(down_s=2 + pick % 5)
    wait_seconds(rig.api_answers, timeout=120, what="the API server answers after the restart")
    wait_seconds(lambda: rig.fake_nodes_back(since), timeout=120, what="the KWOK nodes renew their leases")
    return "etcd + kube-apiserver + controllers"


def edit_pool(rig: Rig, pick: int, _: Any) -> str:
    """Change a pool's queue capacity: the pod template changes, the workers roll over."""
    pools = sorted(p["metadata"]["name"] for p in rig.pools() if not p["metadata"].get("deletionTimestamp"))
    if not pools:
        return ""
    name = pools[pick % len(pools)]
    capacity = 16 + pick % 48
    patch = json.dumps({"spec": {"queue": {"capacity": capacity}}})
    rig.cluster.kubectl("patch", POOLS, name, "-n", NAMESPACE, "--type=merge", "-p", patch)
    return f"{name} queue.capacity={capacity}"


def create_pool(rig: Rig, pick: int, _: Any) -> str:
    name = f"{CHURN_PREFIX}{pick % 100000}"
    apply(rig.cluster, kwok_pool(name, 2), NAMESPACE)
    return name


def delete_pool(rig: Rig, pick: int, _: Any) -> str:
    """Delete a pool the soak created (the oldest), without waiting for its finalizer."""
    churn = sorted(
        (p for p in rig.pools() if p["metadata"]["name"].startswith(CHURN_PREFIX)),
        key=lambda p: str(p["metadata"]["creationTimestamp"]),
    )
    churn = [p for p in churn if not p["metadata"].get("deletionTimestamp")]
    if not churn:
        return ""
    name = str(churn[0]["metadata"]["name"])
    rig.cluster.kubectl("delete", POOLS, name, "-n", NAMESPACE, "--wait=false")
    return name


def set_budget(gib_of: Any) -> Any:
    def act(rig: Rig, _: int, history: list[tuple[float, int]]) -> str:
        gib = gib_of(rig)
        # Recorded before the change is asked for: the auditor judges against the larger of the two until
        # the operator can have seen the change.
        history.append((time.monotonic(), gib * 2**30))
        rig.set_budget(gib)
        return f"{gib}Gi"

    return act


ACTIONS: dict[str, Any] = {
    s.WORKER_KILL: kill_worker,
    s.KWOK_OOM: kwok_chaos(s.KWOK_OOM),
    s.KWOK_CRASH: kwok_chaos(s.KWOK_CRASH),
    s.KWOK_LOAD_FAILED: kwok_chaos(s.KWOK_LOAD_FAILED),
    s.OPERATOR_KILL: kill_operator,
    s.GATEWAY_KILL: kill_gateway,
    s.CONTROL_PLANE_RESTART: restart_control_plane,
    s.POOL_EDIT: edit_pool,
    s.POOL_CREATE: create_pool,
    s.POOL_DELETE: delete_pool,
    s.BUDGET_SHRINK: set_budget(lambda rig: rig.plan.shrunk_gib),
    s.BUDGET_GROW: set_budget(lambda rig: rig.plan.budget_gib),
}
