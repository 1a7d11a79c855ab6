"""A node drain goes through the pool's PodDisruptionBudget: one worker at a time, each replaced by the
operator within the ModelBudget before the next goes, and the pool never below its replicas less
``spec.disruption.maxUnavailable`` serving (issue 31, item 3).

Real API server, scheduler, disruption controller and ``kubectl drain`` (the Eviction API); two KWOK nodes
of the test's own (a label and a taint no other test's pods select or tolerate), so cordoning one touches
nobody else's pods. The pod watcher sees every change of the pool's pods and keeps the fewest ready ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, is_ready, wait_for
from tests.operator.integration.opharness import (
    GI,
    BudgetedOperator,
    pool_manifest,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster]

REPLICAS = 4
MAX_UNAVAILABLE = 1
TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def _node(name: str, label: str) -> dict[str, Any]:
    capacity = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8", "pods": "50"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": label, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {"taints": [TAINT], "podCIDR": "127.80.0.0/16", "podCIDRs": ["127.80.0.0/16"]},
        "status": {"allocatable": capacity, "capacity": capacity},
    }


@pytest.fixture
def drain_nodes(crds: Cluster, namespace: str) -> Iterator[tuple[str, list[str]]]:
    """Two KWOK nodes labelled ``type=<label>`` for this test alone; deleted afterwards."""
    label = f"drain-{namespace}"
    names = [f"{label}-a", f"{label}-b"]
    for name in names:
        apply(crds, _node(name, label))
    # A node's Ready condition is a pod's shape: testkit's ``is_ready`` reads both.
    wait_for(
        lambda: all(is_ready(get_json(crds, "node", n)) for n in names),
        timeout=60,
        message="the test's KWOK nodes Ready",
    )
    yield label, names
    for name in names:
        crds.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def _budget_status(crds: Cluster, namespace: str, name: str) -> dict[str, Any]:
    done = crds.kubectl("get", "pdb", name, "-n", namespace, "-o", "json", check=False)
    return (json.loads(done.stdout).get("status") or {}) if done.returncode == 0 else {}


def _all_ready(crds: Cluster, namespace: str, timeout: float, message: str) -> None:
    """Wait until every one of the pool's ``REPLICAS`` workers is ready, as its status says."""
    wait_status(
        crds,
        namespace,
        "drained",
        lambda s: s.get("readyReplicas") == REPLICAS,
        timeout=timeout,
        message=message,
    )


def test_a_drain_evicts_a_pools_workers_one_at_a_time_and_serving_never_drops_below_the_budget(
    crds: Cluster, namespace: str, drain_nodes: tuple[str, list[str]], budgeted_operator: BudgetedOperator
) -> None:
    label, nodes = drain_nodes
    # The budget holds the pool's workers and nothing more: a replacement fits only once the evicted
    # worker is gone, as the operator's admission rules say.
    watcher, _ = budgeted_operator(f"{REPLICAS}Gi")
    manifest = pool_manifest(
        "drained",
        replicas=REPLICAS,
        min_replicas=REPLICAS,
        max_replicas=REPLICAS,
        node_selector={"type": label},
    )
    manifest["spec"]["disruption"] = {"maxUnavailable": MAX_UNAVAILABLE}
    apply(crds, manifest, namespace)
    _all_ready(crds, namespace, 60, "4 ready")
    # The operator's budget, as the disruption controller sees it: one of the four may go.
    wait_for(
        lambda: (
            _budget_status(crds, namespace, "modelpool-drained").get("disruptionsAllowed") == MAX_UNAVAILABLE
        ),
        timeout=30,
        message="the pool's PodDisruptionBudget allows one disruption",
    )
    pods = worker_pods(crds, namespace, "drained")
    on_node = {n: [p for p in pods if p["spec"].get("nodeName") == n] for n in nodes}
    # The default soft spread put them on both nodes: drain the one that holds more (at least two).
    node = max(nodes, key=lambda n: len(on_node[n]))
    assert len(on_node[node]) >= 2 and all(on_node.values()), {n: len(v) for n, v in on_node.items()}

    watcher.arm_ready_floor("drained", REPLICAS - MAX_UNAVAILABLE)
    drained = crds.kubectl(
        "drain", node, "--pod-selector=modelpool.dev/pool=drained", "--delete-emptydir-data",
        "--ignore-daemonsets", "--timeout=50s", timeout=60,
    )  # fmt: skip
    output = drained.stdout + drained.stderr
    evicted = {p["metadata"]["name"] for p in on_node[node]}
    assert all(f"evicting pod {namespace}/{name}" in output for name in evicted), output
    # kubectl asked for both evictions at once; the budget let the second go only once the first worker's
    # replacement served: never fewer than replicas - maxUnavailable ready (every pod change was seen).
    t0 = watcher.history[0][0]
    trace = "\n".join(f"{t - t0:.3f} {kind} {name} {phase}" for t, kind, name, phase in watcher.history)
    assert watcher.min_ready_after["drained"] >= REPLICAS - MAX_UNAVAILABLE, f"{output}\n{trace}"
    deleted = [name for _, kind, name, _ in watcher.history if kind == "DELETED"]
    assert sorted(deleted) == sorted(evicted), trace
    _all_ready(crds, namespace, 30, "4 ready again")
    after = worker_pods(crds, namespace, "drained")
    assert all(p["spec"].get("nodeName") != node for p in after), "a worker on the cordoned node"
    watcher.stop()
    assert watcher.min_ready_after["drained"] >= REPLICAS - MAX_UNAVAILABLE, trace
    assert watcher.max_memory <= REPLICAS * GI, "the replacements were admitted within the budget"
