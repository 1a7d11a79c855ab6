"""Views of the watched objects: which pods are routable workers, what a pool's status says."""

from __future__ import annotations

from typing import Any

import pytest

from modelpool_gateway.state import pool_from_object, worker_from_pod

MINIMAL = {"model": {"source": "/models/m", "task": "text-embedding"}, "resources": {"memory": "1Gi"}}


def pod(
    *,
    serving: str | None = "true",
    ready: str = "True",
    ip: str | None = "10.1.2.3",
    deleting: bool = False,
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    labels = {"modelpool.dev/pool": "minilm"}
    if serving is not None:
        labels["modelpool.dev/serving"] = serving
    meta: dict[str, Any] = {"name": "minilm-abcde-0", "namespace": "ns", "labels": labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "containers": [
                {"name": "sidecar", "ports": [{"name": "metrics", "containerPort": 9090}]},
                {"name": "server", "ports": ports or [{"name": "http", "containerPort": 8000}]},
            ]
        },
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
    }


def test_a_serving_ready_pod_with_an_address_is_routable() -> None:
    worker = worker_from_pod(pod())
    assert worker is not None and worker.routable
    assert (worker.namespace, worker.name, worker.pool) == ("ns", "minilm-abcde-0", "minilm")
    assert worker.base_url == "http://10.1.2.3:8000"


def test_what_makes_a_worker_unroutable() -> None:
    for kwargs in (
        {"serving": None},
        {"serving": "false"},
        {"ready": "False"},
        {"ip": None},
        {"deleting": True},
    ):
        worker = worker_from_pod(pod(**kwargs))
        assert worker is not None and not worker.routable, kwargs


def test_the_port_is_the_server_containers_http_port() -> None:
    ports = [{"name": "grpc", "containerPort": 9000}, {"name": "http", "containerPort": 8080}]
    worker = worker_from_pod(pod(ports=ports))
    assert worker is not None and worker.port == 8080
    bare = pod()
    bare["spec"] = {}
    worker = worker_from_pod(bare)
    assert worker is not None and worker.port == 8000


def test_ipv6_addresses_are_bracketed() -> None:
    worker = worker_from_pod(pod(ip="fd00::5"))
    assert worker is not None and worker.base_url == "http://[fd00::5]:8000"


def test_a_pod_without_the_pool_label_is_no_worker() -> None:
    assert worker_from_pod({"metadata": {"name": "x", "labels": {}}}) is None


def test_a_pool_view_keeps_names_bounds_and_what_status_says() -> None:
    obj = {
        "metadata": {
            "name": "minilm",
            "namespace": "ns",
            "uid": "u-1",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            **MINIMAL,
            "servedModelName": "sentence-transformers/all-MiniLM-L6-v2",
            "activationTimeoutSeconds": 30,
        },
        "status": {
            "phase": "Loading",
            "workers": [
                {"name": "minilm-a-0", "state": "Ready", "queueDepth": 4, "since": "2026-01-01T00:00:10Z"},
                {"name": "minilm-a-1", "state": "Loading", "loadProgress": 0.25},
            ],
            "conditions": [
                {"type": "BudgetExceeded", "status": "True", "message": "needs 4Gi; 1Gi free"},
                {"type": "Degraded", "status": "False", "message": "all workers healthy"},
            ],
        },
    }
    pool = pool_from_object(obj)
    assert pool.key == ("ns", "minilm")
    assert pool.served_model_name == "sentence-transformers/all-MiniLM-L6-v2"
    assert pool.activation_timeout_s == 30
    assert pool.task == "text-embedding"
    assert pool.uid == "u-1" and pool.created is not None and pool.invalid is None
    assert pool.demanded_at is None  # the demand is in the pool's Lease, not on the pool
    assert pool.budget_exceeded == "needs 4Gi; 1Gi free"
    assert pool.degraded is None
    assert pool.queue_depths == {"minilm-a-0": 4}
    assert [w.state for w in pool.workers] == ["Ready", "Loading"]
    assert pool.workers[1].load_progress == 0.25


def test_a_pool_without_status_or_new_fields() -> None:
    pool = pool_from_object({"metadata": {"name": "p", "namespace": "ns"}, "spec": MINIMAL})
    assert pool.activation_timeout_s == 120
    assert pool.served_model_name is None and pool.workers == () and pool.demanded_at is None


def test_a_pool_whose_spec_does_not_parse_is_kept_by_name_and_never_held() -> None:
    """A spec the operator's models refuse (an old CRD let it in) does not fail the watch: the pool is known
    by its name, with the first error, no alias, no hold time and no wake on demand."""
    spec = {**MINIMAL, "servedModelName": "alias", "replicas": 5, "maxReplicas": 2}
    pool = pool_from_object({"metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    assert pool.key == ("ns", "p") and pool.served_model_name is None
    assert pool.invalid is not None and "spec" in pool.invalid and "maxReplicas" in pool.invalid
    assert pool.activation_timeout_s == 0 and not pool.wakes_on_demand
    nothing = pool_from_object({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"replicas": "x"}})
    assert nothing.invalid is not None and nothing.invalid.startswith("spec.")


def test_an_unreadable_status_is_an_empty_one() -> None:
    obj = {"metadata": {"name": "p", "namespace": "ns"}, "spec": MINIMAL, "status": {"workers": "many"}}
    pool = pool_from_object(obj)
    assert pool.workers == () and pool.phase is None and pool.invalid is None


@pytest.mark.parametrize(
    ("spec", "wakes"),
    [
        ({}, True),  # replicas 1 of up to 10, autoscaling on by default
        ({"replicas": 0, "minReplicas": 0, "maxReplicas": 4}, True),  # autoscaling: up to maxReplicas
        ({"replicas": 0, "maxReplicas": 4, "autoscaling": {"enabled": False}}, False),
        ({"replicas": 2, "maxReplicas": 4, "autoscaling": {"enabled": False}}, True),
        ({"replicas": 0, "minReplicas": 0, "maxReplicas": 1, "autoscaling": {"enabled": False}}, False),
    ],
)
def test_whether_the_operator_wakes_a_pool_at_zero(spec: dict[str, Any], wakes: bool) -> None:
    obj = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {**MINIMAL, **spec}}
    assert pool_from_object(obj).wakes_on_demand is wakes


def test_a_shared_hosts_pod_is_no_worker() -> None:
    """Host pods carry a pool label of their own (host_<name>, for the budget): never routed as workers."""
    host = pod()
    host["metadata"]["labels"] |= {"modelpool.dev/pool": "host_gpu", "modelpool.dev/host": "gpu"}
    assert worker_from_pod(host) is None
