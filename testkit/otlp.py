"""An OTLP/HTTP trace receiver on loopback, for the tests of traces (``modelpool_contract.tracing``).

``OtlpReceiver`` answers ``POST /v1/traces`` as the OpenTelemetry Collector's OTLP receiver does: a
protobuf ``ExportTraceServiceRequest`` in (gzip or not), an empty ``ExportTraceServiceResponse`` out,
decoded with the ``opentelemetry-proto`` package (the messages the SDK's exporter encodes with), and keeps
every span as a ``Received`` value: ids in hex, the parent's, the service that sent it, the attributes
as plain values.  It stands in for the Collector, whose build from the Go module proxy took longer than
this project allows a test binary on its 2-core machine (docs/gateway.md, "Traces")."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class Received:
    """One span as the receiver got it."""

    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    kind: int  # the protobuf enum: 1 internal, 2 server, 3 client
    service: str  # its resource's service.name
    start_ns: int
    end_ns: int
    error: bool  # status ERROR
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)  # its resource's attributes


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


def decode(body: bytes) -> list[Received]:
    """The spans of one export request (protobuf)."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[Received] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        service = str(resource.get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    Received(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=int(span.kind),
                        service=service,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        error=span.status.code == 2,
                        attributes=_attributes(span.attributes),
                        resource=resource,
                    )
                )
    return spans


class OtlpReceiver:
    """The receiver (module docstring): ``url`` is what ``--otlp-endpoint`` takes; ``spans()`` what came,
    ``posts`` how many export requests came at all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Received] = []
        self.posts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != TRACES_PATH:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                receiver.add(decode(body))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def add(self, spans: list[Received]) -> None:
        with self._lock:
            self._spans.extend(spans)
            self.posts += 1

    def spans(self, trace_id: str | None = None) -> list[Received]:
        """What came so far (of one trace, when given)."""
        with self._lock:
            return [s for s in self._spans if trace_id is None or s.trace_id == trace_id]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def by_name(spans: list[Received], name: str) -> Received:
    """The one span of that name (an AssertionError naming what there is otherwise)."""
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"{len(found)} spans named {name!r} in {sorted(s.name for s in spans)}"
    return found[0]


__all__ = ["TRACES_PATH", "OtlpReceiver", "Received", "by_name", "decode"]
