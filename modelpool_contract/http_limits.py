"""The HTTP parser the model server and the gateway run uvicorn with: httptools, with a bound on the
request line and header block.

uvicorn's httptools protocol accumulates a request's URL and headers without limit (its h11 protocol has
one, but is slower): a client that sends an endless header line grows the process's memory for as long
as it keeps sending.  ``BoundedHeadersProtocol`` counts the bytes that arrive while a request's headers
are incomplete and answers **431** (``Connection: close``) once they pass ``MAX_HEADER_BYTES``.  Only the
server and the gateway import this module (it needs uvicorn; the operator does not).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The request line plus every header, in bytes: far above what any client of these APIs sends (an API
# key, a W3C trace context, a few custom headers), the same order as nginx's 4 x 8 KiB buffers.
MAX_HEADER_BYTES = 64 * 1024
_MESSAGE = b"request header fields too large: over %d bytes" % MAX_HEADER_BYTES


class HeadersTooLargeError(Exception):
    """Raised from a parser callback: httptools turns it into a parser error, uvicorn into an answer."""


class BoundedHeadersProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, answering 431 to a request line and header block over
    ``MAX_HEADER_BYTES`` (counted per request, so a long keep-alive connection is not penalised).

    Two counts: the bytes that arrive while a request's headers are incomplete (a block that never
    ends is cut off after one read past the bound), and the parsed URL and headers once complete (a
    whole block that arrived in one read)."""

    _header_bytes = 0
    _parsed_bytes = 0
    _awaiting_headers = True
    _too_large = False

    def data_received(self, data: bytes) -> None:
        if self._awaiting_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        # Checked after parsing: a chunk that completes the headers (with some body after them) is fine.
        if (
            self._awaiting_headers
            and self._header_bytes > MAX_HEADER_BYTES
            and not self.transport.is_closing()
        ):
            self._refuse()

    def on_message_begin(self) -> None:
        self._parsed_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._parsed_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_bytes += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.end_of_headers()
        super().on_headers_complete()

    def end_of_headers(self) -> None:
        """The bookkeeping of headers-complete; raises when the parsed block is over the bound.  A
        subclass that answers a request at headers-complete itself (the server's early 429) calls it
        first, so the bound holds on that path too."""
        self._awaiting_headers = False
        self._header_bytes = 0
        if self._parsed_bytes > MAX_HEADER_BYTES:
            self._too_large = True
            raise HeadersTooLargeError

    def on_message_complete(self) -> None:
        self._awaiting_headers = True
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers a parser error (our HeadersTooLargeError among them) 400: ours is a 431.
        if self._too_large:
            self._refuse()
        else:
            super().send_400_response(msg)

    def _refuse(self) -> None:
        busy = self.cycle is not None and not self.cycle.response_complete
        if not busy:  # an answer in progress on this connection cannot be interleaved: just close
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_MESSAGE), _MESSAGE)
            )
        self.transport.close()
