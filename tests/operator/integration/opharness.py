"""Harness for the operator integration tests: the real operator process, pool manifests, a pod watcher.

* ``OperatorProcess``, ``pool_manifest``, ``budget_manifest`` (from ``testkit.services``): the real
  operator process, with short intervals so the suite stays quick; its log is printed when a test fails.
* ``PodWatcher``: a real watch (kubernetes client) on the test namespace(s) in a thread, so properties
  such as "never more memory admitted than the budget" are checked at every change, not by sampling.

The fixtures that put these together (``start_operator``, ``budget``, ``watch_pods``,
``budgeted_operator``) are in this folder's conftest.py; the aliases below type them.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from modelpool_contract.picker import INFERENCE_GROUP, INFERENCE_POOL_PLURAL
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import get_json, wait_established, wait_for
from testkit.services import (  # the processes and manifests the soak and the demo share (re-exported)
    GI,
    GROUP_VERSION,
    POOLS,
    PROCESS_NODE,
    TEST_ENV,
    OperatorProcess,
    budget_manifest,
    minilm_source,
    pool_manifest,
    worker_pods,
)
from testkit.watch import ListWatch

__all__ = ["GI", "GROUP_VERSION", "POOLS", "PROCESS_NODE", "TEST_ENV", "OperatorProcess", "budget_manifest"]
__all__ += ["minilm_source", "pool_manifest", "worker_pods"]

# ``start_operator(*namespaces, peering=None, kubeconfig=None, **env)``.
StartOperator = Callable[..., "OperatorProcess"]
# ``watch_pods()``: a started PodWatcher on the test's namespace.
WatchPods = Callable[[], "PodWatcher"]
# ``budgeted_operator(memory, **env)``: the budget set, a pod watcher, then the operator.
BudgetedOperator = Callable[..., tuple["PodWatcher", "OperatorProcess"]]


#: What a merge patch of a ``pool_manifest`` pool's spec removes, with ``host`` set, to switch it to a
#: ModelHost: a shared pool has no pod template and no GPUs of its own (the CRD refuses both).
TO_SHARED: dict[str, Any] = {"podTemplate": None, "resources": {"gpus": None}}


#: The Gateway API Inference Extension's InferencePool CRD (v1), vendored for the tests (testdata/).
INFERENCE_POOL_CRD = ROOT / "tests" / "operator" / "integration" / "testdata" / "inferencepools-v1.6.0.yaml"
INFERENCE_POOL_CRD_NAME = f"{INFERENCE_POOL_PLURAL}.{INFERENCE_GROUP}"


def install_inference_pool_crd(cluster: Cluster) -> None:
    """Install the InferencePool CRD and wait until the API server serves the resource."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(INFERENCE_POOL_CRD))
    wait_established(cluster, INFERENCE_POOL_CRD_NAME)
    # Established is the CRD's word; the API server serves the resource once discovery has it.
    wait_for(
        lambda: cluster.kubectl("get", INFERENCE_POOL_CRD_NAME, "-A", check=False).returncode == 0,
        timeout=60,
        message="the InferencePool API served",
    )


def remove_inference_pool_crd(cluster: Cluster) -> None:
    """Delete the InferencePool CRD (if there) and wait until it is gone."""
    cluster.kubectl("delete", "crd", INFERENCE_POOL_CRD_NAME, "--ignore-not-found", "--timeout=60s")
    wait_for(
        lambda: cluster.kubectl("get", "crd", INFERENCE_POOL_CRD_NAME, check=False).returncode != 0,
        timeout=60,
        message="the InferencePool CRD gone",
    )


