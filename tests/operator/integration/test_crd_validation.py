"""The generated CRDs on the real kube-apiserver: bad manifests are refused naming the field, kubectl
explain documents every field, the printer columns and the scale subresource work."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from modelpool_contract.api import (
    MSG_ADAPTER_POOL_NAME,
    MSG_ADAPTER_SERVED_NAME,
    MSG_ADAPTER_SOURCE,
    MSG_ADAPTER_TASK,
    MSG_ADAPTER_UNIQUE,
    MSG_KV_CACHE_TARGET,
    MSG_TOKENS_TARGET,
)
from testkit.cluster import Cluster

pytestmark = pytest.mark.cluster


def pool(name: str, **spec_overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"source": "/models/minilm", "task": "text-embedding"},
        "resources": {"memory": "2Gi"},
        "replicas": 1,
    }
    spec.update(spec_overrides)
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name},
        "spec": spec,
    }


SECRET_KEY = {"name": "hf", "key": "token"}


def _cached(**cache: str) -> dict[str, Any]:
    return {"source": "hf://org/m", "task": "text-embedding", "cache": cache}


def _llm() -> dict[str, str]:
    return {"source": "hf://org/llm", "task": "text-generation"}


def _adapter(name: str) -> dict[str, str]:
    return {"name": name, "source": f"hf://org/{name.replace(' ', '-')}-lora"}


def test_a_pool_with_adapters_is_accepted(crds: Cluster, namespace: str) -> None:
    adapters = [_adapter("sql"), {"name": "chat", "source": "pvc://loras/chat@v2"}]
    manifest = pool("llm", model=_llm(), servedModelName="org/llm", adapters=adapters)
    args = ("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-")
    spec = json.loads(crds.kubectl(*args, input=json.dumps(manifest)).stdout)["spec"]
    assert [a["name"] for a in spec["adapters"]] == ["sql", "chat"] and spec["maxLoadedAdapters"] == 4


def create(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> tuple[int, str]:
    # --dry-run=server: the API server validates (schema, CEL) without storing anything.
    done = cluster.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(manifest), check=False
    )
    return done.returncode, done.stderr + done.stdout


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ({"replicas": 3, "maxReplicas": 2}, ["spec.replicas must be less than or equal to spec.maxReplicas"]),
        ({"replicas": 1, "minReplicas": 2}, ["spec.minReplicas must be less than or equal to spec.replicas"]),
        ({"model": {"source": "/m", "task": "translation"}}, ["spec.model.task", "translation"]),
        ({"model": {"source": "s3://bucket/m", "task": "vision"}}, ["spec.model.source", "hf://"]),
        ({"resources": {"memory": "lots"}}, ["spec.resources.memory"]),
        ({"queue": {"capacity": 0}}, ["spec.queue.capacity"]),
        ({"replicas": -1}, ["spec.replicas"]),
        ({"autoscaling": {"targetPerWorker": 0}}, ["spec.autoscaling.targetPerWorker"]),
        (
            {"queue": {"capacity": 5}, "autoscaling": {"targetPerWorker": 6}},
            ["spec.autoscaling.targetPerWorker must be less than or equal to spec.queue.capacity"],
        ),
        # Without spec.queue the capacity is its default (100); the target set explicitly is over it.
        (
            {"autoscaling": {"targetPerWorker": 101}},
            ["spec.autoscaling.targetPerWorker", "spec.queue.capacity"],
        ),
        (
            {"autoscaling": {"scaleUpWindowSeconds": 90}},
            ["spec.autoscaling.stableWindowSeconds must be at least spec.autoscaling.scaleUpWindowSeconds"],
        ),
        ({"resources": {"memory": "2Gi", "hostMemory": "a lot"}}, ["spec.resources.hostMemory"]),
        (
            {
                "podTemplate": {
                    "env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": SECRET_KEY}}]
                }
            },
            ["spec.podTemplate.env[0]", "an env entry has either value or valueFrom, not both"],
        ),
        (
            {"podTemplate": {"env": [{"name": "A", "valueFrom": {}}]}},
            [
                "spec.podTemplate.env[0].valueFrom",
                "valueFrom needs exactly one of secretKeyRef and configMapKeyRef",
            ],
        ),
        (
            {"podTemplate": {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "hf"}}}]}},
            ["spec.podTemplate.env[0].valueFrom.secretKeyRef.key", "Required value"],
        ),
        ({"auth": {"apiKeySecret": {"name": "keys"}}}, ["spec.auth.apiKeySecret.key", "Required value"]),
        ({"model": _cached(type="pvc")}, ["spec.model.cache.claimName is required when type is pvc"]),
        ({"model": _cached(type="hostPath")}, ["spec.model.cache.path is required when type is hostPath"]),
        ({"model": _cached(type="hostPath", path="rel/dir")}, ["spec.model.cache.path"]),
        ({"model": _cached(type="nfs")}, ["spec.model.cache.type", "hostPath"]),
        ({"servedModelName": "a/b/c"}, ["spec.servedModelName"]),
        ({"autoscaling": {"metric": "bytes"}}, ["spec.autoscaling.metric", "kvCache"]),
        ({"autoscaling": {"metric": "tokens"}}, [MSG_TOKENS_TARGET]),
        (
            {"autoscaling": {"metric": "tokens", "targetTokensPerWorker": 0}},
            ["spec.autoscaling.targetTokensPerWorker", "greater than or equal to 1"],
        ),
        ({"autoscaling": {"metric": "kvCache"}}, [MSG_KV_CACHE_TARGET]),
        ({"autoscaling": {"metric": "kvCache", "targetKvCache": 0}}, ["spec.autoscaling.targetKvCache"]),
        ({"autoscaling": {"metric": "kvCache", "targetKvCache": 1.5}}, ["spec.autoscaling.targetKvCache"]),
        ({"activationTimeoutSeconds": 0}, ["spec.activationTimeoutSeconds"]),
        # LoRA adapters: a causal LM's, each named once, none the base model's name, from hf:// or pvc://.
        ({"adapters": [_adapter("a")]}, [MSG_ADAPTER_TASK]),
        ({"model": _llm(), "adapters": [_adapter("a"), _adapter("a")]}, [MSG_ADAPTER_UNIQUE]),
        (
            {"model": _llm(), "servedModelName": "llm", "adapters": [_adapter("llm")]},
            [MSG_ADAPTER_SERVED_NAME],
        ),
        ({"model": _llm(), "adapters": [_adapter("bad")]}, [MSG_ADAPTER_POOL_NAME]),
        (
            {"model": _llm(), "adapters": [{"name": "a", "source": "/models/lora"}]},
            ["spec.adapters[0].source", MSG_ADAPTER_SOURCE],
        ),
        ({"model": _llm(), "adapters": [_adapter("a b")]}, ["spec.adapters[0].name"]),
        ({"model": _llm(), "maxLoadedAdapters": 0}, ["spec.maxLoadedAdapters"]),
        (
            {"model": _llm(), "host": "gpus", "adapters": [_adapter("a")]},
            ["spec.adapters is not supported on a shared pool"],
        ),
    ],
)
def test_bad_manifests_are_refused_naming_the_field(
    crds: Cluster, namespace: str, overrides: dict[str, Any], needles: list[str]
) -> None:
    code, output = create(crds, namespace, pool("bad", **overrides))
    assert code != 0, output
    for needle in needles:
        assert needle in output, output


@pytest.mark.parametrize(
    "source", ["/models/x", "file:///models/x", "hf://org/name@v1", "pvc://claim/sub/path"]
)
def test_good_manifests_are_accepted_with_defaults(crds: Cluster, namespace: str, source: str) -> None:
    manifest = pool("good", model={"source": source, "task": "text-embedding"}, resources={"memory": 2**31})
    args = ("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-")
    spec = json.loads(crds.kubectl(*args, input=json.dumps(manifest)).stdout)["spec"]
    assert spec["maxReplicas"] == 10 and spec["minReplicas"] == 0 and spec["model"]["dtype"] == "auto"
    assert spec["activationTimeoutSeconds"] == 120 and "servedModelName" not in spec


@pytest.mark.parametrize(
    "overrides",
    [
        {"queue": {"capacity": 5}, "autoscaling": {"targetPerWorker": 5}},
        {"queue": {"capacity": 5}},  # no spec.autoscaling: the rule does not apply
        # Not counted in requests: the queue's bound is not the target's.
        {"queue": {"capacity": 5}, "autoscaling": {"metric": "tokens", "targetTokensPerWorker": 4096}},
        {"queue": {"capacity": 5}, "autoscaling": {"metric": "kvCache", "targetKvCache": 1}},
    ],
)
def test_a_target_within_the_queue_capacity_is_accepted(
    crds: Cluster, namespace: str, overrides: dict[str, Any]
) -> None:
    code, output = create(crds, namespace, pool("fits", **overrides))
    assert code == 0, output


def test_secrets_by_reference_and_host_memory_are_accepted(crds: Cluster, namespace: str) -> None:
    manifest = pool(
        "good",
        resources={"memory": "24Gi", "gpus": 1, "hostMemory": "8Gi"},
        podTemplate={
            "env": [
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": SECRET_KEY}},
                {
                    "name": "MODE",
                    "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": True}},
                },
                {"name": "PLAIN", "value": "1"},
            ]
        },
        auth={"apiKeySecret": {"name": "keys", "key": "pool"}},
    )
    args = ("create", "--dry-run=server", "-o", "json", "-n", namespace, "-f", "-")
    spec = json.loads(crds.kubectl(*args, input=json.dumps(manifest)).stdout)["spec"]
    assert spec["podTemplate"]["env"][0] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": SECRET_KEY}}
    assert spec["resources"]["hostMemory"] == "8Gi" and spec["auth"]["apiKeySecret"]["key"] == "pool"


@pytest.mark.parametrize(
    "cache",
    [
        {"type": "none"},
        {"type": "pvc", "claimName": "hub-cache"},
        {"type": "hostPath", "path": "/var/cache/m"},
    ],
)
def test_model_caches_are_accepted(crds: Cluster, namespace: str, cache: dict[str, str]) -> None:
    code, output = create(crds, namespace, pool("cached", model=_cached(**cache)))
    assert code == 0, output


def test_kubectl_explain_documents_the_queue(crds: Cluster) -> None:
    out = crds.kubectl("explain", "modelpool.spec.queue").stdout
    for field in ("capacity", "maxBatchSize", "maxBatchDelayMs", "requestTimeoutSeconds", "429"):
        assert field in out, out
    status = crds.kubectl("explain", "modelpool.status.workers").stdout
    assert "lastRequestTime" in status and "queueDepth" in status and "generation" in status
    autoscaling = crds.kubectl("explain", "modelpool.spec.autoscaling").stdout
    fields = ("enabled", "targetPerWorker", "scaleUpWindowSeconds", "scaleDownDelaySeconds", "HPA")
    for field in (*fields, "metric", "targetTokensPerWorker", "targetKvCache"):
        assert field in autoscaling, autoscaling


def test_printer_columns_status_and_scale(crds: Cluster, namespace: str) -> None:
    crds.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(pool("cols", maxReplicas=4)))
    status = {
        "status": {
            "phase": "Ready",
            "readyText": "1/1",
            "targetReplicas": 1,
            "memory": {"charged": "2Gi", "chargedBytes": 2**31, "declared": "2Gi"},
            "generation": {"running": 3, "tokensInFlight": 1500, "kvCacheUse": 0.37},
        }
    }
    crds.kubectl(
        "patch", "modelpool/cols", "-n", namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    table = crds.kubectl("get", "mp", "cols", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "TASK", "READY", "DESIRED", "STATE", "MEMORY", "AGE"]
    assert table[1].split()[:6] == ["cols", "text-embedding", "1/1", "1", "Ready", "2Gi"]
    wide = crds.kubectl("get", "mp", "cols", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["DECLARED", "MEASURED", "TOKENS"]
    declared = wide[0].index("DECLARED")
    assert wide[1][declared:].split() == ["2Gi", "1500"]  # an unset MEASURED prints as nothing
    crds.kubectl("scale", "modelpool/cols", "-n", namespace, "--replicas=3")
    got = json.loads(crds.kubectl("get", "mp", "cols", "-n", namespace, "-o", "json").stdout)
    assert got["spec"]["replicas"] == 3
    refused = crds.kubectl("scale", "modelpool/cols", "-n", namespace, "--replicas=9", check=False)
    assert (
        refused.returncode != 0
        and "spec.replicas must be less than or equal to spec.maxReplicas" in refused.stderr
    )


def test_modelbudget_columns_and_validation(crds: Cluster) -> None:
    name = "crd-check-budget"
    bad = {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelBudget",
        "metadata": {"name": name},
        "spec": {"memory": "much"},
    }
    done = crds.kubectl("create", "--dry-run=server", "-f", "-", input=yaml.safe_dump(bad), check=False)
    assert done.returncode != 0 and "spec.memory" in done.stderr
    good = {**bad, "spec": {"memory": "80Gi"}}
    crds.kubectl("create", "-f", "-", input=yaml.safe_dump(good))
    try:
        table = crds.kubectl("get", "mb", name).stdout.splitlines()
        assert table[0].split() == ["NAME", "TOTAL", "USED", "RESERVED", "AGE"]
        assert table[1].split()[:2] == [name, "80Gi"]
    finally:
        crds.kubectl("delete", "mb", name, "--wait=false", check=False)
