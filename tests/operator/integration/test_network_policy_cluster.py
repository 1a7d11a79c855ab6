"""The pool's NetworkPolicy on the real API server: the operator makes it with the exact shape, brings it up
to date when it starts with other settings, and the garbage collector of the real kube-controller-manager
deletes it with its pool; a ModelHost's too, owned by it. Without the setting no policy is made. A pool's
NetworkPolicy, PodDisruptionBudget or Service, or a ModelHost's NetworkPolicy or PodDisruptionBudget,
deleted by someone is made again by the running operator (it watches what it owns), and one edited is
written back; a pool switched to
``spec.host`` loses its Service, NetworkPolicy and PodDisruptionBudget.

No CNI runs here, so nothing enforces the policies: what is checked is the object the API server accepted
(its validation of named ports, peers and selectors included), not that traffic is refused.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from testkit.services import host_manifest
from tests.operator.integration.opharness import (
    POOLS,
    TO_SHARED,
    StartOperator,
    pool_manifest,
    states,
    wait_status,
)

pytestmark = pytest.mark.cluster

OPERATOR = {"app.kubernetes.io/name": "modelpool-operator", "app.kubernetes.io/instance": "mp"}
GATEWAY = {"app.kubernetes.io/name": "modelpool-operator-gateway", "app.kubernetes.io/instance": "mp"}
APPS = {"namespaceSelector": {"matchLabels": {"team": "apps"}}}
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def _settings(*callers: dict[str, Any]) -> dict[str, str]:
    """The operator's environment as the chart sets it for a release ``mp`` in ``mp-system``."""
    prefix = "MODELPOOL_OPERATOR_NETWORK_POLICY_"
    return {
        f"{prefix}ENABLED": "true",
        f"{prefix}NAMESPACE": "mp-system",
        f"{prefix}OPERATOR_LABELS": json.dumps(OPERATOR),
        f"{prefix}GATEWAY_LABELS": json.dumps(GATEWAY),
        f"{prefix}FROM": json.dumps(list(callers)),
        f"{prefix}METRICS_FROM": json.dumps([PROMETHEUS]),
    }


