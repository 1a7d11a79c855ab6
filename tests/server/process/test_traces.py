"""A worker's traces, called directly (no gateway): a real echo ``modelpool-server`` with
``--otlp-endpoint`` sending to an OpenTelemetry Collector on loopback (``testkit.otlp``).  A request with a
client's ``traceparent`` is its child; one without starts a trace in the worker, whose access line names
it; the HTTP process's spans and the inference process's link up under the server span.  Through the
gateway and with the operator: ``tests/gateway/integration/test_gateway_traces.py``."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from testkit.echo_models import ECHO
from testkit.otlp import Collector, Received, by_name
from testkit.server import ServerProcess, start_server
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow
SERVICE = "modelpool-server"


@dataclass
class Traced:
    server: ServerProcess
    collector: Collector


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    collector = Collector(Path(tmp_path_factory.mktemp("worker-traces")))
    try:
        server = start_server(
            "--model", "/", "--task", "text-embedding", "--name", "echo", "--handler", ECHO,
            "--otlp-endpoint", collector.url, "--trace-sample-ratio", "1",  # every request (default 0.1)
            env={"OTEL_BSP_SCHEDULE_DELAY": "100"}, wait="ready",
        )  # fmt: skip
    except BaseException:
        collector.close()
        raise
    yield Traced(server, collector)
    server.stop()
    collector.close()


def _spans(traced: Traced, trace_id: str) -> list[Received]:
    """The trace's spans once the HTTP process's server span and the inference process's batch are in
    (each process exports on its own; each of those ends last in its process)."""

    def arrived() -> list[Received] | None:
        spans = traced.collector.spans(trace_id)
        names = {s.name for s in spans}
        return spans if {"POST /v1/embeddings", "modelpool.batch"} <= names else None

    found = wait_for(arrived, timeout=60, message=f"the worker's spans of {trace_id}")
    assert found is not None
    return found


def _linked(spans: list[Received]) -> Received:
    """The server span, after checking the others hang under it as they should."""
    served = by_name(spans, "POST /v1/embeddings")
    assert served.kind == 2 and served.service == SERVICE and served.attributes["modelpool.model"] == "echo"
    assert served.attributes["http.response.status_code"] == 200
    for name in ("modelpool.admission", "modelpool.wait", "modelpool.inference"):
        assert by_name(spans, name).parent_id == served.span_id, name
    inference = by_name(spans, "modelpool.inference")
    assert by_name(spans, "modelpool.queue").parent_id == inference.span_id
    assert by_name(spans, "modelpool.batch").parent_id == inference.span_id
    return served


def test_a_client_traceparent_is_the_parent(traced: Traced) -> None:
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    response = httpx.post(
        traced.server.url + "/v1/embeddings",
        json={"model": "echo", "input": ["hello"]},
        headers={"traceparent": f"00-{trace_id}-{client_span}-01"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert _linked(_spans(traced, trace_id)).parent_id == client_span


def test_without_one_the_worker_starts_the_trace_and_its_access_line_names_it(traced: Traced) -> None:
    request_id = f"worker-traces-{uuid.uuid4().hex}"
    response = httpx.post(
        traced.server.url + "/v1/embeddings",
        json={"model": "echo", "input": ["hello"]},
        headers={"x-request-id": request_id},
        timeout=30,
    )
    assert response.status_code == 200, response.text

    def access_line() -> dict[str, object] | None:
        for line in traced.server.log().splitlines():
            if request_id in line and line.startswith("{"):
                doc = json.loads(line)
                if doc.get("request_id") == request_id and isinstance(doc.get("trace_id"), str):
                    return dict(doc)
        return None

    line = wait_for(
        access_line, timeout=30, message=lambda: f"the access line:\n{traced.server.log()[-3000:]}"
    )
    assert line is not None
    assert _linked(_spans(traced, str(line["trace_id"]))).parent_id == ""
