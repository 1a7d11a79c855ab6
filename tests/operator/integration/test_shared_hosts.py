"""Shared hosts (issue 21) with the real operator on the local control plane: a pool with ``spec.host``
never gets dedicated workers; its status says it waits for placement on its ModelHost, and why.

One operator serves the module's tests (they share a namespace and a set-up: each costs seconds)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from modelpool_contract.labels import LABEL_POOL
from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_established, wait_for
from testkit.services import OperatorProcess, stop_all
from tests.operator.integration.opharness import condition, reasons, wait_status

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def shared_ns(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A namespace with one operator watching it (the objects deleted and the operator stopped, exiting 0,
    at the module's end; its log shown then)."""
    wait_established(crds, "modelhosts.modelpool.dev")
    namespace = f"shared-{uuid.uuid4().hex[:8]}"
    crds.kubectl("create", "namespace", namespace)
    wait_for(
        lambda: (
            crds.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False).returncode == 0
        ),
        timeout=30,
        message=f"default ServiceAccount in {namespace}",
    )
    process = OperatorProcess(crds, (namespace,), tmp_path_factory.mktemp("shared") / "operator.log")
    try:
        yield namespace
    finally:
        crds.kubectl(
            "delete", "modelpools,modelhosts", "--all", "-n", namespace, "--timeout=30s", check=False
        )
        stop_all([process], show_logs=True, what="operator")
        crds.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def shared_pool(name: str, host: str, memory: str = "2Gi") -> dict[str, Any]:
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "/models/tiny", "task": "text-embedding"},
            "resources": {"memory": memory},
            "host": host,
        },
    }


def model_host(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelHost",
        "metadata": {"name": name},
        "spec": spec,
    }


def placed(reason: str) -> Any:
    return lambda status: condition(status, "Placed").get("reason") == reason


def test_a_shared_pool_waits_for_its_host_with_the_reason_and_gets_no_worker(
    crds: Cluster, shared_ns: str
) -> None:
    apply(crds, shared_pool("emb", "gpus"), shared_ns)
    status = wait_status(
        crds, shared_ns, "emb", placed("HostNotFound"), timeout=60, message="the pool waits: no ModelHost"
    )
    assert status["phase"] == "Pending" and status["replicas"] == 0
    assert "waiting for placement on ModelHost gpus" in condition(status, "Placed")["message"]
    assert condition(status, "Ready")["status"] == "False"
    apply(crds, model_host("gpus", replicas=0, gpusPerHost=1, deviceMemory="8Gi"), shared_ns)
    wait_status(crds, shared_ns, "emb", placed("NoHost"), timeout=30, message="the pool waits: no host pod")
    told = [reason for reason, _ in reasons(crds, shared_ns, "emb")]
    assert told[:2] == ["HostNotFound", "NoHost"]
    pods = get_json(crds, "pods", "-n", shared_ns, "-l", f"{LABEL_POOL}=emb")["items"]
    assert pods == []
