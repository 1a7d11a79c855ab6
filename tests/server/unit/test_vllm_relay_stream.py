"""The relay of a vLLM stream (``vllm_relay.RelayedStream``) against an upstream served here: a real
loopback HTTP server that answers as vLLM's does (server-sent events, one HTTP chunk each), whose writes the
test controls, driven through ASGI as uvicorn drives it.

The case that matters: vLLM is ahead of the relay (a burst of events already on the connection when the
client leaves, as when the HTTP process is starved beside a busy vLLM), and the client leaves after its
first chunk.  Not one more chunk may be relayed, and the upstream connection must close at once (that is
what makes vLLM abort), not once the relay has worked through what it had read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from starlette.types import Message

from model_server.frontend.vllm_relay import Hold, RelayedStream
from model_server.worker_view import Door

# One event as vLLM sends a completion's token (about its size).
EVENT = b'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" token"}]}\n\n'
# Events on the connection before the relay reads: one read of the relay's (64 KiB) holds them all.
BURST = 250
# The generation's length: the upstream writes the rest one by one after the burst, unless closed first.
TOTAL = 4000
WAIT_S = 10.0


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class Upstream:
    """A vLLM stand-in: each connection gets the headers and ``burst`` events in one write, then one event
    per loop turn (``after`` of them, then ``[DONE]`` unless not ``finish``), until the peer closes.
    ``closed`` is set when it sees its connection closed, with ``written`` events then."""

    burst: int = BURST
    after: int = TOTAL - BURST
    finish: bool = True  # False: no end after them (vLLM still generating)
    written: int = 0
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False  # wrote its whole answer
    # The chunks relayed to the client, and those relayed after it left (dropped, as uvicorn drops them).
    bodies: list[bytes] = field(default_factory=list)
    late: list[bytes] = field(default_factory=list)
    on_close: list[tuple[int, int]] = field(default_factory=list)  # (bodies, late) when it saw the close

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        writer.write(head + _chunk(EVENT) * self.burst)
        self.written = self.burst
        watch = asyncio.ensure_future(reader.read())  # b"" (or an error) once the relay closes
        try:
            await self._generate(writer, watch)
        finally:
            watch.cancel()
            writer.close()

    async def _generate(self, writer: asyncio.StreamWriter, watch: asyncio.Future[bytes]) -> None:
        for _ in range(self.after):
            if watch.done():
                break
            writer.write(_chunk(EVENT))
            self.written += 1
            await asyncio.sleep(0)
        else:
            if self.finish:
                writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                self.ended = True
                return  # the relay keeps the connection for its next request
        await asyncio.wait({watch}, timeout=WAIT_S)
        self.on_close.append((len(self.bodies), len(self.late)))
        self.closed.set()


@dataclass
class Client:
    """The ASGI side of a client: what it received, and its leaving (after ``leave_after`` chunks)."""

    upstream: Upstream
    leave_after: int | None = None
    left: asyncio.Event = field(default_factory=asyncio.Event)

    async def receive(self) -> Message:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        """As uvicorn's: no wait, and nothing written once the client has left."""
        if message["type"] != "http.response.body" or not message.get("body"):
            return
        if self.left.is_set():
            self.upstream.late.append(message["body"])
            return
        self.upstream.bodies.append(message["body"])
        if self.leave_after is not None and len(self.upstream.bodies) >= self.leave_after:
            self.left.set()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, httpx.AsyncClient]]:
    fake = Upstream()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT_S) as client:
        yield fake, client
    server.close()


async def _relay(client: httpx.AsyncClient, door: Door, deadline_s: float = WAIT_S) -> RelayedStream:
    assert door.take()
    call = client.build_request("POST", "/v1/completions", content=b"{}")
    response = await client.send(call, stream=True)
    return RelayedStream(response, Hold(door), time.monotonic() + deadline_s)


async def test_a_client_leaving_closes_vllms_connection_at_once_with_no_chunk_after(
    upstream: tuple[Upstream, httpx.AsyncClient],
) -> None:
    fake, client = upstream
    door = Door(1)
    stream = await _relay(client, door)
    asgi = Client(fake, leave_after=1)
    await stream({"type": "http", "asgi": {"spec_version": "2.3"}}, asgi.receive, asgi.send)
    await asyncio.wait_for(fake.closed.wait(), WAIT_S)
    # Nothing relayed after the first chunk, though 249 more had been read already; the connection closed
    # before anything else was, and long before the generation's end.
    assert (len(fake.bodies), len(fake.late)) == (1, 0)
    assert fake.on_close == [(1, 0)], fake.on_close
    assert not fake.ended and fake.written < BURST + 100, fake.written
    assert door.taken == 0


async def test_the_whole_stream_is_relayed_and_its_slot_given_back(
    upstream: tuple[Upstream, httpx.AsyncClient],
) -> None:
    fake, client = upstream
    fake.after = 50
    door = Door(1)
    stream = await _relay(client, door)
    asgi = Client(fake)
    await stream({"type": "http", "asgi": {"spec_version": "2.4"}}, asgi.receive, asgi.send)
    text = b"".join(fake.bodies)
    assert text.count(EVENT) == BURST + 50 and text.endswith(b"data: [DONE]\n\n")
    assert fake.ended and door.taken == 0


async def test_the_deadline_ends_the_stream_with_an_error_event_and_closes_vllms_connection(
    upstream: tuple[Upstream, httpx.AsyncClient],
) -> None:
    fake, client = upstream
    fake.burst, fake.after, fake.finish = 1, 0, False  # one event, then nothing: vLLM still generating
    door = Door(1)
    stream = await _relay(client, door, deadline_s=0.2)
    asgi = Client(fake)
    await stream({"type": "http", "asgi": {"spec_version": "2.3"}}, asgi.receive, asgi.send)
    assert fake.bodies[0] == EVENT and b"request deadline passed" in fake.bodies[-1], fake.bodies
    await asyncio.wait_for(fake.closed.wait(), WAIT_S)
    assert door.taken == 0
