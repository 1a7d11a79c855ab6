"""The outermost ASGI layer: 429 for a full queue and 413 for a body over ``--max-request-bytes``
before any route reads the body, 408 for a body that does not arrive within
``--request-body-timeout-seconds``, request count and latency per route, and the v2 infer fast path."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from model_server.errors import BodyTimeout, Overloaded, PayloadTooLarge
from model_server.frontend.endpoints.common import error_response, http_response, server_error_response
from model_server.frontend.endpoints.kserve_routes import InferHandler
from model_server.frontend.server import ModelServer

# The OpenAI routes, each its own route label.
_OPENAI = {
    "/v1/models",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/images/generations",
}
# Routes that queue work: a full queue refuses them in the middleware.
INFERENCE_ROUTES = frozenset(
    {"v2_infer", "embeddings", "completions", "chat_completions", "images_generations"}
)
# Methods whose body the middleware reads (within the deadline and the limit) before any route runs.
_BODY_METHODS = ("POST", "PUT", "PATCH")


async def read_bounded(receive: Receive, limit: int) -> tuple[bytes | None, int, bool]:
    """The whole body (None once over ``limit``), the bytes read, and whether the client is still
    connected; a shared host's router reads an OpenAI body with it too (``host_http``)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(parts), size, False
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, size, True
        if not message.get("more_body", False):
            return (b"".join((*parts, chunk)) if parts else chunk), size, True
        parts.append(chunk)


def replay(body: bytes, then: Receive) -> Receive:
    """The body read already, once; then the connection's own messages (a disconnect)."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return await then()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


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


class LimitsMiddleware:
    """The outermost ASGI layer: 429 before anything else when the queue is full; 413 for bodies over
    the limit (declared or streamed); 408 (``Connection: close``) for a body that has not all arrived
    within ``--request-body-timeout-seconds`` of the headers; request count and latency per route; and
    the infer fast path.

    The body is read here, whole, and replayed to the route: so one deadline covers all of it (a client
    sending a byte at a time holds a connection and an ASGI task), and nothing is admitted before it is
    in (the door's slot is taken by the route, after the body), so a slow body never holds a queue slot.

    The fast path: ``POST /v2/models/{name}/infer`` is handed straight to the v2 handler.  FastAPI's
    middleware stack, routing and dependency solving cost about as much CPU as the handler itself, and
    on the event loop that is what bounds small-request throughput.  FastAPI keeps the route for the
    OpenAPI schema (and the ``/versions/...`` form)."""

    def __init__(self, app: ASGIApp, server: ModelServer, infer: InferHandler | None = None) -> None:
        self.app = app
        self.server = server
        self.limit = server.config.max_request_bytes
        self.body_timeout = server.config.request_body_timeout_seconds
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
            if route in INFERENCE_ROUTES and scope["method"] == "POST" and self.server.state_machine.serving:
                # Fast path: a full queue is answered here, before routing and body parsing, so that
                # refusing costs the event loop as little as possible under overload.
                try:
                    self.server.inference.check_capacity()
                except Overloaded as exc:
                    self.server.inference.reject(exc.reason)
                    await http_response(path, exc)(scope, receive, send_wrapper)
                    return
            declared = dict(scope["headers"]).get(b"content-length")
            if declared is not None and declared.isdigit() and int(declared) > self.limit:
                await self._too_large(scope, receive, send_wrapper, path, int(declared))
                return
            if scope["method"] in _BODY_METHODS:
                # The whole body, within the deadline and the limit (a chunked one has no declared
                # length), then replayed to the route.
                read = await self._read_within_deadline(receive)
                if read is None:
                    await self._body_timeout(scope, receive, send_wrapper, path)
                    return
                body, size, connected = read
                if not connected:
                    return  # the client went away mid-body: nobody to answer
                if body is None:
                    await self._too_large(scope, receive, send_wrapper, path, size)
                    return
                await self._dispatch(scope, replay(body, receive), send_wrapper, route)
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

    async def _read_within_deadline(self, receive: Receive) -> tuple[bytes | None, int, bool] | None:
        """``read_bounded`` within ``--request-body-timeout-seconds``; None when the body was late."""
        try:
            async with asyncio.timeout(self.body_timeout):
                return await read_bounded(receive, self.limit)
        except TimeoutError:
            return None

    async def _body_timeout(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """408, counted as a rejection (``body_timeout``); the connection is closed after it (the rest of
        the body may still be on its way, and the client was slow enough already)."""
        exc = BodyTimeout(
            f"the request body did not arrive within {self.body_timeout:g} s (--request-body-timeout-seconds)"
        )
        self.server.inference.reject(exc.reason)
        response = error_response(path, exc.status, exc.reason, str(exc), {"Connection": "close"})
        await response(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send, path: str, size: int) -> None:
        self.server.inference.reject(PayloadTooLarge.reason)
        exc = PayloadTooLarge(f"request body of {size} bytes exceeds --max-request-bytes={self.limit}")
        await http_response(path, exc)(scope, receive, send)
