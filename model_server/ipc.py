"""Messages between an HTTP process and the inference process: framing, and the asyncio channel.

The supervisor makes one connected stream socket pair per HTTP process.  A message is a tuple, sent as
one frame: a pickle (protocol 5) whose large buffers (numpy arrays: embeddings, tensors) travel out of
band, written after it as they are, never copied into the pickle stream nor converted element by
element; the receiver rebuilds the arrays over its copy of those bytes.  Measured on the 2-core
machine, a round trip of a 1-item request and its answer costs about 0.1 ms of CPU per side, and a
64 MiB array crosses at about 1.5 GB/s (docs/server.md).

Frame: ``<I pickle length><I buffer count>``, one ``<Q length>`` per buffer, the pickle, the buffers.

Messages, one ``NamedTuple`` class each, defined here once for both sides (a named tuple pickles as its
class's name and its fields, about as cheaply as a bare tuple; the receiver tells them apart by class):

* HTTP -> inference (``ToEngine``): ``Submit``, ``Cancel``;
* inference -> HTTP (``ToFrontend``): ``Result``, ``Failure``, ``Piece``.

Items and results travel ``pack``ed: texts as strings, an answer's embeddings as one stacked array.

``deadline`` is a ``time.monotonic()`` instant, which every process of the machine shares.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import numpy as np

from model_server.errors import ServerError
from model_server.tasks.base import Embedding, TextItem

log = logging.getLogger("modelpool.ipc")


class Submit(NamedTuple):
    """HTTP -> inference: an admitted request (it holds a slot of the door until it leaves the queue)."""

    id: int  # the sending HTTP process's request id, unique on its channel
    deadline: float  # a time.monotonic() instant
    items: Any  # pack()ed
    lengths: list[int]  # the task's length hint per item ([] when the task does not batch)
    streaming: bool  # send the text as it comes (Piece messages) before the Result
    # The request's id and trace id (``modelpool_contract.logs``), for the inference process's lines about it.
    ids: tuple[str | None, str | None] = (None, None)
    # The HTTP process's server span as a W3C traceparent (tracing on, the request sampled), the parent of
    # the inference process's spans; None: untraced.
    trace: str | None = None


class Cancel(NamedTuple):
    """HTTP -> inference: the HTTP side gave up on a request (a deadline, a disconnect): drop it before
    compute, or stop generating for it."""

    id: int
    reason: str


class Result(NamedTuple):
    """Inference -> HTTP: a request's results, one per item, pack()ed."""

    id: int
    results: Any


class Failure(NamedTuple):
    """Inference -> HTTP: a request failed; the error is raised to the route, which maps it to HTTP."""

    id: int
    error: ServerError


class Piece(NamedTuple):
    """Inference -> HTTP: the next text of a streamed request (from the inference thread)."""

    id: int
    text: str


ToEngine = Submit | Cancel
ToFrontend = Result | Failure | Piece

_AS_IS, _TEXTS, _EMBEDDINGS = 0, 1, 2
_HEAD = struct.Struct("<II")
_LENGTH = struct.Struct("<Q")
# Messages handed on per event-loop iteration (see ``Channel._deliver``).
DELIVER_SLICE = 8


def pack(values: list[Any]) -> Any:
    """Items or results in their most compact form for the wire: texts as plain strings, embeddings as
    one stacked array (one out-of-band buffer for a whole answer, instead of a pickled object and an
    array per item); anything else as it is.  ``unpack`` rebuilds the list."""
    if values and all(type(v) is TextItem for v in values):
        return (_TEXTS, [v.text for v in values])
    if values and all(type(v) is Embedding for v in values):
        vectors = [v.vector for v in values]
        if len({(a.shape, a.dtype) for a in vectors}) == 1:
            return (_EMBEDDINGS, np.stack(vectors), [v.tokens for v in values], [v.truncated for v in values])
    return (_AS_IS, values)


def unpack(packed: Any) -> list[Any]:
    """The list ``pack`` packed (embedding vectors are rows of one array: views, not copies)."""
    kind = packed[0]
    if kind == _TEXTS:
        return [TextItem(text) for text in packed[1]]
    if kind == _EMBEDDINGS:
        _, array, tokens, truncated = packed
        return [Embedding(array[k], tokens[k], truncated[k]) for k in range(len(tokens))]
    return list(packed[1])


