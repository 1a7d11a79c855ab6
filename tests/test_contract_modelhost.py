"""The ModelHost API and a ModelPool's spec.host across the boundary: what the operator writes into a
ModelHost's status reads back the same (camelCase on the wire), the model refuses what the CRD refuses with
the same words, and a shared pool is still a pool the gateway reads."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from modelpool_contract.api import (
    MSG_DEVICE_MEMORY_POSITIVE,
    MSG_DEVICE_MEMORY_REQUIRED,
    SHARED_POOL_RULES,
    HostDeviceStatus,
    HostModelStatus,
    HostPodStatus,
    ModelHostStatus,
    parse_host_spec,
    parse_pool_spec,
)
from modelpool_gateway.state import pool_from_object

POOL: dict[str, Any] = {
    "model": {"source": "/models/minilm", "task": "text-embedding"},
    "resources": {"memory": "2Gi"},
}


def test_a_host_status_round_trips_in_camel_case() -> None:
    gib = 2**30
    status = ModelHostStatus(
        replicas=1,
        ready_replicas=1,
        ready_text="1/1",
        models=2,
        hosts=[
            HostPodStatus(
                name="gpus-0",
                state="Ready",
                devices=[
                    HostDeviceStatus(
                        index=0, capacity="80Gi", capacity_bytes=80 * gib, awake="8Gi", awake_bytes=8 * gib,
                        asleep="4Gi", asleep_bytes=4 * gib, free="72Gi", free_bytes=72 * gib,
                    )
                ],
                models=[
                    HostModelStatus(namespace="a", pool="minilm", state="Sleeping", device=0, memory="4Gi"),
                    HostModelStatus(namespace="a", pool="qwen", state="Waking", device=0, measured=True),
                ],
            )
        ],
    )  # fmt: skip
    wire = status.wire()
    assert wire["hosts"][0]["devices"][0]["freeBytes"] == 72 * gib
    assert wire["hosts"][0]["models"][0]["state"] == "Sleeping" and "readyText" in wire
    assert ModelHostStatus.model_validate(wire) == status


def test_a_host_spec_reads_its_sizes_and_refuses_with_the_crds_words() -> None:
    spec = parse_host_spec({"gpusPerHost": 2, "deviceMemory": "80Gi", "hostMemory": "64Gi"})
    assert (spec.devices, spec.device_memory_bytes, spec.host_memory_bytes) == (2, 80 * 2**30, 64 * 2**30)
    cpu = parse_host_spec({"deviceMemory": 2**33})
    assert (cpu.devices, cpu.host_memory_bytes, cpu.replicas) == (1, 0, 1)
    for bad, message in (
        ({}, MSG_DEVICE_MEMORY_REQUIRED),
        ({"deviceMemory": "0"}, MSG_DEVICE_MEMORY_POSITIVE),
    ):
        with pytest.raises(ValidationError, match=message.split(":")[0]):
            parse_host_spec(bad)


@pytest.mark.parametrize(
    ("field", "overrides"),
    [
        ("image", {"image": "ghcr.io/x/y:1"}),
        ("podTemplate", {"podTemplate": {"labels": {"a": "b"}}}),
        ("podTemplate", {"podTemplate": {"topologySpreadConstraints": []}}),
        ("disruption", {"disruption": {"maxUnavailable": 2}}),
        ("auth", {"auth": {"apiKeySecret": {"name": "k", "key": "k"}}}),
        ("resources.gpus", {"resources": {"memory": "2Gi", "gpus": 1}}),
        ("resources.hostMemory", {"resources": {"memory": "2Gi", "hostMemory": "4Gi"}}),
        ("resources.cpu", {"resources": {"memory": "2Gi", "cpu": "2"}}),
    ],
)
def test_a_shared_pool_is_refused_a_field_of_its_host(field: str, overrides: dict[str, Any]) -> None:
    message = dict((f, m) for f, _, m in SHARED_POOL_RULES)[field]
    with pytest.raises(ValidationError) as refused:
        parse_pool_spec({**POOL, **overrides, "host": "gpus"})
    assert message in str(refused.value)
    # The same fields on a dedicated pool are its own.
    assert parse_pool_spec({**POOL, **overrides}).host is None


def test_a_shared_pool_is_a_pool_the_gateway_reads() -> None:
    spec = parse_pool_spec({**POOL, "host": "gpus", "resources": {"memory": "2Gi", "gpus": 0}})
    assert spec.host == "gpus"
    body = {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "minilm", "namespace": "a"},
        "spec": spec.wire(),
    }
    assert pool_from_object(body).invalid is None
