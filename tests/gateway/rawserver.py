"""A socket server of the test's own, for worker behaviour a healthy ``modelpool-server`` does not show on
demand (a 429 with a given Retry-After, a 503, a closed connection, garbage): real HTTP over loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class raw_server:  # noqa: N801 - used like a function: `async with raw_server(handler) as port`
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self.handler, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request: head and Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")), 0
    )
    return head + await reader.readexactly(length)


def answering(status: int, body: bytes = b"{}", **headers: str) -> Handler:
    """A handler that answers every request on a connection with ``status``, ``headers`` and ``body``."""
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{extra}"
                    f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle
