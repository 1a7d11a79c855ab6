"""The pure pieces of spec.inferencePool (issue 33): the InferencePool the operator builds, the spec's
validation, and the NetworkPolicy's picker peers."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from modelpool_contract.api import (
    DEFAULT_PICKER_PORT,
    MSG_INFERENCE_POOL_TASK,
    SHARED_POOL_RULES,
    ModelPoolSpec,
)
from modelpool_contract.picker import INFERENCE_GROUP, INFERENCE_POOL_KIND, INFERENCE_VERSION
from modelpool_operator.effects.inference_pool import build_inference_pool
from modelpool_operator.effects.network_policy import picker_peers
from modelpool_operator.effects.resources import build_service
from modelpool_operator.pool import PoolView

ASKED = {"endpointPicker": "epp", "pickerPodLabels": {"app": "epp"}}


def _body(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": {"source": "/models/llm", "task": "text-generation"},
        "resources": {"memory": "1Gi"},
        "inferencePool": ASKED,
    }
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "llm", "namespace": "team", "uid": "u-1", "generation": 1},
        "spec": base | spec,
    }


def test_the_inference_pool_selects_what_the_service_selects() -> None:
    """A draining worker (the serving label dropped) leaves both at once."""
    pool = PoolView.from_body(_body())
    assert pool.spec.inference_pool is not None
    made = build_inference_pool(pool, pool.spec.inference_pool, 8000)
    assert (
        made["apiVersion"] == f"{INFERENCE_GROUP}/{INFERENCE_VERSION}" and made["kind"] == INFERENCE_POOL_KIND
    )
    assert made["metadata"]["name"] == "llm" and made["metadata"]["namespace"] == "team"
    assert made["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert made["spec"]["selector"]["matchLabels"] == build_service(pool)["spec"]["selector"]
    assert made["spec"]["targetPorts"] == [{"number": 8000}]
    assert made["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "epp",
        "port": {"number": DEFAULT_PICKER_PORT},
        "failureMode": "FailClose",
    }


def test_only_a_text_generation_pool_may_ask() -> None:
    with pytest.raises(ValidationError, match="text-generation"):
        ModelPoolSpec.model_validate(_body(model={"source": "/m", "task": "text-embedding"})["spec"])
    assert MSG_INFERENCE_POOL_TASK.startswith("spec.inferencePool")


def test_a_shared_pool_may_not_ask() -> None:
    (message,) = [m for field, _, m in SHARED_POOL_RULES if field == "inferencePool"]
    with pytest.raises(ValidationError) as refused:
        ModelPoolSpec.model_validate(_body(host="gpus")["spec"])
    assert message in str(refused.value)


def test_the_picker_is_named_by_its_labels_in_its_namespace_or_the_pools() -> None:
    assert picker_peers(PoolView.from_body(_body(inferencePool=None))) == []
    (own,) = picker_peers(PoolView.from_body(_body()))
    assert own == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team"}},
        "podSelector": {"matchLabels": {"app": "epp"}},
    }
    elsewhere = _body(inferencePool=ASKED | {"pickerNamespace": "llm-d"})
    (peer,) = picker_peers(PoolView.from_body(elsewhere))
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "llm-d"}


def test_the_picker_must_be_named() -> None:
    with pytest.raises(ValidationError, match="pickerPodLabels"):
        ModelPoolSpec.model_validate(
            _body(inferencePool={"endpointPicker": "epp", "pickerPodLabels": {}})["spec"]
        )
