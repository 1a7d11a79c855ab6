"""The pydantic API models: camelCase wire, validation messages that name the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from modelpool_contract.api import (
    MSG_TARGET_LE_CAPACITY,
    ModelBudgetSpec,
    ModelPoolSpec,
    ModelPoolStatus,
    WorkerStatus,
    autoscaling_enabled,
    parse_pool_spec,
    parse_pool_status,
    source_is_supported,
)


def body(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"source": "hf://sentence-transformers/all-MiniLM-L6-v2", "task": "text-embedding"},
        "resources": {"memory": "2Gi", "gpus": 1},
        "replicas": 2,
        "minReplicas": 1,
        "maxReplicas": 4,
        "queue": {"capacity": 10, "maxBatchSize": 8, "maxBatchDelayMs": 2, "requestTimeoutSeconds": 5},
        "podTemplate": {"nodeSelector": {"gpu": "a100"}, "env": [{"name": "X", "value": "1"}]},
    }
    spec.update(overrides)
    return spec


def test_parse_full_spec_camel_case() -> None:
    spec = parse_pool_spec(body())
    assert spec.min_replicas == 1 and spec.queue.max_batch_size == 8
    assert spec.resources.memory_bytes == 2 * 2**30
    assert spec.pod_template.node_selector == {"gpu": "a100"}
    wire = spec.wire()
    assert wire["minReplicas"] == 1 and wire["queue"]["requestTimeoutSeconds"] == 5
    assert wire["model"]["trustRemoteCode"] is False


def _cached(cache: dict[str, Any]) -> dict[str, Any]:
    return {"model": {"source": "hf://org/m", "task": "text-embedding", "cache": cache}}


def test_defaults() -> None:
    spec = ModelPoolSpec.model_validate(
        {"model": {"source": "/models/x", "task": "vision"}, "resources": {"memory": 1}}
    )
    assert (spec.replicas, spec.min_replicas, spec.max_replicas, spec.priority) == (1, 0, 10, 0)
    assert spec.queue.capacity == 100 and spec.model.dtype == "auto"
    policy = spec.autoscaling
    assert (policy.enabled, policy.target_per_worker, policy.scale_up_window_seconds) == (None, 10, 10)
    assert (policy.stable_window_seconds, policy.scale_down_delay_seconds) == (60, 120)
    # On by default when maxReplicas > minReplicas; an explicit setting wins.
    assert autoscaling_enabled(spec)
    assert not autoscaling_enabled(parse_pool_spec(body(autoscaling={"enabled": False})))
    assert not autoscaling_enabled(parse_pool_spec(body(minReplicas=2, replicas=2, maxReplicas=2)))
    assert spec.served_model_name is None and spec.activation_timeout_seconds == 120


@pytest.mark.parametrize(
    "name", ["minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "llama3:8b", "a"]
)
def test_served_model_names_a_client_would_use(name: str) -> None:
    assert parse_pool_spec(body(servedModelName=name)).served_model_name == name


def test_a_target_per_worker_within_the_queue_capacity_is_accepted() -> None:
    assert parse_pool_spec(body(autoscaling={"targetPerWorker": 10})).autoscaling.target_per_worker == 10
    # Without spec.autoscaling the rule does not apply (a small queue with the default target is not refused).
    assert parse_pool_spec(body(queue={"capacity": 3})).queue.capacity == 3
    assert "spec.autoscaling.targetPerWorker" in MSG_TARGET_LE_CAPACITY
    assert "spec.queue.capacity" in MSG_TARGET_LE_CAPACITY


@pytest.mark.parametrize(
    ("overrides", "field", "needle"),
    [
        ({"minReplicas": 3}, "", "spec.minReplicas must be less than or equal to spec.replicas"),
        ({"replicas": 5}, "", "spec.replicas must be less than or equal to spec.maxReplicas"),
        ({"model": {"source": "/m", "task": "translation"}}, "model.task", "text-embedding"),
        ({"model": {"source": "s3://bucket/m", "task": "vision"}}, "model.source", "pattern"),
        ({"resources": {"memory": "lots"}}, "resources.memory", "invalid quantity"),
        ({"resources": {"memory": "0"}}, "resources.memory", "greater than 0"),
        ({"queue": {"capacity": 0}}, "queue.capacity", "greater than or equal to 1"),
        ({"replicas": -1}, "replicas", "greater than or equal to 0"),
        (
            {"autoscaling": {"targetPerWorker": 0}},
            "autoscaling.targetPerWorker",
            "greater than or equal to 1",
        ),
        (
            {"autoscaling": {"scaleUpWindowSeconds": 90}},
            "",
            "spec.autoscaling.stableWindowSeconds must be at least spec.autoscaling.scaleUpWindowSeconds",
        ),
        ({"autoscaling": {"scaleDownDelaySeconds": 7200}}, "scaleDownDelaySeconds", "less than or equal to"),
        ({"autoscaling": {"targetPerWorker": 11}}, "", MSG_TARGET_LE_CAPACITY),
        # The default target (10) counts once spec.autoscaling is written (the API server fills it in).
        ({"queue": {"capacity": 9}, "autoscaling": {"enabled": True}}, "", MSG_TARGET_LE_CAPACITY),
        (_cached({"type": "pvc"}), "", "spec.model.cache.claimName is required when type is pvc"),
        (_cached({"type": "hostPath"}), "", "spec.model.cache.path is required when type is hostPath"),
        (_cached({"type": "hostPath", "path": "cache"}), "model.cache.path", "pattern"),
        (_cached({"type": "pvc", "claimName": "Bad_Name"}), "model.cache.claimName", "pattern"),
        (_cached({"type": "nfs"}), "model.cache.type", "'none', 'pvc' or 'hostPath'"),
        ({"servedModelName": "two/slashes/here"}, "servedModelName", "pattern"),
        ({"servedModelName": "-leading-dash"}, "servedModelName", "pattern"),
        ({"servedModelName": ""}, "servedModelName", "at least 1"),
        ({"activationTimeoutSeconds": 0}, "activationTimeoutSeconds", "greater than or equal to 1"),
        ({"activationTimeoutSeconds": 3601}, "activationTimeoutSeconds", "less than or equal to 3600"),
    ],
)
def test_bad_specs_are_refused_naming_the_field(overrides: dict[str, Any], field: str, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_pool_spec(body(**overrides))
    text = str(info.value)
    assert needle in text
    if field:
        assert field in text


@pytest.mark.parametrize(
    ("source", "ok"),
    [
        ("/models/x", True),
        ("file:///models/x", True),
        ("hf://org/name", True),
        ("hf://org/name@v1", True),
        ("pvc://claim/sub/path", True),
        ("pvc://claim", True),
        ("s3://b/k", False),
        ("models/x", False),
        ("hf://name-only", False),
        ("pvc://Bad_Claim/x", False),
    ],
)
def test_source_schemes(source: str, ok: bool) -> None:
    assert source_is_supported(source) is ok


def test_status_round_trip_and_tolerant_parse() -> None:
    status = ModelPoolStatus(
        phase="Ready", ready_replicas=1, workers=[WorkerStatus(name="w", state="Ready", memory="2Gi")]
    )
    wire = status.wire()
    assert wire["readyReplicas"] == 1 and wire["workers"][0]["state"] == "Ready"
    assert parse_pool_status(wire) == status
    assert parse_pool_status({"workers": "garbage"}) == ModelPoolStatus()
    assert parse_pool_status(None) == ModelPoolStatus()


def test_budget_spec() -> None:
    assert ModelBudgetSpec.model_validate({"memory": "80Gi"}).memory_bytes == 80 * 2**30
    with pytest.raises(ValidationError, match=r"spec\.memory"):
        ModelBudgetSpec.model_validate({"memory": "eighty"})
