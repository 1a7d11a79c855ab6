"""The operator's Prometheus endpoint, scraped from the real operator process while it works on the local
control plane: reconcile passes and their latency, workers by state per pool, the budget, evictions and
failures by reason, and API errors (a worker pod the API server refuses), read with prometheus-client's own
parser (docs/operator.md, "Metrics")."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from testkit import prom
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, wait_for
from testkit.prom import Samples, sample
from tests.operator.integration.opharness import (
    GI,
    POOLS,
    BudgetedOperator,
    pool_manifest,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster]


def scrape(port: int) -> Samples:
    return prom.samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False).text)


def until(port: int, check: Callable[[Samples], bool], message: str) -> Samples:
    """Scrape until ``check`` holds (bounded), returning those samples."""

    def checked() -> Samples | None:
        samples = scrape(port)
        return samples if samples and check(samples) else None

    return wait_for(checked, timeout=60, interval=0.5, message=message)


def test_the_operator_exports_passes_workers_budget_evictions_failures_and_api_errors(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    port = free_port()
    # The missing PriorityClass below is allowed by the operator's policy: the API server refuses the pod.
    budgeted_operator(
        "64Gi",
        MODELPOOL_OPERATOR_METRICS_PORT=str(port),
        MODELPOOL_OPERATOR_ALLOWED_PRIORITY_CLASSES="no-such-priority-class",
    )
    ns = {"namespace": namespace}

    apply(cluster, pool_manifest("serving", replicas=2, memory="4Gi"), namespace)
    wait_status(
        cluster, namespace, "serving", lambda s: s.get("readyReplicas") == 2, timeout=60, message="2 ready"
    )
    samples = until(
        port,
        lambda s: sample(s, "modelpool_operator_workers", pool="serving", state="Ready", **ns) == 2,
        "2 Ready workers in the metrics",
    )
    assert sample(samples, "modelpool_operator_workers", pool="serving", state="Failed", **ns) == 0
    assert (sample(samples, "modelpool_operator_reconcile_total", result="ok") or 0) >= 1
    assert (sample(samples, "modelpool_operator_reconcile_duration_seconds_count") or 0) >= 1
    until(
        port,
        lambda s: (
            sample(s, "modelpool_operator_budget_bytes", kind="total") == 64 * GI
            and sample(s, "modelpool_operator_budget_bytes", kind="used") == 8 * GI
        ),
        "the budget's total and used bytes",
    )

    # A scale-down evicts one worker.
    cluster.kubectl(
        "patch", POOLS, "serving", "-n", namespace, "--type", "merge", "-p", '{"spec":{"replicas":1}}'
    )
    until(
        port,
        lambda s: sample(s, "modelpool_operator_evictions_total", reason="ScaleDown") == 1,
        "one ScaleDown eviction",
    )

    # A worker killed for its memory (KWOK's chaos stage) is one failure, counted once.
    oom = pool_manifest("oom", replicas=1, memory="1Gi", labels={"kwok.modelpool.test/chaos": "oom"})
    apply(cluster, oom, namespace)
    until(
        port,
        lambda s: (sample(s, "modelpool_operator_worker_failures_total", reason="OOMKilled") or 0) >= 1,
        "an OOMKilled failure",
    )

    # A worker pod the API server refuses (no such PriorityClass: 403 from admission) is an API error.
    refused = pool_manifest("refused", replicas=1, memory="1Gi")
    refused["spec"]["podTemplate"]["priorityClassName"] = "no-such-priority-class"
    apply(cluster, refused, namespace)
    until(
        port,
        lambda s: (
            (sample(s, "modelpool_operator_api_errors_total", operation="create_pod", code="403") or 0) >= 1
        ),
        "a refused pod creation counted",
    )
    assert not worker_pods(cluster, namespace, "refused")

    # A deleted pool's series go away with its daemon.
    cluster.kubectl("delete", POOLS, "serving", "-n", namespace, "--timeout=60s")
    until(
        port,
        lambda s: sample(s, "modelpool_operator_workers", pool="serving", state="Ready", **ns) is None,
        "the deleted pool's series removed",
    )
