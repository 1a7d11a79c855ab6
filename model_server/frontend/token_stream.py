"""A streaming request's text, piece by piece, as an HTTP process receives it from the inference process.

The task calls its ``emit`` on the inference thread for each new piece of text; the inference process
sends each piece across the process boundary as it comes (``ipc.Piece``), and the HTTP process ``put``s
it here.  The route iterates the stream and sends each piece to the client at once; the iteration ends
when the request's answer has arrived, and ``results()`` then gives its results (or raises the error it
failed with).

An empty piece is no text: it says the model has taken the request (a generation engine admitted it, or
the serial path began generating).  The route waits for that, or the first piece, or the answer
(``accepted``) before it sends the response's headers, so a request refused by the model (400, 429)
is answered with that status instead of an error event inside a 200 stream.

With tracing on, the request's wait span (``inference_client``) is ``traced``: the first piece of text is
an event on it (``modelpool.first_piece``: the time to first token, in the trace) and the number of pieces
an attribute.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from opentelemetry.trace import Span


class TokenStream:
    """The pieces of one admitted streaming request (made by ``InferenceClient.stream``), then its
    results."""

    def __init__(self) -> None:
        self._pieces: asyncio.Queue[str] = asyncio.Queue()
        self._results: asyncio.Future[list[Any]] | None = None
        self._abandon: Callable[[], None] = lambda: None
        self._taken = asyncio.Event()
        self.traced: Span | None = None  # the wait span, with tracing on (module docstring)
        self._count = 0

    def put(self, text: str) -> None:
        """A new piece of text (on the event loop); an empty one only says the model took the request."""
        self._taken.set()
        if text:
            self._pieces.put_nowait(text)
            self._count += 1
            if self.traced is not None:
                if self._count == 1:
                    self.traced.add_event("modelpool.first_piece")
                self.traced.set_attribute("modelpool.pieces", self._count)

    async def accepted(self, gone: asyncio.Event) -> None:
        """Wait until the model has taken the request (an empty piece or the first text), its answer has
        come (``refusal`` then says whether it failed), or the client is gone (``gone``)."""
        assert self._results is not None, "start() comes first"
        waiters: set[asyncio.Future[Any]] = {
            asyncio.ensure_future(self._taken.wait()),
            asyncio.ensure_future(gone.wait()),
        }
        try:
            await asyncio.wait({*waiters, self._results}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    def refusal(self) -> BaseException | None:
        """The error the request ended with before the model took it (None: it was taken, or succeeded)."""
        if self._taken.is_set() or self._results is None or not self._results.done():
            return None
        return None if self._results.cancelled() else self._results.exception()

    def start(self, results: asyncio.Future[list[Any]], abandon: Callable[[], None]) -> None:
        """The request is admitted: ``results`` completes with its results; ``abandon`` drops it."""
        self._results, self._abandon = results, abandon

    def __aiter__(self) -> AsyncIterator[str]:
        return self._pieces_until_done()

    async def _pieces_until_done(self) -> AsyncIterator[str]:
        assert self._results is not None, "start() comes first"
        while True:
            getter = asyncio.ensure_future(self._pieces.get())
            waiting: set[asyncio.Future[Any]] = {getter, self._results}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                break
            yield getter.result()
        while not self._pieces.empty():  # arrived just before the answer
            yield self._pieces.get_nowait()

    def results(self) -> list[Any]:
        """The request's results once the iteration has ended (raises the ``ServerError`` it failed
        with)."""
        assert self._results is not None and self._results.done()
        return self._results.result()

    def close(self) -> None:
        """The response is over (finished, or the client went away): drop the request if it is not."""
        if self._results is not None and not self._results.done():
            self._abandon()
            self._results.cancel()
