"""Traces: OpenTelemetry spans of a request through the gateway and the worker, exported over OTLP/HTTP.

One module for both programs (the gateway, and each process of a worker that serves requests: its HTTP
processes and its inference process), so that the span names, the attributes and the wire agree.
Off unless an OTLP endpoint is set (``--otlp-endpoint``): then ``setup`` does nothing, ``on()`` is
False, ``span()`` returns one shared null context, ``traceparent()`` None, and no provider, processor,
exporter or thread exists; callers on a hot path test ``on()`` first, so tracing off costs a global
read per request.  On, ``setup`` makes a ``TracerProvider`` whose sampler follows a sampled parent
(the client's ``traceparent``, the gateway's for a worker) and samples ``--trace-sample-ratio`` of the
traces that start here, with one ``BatchSpanProcessor`` (one exporter thread per process) sending to
``<endpoint>/v1/traces``.

**Sampled out, no span at all.** ``decide`` makes the sampler's decision for a request before any span
exists, the SDK's own way (a sampled parent is followed, an unsampled one too; a trace of its own is
sampled when the low 64 bits of its random trace id fall under the ratio's bound, as
``TraceIdRatioBased`` does): a request it samples is ``Sampled`` and gets its server span from
``request_span`` (a trace of its own with the very trace id that was drawn: ``_DrawnIds``), while one
sampled out is ``Unsampled``: a trace id for the logs and a hand-made ``traceparent`` for the next hop
(the same trace, a span id of this hop's own, the sampled flag off), which is all the SDK's
non-recording span would have given, without building one (its span, context and propagation cost a
gateway request about 50 us of CPU, where ``decide`` costs about 2 us).

Spans are made current (``start_as_current_span``) while a request is served, so anything that reads
``opentelemetry.trace.get_current_span()`` (the logs' trace id) sees the request's span.  Each costs about
50 us of CPU sampled (the SDK's span, its attributes, its context), so a hot path makes few and puts what
it knows on them as attributes, given at the start where it can (one copy into the span's attributes,
not one bounded set each): the callers' mappings go to the SDK as they are, which copies them.

The W3C ``traceparent`` crosses every hop: the client's header is the gateway's server span's parent
(``parent_of``), the gateway's relay span goes to the worker in the request's ``traceparent`` header
(``inject``), and the worker's HTTP process hands its server span to the inference process in the
``ipc.Submit`` message as the header's string (``traceparent()`` there, ``remote()`` here).  The
inference process records its spans after the fact from the monotonic instants it noted (``record``):
the inference thread never touches a span.

This is the one contract module (beside ``http_limits``) that imports more than pydantic: the
OpenTelemetry API, which the gateway's and the server's extras install; the package's ``__init__`` and
the operator never import it.  The SDK is imported only by ``setup``, when tracing is on.
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from modelpool_contract.flags import DEFAULT_SAMPLE_RATIO
from modelpool_contract.version import VERSION

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator

#: The W3C trace context headers (lower case, as ASGI and our client spell them).
TRACEPARENT = b"traceparent"
TRACESTATE = b"tracestate"
#: The attributes every side sets (OpenTelemetry's HTTP names where one exists).
POOL = "modelpool.pool"  # namespace/name
MODEL = "modelpool.model"  # the name the client asked for (gateway), the served name (worker)
KEY = "modelpool.key"  # the API key's Secret, namespace/name: never the key
WORKER = "modelpool.worker"  # the worker pod a request was relayed to
STATUS = "http.response.status_code"
METHOD = "http.request.method"
PATH = "url.path"

#: How long ``shutdown`` waits for the last spans to leave.
SHUTDOWN_S = 2.0
_PROPAGATOR = TraceContextTextMapPropagator()
_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None
# ``TraceIdRatioBased``'s test: a trace of its own is sampled when its id's low 64 bits are under the bound.
_LOW_64 = (1 << 64) - 1
_bound = 0
# The trace id ``decide`` drew for a trace of its own that it sampled, while ``request_span`` starts it.
_DRAWN: contextvars.ContextVar[int | None] = contextvars.ContextVar("modelpool_drawn_trace", default=None)


def traces_url(endpoint: str) -> str:
    """Pure: where spans are posted, from an OTLP/HTTP base URL (as ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    return endpoint.rstrip("/") + "/v1/traces"


def setup(
    service: str,
    endpoint: str | None,
    sample_ratio: float = DEFAULT_SAMPLE_RATIO,
    *,
    processor: SpanProcessor | None = None,
) -> bool:
    """Start tracing in this process when ``endpoint`` (or, in tests, ``processor``) is given; True when
    on.  ``service`` is the resource's ``service.name`` (``OTEL_RESOURCE_ATTRIBUTES`` adds more, such as
    the pod's name)."""
    global _tracer, _provider, _bound
    if endpoint is None and processor is None:
        return False
    from opentelemetry.sdk.resources import Resource  # the SDK: only when on
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    if processor is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        assert endpoint is not None
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)))
    shutdown()
    resource = Resource.create({"service.name": service, "service.version": VERSION})
    # At exit ``shutdown`` flushes (``process_setup.exit_now`` calls it: the worker's processes end with
    # os._exit, which runs no atexit hook).
    ratio = TraceIdRatioBased(sample_ratio)
    provider = TracerProvider(
        sampler=ParentBased(ratio), resource=resource, shutdown_on_exit=False, id_generator=_drawn_ids()
    )
    provider.add_span_processor(processor)
    _provider, _tracer, _bound = provider, provider.get_tracer("modelpool", VERSION), ratio.bound
    return True


