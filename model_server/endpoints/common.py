"""Helpers every route uses: deadlines from headers, disconnect watching, JSON responses, the task guard."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from model_server.errors import InvalidInput, ModelNotFound, ModelNotReady, UnsupportedOperation
from model_server.server import ModelServer

TIMEOUT_HEADER = "x-request-timeout"


class ORJSONResponse(Response):
    """JSON via orjson (fast for float arrays; numpy arrays serialised natively)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


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


def check_model(server: ModelServer, name: str | None) -> None:
    """404 for a model name this server does not serve (None/empty = the served model)."""
    if name and name != server.config.served_name:
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
    if server.dataplane.task_class is None:
        raise ModelNotReady(f"model {server.config.served_name!r} is not loaded yet")
    return task