def _policy(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    found = cluster.kubectl("get", "networkpolicy", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def _release_pods(labels: dict[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mp-system"}},
        "podSelector": {"matchLabels": labels},
    }


def _modelhost(name: str) -> dict[str, Any]:
    """A ModelHost with no host pod: its policy is made all the same."""
    return host_manifest(name, replicas=0, deviceMemory="1Gi")


def test_a_pool_gets_its_network_policy_updated_on_restart_and_deleted_with_it(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    operator = start_operator(namespace, **_settings(APPS))
    apply(cluster, pool_manifest("fenced", replicas=1), namespace)
    policy = wait_for(
        lambda: _policy(cluster, namespace, "modelpool-fenced"),
        timeout=60,
        message="the pool's NetworkPolicy",
    )
    pool = get_json(cluster, POOLS, "fenced", "-n", namespace)
    assert policy["metadata"]["labels"] == {
        "modelpool.dev/pool": "fenced",
        "app.kubernetes.io/managed-by": "modelpool-operator",
    }
    assert policy["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelPool",
            "name": "fenced",
            "uid": pool["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    operator_peer = _release_pods(OPERATOR)
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"modelpool.dev/pool": "fenced"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"ports": [{"port": "probes", "protocol": "TCP"}], "from": [operator_peer, PROMETHEUS]},
            {
                "ports": [{"port": "http", "protocol": "TCP"}],
                "from": [operator_peer, _release_pods(GATEWAY), APPS],
            },
        ],
    }
    # It selects the pool's worker, whose ports carry the names it admits on.
    [worker] = get_json(cluster, "pods", "-n", namespace, "-l", "modelpool.dev/pool=fenced")["items"]
    ports = {p["name"] for c in worker["spec"]["containers"] for p in c.get("ports", [])}
    assert {"http", "probes"} <= ports

    # A restart with other callers (a helm upgrade) brings the existing policy up to date.
    assert operator.stop() == 0
    others = {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.1.0/24"]}}
    start_operator(namespace, **_settings(others))

    def callers() -> list[dict[str, Any]]:
        policy = _policy(cluster, namespace, "modelpool-fenced")
        return policy["spec"]["ingress"][1]["from"][2:] if policy else []

    wait_for(lambda: callers() == [others], timeout=60, message="the policy's callers replaced")

    cluster.kubectl("delete", POOLS, "fenced", "-n", namespace, "--timeout=60s")
    wait_for(
        lambda: _policy(cluster, namespace, "modelpool-fenced") is None,
        timeout=60,
        interval=0.5,
        message="the NetworkPolicy garbage-collected with its pool",
    )

    # A ModelHost's host pods get theirs (no pod needed), owned by the ModelHost: its probe port carries the
    # control API, so the operator alone is admitted there. (After the pool's garbage collection: with the
    # ModelHost made before it, the garbage collector took 20 s longer in a run.)
    apply(cluster, _modelhost("fenced-gpus"), namespace)
    host_policy = wait_for(
        lambda: _policy(cluster, namespace, "modelhost-fenced-gpus"),
        timeout=60,
        message="the ModelHost's NetworkPolicy",
    )
    host = get_json(cluster, "modelhosts", "fenced-gpus", "-n", namespace)
    assert host_policy["metadata"]["ownerReferences"][0]["uid"] == host["metadata"]["uid"]
    assert host_policy["spec"]["podSelector"] == {"matchLabels": {"modelpool.dev/pool": "host_fenced-gpus"}}
    assert host_policy["spec"]["ingress"] == [
        {"ports": [{"port": "probes", "protocol": "TCP"}], "from": [operator_peer]},
        {
            "ports": [{"port": "http", "protocol": "TCP"}],
            "from": [operator_peer, _release_pods(GATEWAY), others],
        },
    ]
    cluster.kubectl("delete", "modelhosts", "fenced-gpus", "-n", namespace, "--timeout=60s")


#: How soon a deleted object is back: a watch event and one pass (a resync would take far longer).
REMADE_S = 20


def _uid(cluster: Cluster, namespace: str, kind: str, name: str) -> str | None:
    found = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "jsonpath={.metadata.uid}", check=False)
    return found.stdout.strip() or None if found.returncode == 0 else None


def _delete_and_wait_remade(cluster: Cluster, namespace: str, kind: str, name: str) -> None:
    """Delete the object ``kind``/``name`` and wait until the operator has made it again (a new uid)."""
    old = wait_for(lambda: _uid(cluster, namespace, kind, name), timeout=60, message=f"{kind} {name} made")
    cluster.kubectl("delete", kind, name, "-n", namespace, "--timeout=60s")
    wait_for(
        lambda: _uid(cluster, namespace, kind, name) not in (None, old),
        timeout=REMADE_S,
        interval=0.2,
        message=f"{kind} {name} made again after its deletion",
    )


def _at(obj: Any, path: str) -> Any:
    """The value at ``path`` (a JSON pointer) of ``obj``; None where it is gone."""
    for part in path.strip("/").split("/"):
        if obj is None:
            return None
        obj = obj[int(part)] if isinstance(obj, list) else obj.get(part)
    return obj


def _edit_and_wait_restored(
    cluster: Cluster, namespace: str, kind: str, name: str, edit: dict[str, Any]
) -> None:
    """Apply the JSON patch operation ``edit`` to ``kind``/``name`` and wait until the operator has written
    the field back as it was, in the same object (an edit is undone in place, not by a new object)."""
    before = get_json(cluster, kind, name, "-n", namespace)
    path = edit["path"]
    cluster.kubectl("patch", kind, name, "-n", namespace, "--type", "json", "-p", json.dumps([edit]))

    def restored() -> bool:
        now = get_json(cluster, kind, name, "-n", namespace)
        return bool(
            now["metadata"]["uid"] == before["metadata"]["uid"] and _at(now, path) == _at(before, path)
        )

    wait_for(restored, timeout=REMADE_S, interval=0.2, message=f"{kind} {name} {path} written back")


def test_a_deleted_or_edited_policy_budget_or_service_is_made_again(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    """Each object a pool or a ModelHost owns, deleted while the operator runs, is back within REMADE_S,
    and so is a field of one edited by someone: the operator watches them (as controller-runtime's
    Owns()), not only writes them once per process."""
    start_operator(namespace, **_settings(APPS))
    apply(cluster, pool_manifest("kept", replicas=1), namespace)
    apply(cluster, _modelhost("kept-gpus"), namespace)
    for kind, name in [
        ("networkpolicy", "modelpool-kept"),
        ("poddisruptionbudget", "modelpool-kept"),
        ("service", "kept"),
        ("networkpolicy", "modelhost-kept-gpus"),
        ("poddisruptionbudget", "modelhost-kept-gpus"),
    ]:
        _delete_and_wait_remade(cluster, namespace, kind, name)
    for kind, name, edit in [
        # The policy would select no worker, the Service resolve to none, the budget block every drain.
        ("networkpolicy", "modelpool-kept", {"op": "replace", "path": "/spec/podSelector", "value": {}}),
        ("service", "kept", {"op": "replace", "path": "/spec/selector", "value": {"app": "else"}}),
        (
            "poddisruptionbudget",
            "modelpool-kept",
            {"op": "replace", "path": "/spec/minAvailable", "value": 5},
        ),
        ("networkpolicy", "modelhost-kept-gpus", {"op": "remove", "path": "/spec/ingress/1"}),
    ]:
        _edit_and_wait_restored(cluster, namespace, kind, name, edit)
    # Made again as before: the pool's policy still selects its workers and admits its callers.
    policy = _policy(cluster, namespace, "modelpool-kept")
    assert policy is not None
    assert policy["spec"]["podSelector"] == {"matchLabels": {"modelpool.dev/pool": "kept"}}
    assert policy["spec"]["ingress"][1]["from"][2:] == [APPS]
    # Switched to the ModelHost (spec.host), the pool has no worker of its own: what selected them goes.
    shared = ["--type", "merge", "-p", json.dumps({"spec": TO_SHARED | {"host": "kept-gpus"}})]
    cluster.kubectl("patch", POOLS, "kept", "-n", namespace, *shared)
    dedicated = [
        ("networkpolicy", "modelpool-kept"),
        ("poddisruptionbudget", "modelpool-kept"),
        ("service", "kept"),
    ]
    wait_for(
        lambda: all(_uid(cluster, namespace, kind, name) is None for kind, name in dedicated),
        timeout=REMADE_S,
        interval=0.2,
        message="a shared pool's Service, NetworkPolicy and PodDisruptionBudget deleted",
    )
    # The ModelHost's own are kept.
    assert _policy(cluster, namespace, "modelhost-kept-gpus") is not None
    cluster.kubectl("delete", "modelhosts", "kept-gpus", "-n", namespace, "--timeout=60s")
    cluster.kubectl("delete", POOLS, "kept", "-n", namespace, "--timeout=60s")


def test_without_the_setting_no_policy_is_made(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    start_operator(namespace)
    apply(cluster, pool_manifest("open", replicas=1), namespace)
    wait_status(cluster, namespace, "open", lambda s: states(s) == ["Ready"], timeout=60, message="1 ready")
    # The pass that made the worker and the Service went by: a policy would have been made before them.
    assert get_json(cluster, "service", "open", "-n", namespace)
    assert get_json(cluster, "networkpolicies", "-n", namespace)["items"] == []