def encode(message: Any) -> list[bytes | memoryview]:
    """One message as the pieces of its frame (written as they are, in order)."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(message, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    head = _HEAD.pack(len(payload), len(raws))
    if raws:
        head += b"".join(_LENGTH.pack(raw.nbytes) for raw in raws)
    return [head, payload, *raws]


def decode(data: bytes | bytearray | memoryview) -> tuple[list[Any], int]:
    """The complete frames at the start of ``data``, and how many bytes they took."""
    messages: list[Any] = []
    pos = 0
    end = len(data)
    with memoryview(data) as view:
        while end - pos >= _HEAD.size:
            size, count = _HEAD.unpack_from(view, pos)
            body = pos + _HEAD.size + count * _LENGTH.size
            if body > end:
                break
            lengths = [
                _LENGTH.unpack_from(view, pos + _HEAD.size + k * _LENGTH.size)[0] for k in range(count)
            ]
            stop = body + size + sum(lengths)
            if stop > end:
                break
            buffers = []
            offset = body + size
            for length in lengths:
                # A copy: the arrays outlive the receive buffer, which is reused.
                buffers.append(bytearray(view[offset : offset + length]))
                offset += length
            messages.append(pickle.loads(view[body : body + size], buffers=buffers))
            pos = stop
    return messages, pos


class Channel(asyncio.Protocol):
    """One end of a connection between two processes of a worker.

    ``send`` queues a message; everything sent during one event-loop iteration goes out in one write.
    Received messages go to ``on_message`` at most ``DELIVER_SLICE`` per iteration, so that the event
    loop polls its sockets between slices (a finished batch of 128 answers would otherwise be handed on
    in one go, with new requests, and their 429s, waiting behind all of it).  ``on_lost`` is called once
    when the other end is gone."""

    def __init__(self, on_message: Callable[[Any], None], on_lost: Callable[[], None]) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._received = bytearray()
        self._inbox: deque[Any] = deque()
        self._delivering = False
        self._outbox: list[bytes | memoryview] = []
        self._closed = False

    # ---- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        if self._received:
            self._received += data
            messages, used = decode(self._received)
            del self._received[:used]
        else:
            messages, used = decode(data)
            if used < len(data):
                self._received += data[used:]
        self._inbox.extend(messages)
        if not self._delivering:
            self._deliver()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None
        if exc is not None:
            log.warning("channel lost: %s", exc)
        # What had arrived is still handed on, then the loss.
        if self._delivering:
            self._inbox.append(_LOST)
        else:
            self._on_lost()

    # ---- sending ------------------------------------------------------------------------------------

    @property
    def open(self) -> bool:
        return not self._closed

    def send(self, message: Any) -> bool:
        """Queue ``message`` for the next write; False when the other end is gone."""
        if self._closed or self._loop is None:
            return False
        if not self._outbox:
            self._loop.call_soon(self._flush)
        self._outbox.extend(encode(message))
        return True

    def send_threadsafe(self, message: Any) -> None:
        """``send`` from another thread (the inference thread's streamed pieces)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.send, message)

    def _flush(self) -> None:
        pieces, self._outbox = self._outbox, []
        if self._transport is not None and pieces:
            self._transport.writelines(pieces)

    async def drained(self, timeout: float) -> None:  # noqa: ASYNC109 - a bounded wait before exit
        """Wait (bounded) until everything sent has been written to the socket."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while loop.time() < until and self._transport is not None:
            if not self._outbox and not self._transport.get_write_buffer_size():
                return
            await asyncio.sleep(0.005)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # ---- receiving ----------------------------------------------------------------------------------

    def _deliver(self) -> None:
        self._delivering = False
        for _ in range(DELIVER_SLICE):
            if not self._inbox:
                return
            message = self._inbox.popleft()
            if message is _LOST:
                self._on_lost()
                return
            try:
                self._on_message(message)
            except Exception:  # one bad message must not stop the channel
                log.exception("handling a message failed")
        if self._inbox and self._loop is not None:
            self._delivering = True
            self._loop.call_soon(self._deliver)


_LOST = object()


async def connect(sock: Any, channel: Channel) -> Channel:
    """Run ``channel`` over an already connected socket (one end of the supervisor's socket pair)."""
    loop = asyncio.get_running_loop()
    await loop.create_connection(lambda: channel, sock=sock)
    return channel


__all__ = [
    "DELIVER_SLICE",
    "Cancel",
    "Channel",
    "Failure",
    "Piece",
    "Result",
    "Submit",
    "ToEngine",
    "ToFrontend",
    "connect",
    "decode",
    "encode",
    "pack",
    "unpack",
]
