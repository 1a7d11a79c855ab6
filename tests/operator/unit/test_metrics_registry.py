"""The operator's Prometheus metrics: what each hook counts, bounded labels, and the real HTTP endpoint
(prometheus-client's server on a free loopback port, read back with its own parser)."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from modelpool_contract.api import (
    Condition,
    HostDeviceStatus,
    HostModelStatus,
    HostPodStatus,
    ModelHostStatus,
    ModelPoolStatus,
    WorkerStatus,
)
from modelpool_operator.metrics import OperatorMetrics


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def status(*workers: tuple[str, str, str | None]) -> ModelPoolStatus:
    return ModelPoolStatus(
        workers=[WorkerStatus(name=name, state=state, reason=reason) for name, state, reason in workers]  # type: ignore[arg-type]
    )


def test_passes_are_counted_by_outcome_and_timed() -> None:
    metrics = OperatorMetrics()
    with metrics.reconcile_pass():
        pass
    with metrics.reconcile_pass() as outcome:
        outcome.result = "invalid"
    with pytest.raises(RuntimeError), metrics.reconcile_pass():
        raise RuntimeError("the API said no")
    with pytest.raises(asyncio.CancelledError), metrics.reconcile_pass():
        raise asyncio.CancelledError  # the daemon stopping: not a pass
    assert value(metrics, "modelpool_operator_reconcile_total", result="ok") == 1
    assert value(metrics, "modelpool_operator_reconcile_total", result="invalid") == 1
    assert value(metrics, "modelpool_operator_reconcile_total", result="error") == 1
    assert value(metrics, "modelpool_operator_reconcile_duration_seconds_count") == 3


def test_workers_by_state_and_each_failure_once_with_a_bounded_reason() -> None:
    metrics = OperatorMetrics()
    key = ("team", "emb")
    first = status(("w-0", "Ready", None), ("w-1", "Failed", "OOMKilled"), ("w-2", "Failed", "SomethingNew"))
    metrics.pool_written(key, ModelPoolStatus(), first)
    # The next pass sees the same failed workers: they are not counted again.
    metrics.pool_written(key, first, status(("w-0", "Idle", None), ("w-1", "Failed", "OOMKilled")))
    labels = {"namespace": "team", "pool": "emb"}
    assert value(metrics, "modelpool_operator_workers", state="Idle", **labels) == 1
    assert value(metrics, "modelpool_operator_workers", state="Ready", **labels) == 0
    assert value(metrics, "modelpool_operator_workers", state="Failed", **labels) == 1
    assert value(metrics, "modelpool_operator_worker_failures_total", reason="OOMKilled") == 1
    assert value(metrics, "modelpool_operator_worker_failures_total", reason="Other") == 1
    assert value(metrics, "modelpool_operator_worker_failures_total", reason="SomethingNew") is None
    metrics.pool_gone(key)
    assert value(metrics, "modelpool_operator_workers", state="Idle", **labels) is None


def test_a_pools_target_and_conditions_follow_its_status_and_go_with_it() -> None:
    metrics = OperatorMetrics()
    # Each failure reason starts at 0, so the first one is a rise an alert's increase() sees.
    assert value(metrics, "modelpool_operator_worker_failures_total", reason="InferenceWedged") == 0
    key = ("team", "emb")
    labels = {"namespace": "team", "pool": "emb"}
    written = ModelPoolStatus(
        target_replicas=2,
        conditions=[
            Condition(type="Ready", status="False", reason="Loading"),
            Condition(type="BudgetExceeded", status="True", reason="BudgetExceeded"),
        ],
    )
    metrics.pool_written(key, ModelPoolStatus(), written)
    assert value(metrics, "modelpool_operator_pool_target_replicas", **labels) == 2
    assert value(metrics, "modelpool_operator_pool_condition", condition="BudgetExceeded", **labels) == 1
    assert value(metrics, "modelpool_operator_pool_condition", condition="Ready", **labels) == 0
    # A condition the status does not carry is exported as 0, so an alert never waits on a missing series.
    assert value(metrics, "modelpool_operator_pool_condition", condition="Degraded", **labels) == 0
    metrics.pool_written(key, written, ModelPoolStatus(target_replicas=0))
    assert value(metrics, "modelpool_operator_pool_target_replicas", **labels) == 0
    assert value(metrics, "modelpool_operator_pool_condition", condition="BudgetExceeded", **labels) == 0
    metrics.pool_gone(key)
    assert value(metrics, "modelpool_operator_pool_target_replicas", **labels) is None
    assert value(metrics, "modelpool_operator_pool_condition", condition="Ready", **labels) is None


def test_evictions_budget_and_api_errors() -> None:
    metrics = OperatorMetrics()
    metrics.evicted("IdleTimeout")
    metrics.evicted("IdleTimeout")
    metrics.budget_written(80 * 2**30, 10 * 2**30, 2**30)
    metrics.api_error("create_pod", 403)
    metrics.api_error("patch_pool_status", None)
    assert value(metrics, "modelpool_operator_evictions_total", reason="IdleTimeout") == 2
    assert value(metrics, "modelpool_operator_budget_bytes", kind="total") == 80 * 2**30
    assert value(metrics, "modelpool_operator_budget_bytes", kind="reserved") == 2**30
    assert value(metrics, "modelpool_operator_api_errors_total", operation="create_pod", code="403") == 1
    assert (
        value(metrics, "modelpool_operator_api_errors_total", operation="patch_pool_status", code="error")
        == 1
    )


def test_the_endpoint_serves_the_registry() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = OperatorMetrics()
    metrics.evicted("ScaleDown")
    metrics.serve(port)
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5, trust_env=False)
    finally:
        metrics.close()
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    [sample] = [s for s in families["modelpool_operator_evictions"].samples if s.name.endswith("_total")]
    assert sample.labels == {"reason": "ScaleDown"} and sample.value == 1
    assert "process_resident_memory_bytes" in {s.name for f in families.values() for s in f.samples}


def host_pod(name: str, *models: str, free: int = 2**30) -> HostPodStatus:
    device = HostDeviceStatus(
        index=0,
        capacity="4Gi",
        capacity_bytes=4 * 2**30,
        awake="3Gi",
        awake_bytes=3 * 2**30 - free,
        asleep="0",
        asleep_bytes=0,
        free="1Gi",
        free_bytes=free,
    )
    return HostPodStatus(
        name=name,
        state="Ready",
        devices=[device],
        models=[
            HostModelStatus(namespace="team", pool=f"p{i}", state=state, memory="1Gi", memory_bytes=2**30)  # type: ignore[arg-type]
            for i, state in enumerate(models)
        ],
    )


def test_host_memory_per_pod_and_device_follows_the_status_and_goes_with_the_host() -> None:
    metrics = OperatorMetrics()
    both = ModelHostStatus(hosts=[host_pod("gpu-0", "Ready", "Sleeping"), host_pod("gpu-1", "Ready")])
    metrics.host_written("team", "gpu", both)
    labels = {"namespace": "team", "modelhost": "gpu", "device": "0"}
    assert value(metrics, "modelpool_operator_host_memory_bytes", pod="gpu-1", kind="free", **labels) == 2**30
    assert (
        value(metrics, "modelpool_operator_host_models", namespace="team", modelhost="gpu", state="Ready")
        == 2
    )
    # The next status has one host pod left, with less free: the other's series go, this one's follow.
    metrics.host_written("team", "gpu", ModelHostStatus(hosts=[host_pod("gpu-0", "Sleeping", free=0)]))
    assert value(metrics, "modelpool_operator_host_memory_bytes", pod="gpu-1", kind="free", **labels) is None
    assert value(metrics, "modelpool_operator_host_memory_bytes", pod="gpu-0", kind="free", **labels) == 0
    assert (
        value(metrics, "modelpool_operator_host_models", namespace="team", modelhost="gpu", state="Ready")
        == 0
    )
    metrics.host_gone("team", "gpu")
    assert (
        value(metrics, "modelpool_operator_host_memory_bytes", pod="gpu-0", kind="capacity", **labels) is None
    )
    assert (
        value(metrics, "modelpool_operator_host_models", namespace="team", modelhost="gpu", state="Ready")
        is None
    )


def test_placement_calls_by_action_and_result() -> None:
    metrics = OperatorMetrics()
    metrics.placement_call("load", ok=True)
    metrics.placement_call("load", ok=False)
    metrics.placement_call("sleep", ok=True)
    assert value(metrics, "modelpool_operator_placement_calls_total", action="load", result="ok") == 1
    assert value(metrics, "modelpool_operator_placement_calls_total", action="load", result="failed") == 1
    assert value(metrics, "modelpool_operator_placement_calls_total", action="sleep", result="ok") == 1
