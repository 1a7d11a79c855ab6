"""Logs and access logs (issue 34 item 5) on the real control plane: the real gateway, operator and worker
processes, all with the default JSON logs.  A request sent with an ``x-request-id`` and a W3C
``traceparent`` is answered with its id, and the same request id and trace id are in the gateway's access
line (with the key's Secret name, never the key, the pool, the model, the status, the latency and the
tokens the answer's usage gave) and in the worker's lines for it; a request without an id gets one,
which the worker's lines carry too.  Every line of every process is one JSON object.

The lines are waited for, never slept for: a process writes its line after the answer went out.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.kubectl import wait_for
from tests.gateway.integration.gwharness import GatewayProcess, bearer, create_key, echo_pool, serving_stack
from tests.operator.integration.opharness import OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    gateway: GatewayProcess
    operator: OperatorProcess
    key_name: str
    key: str

    def worker_logs(self) -> list[Path]:
        """The server container's log of every worker of the test's namespace (the process node's)."""
        return sorted((self.cluster.processnode_log_dir / self.namespace).glob("*/server.log"))


def json_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a log, each parsed as one JSON object (a line that is not one fails the test)."""
    text = path.read_text(errors="strict")
    return [json.loads(line) for line in text.splitlines() if line]


def lines_of(paths: list[Path], request_id: str) -> list[dict[str, Any]]:
    return [line for path in paths for line in json_lines(path) if line.get("request_id") == request_id]


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    logs = tmp_path_factory.mktemp("gateway-logs")
    pools = [(echo_pool("emb"), 1)]
    with serving_stack(crds, "gwlog", logs, pools, log_format="json") as stack:
        gateway, namespace = stack.gateway, stack.namespace
        assert gateway.keys_namespace is not None
        key = create_key(crds, gateway.keys_namespace, "team-logs", namespaces=namespace)
        wait_for(
            lambda: httpx.get(gateway.url + "/v1/models", headers=bearer(key), timeout=5).status_code == 200,
            timeout=10,
            interval=0.1,
            message="the gateway knows the key",
        )
        yield Setup(crds, namespace, gateway, stack.operator, f"{gateway.keys_namespace}/team-logs", key)


def embed(setup: Setup, headers: dict[str, str]) -> httpx.Response:
    response = httpx.post(
        setup.gateway.url + "/v1/embeddings",
        json={"model": "emb", "input": ["8 tokens"]},
        headers={**bearer(setup.key), **headers},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response


def test_one_request_id_and_trace_id_from_the_gateway_access_line_to_the_workers_lines(setup: Setup) -> None:
    request_id = f"it-{uuid.uuid4().hex}"
    response = embed(setup, {"x-request-id": request_id, "traceparent": TRACEPARENT})
    assert response.headers["x-request-id"] == request_id

    def access_line() -> dict[str, Any] | None:
        found = [
            line
            for line in lines_of([setup.gateway.log_path], request_id)
            if line["logger"] == "modelpool.gateway.access"
        ]
        return found[0] if found else None

    wait_for(lambda: access_line() is not None, timeout=10, interval=0.05, message="the access line")
    line = access_line()
    assert line is not None
    assert line["trace_id"] == TRACE_ID
    assert line["key"] == setup.key_name
    assert (line["pool"], line["model"]) == (f"{setup.namespace}/emb", "emb")
    assert (line["status"], line["method"], line["path"]) == (200, "POST", "/v1/embeddings")
    assert line["prompt_tokens"] == 8 and line["completion_tokens"] == 0
    assert line["latency_ms"] > 0
    assert setup.key not in setup.gateway.log_path.read_text()

    wait_for(
        lambda: bool(lines_of(setup.worker_logs(), request_id)),
        timeout=10,
        interval=0.05,
        message="the worker's line of the request",
    )
    [worker] = lines_of(setup.worker_logs(), request_id)
    assert worker["trace_id"] == TRACE_ID
    assert (worker["logger"], worker["status"], worker["path"]) == ("modelpool.access", 200, "/v1/embeddings")
    assert worker["process"].startswith("http-")


def test_a_request_without_an_id_gets_one_that_the_worker_logs_too(setup: Setup) -> None:
    request_id = embed(setup, {}).headers["x-request-id"]
    assert len(request_id) == 32

    wait_for(
        lambda: (
            bool(lines_of(setup.worker_logs(), request_id))
            and bool(lines_of([setup.gateway.log_path], request_id))
        ),
        timeout=10,
        interval=0.05,
        message="the gateway's and the worker's lines of the request",
    )
    [access] = lines_of([setup.gateway.log_path], request_id)
    assert "trace_id" not in access  # no traceparent came, and no tracer runs


def test_every_line_of_every_process_is_one_json_object(setup: Setup) -> None:
    logs = [setup.gateway.log_path, setup.operator.log_path, *setup.worker_logs()]
    assert len(logs) == 3
    for path in logs:
        parsed = json_lines(path)
        assert parsed, path
        for line in parsed:
            assert {"time", "level", "logger", "process", "message"} <= line.keys(), (path, line)
    processes = {line["process"] for line in json_lines(setup.worker_logs()[0])}
    assert {"supervisor", "inference"} <= processes
    assert any(p.startswith("http-") for p in processes)
