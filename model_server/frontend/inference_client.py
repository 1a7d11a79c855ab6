"""An HTTP process's side of the process boundary: admission at the door, and the requests it has sent.

The routes reach the model only through here.  ``admit`` decides at once, from shared memory, without
asking the inference process: 503 unless the worker serves, 400 for no items, 413 for too many, 429
(with Retry-After) when no slot of the worker's one queue capacity is left.  ``infer`` and ``stream``
send an admitted request to the inference process and wait for its answer, bounded by the request's
deadline (504) or until the client is gone; either way the inference process is told to drop it before
compute.  The task's class and an unloaded instance of it serve metadata and the v2 codec here; the
model itself lives only in the inference process.

With tracing on, the admission and the wait are spans (``modelpool.admission``, ``modelpool.wait``: the
queue and the compute as this process sees them), children of the request's server span, which goes to
the inference process in ``ipc.Submit.trace`` as the parent of its own spans.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from model_server import ipc
from model_server.config import ServerConfig
from model_server.errors import (
    DeadlineExceeded,
    InferenceError,
    InvalidInput,
    ModelNotReady,
    Overloaded,
    PayloadTooLarge,
    ServerError,
)
from model_server.frontend.token_stream import TokenStream
from model_server.metrics import Metrics
from model_server.state_machine import StateMachine
from model_server.tasks import task_class
from model_server.tasks.base import Task
from model_server.worker_view import Column, Field, WorkerView
from modelpool_contract import logs, tracing

log = logging.getLogger("modelpool.inference_client")


class ClientGone(ServerError):  # noqa: N818 - named like errors.py's classes
    """The client disconnected; nothing is sent back (499 in the metrics, as nginx logs it)."""

    status = 499
    reason = "disconnected"


def retry_after_seconds(queued_items: float, seconds_per_item: float, jitter: float = 0.0) -> int:
    """Pure: the Retry-After answer in whole seconds (at least 1).

    The base is the time the queue needs to drain (queued items x recent service time, at least 1 s).
    ``jitter`` (0 <= jitter < 1, random per answer) stretches it by up to 2x: clients refused in the same
    burst then come back spread over time instead of as one synchronised herd that overflows the queue
    again."""
    base = max(1.0, queued_items * seconds_per_item)
    return max(math.ceil(base), round(base * (1.0 + jitter)))


@dataclass(eq=False)
class Sent:
    """A request this process admitted and sent: the future its handler awaits, its deadline."""

    id: int
    deadline: float
    future: asyncio.Future[list[Any]]
    stream: TokenStream | None = None


@dataclass
class Slot:
    """A slot of the door held by ``InferenceClient.admit``, until it is handed to the inference process."""

    handed_over: bool = False

    def hand_over(self) -> None:
        self.handed_over = True


class InferenceClient:
    """Admission and the requests in flight, in one HTTP process."""

    def __init__(
        self,
        config: ServerConfig,
        view: WorkerView,
        state_machine: StateMachine,
        metrics: Metrics,
        row: int,
    ) -> None:
        self.config = config
        self.view = view
        self.state_machine = state_machine
        self.metrics = metrics
        self.row = row
        self._channel: ipc.Channel | None = None
        self._sent: dict[int, Sent] = {}
        self._ids = itertools.count(1)
        self._task_cls: type[Task[Any, Any]] | None = None
        self._task: Task[Any, Any] | None = None

    # ---- the channel to the inference process -------------------------------------------------------

    def channel(self) -> ipc.Channel:
        """A channel whose messages come here (``ipc.connect`` runs it over the socket)."""
        self._channel = ipc.Channel(self.on_message, self.on_lost)
        return self._channel

    def on_message(self, message: ipc.ToFrontend) -> None:
        sent = self._sent.get(message.id)
        if sent is None:  # given up on already (504, disconnected)
            return
        if type(message) is ipc.Piece:
            if sent.stream is not None:
                sent.stream.put(message.text)
            return
        del self._sent[message.id]
        if sent.future.done():
            return
        if type(message) is ipc.Result:
            sent.future.set_result(ipc.unpack(message.results))
        else:
            assert type(message) is ipc.Failure
            sent.future.set_exception(message.error)
            sent.future.exception()  # retrieved by the waiter, unless it gave up: no warning

    def on_lost(self) -> None:
        """The inference process is gone: whatever waits is answered 503 (the supervisor ends the worker)."""
        log.log(
            logging.WARNING if self._sent else logging.INFO,
            "the inference process closed its channel; %d requests fail", len(self._sent),
        )  # fmt: skip
        sent, self._sent = self._sent, {}
        for request in sent.values():
            if not request.future.done():
                request.future.set_exception(ModelNotReady("the inference process is gone"))
                request.future.exception()

    # ---- the task -----------------------------------------------------------------------------------

    def import_task(self) -> None:
        """Import the task's class (a handler module too); called off the event loop at start."""
        if self._task_cls is None:
            self._task_cls = task_class(self.config.task, self.config.handler)

    @property
    def task_class(self) -> type[Task[Any, Any]] | None:
        """The task's class (metadata: tensors, batchable), once the inference process has imported it."""
        if not self.view.flag(Field.TASK_IMPORTED):
            return None
        try:
            self.import_task()
        except Exception as exc:  # a broken handler module: the inference process reports the failure
            log.debug("cannot import the task: %s", exc)
            return None
        return self._task_cls

    def loaded_task(self) -> Task[Any, Any]:
        """The task, for its KServe v2 codec and length hints; 503 until the model is loaded."""
        if self._task is None:
            cls = self.task_class
            if cls is None or not self.view.flag(Field.TASK_LOADED):
                raise ModelNotReady(f"model {self.config.served_name!r} is not loaded")
            self._task = cls()
        return self._task

    # ---- admission ----------------------------------------------------------------------------------

    def reject(self, reason: str) -> None:
        self.view.add(self.row, Column.REJECTED)
        self.metrics.rejected.labels(reason=reason).inc()

    def check_ready(self) -> None:
        """Raise 503 unless the worker serves (Loading, Evicting, Failed...)."""
        if not self.state_machine.serving:
            state = self.state_machine.state
            raise ModelNotReady(f"model {self.config.served_name} is not ready (state {state})")

    def _overloaded(self) -> Overloaded:
        view = self.view
        return Overloaded(
            f"queue full ({self.config.queue_capacity} requests waiting)",
            retry_after_seconds(
                view.get(Field.BACKLOG_ITEMS), view.get(Field.SECONDS_PER_ITEM), random.random()
            ),
        )

    def check_capacity(self) -> None:
        """Raise 429 (with the Retry-After estimate) when the queue is full."""
        if self.view.door.full:
            raise self._overloaded()

    @contextlib.contextmanager
    def _slot(self) -> Iterator[Slot]:
        """Take a slot of the door (429 when none is free) for the block, which either hands it over to
        the inference process or, whatever it raises, has it given back: a lost slot would shrink the
        worker's capacity for its life and keep it from Ready (a drain would wait for it in vain)."""
        door = self.view.door
        if not door.take():
            raise self._overloaded()
        slot = Slot()
        try:
            yield slot
        finally:
            if not slot.handed_over:
                door.give_back()

    def admit(self, items: Sequence[Any], timeout: float | None, stream: TokenStream | None = None) -> Sent:
        """Admit a request and send it, or raise at once (503, 400 empty, 413 too many items, 429 full)."""
        if not tracing.on():
            return self._admit(items, timeout, stream, None)
        parent = tracing.traceparent()  # the server span: the inference process's spans are its children
        with tracing.span("modelpool.admission", {"modelpool.items": len(items)}):
            return self._admit(items, timeout, stream, parent)

    def _admit(
        self, items: Sequence[Any], timeout: float | None, stream: TokenStream | None, trace: str | None
    ) -> Sent:
        self.check_ready()
        if not items:
            raise InvalidInput("the request holds no items")
        if len(items) > self.config.max_request_items:
            raise PayloadTooLarge(
                f"{len(items)} items in one request exceed the limit of {self.config.max_request_items}"
            )
        task = self.loaded_task()
        with self._slot() as slot:
            # With the slot taken: a drain that has begun counts this request, or this one sees it begin.
            if not self.state_machine.serving or self._channel is None or not self._channel.open:
                self.check_ready()
                raise ModelNotReady("the inference process is not reachable")
            budget = (
                self.config.request_timeout if timeout is None else min(timeout, self.config.request_timeout)
            )
            sent = Sent(
                next(self._ids), time.monotonic() + budget, asyncio.get_running_loop().create_future(), stream
            )
            self._send(task, sent, items, stream is not None, trace)
            slot.hand_over()  # the inference process gives it back when the request leaves its queue
        self._sent[sent.id] = sent
        self.view.add(self.row, Column.REQUESTS)
        self.view.put(self.row, Column.LAST_REQUEST, time.time())
        return sent

    def _send(
        self, task: Task[Any, Any], sent: Sent, items: Sequence[Any], streaming: bool, trace: str | None
    ) -> None:
        """Send an admitted request to the inference process; raises (500) when the task's length hint or
        the pickling of its items fails (the handler's code: a bug, answered, never a dropped connection)."""
        assert self._channel is not None
        try:
            lengths = [task.length_hint(item) for item in items] if task.batchable else []
            ids = (logs.current_request_id(), logs.current_trace_id())
            packed = ipc.pack(list(items))
            message = ipc.Submit(sent.id, sent.deadline, packed, lengths, streaming, ids, trace)
            delivered = self._channel.send(message)
        except ServerError:
            raise
        except Exception as exc:
            log.exception("cannot send a request to the inference process")
            self.view.add(self.row, Column.ERRORS)
            raise InferenceError(
                f"the request could not be sent to the model: {type(exc).__name__}: {exc}"
            ) from exc
        if not delivered:
            raise ModelNotReady("the inference process is not reachable")

    async def infer(
        self,
        items: Sequence[Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline handed to admission
        gone: asyncio.Event | None = None,
    ) -> list[Any]:
        """Admit, wait (bounded by the deadline, or until the client is gone) and return the results."""
        return await self.wait(self.admit(items, timeout), gone)

    def stream(self, items: Sequence[Any], timeout: float | None) -> TokenStream:
        """Admit a streaming request (or raise at once, as ``admit``): the inference process sends its
        text piece by piece into the returned stream while it computes."""
        stream = TokenStream()
        sent = self.admit(items, timeout, stream)
        stream.start(asyncio.ensure_future(self.wait(sent)), lambda: self._give_up(sent, "disconnected"))
        return stream

    async def wait(self, sent: Sent, gone: asyncio.Event | None = None) -> list[Any]:
        """Wait for a sent request's results (504 after its deadline, ClientGone on disconnect)."""
        if not tracing.on():
            return await self._wait(sent, gone)
        with tracing.span("modelpool.wait") as span:
            if sent.stream is not None:  # a streamed request's first piece and count go on this span
                sent.stream.traced = span
            return await self._wait(sent, gone)

    async def _wait(self, sent: Sent, gone: asyncio.Event | None) -> list[Any]:
        waiters: set[asyncio.Future[Any]] = {sent.future}
        gone_task = asyncio.ensure_future(gone.wait()) if gone is not None else None
        if gone_task is not None:
            waiters.add(gone_task)
        try:
            await asyncio.wait(
                waiters,
                timeout=max(0.0, sent.deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            if gone_task is not None:
                gone_task.cancel()
        if sent.future.done() and not sent.future.cancelled():
            return sent.future.result()
        if gone is not None and gone.is_set():
            self._give_up(sent, "disconnected")
            raise ClientGone("client disconnected before the result was ready")
        self._give_up(sent, "timeout")
        raise DeadlineExceeded("request deadline passed before the result was ready")

    def _give_up(self, sent: Sent, reason: str) -> None:
        """Tell the inference process to drop the request before compute (if it has not started it)."""
        if self._sent.pop(sent.id, None) is not None and self._channel is not None:
            self._channel.send(ipc.Cancel(sent.id, reason))
        if not sent.future.done():
            sent.future.cancel()

    @property
    def waiting(self) -> int:
        """Requests sent and not answered yet."""
        return len(self._sent)


__all__ = ["ClientGone", "InferenceClient", "Sent", "Slot", "retry_after_seconds"]
