"""Traces through the real gateway and real workers, exported over OTLP/HTTP to an OpenTelemetry Collector on
loopback (``bin/otelcol``: ``testkit.otlp``): one trace per request, with the client's trace id, whose spans
link up from the gateway's server span through its relay span to the worker's server span and the inference
process's spans; the key's name (never the key), the pool, the model and the status on them. The gateway makes
those two spans only: the key check, the key's limits and the routing choice are attributes on them. The
operator passes its ``WORKER_OTLP_ENDPOINT`` to the workers it creates (as the chart's
``tracing.otlpEndpoint`` does), so the workers' traces test that path too. A second gateway without an
endpoint sends nothing and passes the client's ``traceparent`` on untouched.

One namespace, one operator, two gateways (``traced``, ``plain``) and two pools serve the module: ``alpha``
(an echo embedding worker) and ``gen`` (a streaming echo generator), real ``modelpool-server`` processes on
the process node.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, wait_for
from testkit.otlp import Collector, Received, by_name
from tests.gateway.integration.gwharness import GENERATION, GatewayProcess, bearer, create_key, echo_pool
from tests.operator.integration.opharness import POOLS, OperatorProcess

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# Spans leave each process 0.1 s after they end, not the SDK's default 5 s.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
SERVER, CLIENT = 2, 3  # OTLP's span kinds
# The services' names: in each process the server span ends last, so it comes with or after the others of
# that process; the inference process exports on its own (its last span: modelpool.batch or .generate).
GATEWAY, WORKER = "modelpool-gateway", "modelpool-server"


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    traced: GatewayProcess
    plain: GatewayProcess
    collector: Collector


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    namespace = f"gwtr-{uuid.uuid4().hex[:8]}"
    crds.kubectl("create", "namespace", namespace)
    logs = tmp_path_factory.mktemp("gateway-traces")
    collector = Collector(logs)
    try:
        operator = OperatorProcess(
            crds,
            [namespace],
            logs / "operator.log",
            MODELPOOL_OPERATOR_SERVER_PORT=str(free_port()),
            MODELPOOL_OPERATOR_WORKER_OTLP_ENDPOINT=collector.url,
            MODELPOOL_OPERATOR_WORKER_TRACE_SAMPLE_RATIO="1",  # every request here (the default: 0.1)
        )
    except BaseException:
        collector.close()
        raise
    gateways: list[GatewayProcess] = []
    try:
        traced_env = {**FAST_EXPORT, "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=traced"}
        gateways.append(
            GatewayProcess(
                crds,
                [namespace],
                logs / "traced.log",
                "--otlp-endpoint",
                collector.url,
                "--trace-sample-ratio",
                "1",
                env=traced_env,
            )
        )
        plain_env = {**FAST_EXPORT, "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=plain"}
        gateways.append(GatewayProcess(crds, [namespace], logs / "plain.log", env=plain_env))
        wait_for(lambda: crds.kubectl("get", "sa", "default", "-n", namespace, check=False).returncode == 0,
                 timeout=30, message="default ServiceAccount")  # fmt: skip
        apply(crds, echo_pool("alpha", env=FAST_EXPORT), namespace)
        generation_env = {**FAST_EXPORT, "HANDLER_RUN_SECONDS": "0.05"}
        apply(
            crds, echo_pool("gen", handler=GENERATION, task="text-generation", env=generation_env), namespace
        )
        for gateway in gateways:
            gateway.wait_ready()
            for pool in ("alpha", "gen"):
                gateway.wait_serving(pool, 1)
        yield Setup(crds, namespace, gateways[0], gateways[1], collector)
    finally:
        crds.kubectl("delete", POOLS, "--all", "-n", namespace, "--timeout=60s", check=False)
        codes = [g.stop() for g in gateways] + [operator.stop()]
        collector.close()
        crds.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        assert set(codes) <= {0}, f"exit codes (gateways, operator): {codes}"


def _client() -> tuple[str, str, str]:
    """A client's trace id, span id and traceparent (sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _trace(setup: Setup, trace_id: str, *names: str) -> list[Received]:
    """The trace's spans once every one of ``names`` arrived (each process exports on its own, so a span
    of one is no sign of another's); a name may be qualified by its service, "modelpool-gateway NAME"."""

    def arrived() -> list[Received] | None:
        spans = setup.collector.spans(trace_id)
        seen = {s.name for s in spans} | {f"{s.service} {s.name}" for s in spans}
        return spans if set(names) <= seen else None

    found = wait_for(arrived, timeout=60, message=lambda: f"spans {names} of {trace_id}")
    assert found is not None
    return found


def _of(spans: list[Received], service: str) -> list[Received]:
    return [s for s in spans if s.service == service]


