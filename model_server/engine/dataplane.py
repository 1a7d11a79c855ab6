"""The inference process's data plane: the queue, deadlines and dropped requests, batching across requests
by length, and each batch's outcome.

Requests arrive from the HTTP processes (``submit``) already admitted: each holds one slot of the
worker's capacity (``worker_view.Door``) until it leaves the queue, so the capacity counts requests on
their way between processes too.  One coroutine (``run``) owns the queue: it drops requests whose
deadline passed or whose client went away *before* any compute; for batchable tasks it takes requests
into a sweep (``sweep.py``: up to a few batches' worth, their items sorted by length) and hands the
worker batches of up to ``--max-batch-size`` items of similar length, waiting at most
``--max-batch-delay-ms`` for more when traffic is concurrent (a lone client never pays the delay), and
only until as many requests as the last sweep's are back (``batch_wait.py``); it answers each request
once its last item is computed.  Other tasks run one request at a time, except
text generation on the continuous-batching engine (``generation_engine.py``): each request is handed to
the engine as soon as it leaves the queue, and answered when the engine says it is done.  A unit whose
client's side gives up stops generating (the engine cancels it; the serial path's generation polls
``Unit.gone``).

Each batch's outcome: results go back to their requests; ``InvalidInput`` in a batch of several
requests retries each request's items alone (one bad request must not fail its batch-mates); any other
error fails that batch's requests; a fatal device error fails the worker (exit 4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from functools import partial

from model_server.adapter_mask import adapter_mask
from model_server.config import ServerConfig
from model_server.engine.batch_wait import keep_waiting
from model_server.engine.spans import record_unit
from model_server.engine.sweep import Sweep, sweep_capacity
from model_server.engine.unit import Outcome, Piece, Unit
from model_server.engine.worker import Worker
from model_server.errors import FatalDeviceError, InvalidInput, ModelNotReady, Overloaded, ServerError
from model_server.metrics import Metrics
from model_server.state_machine import State, StateMachine
from model_server.worker_view import INFERENCE_ROW, Column, Field, WorkerView
from modelpool_contract import logs
from modelpool_contract.exits import EXIT_DEVICE_FAILED

log = logging.getLogger("modelpool.dataplane")


def _tell_failed(units: Sequence[Unit], exc: ServerError) -> None:
    """A batch that failed, on one line with its requests' ids (the forward pass's traceback was logged on
    the inference thread, which knows the items but not whose they are); with one request, its line is that
    request's (``logs.bind``)."""
    request_ids = [u.ids[0] for u in units if u.ids[0] is not None]
    reset = logs.bind(*units[0].ids) if len(units) == 1 else None
    try:
        log.warning(
            "a batch of %d requests failed: %s",
            len(units),
            exc,
            extra={"fields": {"request_ids": request_ids}},
        )
    finally:
        if reset is not None:
            reset()


