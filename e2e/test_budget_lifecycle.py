"""The ModelBudget is the user's object (issue 31 item 2), with the real helm, the chart from the tree and
the chart's own operator on the real API server.

One release, installed as e2e/test_install.py installs it (its own namespaces, its own budget), but with
``budget.create=false`` and the chart's default ``budget.missing`` (refuse):

1. no budget: a pool gets no worker, and its BudgetExceeded condition (reason BudgetMissing) names the
   missing budget;
2. ``helm upgrade`` with ``budget.create=true``: the operator creates the budget at its startup, and the
   pool is admitted;
3. the budget's memory changed with kubectl, then ``helm upgrade`` with an unrelated value changed (and
   ``budget.memory`` changed too, which only sizes a budget the operator creates): the budget keeps its
   uid, its memory and its status; nothing of it is a helm hook, and no finalizer can hang a hook (the
   peering objects carry none).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import eventually
from e2e.test_install import (
    POOL_READY_TIMEOUT_S,
    Release,
    chart_values,
    helm_apply,
    new_release,
    pool_manifest,
    remove_everything,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

POOL = "budget-pool"
GI = 2**30


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("values")


@pytest.fixture(scope="module")
def lifecycle(
    e2e_kubeconfig: Path, e2e_external: bool, tmp_path_factory: pytest.TempPathFactory, folder: Path
) -> Iterator[tuple[Release, dict[str, Any]]]:
    if e2e_external:
        pytest.skip("KWOK fake GPU nodes exist only on the local control plane")
    rel = new_release(e2e_kubeconfig, e2e_external, tmp_path_factory)
    values = chart_values(rel)
    values["budget"] = {"create": False}  # budget.missing left at the chart's default
    values["gateway"] = {**values["gateway"], "enabled": False}  # not under test here
    try:
        helm_apply(rel, "install", values, folder)
        yield rel, values
    finally:
        remove_everything(rel)


def _pool(rel: Release) -> dict[str, Any]:
    return pool_manifest(
        POOL,
        rel.namespace,
        replicas=1,
        resources={"gpus": 1, "memory": "10Gi"},
        podTemplate={
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
        },
    )


def _budget_condition(rel: Release) -> dict[str, Any] | None:
    pool = rel.get("modelpools", POOL, "-n", rel.namespace)
    conditions = (pool.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "BudgetExceeded"), None)


def _workers(rel: Release) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = rel.get("pods", "-n", rel.namespace, "-l", f"modelpool.dev/pool={POOL}")[
        "items"
    ]
    return items


def _budget(rel: Release) -> dict[str, Any] | None:
    found = rel.k("get", "modelbudget", rel.budget, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


def _operator_pod_uids(rel: Release) -> set[str]:
    pods = rel.get("pods", "-n", rel.system_namespace, "-l", "app.kubernetes.io/component=operator")["items"]
    return {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}


def test_the_budget_is_the_users_object(lifecycle: tuple[Release, dict[str, Any]], folder: Path) -> None:
    rel, values = lifecycle
    env = {
        e["name"]: e.get("value")
        for e in rel.get(
            "deployment", "-n", rel.system_namespace, "-l", "app.kubernetes.io/component=operator"
        )["items"][0]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["MODELPOOL_OPERATOR_MISSING_BUDGET"] == "refuse", "the chart's default"
    assert _budget(rel) is None, "budget.create=false: no budget"

    # 1. No budget: the pool waits, and says for what.
    rel.k("apply", "-f", "-", stdin=json.dumps(_pool(rel)))
    waiting = eventually(
        lambda: (
            (c := _budget_condition(rel)) and c["status"] == "True" and c["reason"] == "BudgetMissing" and c
        ),
        timeout=POOL_READY_TIMEOUT_S,
        interval=1,
        what=f"{POOL} BudgetExceeded=True (BudgetMissing)",
    )
    assert f"ModelBudget {rel.budget} does not exist" in waiting["message"]
    assert not _workers(rel), "no worker while the budget is missing"
    events = rel.get("events", "-n", rel.namespace, "--field-selector", f"involvedObject.name={POOL}")[
        "items"
    ]
    assert any(e["reason"] == "BudgetMissing" and e["type"] == "Warning" for e in events)

    # 2. budget.create=true: the (restarted) operator creates the budget; the pool is admitted.
    before = _operator_pod_uids(rel)
    values["budget"] = {"create": True, "memory": "100Gi"}
    helm_apply(rel, "upgrade", values, folder)
    budget = eventually(
        lambda: _budget(rel), timeout=60, interval=1, what=f"ModelBudget {rel.budget} created"
    )
    assert budget["spec"] == {"memory": "100Gi"}
    assert not any(k.startswith("helm.sh/") for k in (budget["metadata"].get("annotations") or {})), (
        "not a chart resource nor a hook: helm never deletes it"
    )
    eventually(
        lambda: (c := _budget_condition(rel)) and c["status"] == "False" and _workers(rel),
        timeout=POOL_READY_TIMEOUT_S,
        interval=1,
        what=f"{POOL} admitted once the budget exists",
    )
    assert _operator_pod_uids(rel) != before, "the upgrade restarted the operator"

    # 3. The user changes the budget; an upgrade keeps it as it is (uid, memory, status).
    rel.k("patch", "modelbudget", rel.budget, "--type", "merge", "-p", '{"spec": {"memory": "120Gi"}}')

    def charged() -> dict[str, Any] | None:
        found = _budget(rel)
        pools = ((found or {}).get("status") or {}).get("pools") or []
        mine = [p for p in pools if (p["namespace"], p["name"]) == (rel.namespace, POOL)]
        return found if mine and mine[0].get("memoryBytes") == 10 * GI else None

    kept = eventually(charged, timeout=60, interval=1, what=f"ModelBudget {rel.budget} charging {POOL}")
    before = _operator_pod_uids(rel)
    values["config"] = {**values["config"], "statsIntervalSeconds": 2}  # an unrelated value
    values["budget"] = {"create": True, "memory": "50Gi"}  # sizes only a budget the operator creates
    helm_apply(rel, "upgrade", values, folder)
    assert _operator_pod_uids(rel) != before, "the upgrade restarted the operator"
    after = _budget(rel)
    assert after is not None, "the budget was never deleted"
    assert after["metadata"]["uid"] == kept["metadata"]["uid"], "not recreated"
    assert after["spec"] == {"memory": "120Gi"}, "the user's memory survives the upgrade"
    assert after["metadata"]["creationTimestamp"] == kept["metadata"]["creationTimestamp"]
    status = after.get("status") or {}
    assert any((p["namespace"], p["name"]) == (rel.namespace, POOL) for p in status.get("pools") or []), (
        f"its status survives the upgrade: {status}"
    )
    assert status.get("usedBytes", 0) >= 10 * GI
    # The restarted operator goes on admitting within the user's budget.
    eventually(
        lambda: (c := _budget_condition(rel)) and c["status"] == "False" and c,
        timeout=60,
        interval=1,
        what=f"{POOL} within the budget after the upgrade",
    )

    # No hook can hang on a finalizer: the budget is no hook, and the peering objects carry none. Kopf's
    # peering CRDs come with peering.enabled (off by default) or from another test of the same cluster
    # (make test runs files on two clusters, in any order): without them there is no peering object.
    if rel.k("get", "crd", "kopfpeerings.kopf.dev", check=False).returncode == 0:
        for peering in rel.get("kopfpeerings", "-n", rel.namespace)["items"]:
            assert not peering["metadata"].get("finalizers"), peering["metadata"]