def test_one_trace_from_the_client_through_the_gateway_to_the_inference_process(setup: Setup) -> None:
    trace_id, client_span, traceparent = _client()
    response = httpx.post(
        setup.traced.url + "/v1/embeddings",
        json={"model": "alpha", "input": ["hello", "world"]},
        headers={**setup.traced.headers, "traceparent": traceparent},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    worker_pod = response.headers["x-modelpool-worker"]
    spans = _trace(
        setup, trace_id, f"{GATEWAY} POST /v1/embeddings", f"{WORKER} POST /v1/embeddings", "modelpool.batch"
    )
    gateway, worker = _of(spans, "modelpool-gateway"), _of(spans, "modelpool-server")
    assert {s.resource.get("service.instance.id") for s in gateway} == {"traced"}

    # The gateway: server span (the client's child, the key check's outcome on it; a key without limits has
    # no limits outcome) -> relay (client span, its routing choice on it). No other span.
    served = by_name(gateway, "POST /v1/embeddings")
    assert served.kind == SERVER and served.parent_id == client_span and not served.error
    key_name = f"{setup.traced.keys_namespace}/all-pools"
    pool = f"{setup.namespace}/alpha"
    assert served.attributes == {
        "http.request.method": "POST",
        "url.path": "/v1/embeddings",
        "modelpool.admission": "admitted",
        "modelpool.key": key_name,
        "modelpool.pool": pool,
        "modelpool.model": "alpha",
        "http.response.status_code": 200,
    }
    assert sorted(s.name for s in gateway) == ["POST /v1/embeddings", "modelpool.relay"]
    relay = by_name(gateway, "modelpool.relay")
    assert relay.kind == CLIENT and relay.parent_id == served.span_id
    address = relay.attributes.pop("server.address")
    assert address and relay.attributes == {
        "modelpool.pool": pool,
        "modelpool.worker": worker_pod,
        "modelpool.tried": 0,
        "server.port": relay.attributes["server.port"],
        "http.response.status_code": 200,
    }
    assert served.start_ns <= relay.start_ns <= relay.end_ns <= served.end_ns

    # The worker: its server span is the relay's child; admission and wait in the HTTP process, the
    # inference process's spans under the server span.
    worker_served = by_name(worker, "POST /v1/embeddings")
    assert worker_served.kind == SERVER and worker_served.parent_id == relay.span_id
    assert worker_served.attributes["modelpool.model"] == "alpha"
    assert worker_served.attributes["http.response.status_code"] == 200
    for name in ("modelpool.admission", "modelpool.wait", "modelpool.inference"):
        assert by_name(worker, name).parent_id == worker_served.span_id, name
    inference = by_name(worker, "modelpool.inference")
    queue, batch = by_name(worker, "modelpool.queue"), by_name(worker, "modelpool.batch")
    assert queue.parent_id == batch.parent_id == inference.span_id
    assert inference.start_ns <= queue.end_ns <= batch.start_ns + 1 and batch.end_ns <= inference.end_ns + 1
    assert batch.attributes["modelpool.batch.items"] >= 2 and inference.attributes["modelpool.items"] == 2

    # One trace, the client's; the key itself is on no span.
    assert {s.trace_id for s in spans} == {trace_id}
    key = setup.traced.key
    assert key and not any(key in str(v) for s in spans for v in s.attributes.values())


def test_a_streamed_generation_is_one_trace_too(setup: Setup) -> None:
    trace_id, client_span, traceparent = _client()
    body = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
    with httpx.stream(
        "POST",
        setup.traced.url + "/v1/chat/completions",
        json=body,
        headers={**setup.traced.headers, "traceparent": traceparent},
        timeout=30,
    ) as response:
        assert response.status_code == 200
        assert "data: [DONE]" in response.read().decode()
    spans = _trace(
        setup,
        trace_id,
        f"{GATEWAY} POST /v1/chat/completions",
        f"{WORKER} POST /v1/chat/completions",
        "modelpool.inference",
    )
    served = by_name(_of(spans, "modelpool-gateway"), "POST /v1/chat/completions")
    relay = by_name(spans, "modelpool.relay")
    worker_served = by_name(_of(spans, "modelpool-server"), "POST /v1/chat/completions")
    assert served.parent_id == client_span and relay.parent_id == served.span_id
    assert worker_served.parent_id == relay.span_id
    # Routed by its prefix (the pool's one worker is its home), which the relay span says.
    assert relay.attributes["modelpool.prefix"] == "home" and relay.attributes["modelpool.tried"] == 0
    inference = by_name(spans, "modelpool.inference")
    assert inference.parent_id == worker_served.span_id
    # The worker's wait lasts the stream: its first piece (the time to first token) and the count on it.
    wait = by_name(spans, "modelpool.wait")
    assert wait.events == ("modelpool.first_piece",) and wait.attributes["modelpool.pieces"] >= 1
    # The relay span lasts while the stream is relayed: until its last piece, after the inference process
    # answered (1 ms for the inference process's mapping of its monotonic instants onto the epoch).
    assert relay.end_ns >= inference.end_ns - 1_000_000


def test_without_a_traceparent_the_gateway_starts_the_trace_and_its_access_line_names_it(
    setup: Setup,
) -> None:
    request_id = f"traces-{uuid.uuid4().hex}"
    response = httpx.post(
        setup.traced.url + "/v1/embeddings",
        json={"model": "alpha", "input": ["hello"]},
        headers={**setup.traced.headers, "x-request-id": request_id},
        timeout=30,
    )
    assert response.status_code == 200, response.text

    def access_line() -> dict[str, object] | None:
        for line in setup.traced.log_path.read_text(errors="replace").splitlines():
            if request_id in line and line.startswith("{"):
                doc = json.loads(line)
                if doc.get("request_id") == request_id and "status" in str(doc):
                    return dict(doc)
        return None

    line = wait_for(access_line, timeout=30, message="the gateway's access line of the request")
    assert line is not None and isinstance(line.get("trace_id"), str)
    spans = _trace(setup, str(line["trace_id"]), f"{GATEWAY} POST /v1/embeddings", "modelpool.batch")
    served = by_name(_of(spans, "modelpool-gateway"), "POST /v1/embeddings")
    assert served.parent_id == ""  # the trace began at the gateway
    assert (
        by_name(_of(spans, "modelpool-server"), "POST /v1/embeddings").parent_id
        == by_name(spans, "modelpool.relay").span_id
    )


def test_a_refused_key_is_traced_and_goes_nowhere(setup: Setup) -> None:
    trace_id, client_span, traceparent = _client()
    response = httpx.post(
        setup.traced.url + "/v1/embeddings",
        json={"model": "alpha", "input": ["x"]},
        headers={"Authorization": "Bearer not-a-key", "traceparent": traceparent},
        timeout=30,
    )
    assert response.status_code == 401
    spans = _trace(setup, trace_id, "POST /v1/embeddings")
    served = by_name(spans, "POST /v1/embeddings")
    assert served.parent_id == client_span and served.attributes["http.response.status_code"] == 401
    assert "modelpool.key" not in served.attributes
    assert served.attributes["modelpool.admission"] not in ("", "admitted")
    assert [s.name for s in spans] == ["POST /v1/embeddings"]


def test_a_keys_limits_outcome_is_on_the_server_span(setup: Setup) -> None:
    """A key with a limit of one request a minute: its first request admitted and relayed, its second
    refused (429) and relayed nowhere; each one's server span says which."""
    admin = setup.traced.keys_namespace
    assert admin is not None
    key = create_key(setup.cluster, admin, "one-a-minute", namespaces=setup.namespace, requests_per_minute=1)

    def post() -> tuple[str, int]:
        trace_id, _, traceparent = _client()  # a trace each: a 401 below is a trace of its own
        headers = {**bearer(key), "traceparent": traceparent}
        body = {"model": "alpha", "input": ["x"]}
        return trace_id, httpx.post(
            setup.traced.url + "/v1/embeddings", json=body, headers=headers
        ).status_code

    def admitted() -> str | None:  # 401 until the gateway knows the key (its Secret's watch event)
        trace_id, status = post()
        return trace_id if status == 200 else None

    first = wait_for(admitted, timeout=10, interval=0.1, message="the gateway admits the new key")
    second, status = post()
    assert first is not None and status == 429
    for trace_id, outcome, names in (
        (first, "admitted", ["POST /v1/embeddings", "modelpool.relay"]),
        (second, "key_rate_limited", ["POST /v1/embeddings"]),
    ):
        gateway = _of(_trace(setup, trace_id, f"{GATEWAY} POST /v1/embeddings"), GATEWAY)
        assert sorted(s.name for s in gateway) == names
        served = by_name(gateway, "POST /v1/embeddings")
        assert served.attributes["modelpool.limits"] == outcome
        assert served.attributes["modelpool.admission"] == "admitted"


def test_without_an_endpoint_the_gateway_sends_nothing_and_passes_the_traceparent_on(setup: Setup) -> None:
    trace_id, client_span, traceparent = _client()
    response = httpx.post(
        setup.plain.url + "/v1/embeddings",
        json={"model": "alpha", "input": ["hello"]},
        headers={**setup.plain.headers, "traceparent": traceparent},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    # The worker (traced) is the client's child directly: the untraced gateway made no span in between.
    spans = _trace(setup, trace_id, f"{WORKER} POST /v1/embeddings", "modelpool.batch")
    assert by_name(spans, "POST /v1/embeddings").parent_id == client_span
    assert _of(spans, "modelpool-gateway") == []
    # By the time the worker's spans came, the traced gateway's of earlier requests had come too; the
    # untraced one never sent any.
    assert [s for s in setup.collector.spans() if s.resource.get("service.instance.id") == "plain"] == []
