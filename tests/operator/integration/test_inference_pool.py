"""spec.inferencePool on the real API server (issue 33): the InferencePool CRD of the Gateway API Inference
Extension (v1.6.0, vendored in testdata/) installed, the operator makes a pool's InferencePool with the exact
shape, selecting the pool's serving workers only (the Service's selector), brings it up to date when the spec
changes, makes it again when someone deletes it, removes it when the field is removed, and the garbage
collector of the real kube-controller-manager deletes it with its pool; the pool's NetworkPolicy admits the
picker. Without the CRD the pool is told so (ApiError, InferencePoolUnavailable, a Warning Event), its
workers are made all the same, and the InferencePool follows once the CRD is installed.

The workers are KWOK pods (no process behind them): what is checked is what the API server accepted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from tests.operator.integration.opharness import (
    INFERENCE_POOL_CRD_NAME,
    POOLS,
    StartOperator,
    condition,
    install_inference_pool_crd,
    pool_manifest,
    pool_status,
    reasons,
    remove_inference_pool_crd,
)

pytestmark = pytest.mark.cluster

RESOURCE = INFERENCE_POOL_CRD_NAME
PICKER = {"app": "llm-epp"}
OPERATOR = {"app.kubernetes.io/name": "modelpool-operator", "app.kubernetes.io/instance": "mp"}


def _settings() -> dict[str, str]:
    """The operator's environment as the chart sets it with inferencePool.enabled and its NetworkPolicy,
    and a short resync (a pass after the CRD is installed, with no event to wake the pool)."""
    prefix = "MODELPOOL_OPERATOR_"
    return {
        f"{prefix}INFERENCE_POOLS_ENABLED": "true",
        f"{prefix}NETWORK_POLICY_ENABLED": "true",
        f"{prefix}NETWORK_POLICY_NAMESPACE": "mp-system",
        f"{prefix}NETWORK_POLICY_OPERATOR_LABELS": json.dumps(OPERATOR),
        f"{prefix}RESYNC_INTERVAL_SECONDS": "1",
    }


def _llm_pool(name: str, replicas: int, inference_pool: dict[str, Any] | None) -> dict[str, Any]:
    body = pool_manifest(name, replicas=replicas, task="text-generation")
    if inference_pool is not None:
        body["spec"]["inferencePool"] = inference_pool
    return body


def _asked(**more: Any) -> dict[str, Any]:
    return {"endpointPicker": "llm-epp", "pickerPodLabels": PICKER, **more}


def _inference_pool(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    found = cluster.kubectl("get", RESOURCE, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(found.stdout) if found.returncode == 0 else None


@pytest.fixture
def without_crd(cluster: Cluster) -> Iterator[Cluster]:
    """No InferencePool CRD at the start (a cluster reused from another run may have it); removed again
    after the test, so the cluster is left as other test files expect it."""
    remove_inference_pool_crd(cluster)
    yield cluster
    cluster.kubectl("delete", "crd", RESOURCE, "--ignore-not-found", "--timeout=60s", check=False)


def _serving_pods(cluster: Cluster, namespace: str, selector: dict[str, str]) -> list[str]:
    """The pods the API server matches with ``selector`` (what the picker's pod reconciler lists)."""
    text = ",".join(f"{k}={v}" for k, v in selector.items())
    items = get_json(cluster, "pods", "-n", namespace, "-l", text)["items"]
    return sorted(p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp"))


def test_without_the_crd_the_pool_is_told_and_its_inference_pool_follows_the_install(
    without_crd: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    cluster = without_crd
    operator = start_operator(namespace, **_settings())
    apply(cluster, _llm_pool("llm", 1, _asked()), namespace)

    def told() -> dict[str, Any] | None:
        api_error = condition(pool_status(cluster, namespace, "llm"), "ApiError")
        return api_error if api_error.get("reason") == "InferencePoolUnavailable" else None

    api_error = wait_for(told, timeout=60, message="ApiError=True, InferencePoolUnavailable")
    assert api_error["status"] == "True" and "no InferencePool API" in api_error["message"]
    warnings = [m for r, m in reasons(cluster, namespace, "llm") if r == "InferencePoolUnavailable"]
    assert warnings and "install the Gateway API Inference Extension's CRDs" in warnings[0]
    # The workers are made all the same, and the operator runs on.
    assert len(get_json(cluster, "pods", "-n", namespace, "-l", "modelpool.dev/pool=llm")["items"]) == 1
    assert operator.alive()

    install_inference_pool_crd(cluster)
    made = wait_for(
        lambda: _inference_pool(cluster, namespace, "llm"),
        timeout=60,
        message="the InferencePool, once served",
    )
    assert made["spec"]["endpointPickerRef"]["name"] == "llm-epp"
    wait_for(
        lambda: condition(pool_status(cluster, namespace, "llm"), "ApiError").get("status") == "False",
        timeout=60,
        message="ApiError=False once the InferencePool is made",
    )


def test_a_pools_inference_pool_selects_its_serving_workers_follows_its_spec_and_goes_with_it(
    without_crd: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    cluster = without_crd
    install_inference_pool_crd(cluster)
    start_operator(namespace, **_settings())
    apply(cluster, _llm_pool("llm", 2, _asked()), namespace)
    made = wait_for(
        lambda: _inference_pool(cluster, namespace, "llm"), timeout=60, message="the InferencePool"
    )
    pool = get_json(cluster, POOLS, "llm", "-n", namespace)
    assert made["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelPool",
            "name": "llm",
            "uid": pool["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    serving = {"modelpool.dev/pool": "llm", "modelpool.dev/serving": "true"}
    assert made["spec"] == {
        "selector": {"matchLabels": serving},
        "targetPorts": [{"number": 8000}],
        "appProtocol": "http",
        "endpointPickerRef": {
            "group": "",
            "kind": "Service",
            "name": "llm-epp",
            "port": {"number": 9002},
            "failureMode": "FailClose",
        },
    }
    # The Service's selector: the workers that serve, labelled for the picker's engine type.
    assert get_json(cluster, "service", "llm", "-n", namespace)["spec"]["selector"] == serving

    def two_serving() -> list[str] | None:
        found = _serving_pods(cluster, namespace, serving)
        return found if len(found) == 2 else None

    workers = wait_for(two_serving, timeout=60, message="two serving workers selected")
    for name in workers:
        labels = get_json(cluster, "pod", name, "-n", namespace)["metadata"]["labels"]
        assert labels["llm-d.ai/engine-type"] == "vllm"
    # The NetworkPolicy admits the picker on both ports.
    policy = get_json(cluster, "networkpolicy", "modelpool-llm", "-n", namespace)
    picker = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "podSelector": {"matchLabels": PICKER},
    }
    assert all(picker in rule["from"] for rule in policy["spec"]["ingress"])

    # A scale-down evicts a worker: the serving label goes first, so the picker's endpoints shrink with the
    # Service's, whatever the drain still holds.
    cluster.kubectl("patch", POOLS, "llm", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":1}}')
    wait_for(
        lambda: len(_serving_pods(cluster, namespace, serving)) == 1,
        timeout=60,
        message="one serving worker selected after the scale-down",
    )

    # A spec change brings it up to date; removing the field removes it (and the picker's admission).
    moved = {"spec": {"inferencePool": _asked(endpointPickerPort=9003, failureMode="FailOpen")}}
    cluster.kubectl("patch", POOLS, "llm", "-n", namespace, "--type=merge", "-p", json.dumps(moved))

    def ref() -> dict[str, Any] | None:
        found = _inference_pool(cluster, namespace, "llm")
        return found["spec"]["endpointPickerRef"] if found else None

    wait_for(lambda: (r := ref()) and r["port"] == {"number": 9003} and r["failureMode"] == "FailOpen",
             timeout=60, message="the picker's port and failure mode brought up to date")  # fmt: skip
    # Deleted by someone, it is made again as the pool says (the operator watches what it owns).
    uid = (_inference_pool(cluster, namespace, "llm") or {})["metadata"]["uid"]
    cluster.kubectl("delete", RESOURCE, "llm", "-n", namespace, "--timeout=60s")
    wait_for(
        lambda: (p := _inference_pool(cluster, namespace, "llm")) and p["metadata"]["uid"] != uid,
        timeout=20,
        interval=0.2,
        message="the deleted InferencePool made again",
    )
    assert (ref() or {}).get("port") == {"number": 9003}
    cluster.kubectl("patch", POOLS, "llm", "-n", namespace, "--type=json", "-p",
                    '[{"op":"remove","path":"/spec/inferencePool"}]')  # fmt: skip
    wait_for(
        lambda: _inference_pool(cluster, namespace, "llm") is None,
        timeout=60,
        message="the InferencePool removed with the field",
    )

    def picker_admitted() -> bool:
        rules = get_json(cluster, "networkpolicy", "modelpool-llm", "-n", namespace)["spec"]["ingress"]
        return any(picker in rule["from"] for rule in rules)

    wait_for(lambda: not picker_admitted(), timeout=60, message="the picker no longer admitted")

    # Asked again, then the pool deleted: the garbage collector takes the InferencePool with it.
    cluster.kubectl("patch", POOLS, "llm", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"inferencePool": _asked()}}))  # fmt: skip
    wait_for(
        lambda: _inference_pool(cluster, namespace, "llm"), timeout=60, message="the InferencePool again"
    )
    cluster.kubectl("delete", POOLS, "llm", "-n", namespace, "--timeout=60s")
    wait_for(
        lambda: _inference_pool(cluster, namespace, "llm") is None,
        timeout=60,
        interval=0.5,
        message="the InferencePool garbage-collected with its pool",
    )


def test_the_api_server_refuses_it_on_a_pool_that_is_not_text_generation(
    crds: Cluster, namespace: str
) -> None:
    body = pool_manifest("emb", task="text-embedding")
    body["spec"]["inferencePool"] = _asked()
    refused = crds.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body), check=False)
    assert refused.returncode != 0
    assert "spec.inferencePool needs spec.model.task text-generation" in refused.stderr
