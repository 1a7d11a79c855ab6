"""Shared hosts (issue 21) with the real operator on the local control plane: a ModelHost gets its host
pods (on KWOK GPU nodes: nothing runs in them) with the right spec, within the ModelBudget, and a status;
a CPU ModelHost's pod on the process node is a real ``modelpool-server --shared-host`` whose ``/stats``
the status shows;
a pool with ``spec.host`` never gets dedicated workers, and its status says it waits for placement on its
ModelHost, and why.

One operator serves the module's tests (they share a namespace and a set-up: each costs seconds)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from modelpool_contract.labels import LABEL_POOL
from modelpool_contract.placements import LABEL_HOST, read_models
from modelpool_operator.effects.resources import CONTROL_KEY_FILE
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import (
    PROCESS_NODE_SELECTOR,
    PROCESS_NODE_TOLERATION,
    apply,
    get_json,
    wait_established,
    wait_for,
)
from testkit.services import (
    KWOK_GPU_PLACEMENT,
    GatewayProcess,
    OperatorProcess,
    budget_manifest,
    host_manifest,
    minilm_source,
    stop_all,
)
from tests.operator.integration.opharness import GI, condition, reasons, wait_status

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
    apply(crds, {**budget_manifest("20Gi"), "metadata": {"name": BUDGET}})
    log = tmp_path_factory.mktemp("shared") / "operator.log"
    # kubeconfig named (its default): mypy matches the values of **OPERATOR_ENV to every parameter left open.
    OPERATOR[namespace] = OperatorProcess(crds, (namespace,), log, kubeconfig=None, **OPERATOR_ENV)
    try:
        yield namespace
    finally:
        crds.kubectl(
            "delete", "modelpools,modelhosts", "--all", "-n", namespace, "--timeout=30s", check=False
        )
        crds.kubectl("delete", "modelbudget", BUDGET, "--ignore-not-found", "--wait=false")
        stop_all([OPERATOR.pop(namespace)], show_logs=True, what="operator")
        crds.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


BUDGET = f"shared-{uuid.uuid4().hex[:6]}"
# The operator watching each module namespace (``restart_operator`` replaces it), and its settings: the
# same for a restarted one (the workers' probe port is part of the host pods it renders: another would
# roll them).
OPERATOR: dict[str, OperatorProcess] = {}
OPERATOR_ENV = {
    "MODELPOOL_OPERATOR_BUDGET_NAME": BUDGET,
    "MODELPOOL_OPERATOR_SERVER_PROBE_PORT": str(free_port()),
}


def restart_operator(crds: Cluster, namespace: str) -> None:
    """Stop the namespace's operator (exit 0) and start another (same settings, same log, same seed file:
    testkit's OperatorProcess passes the cluster's, as the chart mounts one)."""
    old = OPERATOR[namespace]
    assert old.stop() == 0, old.log_tail()
    OPERATOR[namespace] = OperatorProcess(crds, (namespace,), old.log_path, kubeconfig=None, **OPERATOR_ENV)


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
    apply(crds, host_manifest("gpus", replicas=0, gpusPerHost=1, deviceMemory="8Gi"), shared_ns)
    wait_status(crds, shared_ns, "emb", placed("NoHost"), timeout=30, message="the pool waits: no host pod")
    # One Event per reason (the events' order as listed is not their order in time).
    told = [reason for reason, _ in reasons(crds, shared_ns, "emb")]
    assert sorted(told) == ["HostNotFound", "NoHost"]
    pods = get_json(crds, "pods", "-n", shared_ns, "-l", f"{LABEL_POOL}=emb")["items"]
    assert pods == []


def test_a_modelhost_gets_its_host_pods_within_the_budget_and_a_status(crds: Cluster, shared_ns: str) -> None:
    # Each GPU host pod is charged its device (8Gi): the 20Gi budget admits two of the three.
    apply(crds, shared_pool("emb2", "kwok"), shared_ns)
    apply(
        crds,
        host_manifest(
            "kwok", replicas=3, gpusPerHost=1, deviceMemory="8Gi", hostMemory="16Gi", **KWOK_GPU_PLACEMENT
        ),
        shared_ns,
    )

    def status() -> dict[str, Any]:
        got: dict[str, Any] = get_json(crds, "modelhost", "kwok", "-n", shared_ns).get("status") or {}
        return got

    wait_for(lambda: status().get("readyReplicas") == 2, timeout=60, message="two host pods ready")
    pods = get_json(crds, "pods", "-n", shared_ns, "-l", f"{LABEL_HOST}=kwok")["items"]
    assert sorted(p["metadata"]["name"] for p in pods) == ["kwok-0", "kwok-1"]
    [container] = pods[0]["spec"]["containers"]
    args = container["args"]
    assert args[0] == "--shared-host" and args[args.index("--device-memory") + 1] == str(8 * GI)
    assert args[args.index("--host-memory") + 1] == str(16 * GI)
    assert args[args.index("--control-key-file") + 1] == CONTROL_KEY_FILE
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pods[0]["spec"]["nodeSelector"] == {"type": "kwok"}
    assert pods[0]["metadata"]["ownerReferences"][0]["kind"] == "ModelHost"
    secret = get_json(crds, "secret", "kwok-control-key", "-n", shared_ns)
    assert secret["data"]["key"]
    got = status()
    assert got["replicas"] == 2 and got["readyText"] == "2/3"
    assert [h["name"] for h in got["hosts"]] == ["kwok-0", "kwok-1"]
    assert got["hosts"][0]["devices"][0]["capacity"] == "8Gi" and got["memory"]["free"] == "16Gi"
    budget = wait_for(
        lambda: (get_json(crds, "modelbudget", BUDGET).get("status") or {}).get("usedBytes") == 16 * GI,
        timeout=30,
        message="the budget charges the two host pods",
    )
    assert budget
    told = [reason for reason, _ in reasons(crds, shared_ns, "kwok")]
    assert "BudgetExceeded" in told
    # KWOK host pods run nothing: without their /stats no model is placed on them.
    wait_status(crds, shared_ns, "emb2", placed("NoHost"), timeout=30, message="no host pod answers")
    assert get_json(crds, "pods", "-n", shared_ns, "-l", f"{LABEL_POOL}=emb2")["items"] == []


def test_a_cpu_host_pod_is_a_real_shared_host_on_the_process_node(crds: Cluster, shared_ns: str) -> None:
    placement = {"nodeSelector": PROCESS_NODE_SELECTOR, "tolerations": [PROCESS_NODE_TOLERATION]}
    host = host_manifest("cpu", replicas=1, gpusPerHost=0, deviceMemory="1Gi", hostMemory="1Gi", **placement)
    apply(crds, host, shared_ns)

    def status() -> dict[str, Any]:
        got: dict[str, Any] = get_json(crds, "modelhost", "cpu", "-n", shared_ns).get("status") or {}
        return got

    # Ready: the host process answers its readiness probe with its control key read from the Secret.
    wait_for(lambda: status().get("readyReplicas") == 1, timeout=90, message="the CPU host pod ready")
    [host] = status()["hosts"]
    assert host["name"] == "cpu-0" and host["state"] in ("Ready", "Idle")
    assert host["devices"][0]["capacity"] == "1Gi" and host["devices"][0]["free"] == "1Gi"
    assert host["models"] == []


def test_a_shared_pool_is_placed_served_put_to_sleep_woken_and_unloaded(
    crds: Cluster, shared_ns: str, tmp_path: Path
) -> None:
    """On the CPU host pod of the test above (a real ``modelpool-server --shared-host``): the operator
    loads MiniLM there, the pool's status lists the host pod, the pod's annotation names the pool, the
    real gateway routes the openai client's embeddings to it; the host puts it to sleep once idle (1 s)
    and a request wakes it and is answered; with minReplicas 0 the operator unloads it once idle twice
    that (the pool scaled to zero), and the gateway's held request gets it placed again and answered;
    deleting the pool, by a restarted operator, unloads it first."""
    pool = {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "minilm"},
        "spec": {
            "model": {"source": minilm_source(), "task": "text-embedding"},
            "resources": {"memory": "512Mi"},
            "idleTimeoutSeconds": 1,
            "minReplicas": 1,
            "host": "cpu",
        },
    }
    apply(crds, pool, shared_ns)
    status = wait_status(
        crds,
        shared_ns,
        "minilm",
        lambda s: condition(s, "Ready").get("status") == "True",
        timeout=120,
        message="MiniLM placed and serving on the host pod",
    )
    assert condition(status, "Placed")["status"] == "True" and status["readyText"] == "1/1"
    [worker] = status["workers"]
    assert worker["name"] == worker["host"] == "cpu-0"

    def on_host() -> dict[str, str]:
        pod = get_json(crds, "pod", "cpu-0", "-n", shared_ns)
        return dict(read_models(pod["metadata"].get("annotations")))

    assert wait_for(lambda: "minilm" in on_host(), timeout=30, message="the host pod's annotation")
    gateway = GatewayProcess(crds, (shared_ns,), tmp_path / "gateway.log")
    try:
        gateway.wait_ready()
        client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.key, max_retries=0, timeout=60)
        answer = client.embeddings.create(model="minilm", input=["A man is eating food."])
        assert len(answer.data[0].embedding) == 384
        wait_for(lambda: on_host().get("minilm") == "Sleeping", timeout=30, message="MiniLM asleep")
        woken = client.embeddings.create(model="minilm", input=["A man is riding a horse."])
        assert len(woken.data[0].embedding) == 384
        wait_for(
            lambda: on_host().get("minilm") in ("Ready", "Idle", "Processing", "Sleeping"),
            timeout=30,
            message="MiniLM awake again",
        )
        # Scale to zero: idle twice idleTimeoutSeconds (asleep for the second), unloaded; the gateway holds
        # the next request and records the demand, for which the operator places the model again.
        patch = '{"spec": {"minReplicas": 0}}'
        crds.kubectl("patch", "modelpool", "minilm", "-n", shared_ns, "--type=merge", "-p", patch)
        wait_status(
            crds, shared_ns, "minilm", lambda s: s["phase"] == "ScaledToZero", timeout=30, message="unloaded"
        )
        wait_for(lambda: "minilm" not in on_host(), timeout=30, message="the annotation without MiniLM")
        placed_again = client.embeddings.create(model="minilm", input=["A woman is playing violin."])
        assert len(placed_again.data[0].embedding) == 384
        told = [reason for reason, _ in reasons(crds, shared_ns, "minilm")]
        assert "IdleUnload" in told and "WokenByDemand" in told
    finally:
        stop_all([gateway], show_logs=True, what="gateway")
    # A restarted operator (nothing remembered, no Secret it may read) still controls the host: the
    # finalizer's unload below carries the key it derives again from the seed (a wrong one: 401, the
    # finalizer holds and the delete times out).
    restart_operator(crds, shared_ns)
    # The finalizer unloads the model before the pool goes (kubectl waits for that).
    crds.kubectl("delete", "modelpool", "minilm", "-n", shared_ns, "--timeout=60s")
    wait_for(lambda: "minilm" not in on_host(), timeout=30, message="the annotation without the pool")
    wait_for(
        lambda: get_json(crds, "modelhost", "cpu", "-n", shared_ns)["status"]["hosts"][0]["models"] == [],
        timeout=30,
        message="the host holds no model once the pool is gone",
    )
