"""The upstream side of a request: what goes to the worker, and its answer relayed to the client.

Request and response bodies pass through untouched (binary tensors byte for byte, no re-encoding); the
answer is relayed chunk by chunk as it arrives, never buffered whole.  A client that leaves a streamed
answer (no Content-Length: server-sent events) drops the worker's connection, so the worker stops
generating for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from modelpool_gateway.client import Client, Headers, Response, request_head
from modelpool_gateway.config import GatewaySettings
from modelpool_gateway.errors import Send
from modelpool_gateway.state import Worker
from modelpool_gateway.usage import UsageScanner

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]

# Hop-by-hop headers (RFC 9110 7.6.1), the ones the client sets itself, and Expect (the gateway's own
# server answered the client's 100-continue; the worker gets the whole body at once).
_REQUEST_SKIP = frozenset(
    {
        b"host", b"content-length", b"connection", b"keep-alive", b"proxy-connection", b"te",
        b"trailer", b"transfer-encoding", b"upgrade", b"proxy-authorization", b"expect",
    }
)  # fmt: skip
_RESPONSE_SKIP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"trailer", b"upgrade"})
WORKER_HEADER = b"x-modelpool-worker"


@dataclass(frozen=True)
class Outbound:
    """What is sent to the worker: method, path with query, headers (hop-by-hop removed), body."""

    method: str
    path: str
    headers: Headers
    body: bytes

    def with_header(self, name: bytes, value: bytes) -> Outbound:
        kept = [(k, v) for k, v in self.headers if k != name]
        return Outbound(self.method, self.path, [*kept, (name, value)], self.body)

    def head(self) -> bytes:
        return request_head(self.method, self.path, self.headers)


def forward_headers(raw: Headers) -> Headers:
    """The client's headers as they go to the worker (ASGI names are lower case already)."""
    return [(k, v) for k, v in raw if k not in _REQUEST_SKIP]


def response_headers(resp: Response, worker: Worker) -> Headers:
    """The worker's headers as they go to the client, naming the worker that answered."""
    out = [(k, v) for k, v in resp.headers if k not in _RESPONSE_SKIP]
    out.append((WORKER_HEADER, worker.name.encode()))
    return out


class Upstream:
    """Sends requests to workers through one keep-alive client."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.client = Client(
            connect_timeout=settings.connect_timeout_seconds,
            read_timeout=settings.upstream_read_timeout_seconds,
            keepalive_s=settings.keepalive_seconds,
        )

    async def open(
        self,
        worker: Worker,
        out: Outbound,
        *,
        on_sent: Callable[[], None] | None = None,
        abandon: asyncio.Future[Any] | None = None,
    ) -> Response:
        """Send ``out`` to ``worker``; return once its status and headers arrived.  ``on_sent`` is called
        as soon as the request has been written; ``abandon`` done first drops the request."""
        assert worker.ip is not None
        return await self.client.request(
            worker.ip, worker.port, out.head(), out.body, on_sent=on_sent, abandon=abandon
        )

    def close(self) -> None:
        self.client.close()


async def watch_disconnect(receive: Receive) -> None:
    """Returns when the client has disconnected (the request body has been read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def relay(
    resp: Response,
    worker: Worker,
    send: Send,
    gone: asyncio.Future[None],
    scanner: UsageScanner | None = None,
) -> bool:
    """Send the worker's answer to the client as it arrives (each chunk shown to ``scanner`` too: what the
    answer says it used); True when it was sent whole.  A streamed answer (no Content-Length) stops when
    the client leaves (``gone``), which closes the worker's connection."""
    await send(
        {"type": "http.response.start", "status": resp.status, "headers": response_headers(resp, worker)}
    )
    if resp.content_length is not None:
        await _copy(resp, send, scanner)
        return True
    copier = asyncio.ensure_future(_copy(resp, send, scanner))
    await asyncio.wait({gone, copier}, return_when=asyncio.FIRST_COMPLETED)
    if not copier.done():  # the client left: stop reading, drop the worker's connection
        copier.cancel()
        resp.close()
        with contextlib.suppress(asyncio.CancelledError):
            await copier
        return False
    copier.result()  # re-raise a failure of the upstream read
    return True


async def _copy(resp: Response, send: Send, scanner: UsageScanner | None) -> None:
    try:
        last = False
        while not last:
            chunk, last = await resp.read_chunk()
            if scanner is not None:
                scanner.feed(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
    finally:
        resp.close()  # a no-op once the answer was read completely (released)
