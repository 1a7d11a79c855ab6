"""The request's ids on the way in and out of an HTTP server: one ASGI middleware for the gateway and the
server's HTTP processes (``RequestIds``).

For each HTTP request it

* takes the client's ``x-request-id`` when it is sane, else makes one (``logs.request_id_of``), and puts a
  made one into the request's headers, so that what the app forwards (the gateway, to the worker) carries
  it; and reads the trace id of a W3C ``traceparent``;
* binds both for every line logged while the request is served (``logs.bind``);
* answers with ``x-request-id`` (replacing one a worker's answer relayed by the gateway already had);
* when the app is done, hands the status sent (0: none) and the seconds taken to ``done``, which writes the
  program's access line (the ids are still bound then).

No dependency beyond the standard library: an ASGI app is called with plain mappings and coroutines.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from modelpool_contract.logs import REQUEST_ID_HEADER, TRACEPARENT_HEADER, bind, request_id_of
from modelpool_contract.logs import traceparent_trace_id as trace_of

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]
#: ``done(scope, status, seconds)``: called once the app returned (or raised), ids still bound.
Done = Callable[[Scope, int, float], None]


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    """The first value of ``name`` (lower case, as ASGI gives names) among ``headers``."""
    for key, value in headers:
        if key == name:
            return value
    return None


class RequestIds:
    """The ASGI middleware (module docstring); other scope types pass through untouched."""

    def __init__(self, app: App, done: Done) -> None:
        self.app = app
        self.done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        given = header(headers, REQUEST_ID_HEADER)
        request_id = request_id_of(given)
        encoded = request_id.encode("ascii")
        if given != encoded:  # made here (or the client's was refused): forwarded as the request's own
            scope["headers"] = [(k, v) for k, v in headers if k != REQUEST_ID_HEADER]
            scope["headers"].append((REQUEST_ID_HEADER, encoded))
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                sent = message.get("headers") or []
                message["headers"] = [(k, v) for k, v in sent if k.lower() != REQUEST_ID_HEADER]
                message["headers"].append((REQUEST_ID_HEADER, encoded))
            await send(message)

        reset = bind(request_id, trace_of(header(headers, TRACEPARENT_HEADER)))
        started = time.perf_counter()
        try:
            await self.app(scope, receive, sending)
        finally:
            try:
                self.done(scope, status, time.perf_counter() - started)
            finally:
                reset()


N = TypeVar("N")


def with_note(app: App, done: Done, note: contextvars.ContextVar[N | None], fresh: Callable[[], N]) -> App:
    """``app`` behind ``RequestIds(app, done)``, with a fresh ``note`` (``fresh()``) current for each HTTP
    request, for what the app learns while serving it (the model, the key, the tokens) and ``done``'s
    access line reads; other scope types pass through untouched."""
    ids = RequestIds(app, done)

    async def noted(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        token = note.set(fresh())
        try:
            await ids(scope, receive, send)
        finally:
            note.reset(token)

    return noted


__all__ = ["Done", "RequestIds", "header", "with_note"]
