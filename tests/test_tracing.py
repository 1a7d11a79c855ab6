"""Traces, in-process (``modelpool_contract.tracing``): off costs nothing (no SDK imported, no thread, no
span), on makes the client's ``traceparent`` the parent, hands the span on as the next hop's
``traceparent`` and records the inference process's spans after the fact; the pure pieces (the receiver's
URL, the clocks, the span names) and the operator's flags.  The same spans through a real gateway and
real workers: ``tests/gateway/integration/test_gateway_traces.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, TraceIdRatioBased

from model_server.engine.spans import record_unit
from model_server.engine.unit import Unit
from model_server.errors import Overloaded
from model_server.frontend.endpoints.traced import span_name
from model_server.host_config import HostConfig, parse_load_body, slot_config
from modelpool_contract import tracing
from modelpool_contract.api import ModelPoolSpec
from modelpool_contract.flags import DEFAULT_SAMPLE_RATIO
from modelpool_contract.logs import traceparent_trace_id
from modelpool_gateway.app import admission_attributes, route_attributes, traced_route
from modelpool_gateway.state import Worker
from modelpool_operator.effects.resources import PodSettings, server_args, tracing_flags

TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
CLIENT = f"00-{TRACE}-{CLIENT_SPAN}-01"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.setup("test", None, 1.0, processor=SimpleSpanProcessor(exporter))
    yield exporter
    tracing.shutdown()


def _hex(span: ReadableSpan) -> tuple[str, str, str]:
    context = span.get_span_context()
    assert context is not None
    parent = f"{span.parent.span_id:016x}" if span.parent is not None else ""
    return f"{context.trace_id:032x}", f"{context.span_id:016x}", parent


def test_off_imports_no_sdk_and_starts_no_thread() -> None:
    """Without an endpoint, setup does nothing: the SDK is never imported, no thread runs, no span is
    made and nothing is propagated (a fresh interpreter, so no other test's import counts)."""
    code = (
        "import sys, threading\n"
        "from modelpool_contract import tracing\n"
        "assert tracing.setup('modelpool-gateway', None) is False and not tracing.on()\n"
        "with tracing.span('x') as s: assert s is None\n"
        "assert tracing.traceparent() is None\n"
        "assert tracing.record('x', tracing.remote('00-"
        + TRACE
        + "-"
        + CLIENT_SPAN
        + "-01'), 1, 2) is None\n"
        "sdk = sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk'))\n"
        "print(sdk, threading.active_count())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["[]", "1"], out.stdout + out.stderr


def test_on_starts_one_exporter_thread_and_shutdown_ends_it() -> None:
    code = (
        "import threading\n"
        "from modelpool_contract import tracing\n"
        "assert tracing.setup('modelpool-gateway', 'http://127.0.0.1:9')\n"
        "print(threading.active_count())\n"
        "tracing.shutdown()\n"
        "print(threading.active_count(), tracing.on())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["2", "1", "False"], out.stdout + out.stderr


def test_the_client_traceparent_is_the_server_span_parent_and_the_next_hop_gets_ours(
    exported: InMemorySpanExporter,
) -> None:
    headers = [(b"content-type", b"application/json"), (b"traceparent", CLIENT.encode())]
    with tracing.server_span("POST /v1/embeddings", headers, {tracing.POOL: "ns/pool"}) as server:
        tracing.annotate({tracing.KEY: "keys/team-a"})
        with tracing.span("modelpool.relay") as relay:
            sent = tracing.inject(headers)
            ours = tracing.traceparent()
        tracing.answered(server, 503)
    assert relay is not None
    spans = {s.name: s for s in exported.get_finished_spans()}
    server_span, relay_span = spans["POST /v1/embeddings"], spans["modelpool.relay"]
    assert _hex(server_span)[0] == TRACE and _hex(server_span)[2] == CLIENT_SPAN
    assert _hex(relay_span)[2] == _hex(server_span)[1]
    assert dict(sent)[b"traceparent"].decode() == ours == f"00-{TRACE}-{_hex(relay_span)[1]}-01"
    assert [k for k, _ in sent].count(b"traceparent") == 1 and (b"content-type", b"application/json") in sent
    assert server_span.attributes == {
        "modelpool.pool": "ns/pool",
        "modelpool.key": "keys/team-a",
        "http.response.status_code": 503,
    }
    assert not server_span.status.is_ok


def test_an_unsampled_client_is_followed_and_nothing_is_recorded(exported: InMemorySpanExporter) -> None:
    headers = [(b"traceparent", f"00-{TRACE}-{CLIENT_SPAN}-00".encode())]
    with tracing.server_span("POST /v1/embeddings", headers, {}):
        assert tracing.traceparent() is None  # the inference process is not asked to record
        with tracing.span("modelpool.relay") as child:
            assert child is None  # no child of a span that records nothing
        assert dict(tracing.inject([]))[b"traceparent"].endswith(b"-00")  # the decision goes on
    assert exported.get_finished_spans() == ()


def test_a_malformed_traceparent_starts_a_trace_of_its_own(exported: InMemorySpanExporter) -> None:
    with tracing.server_span("GET x", [(b"traceparent", b"garbage")], {}):
        pass
    (span,) = exported.get_finished_spans()
    assert span.parent is None and _hex(span)[0] != TRACE


def test_the_inference_process_records_queue_and_batch_after_the_fact(exported: InMemorySpanExporter) -> None:
    unit = Unit(["a", "b"], deadline=0.0, reply=lambda _: None, trace=CLIENT)
    unit.arrived = 100.0
    unit.computed = (100.25, 8, 3)
    record_unit(unit, ["x", "y"])
    spans = {s.name: s for s in exported.get_finished_spans()}
    inference, queue, batch = spans["modelpool.inference"], spans["modelpool.queue"], spans["modelpool.batch"]
    assert _hex(inference)[2] == CLIENT_SPAN
    assert _hex(queue)[2] == _hex(batch)[2] == _hex(inference)[1]
    assert queue.end_time is not None and queue.start_time is not None
    assert queue.end_time - queue.start_time == 250_000_000 and batch.start_time == queue.end_time
    assert batch.attributes == {"modelpool.batch.items": 8, "modelpool.batch.requests": 3}


def test_a_failed_request_and_the_generation_engine(exported: InMemorySpanExporter) -> None:
    unit = Unit(["a"], deadline=0.0, reply=lambda _: None, trace=CLIENT, computed=(1.0, 1, 0))
    record_unit(unit, Overloaded("the KV cache is full", 1))
    spans = {s.name: s for s in exported.get_finished_spans()}
    assert set(spans) == {"modelpool.inference", "modelpool.queue", "modelpool.generate"}
    assert not spans["modelpool.inference"].status.is_ok
    assert spans["modelpool.inference"].attributes == {"modelpool.items": 1, "modelpool.error": "overloaded"}


def test_pure_pieces() -> None:
    assert tracing.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert tracing.wall_ns(9.5, now_wall_ns=10_000_000_000, now_monotonic_s=10.0) == 9_500_000_000
    assert traced_route({"path": "/v1/chat/completions"}) == "/v1/chat/completions"
    assert traced_route({"path": "/v2/models/team%2Fm/infer"}) == "/v2/models/{model}/infer"
    assert traced_route({"path": "/v2/models/m"}) == "/v2/models/{model}"
    assert traced_route({"path": "/healthz"}) is None and traced_route({"path": "/v2/models/"}) is None
    assert span_name("POST", "v2_infer", "/v2/models/m/infer") == "POST /v2/models/{model}/infer"
    assert span_name("POST", "embeddings", "/v1/embeddings") == "POST /v1/embeddings"


def test_the_gateways_key_check_and_routing_choice_are_attributes() -> None:
    """What the gateway's server span and relay spans carry instead of spans of their own."""
    admitted = {"modelpool.admission": "admitted", "modelpool.key": "keys/team"}
    assert admission_attributes("keys/team", None) == admitted
    assert admission_attributes("", "missing_key") == {"modelpool.admission": "missing_key"}
    worker = Worker("ns", "gen-0", "gen", "10.0.0.1", 8000, True, True, False)
    assert route_attributes("ns/gen", worker, 1, "spilled") == {
        "modelpool.pool": "ns/gen",
        "modelpool.worker": "gen-0",
        "modelpool.tried": 1,
        "server.address": "10.0.0.1",
        "server.port": 8000,
        "modelpool.prefix": "spilled",
    }
    none = {"modelpool.pool": "ns/gen", "modelpool.worker": "", "modelpool.tried": 0}
    assert route_attributes("ns/gen", None, 0, None) == none


def test_the_operator_passes_the_endpoint_only_when_set() -> None:
    spec = ModelPoolSpec.model_validate(
        {"model": {"source": "/m", "task": "text-embedding"}, "resources": {"memory": "1Gi"}}
    )
    off = server_args("p", spec, PodSettings())
    assert not any(a.startswith(("--otlp", "--trace")) for a in off) and tracing_flags(PodSettings()) == []
    on = PodSettings(otlp_endpoint="http://c:4318", trace_sample_ratio=0.25)
    args = server_args("p", spec, on)
    assert args[args.index("--otlp-endpoint") + 1] == "http://c:4318"
    assert args[args.index("--trace-sample-ratio") + 1] == "0.25"
    assert tracing_flags(on) == ["--otlp-endpoint", "http://c:4318", "--trace-sample-ratio", "0.25"]


def test_a_shared_hosts_models_trace_with_the_hosts_settings() -> None:
    host = HostConfig(device_memory="8Gi", otlp_endpoint="http://c:4318", trace_sample_ratio=0.5)  # type: ignore[arg-type]
    settings, _, _ = parse_load_body(
        json.dumps(
            {"parameters": {"config": json.dumps({"source": "/m", "task": "text-embedding"})}}
        ).encode()
    )
    model = slot_config(host, "m", settings, 0)
    assert (model.otlp_endpoint, model.trace_sample_ratio) == ("http://c:4318", 0.5)
    assert slot_config(HostConfig(device_memory="8Gi"), "m", settings, 0).otlp_endpoint is None  # type: ignore[arg-type]


def test_at_the_default_ratio_a_sampled_traceparent_is_always_followed() -> None:
    """Traces on at the default ratio (0.1): a request that comes with a sampled ``traceparent`` is
    traced whatever the ratio (ParentBased), and 1,000 without one are sampled near one in ten."""
    exporter = InMemorySpanExporter()
    assert DEFAULT_SAMPLE_RATIO == 0.1
    assert tracing.setup("test", None, processor=SimpleSpanProcessor(exporter))
    try:
        for _ in range(20):
            with tracing.server_span("POST x", [(b"traceparent", CLIENT.encode())], {}):
                pass
        followed = len(exporter.get_finished_spans())
        exporter.clear()
        for _ in range(1000):
            with tracing.server_span("POST x", [], {}):
                pass
        sampled = len(exporter.get_finished_spans())
    finally:
        tracing.shutdown()
    assert followed == 20
    assert 40 <= sampled <= 180  # trace ids are random: 100 expected, far outside these bounds never


def test_decide_samples_before_any_span_as_the_sdks_sampler_would() -> None:
    """``decide`` (the gateway's choice before it makes any span): a sampled client is followed, an unsampled
    one is followed too (its trace goes on, not sampled, under a span id of ours), and a request without a
    ``traceparent`` is sampled by the ratio on its new trace id exactly as ``TraceIdRatioBased`` decides;
    a request sampled out makes no span at all, and one sampled in gets a server span with the very trace
    id drawn for it."""
    exporter = InMemorySpanExporter()
    assert tracing.setup("test", None, 0.5, processor=SimpleSpanProcessor(exporter))
    try:
        followed = tracing.decide([(b"traceparent", CLIENT.encode())])
        assert isinstance(followed, tracing.Sampled) and followed.trace_id is None
        out = tracing.decide([(b"traceparent", f"00-{TRACE}-{CLIENT_SPAN}-00".encode())])
        assert isinstance(out, tracing.Unsampled) and out.trace_id == TRACE
        version, trace_id, span_id, flags = out.traceparent.decode().split("-")
        assert (version, trace_id, flags) == ("00", TRACE, "00") and span_id not in (CLIENT_SPAN, "0" * 16)
        ratio, kinds = TraceIdRatioBased(0.5), set()
        for _ in range(200):
            decided = tracing.decide([(b"traceparent", b"garbage")] if _ % 2 else [])
            kinds.add(type(decided))
            if isinstance(decided, tracing.Unsampled):
                assert ratio.should_sample(None, int(decided.trace_id, 16), "x").decision == Decision.DROP
                assert traceparent_trace_id(decided.traceparent) == decided.trace_id
                continue
            assert decided.trace_id is not None and decided.parent is None
            assert ratio.should_sample(None, decided.trace_id, "x").decision == Decision.RECORD_AND_SAMPLE
            exporter.clear()
            with tracing.request_span("POST x", decided, {tracing.POOL: "ns/p"}) as span:
                assert span.is_recording() and tracing.traceparent() is not None
            (done,) = exporter.get_finished_spans()
            assert _hex(done)[0] == f"{decided.trace_id:032x}" and done.parent is None
        assert kinds == {tracing.Sampled, tracing.Unsampled}
        with tracing.request_span("POST x", followed, {}):
            pass
        assert _hex(exporter.get_finished_spans()[-1])[::2] == (TRACE, CLIENT_SPAN)
    finally:
        tracing.shutdown()
    headers = [(b"traceparent", b"theirs"), (b"tracestate", b"k=v"), (b"x", b"y")]
    assert tracing.with_traceparent(headers, b"ours") == [
        (b"tracestate", b"k=v"), (b"x", b"y"), (b"traceparent", b"ours")
    ]  # fmt: skip
