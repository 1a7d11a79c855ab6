"""The HTTP layer: ``build_app`` assembles every route, the error mapping and the limits middleware.

Routes live in ``ops`` (health, metadata, /metrics, /stats), ``kserve_routes`` (KServe v2 infer) and
``openai_routes`` (the OpenAI-compatible API); typed errors become HTTP answers in ``common``.
``limits.LimitsMiddleware`` (pure ASGI, outermost) refuses a full queue with 429 and bodies over
``--max-request-bytes`` with 413 before any route reads them, hands v2 infer straight to its handler
(the hot path skips FastAPI's stack), and records request count and latency.  With ``--api-key-file``,
``auth.ApiKeyMiddleware`` wraps it all: a request without the key is refused before anything else; with
tracing on, ``traced.TracingMiddleware`` wraps that (the request's server span).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from model_server import __version__
from model_server.errors import InvalidInput, ServerError
from model_server.frontend.endpoints import kserve_routes, openai_routes, ops
from model_server.frontend.endpoints.auth import ApiKeyMiddleware
from model_server.frontend.endpoints.common import error_response, server_error_response
from model_server.frontend.endpoints.limits import LimitsMiddleware
from model_server.frontend.endpoints.traced import TracingMiddleware
from model_server.frontend.server import ModelServer
from modelpool_contract import tracing


def build_app(server: ModelServer) -> ASGIApp:
    """The ASGI app uvicorn serves: the limits middleware outermost, then FastAPI.

    Outermost, so that a 429 under overload or a 413 costs the event loop no more than this one
    middleware (FastAPI's own middleware stack, routing and body parsing are skipped).  The API-key
    check, when configured, goes around even that, and the server span (tracing on: ``traced``) around
    everything, so a refusal is traced too."""
    app: ASGIApp = LimitsMiddleware(build_api(server), server, kserve_routes.infer_handler(server))
    key = server.config.api_key
    if key is not None:
        app = ApiKeyMiddleware(app, key, server.inference.reject)
    return TracingMiddleware(app, server) if tracing.on() else app


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
        server.inference.reject(InvalidInput.reason)
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
