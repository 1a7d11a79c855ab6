"""The OpenAI routes of ``--engine vllm``: each request admitted here, then relayed to vLLM's server on its
loopback port (``engine.vllm_engine`` publishes the port in the shared view).

What stays ours, as on the transformers engine: the model name check (404), readiness (503 unless the
worker serves), the door (429 with Retry-After when the worker's capacity is taken; a request holds its
slot until its answer is complete, so ``--queue-capacity`` bounds what vLLM holds), the deadline
(``--request-timeout``, shortened by ``x-request-timeout``: 504 before the answer, an error event in a
stream) and the disconnect watch.  A request whose client leaves, or whose deadline passes, has its
upstream connection closed, and vLLM aborts it.  The bodies go to vLLM as they came (vLLM validates its
own parameters and answers 400 in OpenAI's shape), and its answers come back as they are, a stream chunk
by chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import httpx
import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from model_server.errors import DeadlineExceeded, InvalidInput, ModelNotReady, ServerError
from model_server.frontend.endpoints.common import (
    ORJSONResponse,
    check_model,
    disconnect_watch,
    header_timeout,
)
from model_server.frontend.inference_client import ClientGone
from model_server.frontend.openai_codec import models_response, sse, stream_error
from model_server.frontend.server import ModelServer
from model_server.worker_view import Column, Door, Field

T = TypeVar("T")
# httpx logs every request it sends at INFO: one line per relayed request would double the worker's log.
logging.getLogger("httpx").setLevel(logging.WARNING)
LOOPBACK = "127.0.0.1"
# How long vLLM gets to accept a connection (it is on this machine: anything longer means it is gone).
CONNECT_TIMEOUT_S = 5.0
RELAYED = ("/v1/completions", "/v1/chat/completions")
_JSON = {"content-type": "application/json"}
SSE_END = b"data: [DONE]"


class Upstream:
    """One HTTP process's connections to vLLM (a pool, made once vLLM's port is known)."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        port = int(self.server.view.get(Field.UPSTREAM_PORT))
        if not port:
            raise ModelNotReady(f"model {self.server.config.served_name!r} is not loaded")
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=f"http://{LOOPBACK}:{port}",
                timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            )
        return self._client


class Hold:
    """A slot of the door, held until the answer is complete; given back once, whoever gets there first."""

    def __init__(self, door: Door) -> None:
        self.door = door
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.door.give_back()


