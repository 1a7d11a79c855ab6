"""What the gateway's spans cost per request in CPU, in-process (`python -m bench.tracing_spans`).

The spans a request relayed once makes in the gateway with traces on (``modelpool_contract.tracing``: the
server span continuing a client's ``traceparent``, with the key check's outcome on it, and the relay with its
routing choice's attributes and its ``traceparent`` injected), timed with ``time.process_time`` over a few
thousand requests, with a batch processor whose exporter drops the spans (the export itself runs on the
exporter's thread, off the request path); a request sampled out (``tracing.decide``) makes none; and, traces
off, the tests of ``tracing.on()`` the request path makes instead. A CPU figure, not a latency:
``python -m bench.gateway --overhead-only`` measures the gateway's added latency with traces (and keys,
limits, usage, access lines) off and on. Prints one line per case; docs/benchmarks.md quotes it by hand.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from modelpool_contract import logs, tracing
from modelpool_gateway.app import admission_attributes, route_attributes
from modelpool_gateway.state import Worker

HEADERS = [
    (b"content-type", b"application/json"),
    (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
]

WORKER = Worker("ns", "pool-abcde-0", "pool", "10.0.0.1", 8000, True, True, False)


class Dropped(SpanExporter):
    """An exporter that sends nothing (what is measured is the request path's share)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def traced_request(headers: list[tuple[bytes, bytes]] = HEADERS) -> None:
    """The spans of one request relayed once by the gateway (``modelpool_gateway.app``): sampled first
    (``tracing.decide``); one sampled out makes no span, only its trace id bound for the logs and its
    ``traceparent`` in the headers relayed."""
    decided = tracing.decide(headers)
    if isinstance(decided, tracing.Unsampled):
        logs.bind(None, decided.trace_id)()
        tracing.with_traceparent(headers, decided.traceparent)
        return
    attributes = {tracing.METHOD: "POST", tracing.PATH: "/v1/embeddings"}
    with tracing.request_span("POST /v1/embeddings", decided, attributes) as span:
        span.set_attributes(admission_attributes("keys/team", None))
        tracing.annotate({tracing.POOL: "ns/pool", tracing.MODEL: "pool"})
        routed = route_attributes("ns/pool", WORKER, 0, None)
        with tracing.span("modelpool.relay", routed, SpanKind.CLIENT) as relay:
            tracing.inject(HEADERS)
            tracing.answered(relay, 200, server=False)
        tracing.answered(span, 200)


def untraced_request() -> None:
    """Traces off: the request path's tests of ``tracing.on()`` (one per place that would trace)."""
    for _ in range(6):
        tracing.on()


def cpu_us(request: Callable[[], None], count: int, rounds: int) -> list[float]:
    """CPU microseconds per request, one figure per round."""
    request()
    figures = []
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(count):
            request()
        figures.append((time.process_time() - started) / count * 1e6)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=5000, help="requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    off = cpu_us(untraced_request, args.requests * 10, args.rounds)
    tracing.setup("bench", None, processor=BatchSpanProcessor(Dropped(), max_queue_size=args.requests * 2))
    try:
        on = cpu_us(traced_request, args.requests, args.rounds)
    finally:
        tracing.shutdown()
    # Sampled out: a ratio of 0 and no traceparent from the client (no span is made).
    tracing.setup("bench", None, 0.0, processor=BatchSpanProcessor(Dropped()))
    try:
        out = cpu_us(lambda: traced_request(HEADERS[:1]), args.requests, args.rounds)
    finally:
        tracing.shutdown()
    cases = (("traces off", off), ("traces on, every request sampled", on), ("traces on, sampled out", out))
    for name, figures in cases:
        rounds = ", ".join(f"{f:.2f}" for f in figures)
        print(f"{name}: {statistics.median(figures):.2f} us of CPU per request (rounds {rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