class DataPlane:
    """The queue in front of one ``Worker`` (lives in the inference process)."""

    def __init__(
        self,
        config: ServerConfig,
        worker: Worker,
        state_machine: StateMachine,
        metrics: Metrics,
        view: WorkerView,
    ) -> None:
        self.config = config
        self.worker = worker
        self.state_machine = state_machine
        self.metrics = metrics
        self.view = view
        self._queue: deque[Unit] = deque()
        self._queued_items = 0
        self._sweep: Sweep[Unit] = Sweep()
        self._active: set[Unit] = set()  # taken from the queue, neither answered nor dropped yet
        self._wakeup = asyncio.Event()
        self._last_activity = time.monotonic()
        self._seconds_per_item = 0.01  # EWMA of service time per item
        self._last_sweep = 0  # the requests the last sweep took (more than one: traffic is concurrent)

    # ---- what the HTTP processes send ---------------------------------------------------------------

    @property
    def batchable(self) -> bool:
        cls = self.worker.task_cls
        return bool(cls is not None and cls.batchable)

    def submit(self, unit: Unit) -> None:
        """An admitted request arrives; it holds a slot of the door until it leaves the queue."""
        if self.state_machine.state in (State.FAILED, State.DEAD):
            self.view.door.give_back()
            self._count(Column.REJECTED, ModelNotReady.reason)
            unit.answer(ModelNotReady(f"model {self.config.served_name} is not serving"))
            return
        unit.remaining = len(unit.items)
        unit.results = [None] * len(unit.items)
        self._queue.append(unit)
        self._queued_items += len(unit.items)
        self._last_activity = time.monotonic()
        self._wakeup.set()
        self.publish()

    @staticmethod
    def cancel(unit: Unit, reason: str) -> None:
        """The client's side gave up (deadline, disconnect): never compute what is left of it."""
        if unit.abandoned is None:
            unit.abandoned = reason
            if unit.on_abandon is not None:
                unit.on_abandon()

    # ---- the queue ----------------------------------------------------------------------------------

    def _leave_queue(self) -> Unit:
        unit = self._queue.popleft()
        self._queued_items -= len(unit.items)
        self.view.door.give_back()
        return unit

    def _drop_reason(self, unit: Unit, now: float) -> str | None:
        if unit.abandoned:
            return unit.abandoned
        if unit.deadline <= now:
            return "timeout"
        return None

    def _keep(self, unit: Unit) -> bool:
        """Is this request still worth computing?  Drops (and counts, once) one that is not."""
        if unit.answered:
            return False
        reason = self._drop_reason(unit, time.monotonic())
        if reason is None:
            return True
        # Dropped before compute: the HTTP side has answered 504, or its client is gone.
        self.metrics.dropped.labels(reason=reason).inc()
        unit.answered = True
        self._active.discard(unit)
        return False

    def _pop_live(self) -> Unit | None:
        """Take the next request worth computing off the queue, dropping dead ones on the way."""
        while self._queue:
            unit = self._leave_queue()
            if self._keep(unit):
                return unit
        return None

    # ---- the queue owner ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: form a batch, compute it on the inference thread, answer its requests."""
        while True:
            batch = await self._next_batch()
            if not batch:
                self.publish()
                self._settle()
                self._wakeup.clear()
                if not self._queue:
                    await self._wakeup.wait()
                continue
            await self._execute(batch)

    async def _next_batch(self) -> list[Piece]:
        limit = self.config.max_batch_size
        if not self.batchable:  # one request at a time, whole
            unit = self._pop_live()
            if unit is None:
                return []
            self._active.add(unit)
            return [(unit, i) for i in range(len(unit.items))]
        if not self._sweep:
            await self._start_sweep(limit)
        return self._sweep.take(self._keep)

    async def _start_sweep(self, limit: int) -> None:
        head = self._pop_live()
        if head is None:
            return
        taken = [head]
        hinted = any(head.hints())
        # Traffic is concurrent when sweeps gather several requests; only then is it worth waiting
        # --max-batch-delay-ms for more (a lone client would just pay the delay).
        await self._gather(taken, sweep_capacity(limit, hinted), limit, wait=self._last_sweep > 1)
        self._last_sweep = len(taken)
        self._active.update(taken)
        self._sweep.start(taken, Unit.hints, limit)

    async def _gather(self, taken: list[Unit], capacity: int, limit: int, wait: bool) -> None:
        """Add queued requests to ``taken`` while they fit in ``capacity`` items, waiting (if ``wait``)
        at most max-batch-delay for more while ``batch_wait.keep_waiting`` says more are coming."""
        n = sum(len(u.items) for u in taken)
        until = time.monotonic() + (self.config.max_batch_delay_ms / 1000.0 if wait else 0.0)
        while True:
            if self._queue:
                head = self._queue[0]
                if not self._keep(head):
                    self._leave_queue()
                    continue
                if n + len(head.items) > capacity:
                    return
                taken.append(self._leave_queue())
                n += len(head.items)
                continue
            remaining = until - time.monotonic()
            if remaining <= 0 or not keep_waiting(
                requests=len(taken),
                items=n,
                expected=self._last_sweep,
                on_the_way=self._on_the_way(),
                limit=limit,
            ):
                return
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), remaining)

    def _on_the_way(self) -> int:
        """Requests admitted by the HTTP processes (their slot taken) that have not reached the queue."""
        return max(0, self.view.door.taken - len(self._queue))

    async def _execute(self, batch: list[Piece]) -> None:
        units = list({id(u): u for u, _ in batch}.values())
        if self.worker.engine is not None:  # text generation, batched at the token level
            self._hand_to_engine(units[0])
            return
        items = [unit.items[i] for unit, i in batch]
        emit = units[0].emit if len(units) == 1 else None
        # A generation stops at its next token once nobody waits for it (one unit at a time).
        cancelled = units[0].gone if len(units) == 1 else None
        self.state_machine.try_to(State.PROCESSING)
        self.metrics.batch_size.observe(len(items))
        self.publish()
        started = time.monotonic()
        for unit in units:  # what its spans say (tracing on): one batch of this many items and requests
            unit.computed = (started, len(items), len(units))
        # Watched by the supervisor: a batch running past --request-timeout + --wedge-grace is wedged.
        self.view.set(Field.BATCH_STARTED, started)
        try:
            results = await self.worker.run(items, emit, cancelled)
        except FatalDeviceError as exc:
            self._fail(units, exc)
            self.worker.fail(EXIT_DEVICE_FAILED, str(exc))
        except InvalidInput as exc:
            if len(units) == 1:
                self._fail(units, exc)
            else:  # one bad request must not fail its batch-mates: retry each alone
                for unit in units:
                    await self._execute([p for p in batch if p[0] is unit])
        except ServerError as exc:
            _tell_failed(units, exc)
            self._fail(units, exc)
        else:
            elapsed = time.monotonic() - started
            self.metrics.compute.observe(elapsed)
            self._seconds_per_item = 0.8 * self._seconds_per_item + 0.2 * (elapsed / max(1, len(items)))
            for (unit, i), result in zip(batch, results, strict=True):
                if unit.answered:
                    continue
                unit.results[i] = result
                unit.remaining -= 1
                if unit.remaining == 0:
                    self._finish(unit, unit.results)
        finally:
            self.view.set(Field.BATCH_STARTED, math.nan)
            self._last_activity = time.monotonic()
            self.publish()
            self._settle()

    def _hand_to_engine(self, unit: Unit) -> None:
        """Start a request on the generation engine: it runs beside the others (``_engine_done`` ends it)."""
        engine = self.worker.engine
        assert engine is not None
        self.state_machine.try_to(State.PROCESSING)
        engine.metrics = self.metrics
        engine.view = self.view  # the engine keeps BATCH_STARTED for the supervisor's wedge watch
        unit.computed = (time.monotonic(), len(unit.items), 0)  # 0: the engine's own batching
        unit.on_abandon = partial(engine.abandon, unit)
        engine.submit(unit, self._engine_done)
        self.publish()

    def _engine_done(self, unit: Unit, outcome: Outcome | None) -> None:
        """The engine is done with a request: its results, its error, or None when nobody waits for it."""
        if outcome is None:
            if not unit.answered:
                self.metrics.dropped.labels(reason=unit.abandoned or "timeout").inc()
                unit.answered = True
            self._active.discard(unit)
        else:
            if isinstance(outcome, Overloaded):
                self._count(Column.REJECTED, outcome.reason)
            elif isinstance(outcome, ServerError) and not isinstance(outcome, InvalidInput):
                self._count(Column.ERRORS, None)
            self._finish(unit, outcome)
        self._last_activity = time.monotonic()
        self.publish()
        self._settle()

    def _finish(self, unit: Unit, outcome: Outcome) -> None:
        if unit.trace is not None and not unit.answered:
            record_unit(unit, outcome)
        unit.answer(outcome)
        self._active.discard(unit)

    def _fail(self, units: Sequence[Unit], exc: ServerError) -> None:
        if not isinstance(exc, InvalidInput):
            self._count(Column.ERRORS, None, len(units))
        for unit in units:
            self._finish(unit, exc)

    def _settle(self) -> None:
        """Back to Ready once nothing is queued, in flight or on its way."""
        if not self._queue and not self._active and not self.view.door.taken:
            self.state_machine.try_to(State.READY)

    def _count(self, column: Column, reason: str | None, amount: int = 1) -> None:
        self.view.add(INFERENCE_ROW, column, amount)
        if reason is not None:
            self.metrics.rejected.labels(reason=reason).inc(amount)

    def publish(self) -> None:
        """The figures /stats and Retry-After read, into the worker's shared view."""
        view = self.view
        view.set(Field.IN_FLIGHT, len(self._active))
        view.set(Field.BACKLOG_ITEMS, self._queued_items + len(self._sweep))
        view.set(Field.SECONDS_PER_ITEM, self._seconds_per_item)
        engine = self.worker.engine
        if engine is not None:
            view.set(Field.GENERATING, engine.running)
            view.set(Field.KV_CACHE_RESERVED, engine.reserved)
        adapters = self.worker.adapters
        if adapters is not None:
            view.set(Field.ADAPTERS_LOADED, adapters.mask())
            view.set(Field.ADAPTERS_RUNNING, adapter_mask(adapters.declared, adapters.running))

    # ---- idle, drain, failure -----------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Anything queued, in flight, or admitted and on its way here?"""
        return bool(self._queue or self._active or self.view.door.taken)

    async def watch_idle(self) -> None:
        """Ready -> Idle after ``--idle-after`` seconds with nothing to do."""
        period = min(1.0, self.config.idle_after / 4)
        while True:
            await asyncio.sleep(period)
            # Idle time counts from the later of the last request and entering Ready, so a load longer
            # than --idle-after does not turn a fresh worker Idle the moment it becomes Ready.
            quiet = min(time.monotonic() - self._last_activity, time.time() - self.state_machine.since)
            if self.state_machine.state is State.READY and not self.busy and quiet >= self.config.idle_after:
                self.state_machine.try_to(State.IDLE)

    async def drain(self, timeout: float) -> int:  # noqa: ASYNC109 - polled with its own deadline
        """Wait (bounded) until queued, in-flight and on-their-way requests are done; returns how many
        were abandoned at the deadline (answered 503; 0: drained)."""
        deadline = time.monotonic() + timeout
        while self.busy:
            if time.monotonic() >= deadline:
                # Admitted in an HTTP process and not here yet: turned away by ``submit`` on arrival.
                on_their_way = self._on_the_way()
                return self.fail_all("server is shutting down") + on_their_way
            await asyncio.sleep(0.02)
        return 0

    def fail_all(self, reason: str) -> int:
        """Answer every queued and in-flight request with 503 (the worker is Failed or gone); returns how
        many requests were still unanswered."""
        unanswered = 0
        while self._queue:
            unit = self._leave_queue()
            unanswered += not unit.answered
            unit.answer(ModelNotReady(reason))
        for unit in {*self._active, *self._sweep.units()}:
            unanswered += not unit.answered
            self._finish(unit, ModelNotReady(reason))
        self._sweep.clear()
        self.publish()
        return unanswered


__all__ = ["DataPlane", "Unit"]