def get_pool(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    return get_json(cluster, POOLS, name, "-n", namespace)


def pool_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    status: dict[str, Any] = get_pool(cluster, namespace, name).get("status") or {}
    return status


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        cluster, "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def reasons(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the object's Events."""
    return [(e["reason"], e["message"]) for e in events(cluster, namespace, name)]


def pod_memory(pod: dict[str, Any]) -> int:
    """What a worker pod holds: its memory annotation (written by the pod builder)."""
    raw = (pod["metadata"].get("annotations") or {}).get("modelpool.dev/memory-bytes", "0")
    return int(raw)


def holds_memory(pod: dict[str, Any]) -> bool:
    """A pod that exists and has not ended (Failed/Succeeded pods hold nothing)."""
    return (pod.get("status") or {}).get("phase") not in ("Failed", "Succeeded")


@dataclass
class PodWatcher:
    """Watches the worker pods of some namespaces and records properties at every single change."""

    cluster: Cluster
    namespaces: list[str]
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    max_memory: int = 0
    max_pods: dict[str, int] = field(default_factory=dict)  # pool -> most pods holding memory at once
    min_ready_after: dict[str, int] = field(default_factory=dict)
    history: list[tuple[float, str, str, str]] = field(default_factory=list)
    _stopped: bool = False
    _watches: list[ListWatch] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ready_floor_armed: dict[str, int] = field(default_factory=dict)

    def start(self) -> PodWatcher:
        for ns in self.namespaces:
            watch = ListWatch(
                self.cluster.kubeconfig, "CoreV1Api", "list_namespaced_pod", ns,
                label_selector="modelpool.dev/pool", on_event=self._record, name=f"pods-{ns}",
            )  # fmt: skip
            self._watches.append(watch.start())
        return self

    def stop(self) -> None:
        self._stopped = True
        for watch in self._watches:
            watch.stop()
        if self.error is not None:
            raise AssertionError(f"the pod watcher failed: {self.error!r}")

    @property
    def error(self) -> BaseException | None:
        return next((w.error for w in self._watches if w.error is not None), None)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def snapshot(self) -> list[dict[str, Any]]:
        """The pods as last seen (a copy of the list, taken under the watcher's lock)."""
        with self._lock:
            return list(self.pods.values())

    def arm_ready_floor(self, pool: str, floor: int) -> None:
        """From now on, record the lowest number of ready workers of ``pool`` (checked against ``floor``)."""
        with self._lock:
            self._ready_floor_armed[pool] = floor
            self.min_ready_after[pool] = self._ready(pool)

    def _ready(self, pool: str) -> int:
        return sum(
            1
            for pod in self.pods.values()
            if pod["metadata"]["labels"].get("modelpool.dev/pool") == pool
            and not pod["metadata"].get("deletionTimestamp")
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (pod.get("status") or {}).get("conditions") or []
            )
        )

    def _record(self, kind: str, pod: dict[str, Any]) -> None:
        key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(key, None)
            else:
                self.pods[key] = pod
            self.history.append((time.monotonic(), kind, key[1], (pod.get("status") or {}).get("phase", "")))
            held = [p for p in self.pods.values() if holds_memory(p)]
            self.max_memory = max(self.max_memory, sum(pod_memory(p) for p in held))
            counts: dict[str, int] = {}
            for p in held:
                pool = p["metadata"]["labels"].get("modelpool.dev/pool", "")
                counts[pool] = counts.get(pool, 0) + 1
            for pool, count in counts.items():
                self.max_pods[pool] = max(self.max_pods.get(pool, 0), count)
            for pool in self._ready_floor_armed:
                self.min_ready_after[pool] = min(self.min_ready_after[pool], self._ready(pool))


def wait_status(
    cluster: Cluster,
    namespace: str,
    name: str,
    predicate: Callable[[dict[str, Any]], bool],
    *,
    timeout: float,
    message: str,
) -> dict[str, Any]:
    """Wait until the pool's status satisfies ``predicate``; returns that status."""

    def check() -> dict[str, Any] | None:
        status = pool_status(cluster, namespace, name)
        return status if predicate(status) else None

    try:
        return wait_for(check, timeout=timeout, interval=0.5, message=message)
    except AssertionError as exc:
        status = pool_status(cluster, namespace, name)
        raise AssertionError(f"{exc}\nlast status: {json.dumps(status, indent=1)[:4000]}") from None


def wait_at_zero(
    cluster: Cluster, namespace: str, name: str, *, timeout: float, message: str
) -> dict[str, Any]:
    """Wait until the pool is at zero workers (phase ScaledToZero, none listed); returns that status."""
    return wait_status(
        cluster,
        namespace,
        name,
        lambda s: s.get("phase") == "ScaledToZero" and not s.get("workers"),
        timeout=timeout,
        message=message,
    )


def states(status: dict[str, Any]) -> list[str]:
    return sorted(w["state"] for w in status.get("workers") or [])


def wait_pods_gone(cluster: Cluster, namespace: str, pool: str, timeout: float = 60) -> None:
    wait_for(
        lambda: not worker_pods(cluster, namespace, pool),
        timeout=timeout,
        interval=0.5,
        message=f"pods of {pool} gone",
    )


def now() -> float:
    return time.monotonic()


@dataclass
class StatusRecorder:
    """Watches the ModelPools of a namespace and keeps every status they ever had (brief states included)."""

    cluster: Cluster
    namespace: str
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _watch: ListWatch | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> StatusRecorder:
        self._watch = ListWatch(
            self.cluster.kubeconfig, "CustomObjectsApi", "list_namespaced_custom_object",
            "modelpool.dev", "v1alpha1", self.namespace, "modelpools",
            on_event=self._seen, retry=True, name=f"statuses-{self.namespace}",
        ).start()  # fmt: skip
        return self

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def statuses(self, name: str) -> list[dict[str, Any]]:
        with self._lock:
            return [status for pool, status in self.seen if pool == name]

    def _seen(self, _kind: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self.seen.append((obj["metadata"]["name"], obj.get("status") or {}))
