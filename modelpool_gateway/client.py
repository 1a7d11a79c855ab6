"""A lean HTTP/1.1 client for the gateway's one upstream job: forward a request to a worker, stream back.

Why not a general-purpose client: proxying one echo worker on two cores (docs/gateway.md, "How it is
built"), httpx sustained about 5 % of the direct request rate at concurrency 64 and aiohttp 30-60 %; this
client (httptools, the parser uvicorn uses, plus keep-alive connections per worker) sustains 45-95 % and
adds under half of aiohttp's latency.  It does only what forwarding needs: GET/POST with a body held in
memory, a response streamed chunk by chunk with back-pressure (reading pauses while ``HIGH_WATER`` bytes
wait), and errors that tell whether the request may be sent elsewhere (``Unreachable``: nothing was
answered).

A keep-alive connection the worker closed while idle is detected when it is reused and the request is
sent again once on a fresh connection, as HTTP clients do; connections idle longer than ``keepalive_s``
(below the workers' own 5 s) are not reused at all.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any, cast

import httptools

from modelpool_contract.http_limits import MAX_HEADER_BYTES

Headers = list[tuple[bytes, bytes]]
# Reading from a worker pauses while this many answer bytes wait for the client, and resumes below LOW.
HIGH_WATER = 1024 * 1024
LOW_WATER = 256 * 1024
# Idle connections kept per worker; more are closed when released.
MAX_IDLE_PER_HOST = 256
# Closed and expired idle connections are swept out once per this many released answers.
SWEEP_EVERY = 1024
# A worker's status line and headers: at most this many bytes (the bound the gateway's and the workers'
# own request headers have) and this many headers; more breaks the answer off (502) before it is relayed,
# so a worker (running its pool owner's code) cannot make the gateway keep or pass on unbounded headers.
MAX_UPSTREAM_HEADER_BYTES = MAX_HEADER_BYTES
MAX_UPSTREAM_HEADERS = 128


class Unreachable(Exception):  # noqa: N818 - names what happened
    """The worker could not be reached, or closed the connection before answering: nothing was
    answered, so the request may go to another worker."""


class UpstreamTimeout(Exception):  # noqa: N818
    """The worker accepted the request but stayed silent longer than the read timeout."""


class UpstreamBroken(Exception):  # noqa: N818
    """The worker's answer broke off in the middle (the connection closed, or it was not HTTP)."""


class Abandoned(Exception):  # noqa: N818
    """The caller gave up before the worker answered (its own client left): the connection was closed,
    so a worker that still queues the request drops it before computing it."""


def _headers_too_large() -> UpstreamBroken:
    return UpstreamBroken(
        f"the worker's answer headers exceed {MAX_UPSTREAM_HEADERS} headers or {MAX_UPSTREAM_HEADER_BYTES} "
        "bytes"
    )