def _drawn_ids() -> IdGenerator:
    """The SDK's random ids, except the trace id ``decide`` drew for the span ``request_span`` starts."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class _DrawnIds(RandomIdGenerator):
        def generate_trace_id(self) -> int:
            drawn = _DRAWN.get()
            return drawn if drawn is not None else super().generate_trace_id()

    return _DrawnIds()


def shutdown(timeout_s: float = SHUTDOWN_S) -> None:
    """Export what is left, for at most ``timeout_s``, and stop; tracing is off after it.  Bounded: an
    unreachable receiver would hold the exporter in its retries for up to its own 10 s timeout, and a
    worker's shutdown must stay within its pod's grace period (the process exits right after)."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        flushing = threading.Thread(target=provider.shutdown, name="otel-shutdown", daemon=True)
        flushing.start()
        flushing.join(timeout_s)


def on() -> bool:
    """Is tracing on in this process?"""
    return _tracer is not None


def parent_of(headers: Iterable[tuple[bytes, bytes]]) -> Context | None:
    """The remote parent a request's ``traceparent`` (and ``tracestate``) header names; None without one.
    A malformed header gives an empty context: the span starts a trace of its own."""
    carrier: dict[str, str] = {}
    for name, value in headers:
        if name in (TRACEPARENT, TRACESTATE):
            carrier[name.decode()] = value.decode("latin-1")
    return _PROPAGATOR.extract(carrier) if carrier else None


def server_span(
    name: str, headers: Iterable[tuple[bytes, bytes]], attributes: Mapping[str, Any]
) -> contextlib.AbstractContextManager[Span]:
    """A request's server span, child of its ``traceparent``, current for the block (tracing on)."""
    assert _tracer is not None, "server_span needs tracing on"
    return _tracer.start_as_current_span(
        name, context=parent_of(headers), kind=SpanKind.SERVER, attributes=attributes
    )


@dataclass(frozen=True, slots=True)
class Sampled:
    """A request to record (``decide``): the client's sampled ``traceparent`` as its parent, or a trace of
    its own with the id drawn for it."""

    parent: Context | None = None
    trace_id: int | None = None


@dataclass(frozen=True, slots=True)
class Unsampled:
    """A request sampled out (``decide``): no span is made for it; its trace's id (32 hex digits, for the
    logs) and the ``traceparent`` the next hop gets instead of the client's (the same trace, a span id of
    this hop's own, not sampled: what the SDK's non-recording span would have propagated)."""

    trace_id: str
    traceparent: bytes


def _nonzero(bits: int) -> int:
    found = random.getrandbits(bits)
    while not found:  # all zeros is no id (W3C)
        found = random.getrandbits(bits)
    return found


def _unsampled(trace_id: int) -> Unsampled:
    return Unsampled(f"{trace_id:032x}", b"00-%032x-%016x-00" % (trace_id, _nonzero(64)))


def decide(headers: Iterable[tuple[bytes, bytes]]) -> Sampled | Unsampled:
    """The sampler's decision for a request with these headers, before any span (module docstring):
    a valid ``traceparent`` decides by its sampled flag, anything else by the ratio on a new trace id."""
    assert _tracer is not None, "decide needs tracing on"
    parent = parent_of(headers)
    if parent is not None:
        context = trace.get_current_span(parent).get_span_context()
        if context.is_valid:
            return Sampled(parent) if context.trace_flags.sampled else _unsampled(context.trace_id)
    trace_id = _nonzero(128)
    return Sampled(trace_id=trace_id) if trace_id & _LOW_64 < _bound else _unsampled(trace_id)


