"""LoRA adapters on the operator's side (issue 33, item 3): the pydantic models refuse what the CRD's CEL
rules refuse, with the same messages (``api.adapter_refusal``), and a worker's status lists the adapters
its ``/stats`` says it holds.  The CRD on the real API server:
tests/operator/integration/test_crd_validation.py; the pod's flags and volumes: test_pod_builder.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from modelpool_contract.api import (
    MSG_ADAPTER_POOL_NAME,
    MSG_ADAPTER_SERVED_NAME,
    MSG_ADAPTER_TASK,
    MSG_ADAPTER_UNIQUE,
    adapter_refusal,
    parse_pool_spec,
)
from modelpool_operator.observe.worker_state import observe_worker

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def spec(**overrides: Any) -> dict[str, Any]:
    return {
        "model": {"source": "hf://org/llm", "task": "text-generation"},
        "resources": {"memory": "2Gi"},
        **overrides,
    }


def lora(name: str, source: str = "hf://org/lora") -> dict[str, str]:
    return {"name": name, "source": source}


def test_adapters_parse_with_their_bound_default() -> None:
    parsed = parse_pool_spec(spec(adapters=[lora("sql"), lora("poem", "pvc://loras/poem")]))
    assert [(a.name, a.source) for a in parsed.adapters] == [
        ("sql", "hf://org/lora"),
        ("poem", "pvc://loras/poem"),
    ]
    assert parsed.max_loaded_adapters == 4 and parse_pool_spec(spec()).adapters == []


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"model": {"source": "/m", "task": "text-embedding"}, "adapters": [lora("a")]}, MSG_ADAPTER_TASK),
        ({"adapters": [lora("a"), lora("a")]}, MSG_ADAPTER_UNIQUE),
        ({"servedModelName": "llm", "adapters": [lora("llm")]}, MSG_ADAPTER_SERVED_NAME),
        ({"adapters": [lora("a", "/models/lora")]}, "adapters.0.source"),
        ({"adapters": [lora("a", "s3://b/lora")]}, "adapters.0.source"),
        ({"adapters": [lora("a b")]}, "adapters.0.name"),
        ({"maxLoadedAdapters": 0}, "maxLoadedAdapters"),
        ({"adapters": [lora(f"a{i}") for i in range(33)]}, "adapters"),
        ({"host": "shared", "adapters": [lora("a")]}, "spec.adapters is not supported on a shared pool"),
    ],
)
def test_bad_adapters_are_refused(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        parse_pool_spec(spec(**overrides))
    assert needle in str(err.value)


def test_an_adapter_named_as_its_pool_is_refused_where_the_name_is_known() -> None:
    parsed = parse_pool_spec(spec(adapters=[lora("llm")]))
    assert adapter_refusal(parsed, "llm") == MSG_ADAPTER_POOL_NAME
    assert adapter_refusal(parsed, "other") is None


def _pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": "ns", "uid": "w", "labels": {"modelpool.dev/pool": "p"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "server"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "server", "ready": True, "state": {"running": {}}}],
        },
    }


def test_the_worker_status_lists_the_adapters_it_holds() -> None:
    stats = {"state": "Ready", "generation": {"engine": "continuous-batching", "adapters": ["sql", "poem"]}}
    entry = observe_worker(_pod(), stats, NOW).to_status()
    assert entry.adapters == ["sql", "poem"] and entry.wire()["adapters"] == ["sql", "poem"]
    plain = observe_worker(_pod(), {"state": "Ready", "generation": {"engine": "serial"}}, NOW).to_status()
    assert plain.adapters is None and "adapters" not in plain.wire()