class _Connection(asyncio.Protocol):
    """One TCP connection to a worker and the parser of the answer currently on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status: int | None = None
        self.headers: Headers = []
        self.header_bytes = 0  # received while the headers are incomplete
        self.parsed_header_bytes = 0
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.received_any = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.abandoned = False

    def begin(self) -> None:
        """A new request goes out on this connection."""
        self._reset()

    # ---- asyncio.Protocol ----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not derive from asyncio.Transport, so no isinstance check).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        if self.status is None:
            self.header_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = self.error or UpstreamBroken(f"the worker's answer is not valid HTTP: {exc}")
            self.close()
        # Still no end of the headers past the bound: a header block that never ends is cut off here.
        if self.status is None and self.header_bytes > MAX_UPSTREAM_HEADER_BYTES and self.error is None:
            self.error = _headers_too_large()
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.status is not None and not self.complete and self._read_until_close():
            self.complete = True  # an answer without length ends with the connection
        elif not self.complete and self.error is None:
            self.error = UpstreamBroken("the worker closed the connection")
        self._wake()

    # ---- httptools callbacks ----

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))
        self.parsed_header_bytes += len(name) + len(value) + 4
        if len(self.headers) > MAX_UPSTREAM_HEADERS or self.parsed_header_bytes > MAX_UPSTREAM_HEADER_BYTES:
            self.error = _headers_too_large()
            raise self.error  # httptools stops parsing; ``data_received`` closes the connection

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(bytes(body))
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        if not self.parser.should_keep_alive():
            self.close()

    # ---- helpers ----

    def _read_until_close(self) -> bool:
        names = {name for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, limit_s: float) -> None:
        """Until the parser made progress (or the connection ended), at most ``limit_s`` seconds."""
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = loop.call_later(limit_s, self._expire, self.waiter)
        try:
            await self.waiter
        finally:
            timer.cancel()
            self.waiter = None

    @staticmethod
    def _expire(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_exception(UpstreamTimeout("the worker did not answer in time"))

    def abandon(self, _: object = None) -> None:
        """Stop waiting for this answer: close the connection and wake the waiting request."""
        self.abandoned = True
        self.close()
        self._wake()

    def take(self) -> bytes | None:
        """The next buffered chunk (None: nothing buffered), resuming reading below the low mark."""
        if not self.chunks:
            return None
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered < LOW_WATER and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class Response:
    """A worker's answer: status and headers at once, the body as it arrives (``read_chunk``)."""

    def __init__(self, client: Client, host: tuple[str, int], conn: _Connection, read_timeout: float) -> None:
        self._client, self._host, self._conn, self._timeout = client, host, conn, read_timeout
        assert conn.status is not None
        self.status: int = conn.status
        self.headers: Headers = conn.headers
        self.done = False

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    @property
    def content_length(self) -> int | None:
        value = self.header(b"content-length")
        return int(value) if value is not None and value.isdigit() else None

    async def read_chunk(self) -> tuple[bytes, bool]:
        """The next piece of the body and whether it is the last (b"" when the body is empty)."""
        conn = self._conn
        while True:
            chunk = conn.take()
            if chunk is not None:
                last = conn.complete and not conn.chunks
                if last:
                    self.release()
                return chunk, last
            if conn.complete:
                self.release()
                return b"", True
            if conn.error is not None:
                self.close()
                raise conn.error
            await conn.wait(self._timeout)

    async def read(self, limit: int) -> bytes:
        """The whole body (at most ``limit`` bytes; more breaks the connection off)."""
        parts: list[bytes] = []
        size, last = 0, False
        while not last:
            chunk, last = await self.read_chunk()
            size += len(chunk)
            if size > limit:
                self.close()
                raise UpstreamBroken(f"the worker's answer is longer than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: a connection whose answer arrived completely may carry the next
        request (unread body bytes are dropped); any other is closed."""
        if self.done:
            return
        self.done = True
        if self._conn.complete:
            self._conn.chunks.clear()
            self._client._release(self._host, self._conn)
        else:
            self._conn.close()

    def close(self) -> None:
        """Drop the connection (the answer is abandoned: the worker sees its client leave)."""
        if not self.done:
            self.done = True
            self._conn.close()


class Client:
    """Keep-alive connections to every worker, and one request at a time on each."""

    def __init__(self, connect_timeout: float, read_timeout: float, keepalive_s: float) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._releases = 0

    async def request(
        self,
        host: str,
        port: int,
        head: bytes,
        body: bytes,
        *,
        on_sent: Callable[[], None] | None = None,
        abandon: asyncio.Future[Any] | None = None,
    ) -> Response:
        """Send one request (``head``: request line and headers, without host and length, see
        ``request_head``); return when the answer's status and headers arrived.  ``on_sent`` is called once
        the request is written; ``abandon`` done before the answer came raises ``Abandoned``."""
        key = (host, port)
        conn, reused = await self._checkout(key)
        try:
            return await self._exchange(key, conn, (head, body), on_sent, abandon)
        except Unreachable:
            if not reused:
                raise
        # A kept-alive connection the worker had closed: send once more on a fresh one.
        conn = await self._connect(key)
        return await self._exchange(key, conn, (head, body), on_sent, abandon)

    async def _exchange(
        self,
        key: tuple[str, int],
        conn: _Connection,
        out: tuple[bytes, bytes],
        on_sent: Callable[[], None] | None,
        abandon: asyncio.Future[Any] | None,
    ) -> Response:
        head, body = out
        conn.begin()
        assert conn.transport is not None
        host = f"[{key[0]}]" if ":" in key[0] else key[0]  # an IPv6 address
        tail = b"host: %s:%d\r\ncontent-length: %d\r\n\r\n" % (host.encode(), key[1], len(body))
        conn.transport.writelines((head, tail, body))
        if on_sent is not None:
            on_sent()
        if abandon is not None:
            abandon.add_done_callback(conn.abandon)
        try:
            while conn.status is None:
                if conn.abandoned:
                    raise Abandoned("the client left before the worker answered")
                if conn.error is not None or conn.lost:
                    conn.close()
                    if not conn.received_any:
                        raise Unreachable(f"{key[0]}:{key[1]} closed the connection before answering")
                    raise conn.error or UpstreamBroken("the worker closed the connection")
                await conn.wait(self.read_timeout)
        finally:
            if abandon is not None:
                abandon.remove_done_callback(conn.abandon)
            if conn.status is None:  # timed out, abandoned or cancelled mid-request: never reuse it
                conn.close()
        return Response(self, key, conn, self.read_timeout)

    async def _checkout(self, key: tuple[str, int]) -> tuple[_Connection, bool]:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.lost and now - conn.idle_since < self.keepalive_s:
                return conn, True
            conn.close()
        return await self._connect(key), False

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, key[0], key[1]), self.connect_timeout
            )
        except TimeoutError:
            raise Unreachable(f"{key[0]}:{key[1]}: connect timed out") from None
        except OSError as exc:
            raise Unreachable(f"{key[0]}:{key[1]}: {exc.strerror or exc}") from None
        return conn

    def _release(self, key: tuple[str, int], conn: _Connection) -> None:
        self._releases += 1
        if self._releases % SWEEP_EVERY == 0:
            self._sweep()
        if conn.lost or conn.transport is None or conn.transport.is_closing():
            return
        idle = self._idle.setdefault(key, [])
        if len(idle) >= MAX_IDLE_PER_HOST:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _sweep(self) -> None:
        """Forget closed and expired idle connections, and workers that have none left (workers come and
        go; their addresses must not pile up)."""
        now = time.monotonic()
        for key, idle in list(self._idle.items()):
            keep = [c for c in idle if not c.lost and now - c.idle_since < self.keepalive_s]
            for conn in idle:
                if conn not in keep:
                    conn.close()
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


def request_head(method: str, path: str, headers: Headers) -> bytes:
    """The request line and the client's headers (the client adds host and content-length)."""
    parts = [method.encode(), b" ", path.encode("latin-1"), b" HTTP/1.1\r\n"]
    for name, value in headers:
        parts += [name, b": ", value, b"\r\n"]
    return b"".join(parts)
