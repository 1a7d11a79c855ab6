"""The ModelBudget's ledger counts only what the operator made (issue 30), on the local real control plane
with the real operator (KWOK nodes for the workers).

* A Pending pod labelled ``modelpool.dev/pool: ghost`` with a huge ``modelpool.dev/memory-bytes``, and one
  labelled as the real pool's worker, neither owned by a pool: the real pool is admitted (never
  BudgetExceeded), the budget's used memory is the real workers' only, and the operator never deletes
  the foreign pods (they are not its own).
* A worker's own ``modelpool.dev/memory-bytes`` patched to ``0`` (as anyone who may patch the pod can):
  the pool's charge and the budget's used memory stay what the pool declares, and no worker beyond the
  budget is admitted.
* A deleted pool's workers, held Terminating (a finalizer of the test's own stands for a long grace
  period), still hold their memory: a new pool waits (BudgetExceeded) until they are gone, then is
  admitted.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from tests.operator.integration.opharness import (
    GI,
    POOLS,
    BudgetedOperator,
    condition,
    get_pool,
    pool_manifest,
    states,
    wait_status,
    worker_pods,
)

pytestmark = pytest.mark.cluster

HUGE = str(2**60)  # 1 EiB: far beyond any budget


def foreign_pod(name: str, pool: str) -> dict[str, Any]:
    """A pod anyone with ``create pods`` may make: labelled and annotated like a worker, owned by nothing,
    kept Pending (no node has its label), restricted-level compliant."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"modelpool.dev/pool": pool},
            "annotations": {"modelpool.dev/memory-bytes": HUGE},
        },
        "spec": {
            "nodeSelector": {"modelpool.test/no-such-node": "true"},
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "server",
                    "image": "registry.invalid/ghost:1",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def test_a_ghost_pod_with_a_huge_annotation_is_never_charged(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    apply(cluster, foreign_pod("ghost", "ghost"), namespace)
    apply(cluster, foreign_pod("squatter", "emb"), namespace)  # the real pool's label, no owner
    _, operator = budgeted_operator("8Gi")
    apply(cluster, pool_manifest("emb", replicas=2, memory="1Gi"), namespace)

    status = wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: states(s) == ["Ready", "Ready"],
        timeout=90,
        message="both real workers admitted and Ready",
    )
    assert condition(status, "BudgetExceeded").get("status") != "True", status
    assert status["memory"]["chargedBytes"] == 2 * GI
    budget = wait_for(
        lambda: (
            (s := get_json(cluster, "modelbudget", "default").get("status") or {}).get("usedBytes") == 2 * GI
            and s
        ),
        timeout=30,
        interval=0.5,
        message="the budget's used memory is the real workers' only",
    )
    assert {p["name"]: p["memoryBytes"] for p in budget["pools"]} == {"emb": 2 * GI}
    # Ignored, not touched: both foreign pods are still there, and the operator said so once each.
    for name in ("ghost", "squatter"):
        assert not get_json(cluster, "pod", name, "-n", namespace)["metadata"].get("deletionTimestamp")
    log = operator.log_tail(10**7)
    assert log.count(f"ignoring pod {namespace}/ghost") == 1, log[-4000:]
    assert log.count(f"ignoring pod {namespace}/squatter") == 1, log[-4000:]


def test_a_worker_annotation_patched_to_zero_does_not_lower_the_charge(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    budgeted_operator("2Gi")
    apply(cluster, pool_manifest("emb", replicas=3, memory="1Gi"), namespace)
    wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: states(s) == ["Ready", "Ready"] and condition(s, "BudgetExceeded").get("status") == "True",
        timeout=90,
        message="two workers fill the 2Gi budget, the third waits",
    )
    victim = worker_pods(cluster, namespace, "emb")[0]["metadata"]["name"]
    cluster.kubectl(
        "annotate", "pod", victim, "-n", namespace, "--overwrite", "modelpool.dev/memory-bytes=0"
    )  # fmt: skip
    # A spec change after the patch: the pass that answers it (observedGeneration) has seen the patch.
    generation = int(get_pool(cluster, namespace, "emb")["metadata"]["generation"])
    cluster.kubectl(
        "patch", POOLS, "emb", "-n", namespace, "--type=merge", "-p", '{"spec":{"maxReplicas":11}}'
    )
    status = wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: (s.get("observedGeneration") or 0) > generation,
        timeout=60,
        message="a pass after the annotation was patched",
    )
    assert status["memory"]["chargedBytes"] == 2 * GI, status["memory"]
    assert condition(status, "BudgetExceeded").get("status") == "True"
    assert len(worker_pods(cluster, namespace, "emb")) == 2, "a worker admitted beyond the budget"
    assert get_json(cluster, "modelbudget", "default")["status"]["usedBytes"] == 2 * GI


HOLD = "modelpool.test/hold"  # a finalizer of the test's own: the pod stays Terminating while it is there


def test_a_deleted_pools_terminating_workers_stay_charged_until_gone(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    budgeted_operator("2Gi")
    apply(cluster, pool_manifest("old", replicas=2, memory="1Gi"), namespace)
    wait_status(
        cluster, namespace, "old", lambda s: states(s) == ["Ready", "Ready"], timeout=90, message="old Ready"
    )
    held = [p["metadata"]["name"] for p in worker_pods(cluster, namespace, "old")]
    for name in held:
        hold = json.dumps({"metadata": {"finalizers": [HOLD]}})
        cluster.kubectl("patch", "pod", name, "-n", namespace, "--type=merge", "-p", hold)
    cluster.kubectl("delete", POOLS, "old", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(
        lambda: all(p["metadata"].get("deletionTimestamp") for p in worker_pods(cluster, namespace, "old")),
        timeout=60,
        interval=0.5,
        message="the deleted pool's workers Terminating (held by the test's finalizer)",
    )
    apply(cluster, pool_manifest("new", replicas=1, memory="1Gi"), namespace)
    wait_status(
        cluster,
        namespace,
        "new",
        lambda s: condition(s, "BudgetExceeded").get("status") == "True",
        timeout=60,
        message="the new pool waits: the old workers still hold the 2Gi",
    )
    assert not worker_pods(cluster, namespace, "new"), "a worker admitted into memory not yet free"
    assert get_json(cluster, "modelbudget", "default")["status"]["usedBytes"] == 2 * GI
    for name in held:
        cluster.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            namespace,
            "--type=json",
            "-p",
            '[{"op":"remove","path":"/metadata/finalizers"}]',
        )
    status = wait_status(
        cluster,
        namespace,
        "new",
        lambda s: states(s) == ["Ready"],
        timeout=90,
        message="new admitted once they are gone",
    )
    assert condition(status, "BudgetExceeded").get("status") != "True", status