def peek(body: bytes) -> tuple[bool, str | None]:
    """Pure: (``stream``, ``model``) of an OpenAI body; 400 unless it is a JSON object."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the body must be a JSON object")
    model = doc.get("model")
    return bool(doc.get("stream")), model if isinstance(model, str) else None


def budget_s(request_timeout: float, asked: float | None) -> float:
    """Pure: how long a request may take: ``--request-timeout``, or less when the client asks for less."""
    return request_timeout if asked is None else min(asked, request_timeout)


def admit(server: ModelServer) -> Hold:
    """503 unless the worker serves, 429 when no slot of the door is free; else the slot, counted."""
    inference = server.inference
    inference.check_ready()
    if not server.view.door.take():
        raise inference.overloaded()
    row = inference.row
    server.view.add(row, Column.REQUESTS)
    server.view.put(row, Column.LAST_REQUEST, time.time())
    return Hold(server.view.door)


def register(app: FastAPI, server: ModelServer) -> None:
    """``/v1/models`` (ours) and the relayed completion and chat routes."""
    upstream = Upstream(server)

    @app.get("/v1/models", tags=["openai"])
    async def models() -> Response:
        return ORJSONResponse(models_response(server.config.served_name, server.config.task))

    @app.post("/v1/completions", tags=["openai"])
    async def completions(request: Request) -> Response:
        return await relay(upstream, request, "/v1/completions")

    @app.post("/v1/chat/completions", tags=["openai"])
    async def chat(request: Request) -> Response:
        return await relay(upstream, request, "/v1/chat/completions")


async def relay(upstream: Upstream, request: Request, path: str) -> Response:
    """One request through our door to vLLM and back."""
    server = upstream.server
    body = await request.body()
    streaming, model = peek(body)
    check_model(server, model)
    deadline = time.monotonic() + budget_s(server.config.request_timeout, header_timeout(request))
    hold = admit(server)
    streamed = False
    try:
        client = upstream.client()
        call = client.build_request("POST", path, content=body, headers=_JSON)
        response = await _within(request, deadline, _send(client, call))
        if streaming and response.status_code == 200:
            streamed = True  # the stream lets the slot go at its end
            return RelayedStream(response, hold, deadline)
        return await _whole(server, request, deadline, response)
    finally:
        if not streamed:
            hold.release()


async def _send(client: httpx.AsyncClient, call: httpx.Request) -> httpx.Response:
    """The request sent and its headers back (the body streamed after); 503 when vLLM is unreachable."""
    try:
        return await client.send(call, stream=True)
    except httpx.TransportError as exc:
        raise ModelNotReady(f"vLLM is not reachable: {type(exc).__name__}") from None


async def _whole(
    server: ModelServer, request: Request, deadline: float, response: httpx.Response
) -> Response:
    """vLLM's whole answer, as it is (its errors in OpenAI's shape included)."""
    try:
        content = await _within(request, deadline, response.aread())
    finally:
        await response.aclose()
    if response.status_code >= 500:
        server.view.add(server.inference.row, Column.ERRORS)
    media = response.headers.get("content-type", "application/json")
    return Response(content, status_code=response.status_code, media_type=media)


async def _within(request: Request, deadline: float, work: Awaitable[T]) -> T:
    """``work``'s result, unless the client leaves (499) or the deadline passes (504) first: then it is
    cancelled, which closes its upstream connection, and vLLM aborts the request."""
    task = asyncio.ensure_future(work)
    async with disconnect_watch(request) as gone:
        left = asyncio.ensure_future(gone.wait())
        try:
            await asyncio.wait(
                {task, left}, timeout=max(0.0, deadline - time.monotonic()), return_when="FIRST_COMPLETED"
            )
        finally:
            left.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, ServerError, httpx.HTTPError):
        await task
    if gone.is_set():
        raise ClientGone("client disconnected before the answer was complete")
    raise DeadlineExceeded("request deadline passed before the answer was complete")


class RelayedStream(StreamingResponse):
    """vLLM's server-sent events as they come, and the client's leaving relayed to vLLM at once.

    The moment ASGI's ``http.disconnect`` arrives the relay stops (no chunk after it) and the upstream
    connection is closed, which is what makes vLLM abort the request; the slot of the door is given back
    then, at the end of the answer, or at the deadline (an error event, then the end).  The close is done
    here, on the disconnect, and not by cancelling the relay: a cancellation lands only where the relay
    waits, and the relay does not wait while it works through events already read (see ``_events``), so a
    relay behind vLLM would keep the connection, and vLLM the generation, until it caught up."""

    def __init__(self, upstream: httpx.Response, hold: Hold, deadline: float) -> None:
        self.upstream = upstream
        self.hold = hold
        self.gone = asyncio.Event()  # the client left: set before anything else is done about it
        super().__init__(
            _events(upstream, hold, deadline, self.gone),
            status_code=200,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The relay beside the disconnect watch, whatever ASGI version the server speaks (Starlette's own
        ``StreamingResponse`` watches only below 2.4, and then by cancelling the relay)."""
        relay = asyncio.ensure_future(self.stream_response(send))
        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait((relay, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            await self.close()  # vLLM aborts the request now if the answer was not complete
            relay.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await relay  # its own end: a client gone mid-write (OSError) was seen by the watch too

    async def listen_for_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            continue
        self.gone.set()

    async def close(self) -> None:
        """The slot back and the upstream connection closed (both once, whoever gets there first)."""
        self.hold.release()
        await self.upstream.aclose()


async def _events(
    response: httpx.Response, hold: Hold, deadline: float, gone: asyncio.Event
) -> AsyncIterator[bytes]:
    """vLLM's chunks until its end, the deadline, or the client leaving (``gone``).

    The chunks of one read from vLLM's connection (64 KiB: some 270 events) come without any wait, so the
    loop lets the event loop run before it relays each one (``sleep(0)``): the client's disconnect is seen
    between any two chunks, not only once the relay has caught up with vLLM."""
    chunks = response.aiter_raw()
    try:
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                yield sse(stream_error(DeadlineExceeded("request deadline passed during the stream")))
                return
            except httpx.HTTPError as exc:
                if not gone.is_set():  # a connection closed because the client left is no failure
                    yield sse(stream_error(ModelNotReady(f"vLLM's stream broke: {type(exc).__name__}")))
                return
            await asyncio.sleep(0)
            if gone.is_set():
                return
            if chunk.rstrip().endswith(SSE_END):
                hold.release()  # the answer is complete: its slot is free before the client reads the end
            yield chunk
    finally:
        hold.release()  # first: the awaits below may be cancelled again (the client has left)
        await response.aclose()


__all__ = ["RELAYED", "Hold", "RelayedStream", "Upstream", "admit", "budget_s", "peek", "register", "relay"]
