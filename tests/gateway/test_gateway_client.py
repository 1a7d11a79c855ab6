"""The gateway's upstream HTTP client against a real ``modelpool-server`` (echo handlers), and against a
small socket server of the test's own for what a healthy worker never does (close a kept-alive connection
as a request arrives, answer garbage, send a body faster than the client reads)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from modelpool_gateway.client import (
    HIGH_WATER,
    Abandoned,
    Client,
    Response,
    Unreachable,
    UpstreamBroken,
    UpstreamTimeout,
    request_head,
)
from testkit.echo_models import ECHO, GENERATION
from testkit.server import ServerProcess, start_server
from tests.gateway.rawserver import raw_server, read_request

pytestmark = pytest.mark.slow

INFER = json.dumps(
    {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hello"]}]}
).encode()
JSON = [(b"content-type", b"application/json")]


@pytest.fixture(scope="module")
def echo() -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", "/", "--task", "text-embedding", "--name", "echo",
        "--handler", ECHO, wait="ready",
        env={"HANDLER_RUN_SECONDS": "0"},
    )  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def emit_gate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A streamed generation of ``gen`` holds after its first piece until this file exists."""
    return tmp_path_factory.mktemp("gen") / "emit-gate"


@pytest.fixture(scope="module")
def gen(emit_gate: Path) -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", "/", "--task", "text-generation", "--name", "gen",
        "--handler", GENERATION, wait="ready",
        env={"HANDLER_EMIT_GATE": str(emit_gate)},
    )  # fmt: skip
    yield proc
    proc.stop()


def _client(read_timeout: float = 10, keepalive_s: float = 3) -> Client:
    return Client(connect_timeout=2, read_timeout=read_timeout, keepalive_s=keepalive_s)


async def _body(resp: Response) -> bytes:
    return await resp.read(10 * 2**20)


async def test_requests_reuse_one_kept_alive_connection(echo: ServerProcess) -> None:
    client = _client()
    head = request_head("POST", "/v2/models/echo/infer", JSON)
    seen = set()
    for _ in range(3):
        resp = await client.request("127.0.0.1", echo.port, head, INFER)
        assert resp.status == 200
        assert json.loads(await _body(resp))["outputs"][0]["data"] == [5.0, 1.0]
        [conn] = client._idle[("127.0.0.1", echo.port)]
        seen.add(id(conn))
    assert len(seen) == 1, "every request went over the same connection"
    client.close()


async def test_a_get_without_body_and_an_error_status(echo: ServerProcess) -> None:
    client = _client()
    resp = await client.request("127.0.0.1", echo.port, request_head("GET", "/v2/models/echo", []), b"")
    assert resp.status == 200 and json.loads(await _body(resp))["name"] == "echo"
    resp = await client.request("127.0.0.1", echo.port, request_head("GET", "/v2/models/nope", []), b"")
    assert resp.status == 404 and b"not served here" in await _body(resp)
    client.close()


async def test_a_streamed_answer_arrives_in_pieces(gen: ServerProcess, emit_gate: Path) -> None:
    client = _client()
    body = json.dumps(
        {"model": "gen", "messages": [{"role": "user", "content": "one two three four five"}], "stream": True}
    ).encode()
    resp = await client.request(
        "127.0.0.1", gen.port, request_head("POST", "/v1/chat/completions", JSON), body
    )
    assert resp.status == 200 and resp.content_length is None
    # The worker holds the generation after its first word (the chat template's, then the prompt's): the
    # client hands over the role piece and that word while the rest of the body does not exist yet (a client
    # that buffered to the end would wait here until its read timeout).
    before = b""
    while before.count(b"data: ") < 2:
        chunk, last = await resp.read_chunk()
        assert not last, "the body ended while the generation was held"
        before += chunk
    assert b"[DONE]" not in before and b"five" not in before
    await asyncio.to_thread(emit_gate.touch)
    after, last = b"", False
    while not last:
        chunk, last = await resp.read_chunk()
        after += chunk
    assert after.count(b"data: ") >= 4 and after.rstrip().endswith(b"data: [DONE]")
    assert [w for w in (b"one", b"two", b"three", b"four", b"five") if w not in before + after] == []
    client.close()


async def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(Unreachable):
            await _client().request("127.0.0.1", port, request_head("GET", "/", []), b"")


async def test_a_silent_worker_times_out() -> None:
    async with raw_server(_never_answer) as port:
        with pytest.raises(UpstreamTimeout):
            await _client(read_timeout=0.3).request("127.0.0.1", port, request_head("GET", "/", []), b"")


async def _never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    await asyncio.sleep(5)
    writer.close()


async def _one_answer_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers the first request with keep-alive, then closes the connection when the next one arrives:
    what a worker whose keep-alive timer fired at that moment does."""
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
    await writer.drain()
    await reader.read(1)
    writer.close()


async def test_a_kept_alive_connection_closed_by_the_worker_is_retried_on_a_fresh_one() -> None:
    client = _client(keepalive_s=60)
    async with raw_server(_one_answer_per_connection) as port:
        head = request_head("GET", "/", [])
        for _ in range(3):
            resp = await client.request("127.0.0.1", port, head, b"")
            assert (resp.status, await _body(resp)) == (200, b"ok")
    client.close()


async def _garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort")
    await writer.drain()
    writer.close()


async def _not_http(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(1)
    writer.close()


async def test_a_broken_answer_is_reported_not_returned_as_complete() -> None:
    async with raw_server(_garbage) as port:
        resp = await _client().request("127.0.0.1", port, request_head("GET", "/", []), b"")
        assert resp.status == 200
        with pytest.raises(UpstreamBroken):
            await _body(resp)
    async with raw_server(_not_http) as port:
        with pytest.raises(UpstreamBroken):
            await _client().request("127.0.0.1", port, request_head("GET", "/", []), b"")


BIG = 8 * HIGH_WATER


async def _big_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % BIG)
    for _ in range(BIG // 65536):
        writer.write(b"x" * 65536)
        await writer.drain()
    writer.close()


async def test_a_slow_reader_pauses_the_worker_instead_of_buffering_everything() -> None:
    async with raw_server(_big_answer) as port:
        resp = await _client().request("127.0.0.1", port, request_head("GET", "/", []), b"")
        conn = resp._conn
        most, total, last = 0, 0, False
        while not last:
            await asyncio.sleep(0.002)  # a slow client
            most = max(most, conn.buffered)
            chunk, last = await resp.read_chunk()
            total += len(chunk)
        assert total == BIG
        # Reading paused at the high-water mark: never more than that plus one socket read was held.
        assert most <= HIGH_WATER + 2**18, most


async def test_an_abandoned_request_closes_its_connection_so_the_worker_drops_it() -> None:
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[bool] = loop.create_future()
    gone: asyncio.Future[None] = loop.create_future()

    async def note_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        closed.set_result(await reader.read(1) == b"")  # EOF: the client closed the connection
        writer.close()

    async with raw_server(note_close) as port:
        loop.call_later(0.2, gone.set_result, None)
        with pytest.raises(Abandoned):
            await _client().request("127.0.0.1", port, request_head("GET", "/", []), b"", abandon=gone)
        assert await asyncio.wait_for(closed, 5) is True
