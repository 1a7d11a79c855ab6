"""The worker's server span: with tracing on (``--otlp-endpoint``), the outermost ASGI layer of an HTTP
process starts one span per inference request, child of its ``traceparent`` (the gateway's relay span),
and keeps it current while the request is served: the admission and the wait in ``inference_client`` are
its children, and its context goes to the inference process in ``ipc.Submit``.  Health, metadata and the
rest are not traced.  With tracing off ``build_app`` leaves this layer out: it costs nothing."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_server.frontend.endpoints.limits import INFERENCE_ROUTES, route_label
from model_server.frontend.server import ModelServer
from modelpool_contract import logs, tracing

# A request whose client left before any answer started (nginx's convention, as the metrics count it).
_CLIENT_CLOSED = 499


def span_name(method: str, route: str, path: str) -> str:
    """Pure: a server span's name, low cardinality (the route, never the model's name)."""
    return f"{method} /v2/models/{{model}}/infer" if route == "v2_infer" else f"{method} {path}"


class TracingMiddleware:
    """One server span per inference request (module docstring)."""

    def __init__(self, app: ASGIApp, server: ModelServer) -> None:
        self.app = app
        self.model = server.config.served_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_label(scope["path"]) if scope["type"] == "http" else ""
        if route not in INFERENCE_ROUTES:
            await self.app(scope, receive, send)
            return
        status = _CLIENT_CLOSED

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        attributes = {tracing.METHOD: scope["method"], tracing.PATH: scope["path"], tracing.MODEL: self.model}
        name = span_name(scope["method"], route, scope["path"])
        with tracing.server_span(name, scope["headers"], attributes) as span:
            # The access line, written after this span ended (``access_log``, around this app), names its
            # trace: a new one for a request that came without a traceparent. The request ids' own reset,
            # after that line, restores what was before.
            if (context := span.get_span_context()).is_valid:
                logs.bind(logs.current_request_id(), format(context.trace_id, "032x"))
            try:
                await self.app(scope, receive, sending)
            finally:
                tracing.answered(span, status)
