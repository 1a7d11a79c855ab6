"""The operator with real ``modelpool-server`` processes on the process node, serving MiniLM (docs/design.md).

Here the workers' ``/stats`` is real, so the server's own states (Loading, Ready, Idle) reach the pool's
status, idle workers are evicted to minReplicas, and idle workers of a lower-priority pool are preempted
when a higher-priority pool needs the budget. Each test loads one MiniLM server (~10-30 s on a busy CPU).
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from modelpool_contract.flags import DEFAULT_WORKER_CPU
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, wait_for
from tests.operator.integration.opharness import (
    GI,
    PROCESS_NODE,
    BudgetedOperator,
    StartOperator,
    StatusRecorder,
    condition,
    events,
    minilm_source,
    pool_manifest,
    states,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def _worker(status: dict[str, object], state: str) -> bool:
    workers = status.get("workers") or []
    assert isinstance(workers, list)
    return any(w["state"] == state for w in workers)


def test_real_worker_loads_serves_goes_idle_and_is_evicted_to_min_replicas(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    port = free_port()
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(port))
    pool = pool_manifest(
        "minilm",
        replicas=1,
        min_replicas=0,
        memory="2Gi",
        source=minilm_source(),
        idle_timeout_seconds=20,
        node_selector=PROCESS_NODE,
    )
    pool["spec"]["resources"]["gpus"] = 0
    recorder = StatusRecorder(cluster, namespace).start()
    try:
        apply(cluster, pool, namespace)

        def serving() -> dict[str, Any] | None:
            return next((s for s in recorder.statuses("minilm") if _worker(s, "Ready")), None)

        ready = wait_for(serving, timeout=240, interval=0.3, message="worker Ready (model loaded)")
        # The server's own states reached the status, in order: Loading before Ready.
        seen = [w["state"] for s in recorder.statuses("minilm") for w in s.get("workers") or []]
        assert "Loading" in seen and seen.index("Loading") < seen.index("Ready"), seen
        assert ready["readyReplicas"] == 1
        # A CPU worker has no accelerator memory: nothing measured, nothing raised.
        assert "acceleratorMemory" not in ready["workers"][0]
        assert condition(ready, "MemoryExceedsCharge")["reason"] == "NotMeasured"
        pod = worker_pods(cluster, namespace, "minilm")[0]
        ip = pod["status"]["podIP"]

        # An inference straight to the worker's pod IP, the way the pool's Service routes.
        response = httpx.post(
            f"http://{ip}:{port}/v1/embeddings",
            json={"model": "minilm", "input": ["a kubernetes operator", "serves models"]},
            timeout=60,
        )
        assert response.status_code == 200, response.text
        vectors = [item["embedding"] for item in response.json()["data"]]
        assert len(vectors) == 2 and len(vectors[0]) == 384
        # No resources.cpu: the operator's default request, passed as the worker's CPU share, sized the
        # model's threads (issue 29), where torch's default runs one per core of the node.
        assert pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] == DEFAULT_WORKER_CPU
        threads = httpx.get(f"http://{ip}:{port}/stats", timeout=10).json()["threads"]
        share = float(DEFAULT_WORKER_CPU)
        expected = ("share", share) if share < len(os.sched_getaffinity(0)) else ("default", None)
        assert (threads["sized_from"], threads["cpus"]) == expected, threads
        wait_for(
            lambda: any(
                w.get("lastRequestTime") for s in recorder.statuses("minilm") for w in s.get("workers") or []
            ),
            timeout=30,
            message="the request reached the worker's status (lastRequestTime)",
        )

        # Idle after idleTimeoutSeconds without requests -> evicted down to minReplicas (0). The pass that
        # sees it Idle long enough evicts it at once, so status may show Idle or already Evicting/IdleTimeout.
        def idle_evicted(status: dict[str, Any]) -> bool:
            return any(
                w["state"] == "Idle" or (w["state"] == "Evicting" and w.get("reason") == "IdleTimeout")
                for w in status.get("workers") or []
            )

        wait_for(
            lambda: any(idle_evicted(s) for s in recorder.statuses("minilm")),
            timeout=90,
            message="worker Idle, evicted for IdleTimeout",
        )
    finally:
        recorder.stop()
    wait_for(
        lambda: not worker_pods(cluster, namespace, "minilm"),
        timeout=90,
        interval=0.5,
        message="idle worker evicted (pod gone)",
    )
    status = wait_status(
        cluster,
        namespace,
        "minilm",
        lambda s: not s.get("workers"),
        timeout=30,
        message="no workers left in status",
    )
    assert status["targetReplicas"] == 0
    assert status["memory"]["chargedBytes"] == 0
    reasons = [e["reason"] for e in events(cluster, namespace, "minilm")]
    assert "EvictingWorker" in reasons, reasons


def test_idle_worker_of_lower_priority_pool_is_preempted_for_a_higher_one(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    watcher, _ = budgeted_operator("3Gi", MODELPOOL_OPERATOR_SERVER_PORT=str(free_port()))
    try:
        low = pool_manifest(
            "low",
            replicas=1,
            min_replicas=1,
            memory="2Gi",
            priority=-5,
            source=minilm_source(),
            idle_timeout_seconds=3,
            node_selector=PROCESS_NODE,
        )
        low["spec"]["resources"]["gpus"] = 0
        apply(cluster, low, namespace)
        wait_status(
            cluster, namespace, "low", lambda s: _worker(s, "Idle"), timeout=180, message="low's worker Idle"
        )
        low_pod = worker_pods(cluster, namespace, "low")[0]["metadata"]["name"]

        apply(cluster, pool_manifest("high", replicas=1, memory="2Gi", priority=10), namespace)
        wait_status(
            cluster,
            namespace,
            "high",
            lambda s: s.get("readyReplicas") == 1,
            timeout=90,
            message="high's worker admitted after low's idle worker was preempted",
        )
        assert low_pod not in {p["metadata"]["name"] for p in worker_pods(cluster, namespace, "low")}
        preempting = [e for e in events(cluster, namespace, "high") if e["reason"] == "Preempting"]
        assert any(low_pod in e["message"] for e in preempting), preempting
        low_status = wait_status(
            cluster,
            namespace,
            "low",
            lambda s: condition(s, "BudgetExceeded").get("status") == "True",
            timeout=30,
            message="the low-priority pool reports BudgetExceeded",
        )
        assert "Ready" not in states(low_status) and "Idle" not in states(low_status)
    finally:
        watcher.stop()
    assert watcher.max_memory <= 3 * GI, f"over-admitted: {watcher.max_memory / GI:.1f} GiB at once"
