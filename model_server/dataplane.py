"""The data plane: bounded admission, deadlines, disconnect checks, dynamic batching, Retry-After.

The HTTP layer reaches the model only through here: ``infer`` (and ``stream`` for token streaming) to
run requests, ``task_class`` for metadata, ``loaded_task`` for the task's KServe v2 tensor codec.

One coroutine (``run``) owns the queue: it takes requests in arrival order, drops those whose deadline
passed or whose client went away *before* any compute, merges requests of batchable tasks into one unit
of up to ``--max-batch-size`` items (waiting at most ``--max-batch-delay-ms`` for more when the worker
would otherwise start a small batch), hands the unit to the worker's inference thread, and splits the
results back (the delay is only waited while traffic is concurrent, so a lone client never pays it).
Admission happens at the door: a request that finds ``--queue-capacity`` requests waiting
is refused at once with 429 and a Retry-After estimated from queue depth x recent service time, so memory
under overload is bounded by capacity x max request size.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from model_server.config import ServerConfig
from model_server.errors import (
    DeadlineExceeded,
    FatalDeviceError,
    InvalidInput,
    ModelNotReady,
    Overloaded,
    PayloadTooLarge,
    ServerError,
)
from model_server.metrics import Metrics
from model_server.state_machine import State, StateMachine
from model_server.tasks.base import Emitter, Task
from model_server.token_stream import TokenStream
from model_server.worker import Worker
from modelpool_contract.exits import EXIT_DEVICE_FAILED

log = logging.getLogger("modelpool.dataplane")


class ClientGone(ServerError):  # noqa: N818 - named like errors.py's classes
    """The client disconnected; nothing is sent back (499 in the metrics, as nginx logs it)."""

    status = 499
    reason = "disconnected"


@dataclass(eq=False)
class Unit:
    """One admitted request: its items, deadline (monotonic) and the future its handler awaits."""

    items: list[Any]
    deadline: float
    future: asyncio.Future[list[Any]]
    emit: Emitter | None = None
    abandoned: str | None = None  # why the waiter gave up ("timeout", "disconnected"): never compute it


# Requests answered per event-loop iteration when a batch completes (see ``DataPlane._execute``).
ANSWER_SLICE = 8


def retry_after_seconds(queued_items: int, seconds_per_item: float, jitter: float = 0.0) -> int:
    """Pure: the Retry-After answer in whole seconds (at least 1).

    The base is the time the queue needs to drain (queued items x recent service time, at least 1 s).
    ``jitter`` (0 <= jitter < 1, random per answer) stretches it by up to 2x: clients refused in the same
    burst then come back spread over time instead of as one synchronised herd that overflows the queue
    again."""
    base = max(1.0, queued_items * seconds_per_item)
    return max(math.ceil(base), round(base * (1.0 + jitter)))


class DataPlane:
    """Admission, queue and batching in front of one ``Worker``."""

    def __init__(
        self, config: ServerConfig, worker: Worker, state_machine: StateMachine, metrics: Metrics
    ) -> None:
        self.config = config
        self.worker = worker
        self.state_machine = state_machine
        self.metrics = metrics
        self._queue: deque[Unit] = deque()
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.in_flight = 0
        self.requests_total = 0
        self.rejected_total = 0
        self.errors_total = 0
        self.last_request_time: float | None = None  # unix time of the last admitted request
        self._last_activity = time.monotonic()
        self._seconds_per_item = 0.01  # EWMA of service time per item
        self._concurrent = False  # did the last batch gather more than one request?
        self.metrics.queue_capacity.set(config.queue_capacity)

    # ---- admission ----------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def task_class(self) -> type[Task[Any, Any]] | None:
        """The task's class (metadata: tensors, batchable), known once the load has imported it."""
        return self.worker.task_cls

    def loaded_task(self) -> Task[Any, Any]:
        """The loaded task, for its KServe v2 codec (``decode_v2``/``encode_v2`` run on the event loop);
        503 until the model is loaded."""
        task = self.worker.task
        if task is None:
            raise ModelNotReady(f"model {self.config.served_name!r} is not loaded")
        return task

    @property
    def batchable(self) -> bool:
        cls = self.worker.task_cls
        return bool(cls is not None and cls.batchable)

    def reject(self, reason: str) -> None:
        self.rejected_total += 1
        self.metrics.rejected.labels(reason=reason).inc()

    def check_ready(self) -> None:
        """Raise 503 unless the worker serves (Loading, Evicting, Failed...)."""
        if not self.state_machine.serving:
            state = self.state_machine.state
            raise ModelNotReady(f"model {self.config.served_name} is not ready (state {state})")

    def check_capacity(self) -> None:
        """Raise 429 (with the Retry-After estimate) when the queue is full."""
        if len(self._queue) >= self.config.queue_capacity:
            queued = sum(len(u.items) for u in self._queue) + self.in_flight
            raise Overloaded(
                f"queue full ({self.config.queue_capacity} requests waiting)",
                retry_after_seconds(queued, self._seconds_per_item, random.random()),
            )

    def admit(self, items: Sequence[Any], timeout: float | None, emit: Emitter | None = None) -> Unit:
        """Admit a request or raise at once (503 not ready, 400 empty, 413 too many items, 429 full)."""
        self.check_ready()
        if not items:
            raise InvalidInput("the request holds no items")
        if len(items) > self.config.max_request_items:
            raise PayloadTooLarge(
                f"{len(items)} items in one request exceed the limit of {self.config.max_request_items}"
            )
        self.check_capacity()
        budget = self.config.request_timeout if timeout is None else min(timeout, self.config.request_timeout)
        loop = asyncio.get_running_loop()
        unit = Unit(list(items), time.monotonic() + budget, loop.create_future(), emit)
        self._queue.append(unit)
        self.requests_total += 1
        self.last_request_time = time.time()
        self._last_activity = time.monotonic()
        self._idle.clear()
        self.metrics.queue_depth.set(len(self._queue))
        self._wakeup.set()
        return unit

    async def infer(
        self,
        items: Sequence[Any],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline handed to admission
        gone: asyncio.Event | None = None,
        emit: Emitter | None = None,
    ) -> list[Any]:
        """Admit, wait (bounded by the deadline, or until the client is gone) and return the results."""
        unit = self.admit(items, timeout, emit)
        return await self.wait(unit, gone)

    def stream(self, items: Sequence[Any], timeout: float | None) -> TokenStream:
        """Admit a streaming request (or raise at once, as ``admit``): the task emits its text into the
        returned stream while it computes."""
        stream = TokenStream(asyncio.get_running_loop())
        unit = self.admit(items, timeout, stream.emit)

        def abandon() -> None:
            unit.abandoned = "disconnected"

        stream.start(asyncio.ensure_future(self.wait(unit)), abandon)
        return stream

    async def wait(self, unit: Unit, gone: asyncio.Event | None = None) -> list[Any]:
        """Wait for an admitted unit's results (504 after its deadline, ClientGone on disconnect)."""
        waiters: set[asyncio.Future[Any]] = {unit.future}
        gone_task = asyncio.ensure_future(gone.wait()) if gone is not None else None
        if gone_task is not None:
            waiters.add(gone_task)
        try:
            await asyncio.wait(
                waiters,
                timeout=max(0.0, unit.deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            if gone_task is not None:
                gone_task.cancel()
        if unit.future.done() and not unit.future.cancelled():
            return unit.future.result()
        if gone is not None and gone.is_set():
            unit.abandoned = "disconnected"
            raise ClientGone("client disconnected before the result was ready")
        unit.abandoned = "timeout"
        raise DeadlineExceeded("request deadline passed before the result was ready")

    # ---- the queue owner ----------------------------------------------------------------------------

    def _pop_live(self) -> Unit | None:
        """Pop the next unit worth computing; drop (and count) expired or abandoned ones on the way."""
        now = time.monotonic()
        while self._queue:
            unit = self._queue.popleft()
            # Dropped before compute (the waiter has already answered 504/499 and counted the rejection).
            if unit.abandoned or unit.future.done():
                self.metrics.dropped.labels(reason=unit.abandoned or "cancelled").inc()
                unit.future.cancel()
                continue
            if unit.deadline <= now:
                self.metrics.dropped.labels(reason="timeout").inc()
                unit.future.cancel()
                continue
            return unit
        return None

    async def run(self) -> None:
        """Forever: form a batch, compute it on the inference thread, answer its requests."""
        while True:
            unit = self._pop_live()
            if unit is None:
                self.metrics.queue_depth.set(0)
                self._idle.set()
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = [unit]
            if self.batchable:
                await self._fill(batch, wait=self._concurrent)
                # Traffic is concurrent when batches gather several requests; only then is it worth
                # waiting --max-batch-delay-ms for more (a lone client would just pay the delay).
                self._concurrent = len(batch) > 1
            self.metrics.queue_depth.set(len(self._queue))
            await self._execute(batch)

    async def _fill(self, batch: list[Unit], wait: bool = True) -> None:
        """Add queued units to ``batch`` up to max-batch-size items, waiting (if ``wait``) at most
        max-batch-delay for more to arrive."""
        limit = self.config.max_batch_size
        n = sum(len(u.items) for u in batch)
        until = time.monotonic() + (self.config.max_batch_delay_ms / 1000.0 if wait else 0.0)
        while n < limit:
            if self._queue:
                head = self._queue[0]
                if head.abandoned or head.future.done() or head.deadline <= time.monotonic():
                    nxt = self._pop_live()
                    if nxt is None:
                        continue
                    self._queue.appendleft(nxt)
                    continue
                if n + len(head.items) > limit:
                    return
                batch.append(self._queue.popleft())
                n += len(head.items)
                continue
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)

    async def _execute(self, batch: list[Unit]) -> None:
        items = [item for unit in batch for item in unit.items]
        self.state_machine.try_to(State.PROCESSING)
        self.in_flight += len(batch)
        self.metrics.in_flight.set(self.in_flight)
        self.metrics.batch_size.observe(len(items))
        started = time.monotonic()
        try:
            results = await self._compute(items, batch)
        except FatalDeviceError as exc:
            self._fail_units(batch, exc)
            self.worker.fail(EXIT_DEVICE_FAILED, str(exc))
            return
        except InvalidInput as exc:
            if len(batch) > 1:  # one bad request must not fail its batch-mates: retry each alone
                for unit in batch:
                    self.in_flight -= 1
                    await self._execute([unit])
                    self.in_flight += 1
                return
            self._fail_units(batch, exc)
        except ServerError as exc:
            self._fail_units(batch, exc)
        else:
            elapsed = time.monotonic() - started
            self.metrics.compute.observe(elapsed)
            self._seconds_per_item = 0.8 * self._seconds_per_item + 0.2 * (elapsed / max(1, len(items)))
            offset = 0
            for k, unit in enumerate(batch):
                n = len(unit.items)
                if not unit.future.done():
                    unit.future.set_result(results[offset : offset + n])
                offset += n
                if (k + 1) % ANSWER_SLICE == 0 and k + 1 < len(batch):
                    # Let the event loop poll its sockets between slices: a finished batch of 128
                    # requests would otherwise be answered in one go, with new requests (and their
                    # 429s) waiting behind all of it.
                    await asyncio.sleep(0)
        finally:
            self.in_flight -= len(batch)
            self.metrics.in_flight.set(self.in_flight)
            self._last_activity = time.monotonic()
            if not self._queue and self.in_flight == 0:
                self.state_machine.try_to(State.READY)

    async def _compute(self, items: list[Any], batch: list[Unit]) -> list[Any]:
        limit = self.config.max_batch_size
        emit = batch[0].emit if len(batch) == 1 else None
        if not self.batchable or len(items) <= limit:
            return await self.worker.run(items, emit)
        # One request larger than a batch: run it in batch-sized chunks.
        results: list[Any] = []
        for start in range(0, len(items), limit):
            results.extend(await self.worker.run(items[start : start + limit], None))
        return results

    def _fail_units(self, batch: list[Unit], exc: ServerError) -> None:
        if not isinstance(exc, InvalidInput):
            self.errors_total += len(batch)
        for unit in batch:
            if not unit.future.done():
                unit.future.set_exception(exc)
                # Retrieved by the waiter, unless it gave up: mark it retrieved to avoid a warning.
                unit.future.exception()

    # ---- idle and drain -----------------------------------------------------------------------------

    async def watch_idle(self) -> None:
        """Ready -> Idle after ``--idle-after`` seconds with nothing to do."""
        period = min(1.0, self.config.idle_after / 4)
        while True:
            await asyncio.sleep(period)
            # Idle time counts from the later of the last request and entering Ready, so a load longer
            # than --idle-after does not turn a fresh worker Idle the moment it becomes Ready.
            quiet = min(time.monotonic() - self._last_activity, time.time() - self.state_machine.since)
            if (
                self.state_machine.state is State.READY
                and not self._queue
                and self.in_flight == 0
                and quiet >= self.config.idle_after
            ):
                self.state_machine.try_to(State.IDLE)

    async def drain(self, timeout: float) -> bool:  # noqa: ASYNC109 - polled with its own deadline
        """Wait (bounded) until queued and in-flight work is done; True when fully drained."""
        deadline = time.monotonic() + timeout
        while self._queue or self.in_flight:
            if time.monotonic() >= deadline:
                for unit in self._queue:
                    if not unit.future.done():
                        unit.future.set_exception(ModelNotReady("server is shutting down"))
                        unit.future.exception()
                self._queue.clear()
                return False
            await asyncio.sleep(0.02)
        return True

    def fail_all(self, reason: str) -> None:
        """Answer every queued request with 503 (the worker is Failed)."""
        while self._queue:
            unit = self._queue.popleft()
            if not unit.future.done():
                unit.future.set_exception(ModelNotReady(reason))
                unit.future.exception()


__all__ = ["ClientGone", "DataPlane", "Unit", "retry_after_seconds"]
