"""The HTTP layer: every route registered in ``build_app``; typed errors -> HTTP in ``error_response``.

Routes live in ``ops`` (health, metadata, /metrics, /stats), ``kserve_routes`` (KServe v2 infer) and
``openai_routes``.
``LimitsMiddleware`` (pure ASGI, outermost) refuses a full queue with 429 and bodies over
``--max-request-bytes`` with 413 before any route reads them, hands v2 infer straight to its handler
(the hot path skips FastAPI's stack), and records request count and latency.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_server import __version__
from model_server.endpoints import kserve_routes, openai_routes, ops
from model_server.errors import InvalidInput, Overloaded, PayloadTooLarge, ServerError
from model_server.server import ModelServer

log = logging.getLogger("modelpool.http")


def route_label(path: str) -> str:
    """Low-cardinality route label for metrics."""
    if path.startswith("/v2/models/") and path.endswith("/infer"):
        return "v2_infer"
    if path.startswith("/v2/health"):
        return "health"
    if path.startswith("/v2"):
        return "v2_meta"
    if path.startswith("/v1/"):
        return path[4:].replace("/", "_") if path in _OPENAI else "other"
    return path.strip("/") if path in ("/metrics", "/stats") else "other"


_OPENAI = {
    "/v1/models",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/images/generations",
}


_INFERENCE = {"v2_infer", "embeddings", "completions", "chat_completions", "images_generations"}


def error_response(
    path: str, status: int, reason: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    """The one error body: OpenAI's shape on /v1, KServe's ``{"error": msg}`` elsewhere."""
    if path.startswith("/v1/"):
        doc: dict[str, Any] = {"error": {"message": message, "type": reason, "code": status}}
    else:
        doc = {"error": message}
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


def http_response(path: str, exc: ServerError) -> Response:
    """Typed error -> HTTP (status and reason are on the class; Retry-After when the error is temporary)."""
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s is not None else None
    return error_response(path, exc.status, exc.reason, str(exc), headers)


def server_error_response(server: ModelServer, path: str, exc: Exception) -> Response:
    """Any exception a route raised -> its HTTP answer (the one mapping FastAPI's handlers and the
    infer fast path share)."""
    if isinstance(exc, ServerError):
        # Requests refused or given up on (4xx, 429, 499, 503, 504) count as rejections by reason;
        # 500s were computed and failed: the data plane counts those in errors_total.
        if exc.status != 500:
            server.dataplane.reject(exc.reason)
        return http_response(path, exc)
    log.exception("unexpected error on %s", path, exc_info=exc)
    return error_response(path, 500, "internal", f"internal error: {type(exc).__name__}")


class LimitsMiddleware:
    """The outermost ASGI layer: 429 before anything else when the queue is full; 413 for bodies over
    the limit (declared or streamed); request count and latency per route; and the infer fast path.

    The fast path: ``POST /v2/models/{name}/infer`` is handed straight to the v2 handler.  FastAPI's
    middleware stack, routing and dependency solving cost about as much CPU as the handler itself, and
    on the event loop that is what bounds small-request throughput.  FastAPI keeps the route for the
    OpenAPI schema (and the ``/versions/...`` form)."""

    def __init__(
        self, app: ASGIApp, server: ModelServer, infer: kserve_routes.InferHandler | None = None
    ) -> None:
        self.app = app
        self.server = server
        self.limit = server.config.max_request_bytes
        self.infer = infer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path: str = scope["path"]
        route = route_label(path)
        status = [0]

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if route in _INFERENCE and scope["method"] == "POST" and self.server.state_machine.serving:
                # Fast path: a full queue is answered here, before routing and body parsing, so that
                # refusing costs the event loop as little as possible under overload.
                try:
                    self.server.dataplane.check_capacity()
                except Overloaded as exc:
                    self.server.dataplane.reject(exc.reason)
                    await http_response(path, exc)(scope, receive, send_wrapper)
                    return
            declared = dict(scope["headers"]).get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.limit:
                await self._too_large(scope, receive, send_wrapper, path, int(declared))
                return
            if declared is None and scope["method"] in ("POST", "PUT", "PATCH"):
                # A chunked body has no declared length: read it here (bounded), then replay it.
                body, size = await self._read_bounded(receive)
                if body is None:
                    await self._too_large(scope, receive, send_wrapper, path, size)
                    return
                replayed = False

                async def replay() -> Message:
                    nonlocal replayed
                    if not replayed:
                        replayed = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    return await receive()

                await self._dispatch(scope, replay, send_wrapper, route)
            else:
                await self._dispatch(scope, receive, send_wrapper, route)
        finally:
            code = status[0] or 499
            metrics = self.server.metrics
            metrics.requests.labels(route=route, code=str(code)).inc()
            metrics.latency.labels(route=route).observe(time.perf_counter() - started)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send, route: str) -> None:
        path: str = scope["path"]
        if self.infer is None or route != "v2_infer" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        name = path[len("/v2/models/") : -len("/infer")]
        if not name or "/" in name:  # /versions/N/infer and odd paths: FastAPI's routing decides
            await self.app(scope, receive, send)
            return
        try:
            response = await self.infer(Request(scope, receive), name)
        except Exception as exc:  # every error becomes its HTTP answer, as FastAPI's handlers do
            response = server_error_response(self.server, path, exc)
        await response(scope, receive, send)

    async def _read_bounded(self, receive: Receive) -> tuple[bytes | None, int]:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(parts), size
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None, size
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts), size

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, path: str, size: int) -> None:
        self.server.dataplane.reject(PayloadTooLarge.reason)
        exc = PayloadTooLarge(f"request body of {size} bytes exceeds --max-request-bytes={self.limit}")
        await http_response(path, exc)(scope, receive, send)


def build_app(server: ModelServer) -> ASGIApp:
    """The ASGI app uvicorn serves: the limits middleware outermost, then FastAPI.

    Outermost, so that a 429 under overload or a 413 costs the event loop no more than this one
    middleware (FastAPI's own middleware stack, routing and body parsing are skipped)."""
    return LimitsMiddleware(build_api(server), server, kserve_routes.infer_handler(server))


def build_api(server: ModelServer) -> FastAPI:
    """The FastAPI app with every route and the error mapping."""
    app = FastAPI(
        title="modelpool-server",
        version=__version__,
        description="One model behind a bounded queue: KServe v2 and OpenAI-compatible APIs.",
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(ServerError)
    async def on_server_error(request: Request, exc: ServerError) -> Response:
        return server_error_response(server, request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> Response:
        server.dataplane.reject(InvalidInput.reason)
        parts = []
        for err in exc.errors()[:5]:
            loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body") or "body"
            parts.append(f"{loc}: {err.get('msg')}")
        return error_response(
            request.url.path, 400, InvalidInput.reason, "invalid request: " + "; ".join(parts)
        )

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(request.url.path, exc.status_code, "http_error", str(exc.detail))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return server_error_response(server, request.url.path, exc)

    ops.register(app, server)
    kserve_routes.register(app, server)
    openai_routes.register(app, server)
    return app
