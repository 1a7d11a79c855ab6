"""The 429 at line rate: a full worker refuses an inference request as soon as its headers are parsed.

Under a flood, refusing is what an HTTP process spends its CPU on, and that CPU is taken from the model on
the same cores.  Through the ASGI stack a refusal costs a task, a scope, a Response object, a JSON body
and the middleware's bookkeeping: 7,000-16,000 a second for one process with the model idle.  Here the
HTTP protocol (uvicorn's httptools protocol, subclassed) answers on the parser's headers-complete
callback, before any body byte is read and before any ASGI task exists, with bytes built once: per
Retry-After value and error shape, rebuilt only when uvicorn's ``Date`` header ticks (once a second).
The body that follows is parsed and dropped by the same parser, so the connection stays usable.

What it refuses is exactly what ``limits.LimitsMiddleware`` would have refused with 429 (it stays there
as the path for everything this one leaves alone): a ``POST`` to an inference route while the worker
serves and its door (``worker_view.Door``) is full.  It leaves to the ASGI path: a request on a
connection whose previous answer is still being written (pipelining), one that asks ``Expect:
100-continue`` or no keep-alive, and, with an API key configured, one without the right key (the 401
goes first).  The counters are the same (``rejected_total{reason=overloaded}``,
``requests_total{code=429}``, the latency histogram, the worker's ``rejected_total`` in ``/stats``).
"""

from __future__ import annotations

import random
import time
from typing import Any

import orjson

from model_server.errors import Overloaded
from model_server.frontend.endpoints.auth import authorized
from model_server.frontend.inference_client import retry_after_seconds
from model_server.frontend.server import ModelServer
from model_server.worker_view import Column, Field
from modelpool_contract.http_limits import BoundedHeadersProtocol

# The inference routes a full worker refuses (``limits.INFERENCE_ROUTES``): the OpenAI ones by exact path.
_OPENAI_ROUTES = {
    b"/v1/embeddings": "embeddings",
    b"/v1/completions": "completions",
    b"/v1/chat/completions": "chat_completions",
    b"/v1/images/generations": "images_generations",
}
_V2_PREFIX = b"/v2/models/"
_V2_SUFFIX = b"/infer"
# Refusals answered from the cache: Retry-After values above this are built each time (a long backlog).
_CACHED_RETRY_AFTER_S = 64


def refusable_route(method: bytes, url: bytes) -> str | None:
    """Pure: the route label (``limits.route_label``) of an inference request, None for anything else."""
    if method != b"POST":
        return None
    path = url.partition(b"?")[0] if b"?" in url else url
    if path.startswith(_V2_PREFIX) and path.endswith(_V2_SUFFIX):
        return "v2_infer"
    return _OPENAI_ROUTES.get(path)


def refusal_bytes(
    openai: bool, message: str, retry_after_s: int, default_headers: list[tuple[bytes, bytes]]
) -> bytes:
    """Pure: the whole HTTP/1.1 429 answer, in the error shape of ``common.error_response``."""
    doc: dict[str, Any] = (
        {"error": {"message": message, "type": Overloaded.reason, "code": Overloaded.status}}
        if openai
        else {"error": message}
    )
    body = orjson.dumps(doc)
    head = [b"HTTP/1.1 429 Too Many Requests\r\n"]
    head += [name + b": " + value + b"\r\n" for name, value in default_headers]
    head += [
        b"content-type: application/json\r\n",
        b"retry-after: %d\r\n" % retry_after_s,
        b"content-length: %d\r\n\r\n" % len(body),
    ]
    return b"".join(head) + body


class Refusals:
    """One HTTP process's early refusals: when to refuse, the answers built so far, the counters."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server
        key = server.config.api_key
        self.key = key.encode() if key is not None else None
        self.message = f"queue full ({server.config.queue_capacity} requests waiting)"
        metrics = server.metrics
        self._rejected = metrics.rejected.labels(reason=Overloaded.reason)
        routes = ("v2_infer", *_OPENAI_ROUTES.values())
        self._requests = {r: metrics.requests.labels(route=r, code=str(Overloaded.status)) for r in routes}
        self._latency = {r: metrics.latency.labels(route=r) for r in routes}
        self._answers: dict[tuple[bool, int], bytes] = {}
        self._headers: list[tuple[bytes, bytes]] | None = None

    def refuses(self) -> bool:
        """Is the worker serving with its door full (the ASGI path would answer 429)?"""
        server = self.server
        return server.view.door.full and server.state_machine.serving

    def allowed(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """With an API key configured: does the request carry it?  (Without it, the 401 comes first.)"""
        if self.key is None:
            return True
        header = next((v for k, v in headers if k == b"authorization"), None)
        return authorized(header, self.key)

    def answer(self, route: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
        """The 429 for ``route`` (counted), from the cache when it has one."""
        if default_headers is not self._headers:  # uvicorn's Date ticked: a new list
            self._answers.clear()
            self._headers = default_headers
        view = self.server.view
        seconds = retry_after_seconds(
            view.get(Field.BACKLOG_ITEMS), view.get(Field.SECONDS_PER_ITEM), random.random()
        )
        openai = route != "v2_infer"
        answer = self._answers.get((openai, seconds))
        if answer is None:
            answer = refusal_bytes(openai, self.message, seconds, default_headers)
            if seconds <= _CACHED_RETRY_AFTER_S:
                self._answers[(openai, seconds)] = answer
        view.add(self.server.inference.row, Column.REJECTED)
        self._rejected.inc()
        self._requests[route].inc()
        return answer

    def observe(self, route: str, seconds: float) -> None:
        self._latency[route].observe(seconds)


class RefusingProtocol(BoundedHeadersProtocol):
    """uvicorn's httptools protocol with the header bound (``modelpool_contract.http_limits``), answering
    429 at headers-complete when ``refusals`` says so."""

    refusals: Refusals  # set on the per-process subclass (``protocol_for``)

    def on_headers_complete(self) -> None:
        refusals = self.refusals
        if not refusals.refuses():
            super().on_headers_complete()
            return
        route = refusable_route(self.parser.get_method(), self.url)
        if (
            route is None
            or self.expect_100_continue
            or not self.parser.should_keep_alive()
            or (self.cycle is not None and not self.cycle.response_complete)
            or self.flow.write_paused  # a client that does not read its answers waits its turn
            or not refusals.allowed(self.headers)
        ):
            super().on_headers_complete()
            return
        self.end_of_headers()  # the header bound first: a 431 outranks a 429
        started = time.perf_counter()
        # The body still to come is parsed and dropped: on_body and on_message_complete skip a cycle
        # whose response is complete, which the previous cycle's is (or there is none: see below).
        self.cycle = _ANSWERED  # type: ignore[assignment]
        self.transport.write(refusals.answer(route, self.server_state.default_headers))
        self.on_response_complete()
        refusals.observe(route, time.perf_counter() - started)


class _Set:
    def set(self) -> None:
        """Nothing waits on an answered request (``connection_lost`` wakes the cycle's waiter)."""


class _Answered:
    """Stands for the cycle of a request answered here: complete, so the protocol's callbacks (the
    request's body, the connection's loss, a shutdown) leave it alone."""

    response_complete = True
    disconnected = False
    keep_alive = True
    message_event = _Set()


_ANSWERED = _Answered()


def protocol_for(server: ModelServer) -> type[RefusingProtocol]:
    """The protocol class uvicorn builds each connection with, for this process's server."""
    return type("RefusingProtocol", (RefusingProtocol,), {"refusals": Refusals(server)})


__all__ = ["Refusals", "RefusingProtocol", "protocol_for", "refusable_route", "refusal_bytes"]
