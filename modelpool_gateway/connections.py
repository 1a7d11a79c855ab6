"""The gateway's client connections, bounded before any request reaches the app (and its key check).

uvicorn bounds neither how long a request's headers may take nor how many connections are open: a client
that opens connections and sends nothing, or trickles a header byte at a time, holds each one (and its
parser's buffer) for ever.  ``gateway_protocol`` gives uvicorn a protocol class (the httptools one with the
64 KiB header bound, ``modelpool_contract.http_limits``) that adds:

* **a header deadline**: a request's line and headers must arrive within ``header_timeout_s`` of its
  first byte, or of the connection's opening for its first request (an idle new connection is closed
  after it too); later, answered 408 with ``Connection: close`` (nothing is written to a connection that
  sent nothing).  Between requests uvicorn's keep-alive timeout (``--client-keepalive-seconds``) applies;
  the body has the app's own deadline (``--request-body-timeout-seconds``).
* **a connection cap**: a connection opened while ``max_connections`` are open is answered 503 with
  ``Retry-After: 1`` and ``Connection: close`` at once, without parsing a byte of it; what it sends is
  read and dropped for at most ``LINGER_S`` (so its client reads the 503 rather than a reset) and then it
  is closed.

A connection past the cap therefore costs a socket for at most ``LINGER_S``, and a connection within it
its header buffer (at most 64 KiB) for at most the header deadline.
"""

from __future__ import annotations

import asyncio

from modelpool_contract.http_limits import BoundedHeadersProtocol

# How long a refused connection is drained before it is closed.
LINGER_S = 1.0
_FULL = b"the gateway has too many connections open; retry"
_FULL_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nretry-after: 1\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_FULL), _FULL)
)
_SLOW = b"the request headers did not arrive in time"
_SLOW_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_SLOW), _SLOW)
)


def over_cap(open_connections: int, max_connections: int) -> bool:
    """Whether a connection that makes ``open_connections`` open (itself included) is refused."""
    return open_connections > max_connections


class GatewayProtocol(BoundedHeadersProtocol):
    """The bounded protocol (module docstring); ``gateway_protocol`` sets the two bounds."""

    header_timeout_s = 10.0
    max_connections = 4096

    _header_timer: asyncio.TimerHandle | None = None
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if over_cap(len(self.connections), self.max_connections):
            self._refused = True
            transport.write(_FULL_RESPONSE)
            if transport.can_write_eof():
                transport.write_eof()
            self.loop.call_later(LINGER_S, transport.close)
            return
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        if self._refused:  # drained, never parsed
            return
        if self._awaiting_headers and self._header_timer is None:
            self._arm_header_timer()  # the first byte of a next request on a kept-alive connection
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined request's headers are late while the one before is answered: that answer is
            # not cut; the deadline runs once more.
            self._arm_header_timer()
            return
        if self._header_bytes:  # a request began: say why it ends
            self.transport.write(_SLOW_RESPONSE)
        self.transport.close()


def gateway_protocol(header_timeout_s: float, max_connections: int) -> type[GatewayProtocol]:
    """The protocol class uvicorn runs the gateway with, with these bounds."""
    return type(
        "BoundedGatewayProtocol",
        (GatewayProtocol,),
        {"header_timeout_s": header_timeout_s, "max_connections": max_connections},
    )