def request_span(
    name: str, sampled: Sampled, attributes: Mapping[str, Any]
) -> contextlib.AbstractContextManager[Span]:
    """The server span of a request ``decide`` sampled, current for the block (as ``server_span``)."""
    assert _tracer is not None, "request_span needs tracing on"
    token = _DRAWN.set(sampled.trace_id) if sampled.trace_id is not None else None
    try:
        kind = SpanKind.SERVER
        started = _tracer.start_span(name, context=sampled.parent, kind=kind, attributes=attributes)
    finally:
        if token is not None:
            _DRAWN.reset(token)
    return trace.use_span(started, end_on_exit=True)


def with_traceparent(headers: list[tuple[bytes, bytes]], value: bytes) -> list[tuple[bytes, bytes]]:
    """Pure: ``headers`` with ``value`` as their one ``traceparent`` (a ``tracestate`` stays: it is the
    trace's, whichever span is the parent)."""
    return [(k, v) for k, v in headers if k != TRACEPARENT] + [(TRACEPARENT, value)]


def span(
    name: str, attributes: Mapping[str, Any] | None = None, kind: SpanKind = SpanKind.INTERNAL
) -> contextlib.AbstractContextManager[Span | None]:
    """A child of the current span, current for the block; the shared null context when tracing is off or
    the current span records nothing (a request sampled out: its children would record nothing either, and
    what goes on to the next hop is the current span's context, with its decision)."""
    if _tracer is None or not trace.get_current_span().is_recording():
        return _NULL
    return _tracer.start_as_current_span(name, kind=kind, attributes=attributes)


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set attributes on the current span (nothing when tracing is off or no span is current)."""
    if _tracer is not None:
        trace.get_current_span().set_attributes(attributes)


def answered(span: Span | None, status: int, *, server: bool = True) -> None:
    """An HTTP status on a span: its attribute, and an error status for a 5xx (a server span) or any 4xx
    or 5xx (a client span), as OpenTelemetry's HTTP conventions say."""
    if span is None:
        return
    span.set_attribute(STATUS, status)
    if status >= 500 or (not server and status >= 400):
        span.set_status(Status(StatusCode.ERROR))


def traceparent() -> str | None:
    """The current span as a ``traceparent`` value; None when off, when no span is current, or when it is
    not sampled (nothing below it would be recorded: the inference process is not asked to)."""
    if _tracer is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid or not context.trace_flags.sampled:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def inject(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with the current span as their ``traceparent`` (the client's own ``traceparent`` and
    ``tracestate`` replaced: the next hop's parent is this span)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    if not carrier:
        return headers
    kept = [(k, v) for k, v in headers if k not in (TRACEPARENT, TRACESTATE)]
    return kept + [(k.encode(), v.encode("latin-1")) for k, v in carrier.items()]


def remote(value: str | None) -> Context | None:
    """The context a ``traceparent`` string names (an IPC message's), or None without one."""
    if not value:
        return None
    return _PROPAGATOR.extract({"traceparent": value})


def wall_ns(monotonic_s: float, now_wall_ns: int, now_monotonic_s: float) -> int:
    """Pure: a ``time.monotonic()`` instant as the epoch nanoseconds spans carry, given one moment read on
    both clocks."""
    return now_wall_ns - round((now_monotonic_s - monotonic_s) * 1e9)


class Clock:
    """One moment on both clocks, to place several monotonic instants on the spans' epoch clock."""

    def __init__(self) -> None:
        self.wall_ns, self.monotonic_s = time.time_ns(), time.monotonic()

    def ns(self, monotonic_s: float) -> int:
        return wall_ns(monotonic_s, self.wall_ns, self.monotonic_s)


def record(
    name: str,
    parent: Context | None,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any] | None = None,
    *,
    error: bool = False,
) -> Context | None:
    """A span that has already happened (start and end given), child of ``parent``; the context of it for
    its own children.  None when tracing is off or there is no parent (a request that came untraced)."""
    if _tracer is None or parent is None:
        return None
    done = _tracer.start_span(name, context=parent, attributes=dict(attributes or {}), start_time=start_ns)
    if error:
        done.set_status(Status(StatusCode.ERROR))
    done.end(end_time=end_ns)
    return trace.set_span_in_context(done, parent)


__all__ = [
    "KEY",
    "METHOD",
    "MODEL",
    "PATH",
    "POOL",
    "STATUS",
    "TRACEPARENT",
    "WORKER",
    "Clock",
    "Sampled",
    "Unsampled",
    "annotate",
    "answered",
    "decide",
    "inject",
    "on",
    "parent_of",
    "record",
    "remote",
    "request_span",
    "server_span",
    "setup",
    "shutdown",
    "span",
    "traceparent",
    "traces_url",
    "wall_ns",
    "with_traceparent",
]
