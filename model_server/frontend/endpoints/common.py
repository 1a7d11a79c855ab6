"""What every route uses: typed errors -> HTTP answers, deadlines from headers, disconnect watching, JSON
responses, the model and task guards."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from model_server.errors import InvalidInput, ModelNotFound, ModelNotReady, ServerError, UnsupportedOperation
from model_server.frontend.access_log import note_model
from model_server.frontend.server import ModelServer

log = logging.getLogger("modelpool.http")

TIMEOUT_HEADER = "x-request-timeout"


class ORJSONResponse(Response):
    """JSON via orjson (fast for float arrays; numpy arrays serialised natively)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


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
            server.inference.reject(exc.reason)
        return http_response(path, exc)
    log.exception("unexpected error on %s", path, exc_info=exc)
    return error_response(path, 500, "internal", f"internal error: {type(exc).__name__}")


def header_timeout(request: Request) -> float | None:
    """The client's deadline from ``x-request-timeout`` (seconds), if any."""
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise InvalidInput(f"header {TIMEOUT_HEADER} must be a number of seconds, got {raw!r}") from None
    if not (0 < value < float("inf")):  # also refuses NaN
        raise InvalidInput(f"header {TIMEOUT_HEADER} must be a positive number of seconds")
    return value


@contextlib.asynccontextmanager
async def disconnect_watch(request: Request) -> AsyncIterator[asyncio.Event]:
    """An event set when the client disconnects (the body has been read, so the next ASGI message is
    the disconnect); the data plane drops the request before compute when it is set."""
    gone = asyncio.Event()

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                gone.set()
                return

    task = asyncio.create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()


def check_model(server: ModelServer, name: str | None, *, adapters: bool = False) -> str | None:
    """404 for a model name this server does not serve (None/empty = the served model); with ``adapters``
    (the OpenAI generation routes) the LoRA adapter the name selects (None: the base model).  The model
    served goes on the request's access line (``access_log.note_model``)."""
    if not name or name == server.config.served_name:
        note_model(server.config.served_name)
        return None
    if adapters and name in server.config.adapters:
        note_model(name)
        return name
    raise ModelNotFound(
        f"model {name!r} is not served here; this server serves {server.config.served_name!r}"
    )


def require_task(server: ModelServer, *tasks: str) -> str:
    """400 when this model's task cannot serve the route."""
    task = server.config.task
    if task not in tasks:
        raise UnsupportedOperation(
            f"model {server.config.served_name!r} has task {task!r}; this route needs {' or '.join(tasks)}"
        )
    if server.inference.task_class is None:
        raise ModelNotReady(f"model {server.config.served_name!r} is not loaded yet")
    return task
