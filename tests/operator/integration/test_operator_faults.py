"""The operator's fault paths on the local real control plane (KWOK nodes for the workers).

* A namespace whose ResourceQuota allows no Service: the real API server refuses the pool's Service (as it
  did at 300 pools, when the Service IP range was full), and the pool still gets its workers; the
  refusal reaches the pool's status (condition ApiError) and its Events with the API server's own
  message, and the pass never crashes (no traceback in the operator's log).
* An invalid ModelBudget: ``1e41`` passes the CRD's quantity pattern but is beyond any memory the parser
  accepts. The operator fails closed (no worker is ever created while it stays so: watched at every pod
  change), says why on the pool (BudgetExceeded, reason BudgetInvalid) and on the ModelBudget (Valid
  False), and admits the workers once the budget is fixed.
"""

from __future__ import annotations

from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from tests.operator.integration.opharness import (
    BudgetedOperator,
    StartOperator,
    condition,
    events,
    pool_manifest,
    states,
    wait_status,
)

pytestmark = pytest.mark.cluster


def _no_services_quota(cluster: Cluster, namespace: str) -> None:
    """A ResourceQuota that allows no Service, in force (its status filled by the controller-manager: until
    then the API server refuses every Service with "status unknown for quota")."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services"},
        "spec": {"hard": {"services": "0"}},
    }
    apply(cluster, quota, namespace)
    wait_for(
        lambda: (get_json(cluster, "resourcequota", "no-services", "-n", namespace).get("status") or {}).get(
            "hard"
        ),
        timeout=60,
        interval=0.5,
        message="the quota's status filled",
    )


def test_a_service_the_api_refuses_never_keeps_workers_from_starting(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    _no_services_quota(cluster, namespace)
    operator = start_operator(namespace)
    apply(cluster, pool_manifest("emb", replicas=2), namespace)

    status = wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: states(s) == ["Ready", "Ready"] and condition(s, "ApiError").get("status") == "True",
        timeout=90,
        message="two Ready workers, and the Service's refusal in status",
    )
    api_error = condition(status, "ApiError")
    assert api_error["reason"] == "ServiceFailed"
    message = api_error["message"]
    assert message.startswith("Service emb: 403 "), message
    assert "exceeded quota: no-services, requested: services=1" in message, message
    assert "limited: services=0" in message, message
    told = [e for e in events(cluster, namespace, "emb") if e["reason"] == "ServiceFailed"]
    assert [(e["type"], e["message"]) for e in told] == [("Warning", message)]
    assert all(e["reason"] != "ReconcileError" for e in events(cluster, namespace, "emb"))
    services = get_json(cluster, "services", "-n", namespace)["items"]
    assert not services
    # Every pass went through (it is retried at the next, without a traceback each time).
    assert "Traceback" not in operator.log_tail(10**7)


def _budget(cluster: Cluster) -> dict[str, Any]:
    return get_json(cluster, "modelbudget", "default").get("status") or {}


def test_an_invalid_budget_admits_no_worker_until_it_is_fixed(
    cluster: Cluster, namespace: str, budgeted_operator: BudgetedOperator, budget: Any
) -> None:
    watcher, _ = budgeted_operator("1e41")
    apply(cluster, pool_manifest("emb", replicas=2), namespace)

    status = wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: condition(s, "BudgetExceeded").get("reason") == "BudgetInvalid",
        timeout=60,
        message="the pool says the budget is invalid",
    )
    blocked = condition(status, "BudgetExceeded")
    assert blocked["status"] == "True"
    assert blocked["message"].startswith(
        "ModelBudget default is invalid: spec.memory: invalid quantity '1e41'"
    )
    assert blocked["message"].endswith("; no worker is admitted until it is fixed")
    valid = wait_for(
        lambda: condition(_budget(cluster), "Valid") or None,
        timeout=30,
        interval=0.5,
        message="the ModelBudget's Valid condition",
    )
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert valid["message"] == blocked["message"]
    told = [e for e in events(cluster, namespace, "emb") if e["reason"] == "BudgetInvalid"]
    assert [(e["type"], e["message"]) for e in told] == [("Warning", blocked["message"])]
    assert not watcher.history, "a worker was created while the budget was invalid"

    budget("4Gi")
    status = wait_status(
        cluster,
        namespace,
        "emb",
        lambda s: states(s) == ["Ready", "Ready"],
        timeout=60,
        message="the workers admitted once the budget is fixed",
    )
    assert condition(status, "BudgetExceeded")["status"] == "False"
    wait_for(
        lambda: condition(_budget(cluster), "Valid").get("status") == "True",
        timeout=30,
        interval=0.5,
        message="the ModelBudget valid again",
    )
    watcher.stop()
    assert watcher.max_memory <= 4 * 2**30
