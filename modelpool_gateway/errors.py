"""The gateway's own answers (404, 413, 429, 503...) in each protocol's error shape, as raw ASGI sends.

OpenAI routes (``/v1/...``) get ``{"error": {"message", "type", "code"}}`` and KServe v2 routes get
``{"error": message}``: the shapes the workers themselves use, so a client sees one error format whether
the worker or the gateway refused.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]


def error_body(openai: bool, status: int, kind: str, message: str) -> bytes:
    """The error document: OpenAI's shape on /v1 routes, KServe's elsewhere."""
    if openai:
        return orjson.dumps({"error": {"message": message, "type": kind, "code": status}})
    return orjson.dumps({"error": message})


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A complete JSON response."""
    all_headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(
    send: Send,
    openai: bool,
    status: int,
    kind: str,
    message: str,
    *,
    retry_after: int | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> int:
    """An error response (``Retry-After`` when the condition is temporary, and any ``headers``); returns
    ``status``."""
    extra = [(b"retry-after", str(retry_after).encode())] if retry_after is not None else []
    await send_json(send, status, error_body(openai, status, kind, message), [*extra, *(headers or [])])
    return status
