"""The server's parts wired together: config, state machine, metrics, worker, data plane, and process exit.

``ModelServer.start`` runs once the HTTP server is listening: it starts the queue owner, the idle watcher and
the model load (off the event loop).  ``begin_drain`` is what SIGTERM does.  ``request_exit`` records
the exit code and asks uvicorn to stop; ``main`` exits with that code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from model_server.config import ServerConfig
from model_server.dataplane import DataPlane
from model_server.metrics import Metrics, gpu_memory, gpu_peak_reserved, rss_bytes
from model_server.state_machine import State, StateMachine
from model_server.worker import Worker
from modelpool_contract.stats import StatsDownload, StatsMemory, StatsModel, WorkerStats

log = logging.getLogger("modelpool.server")


class ModelServer:
    """One model server: its parts, their start and stop, and the exit code ``main`` exits with."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.state_machine = StateMachine(on_change=self._on_state)
        self.worker = Worker(config, self.state_machine, on_failed=self._on_failed)
        self.dataplane = DataPlane(config, self.worker, self.state_machine, self.metrics)
        self.exit_code = 0
        self._stop: Callable[[], None] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._draining = False

    def _on_state(self, old: State, new: State) -> None:
        self.metrics.set_state(old, new)
        log.info("worker state %s -> %s", old, new)

    # ---- start / stop -------------------------------------------------------------------------------

    def start(self, stop: Callable[[], None]) -> None:
        """Called on the event loop once the socket listens: start the queue owner and the load."""
        self._stop = stop
        self._tasks = [
            asyncio.create_task(self.dataplane.run(), name="queue-owner"),
            asyncio.create_task(self.dataplane.watch_idle(), name="idle-watch"),
            asyncio.create_task(self._load(), name="load"),
        ]

    async def _load(self) -> None:
        if await self.worker.load():
            self.metrics.load_seconds.set(self.worker.load_seconds or 0.0)

    def _on_failed(self, exit_code: int, reason: str) -> None:
        """Failed (load error or fatal device error): answer what waits with 503, then exit non-zero."""
        self.dataplane.fail_all(reason)
        loop = asyncio.get_event_loop()
        # A short grace period so the 500s of the failing batch reach their clients.
        loop.call_soon_threadsafe(loop.call_later, 0.2, self.request_exit, exit_code)

    def request_exit(self, code: int) -> None:
        if code and not self.exit_code:
            self.exit_code = code
        if self._stop is not None:
            self._stop()

    def begin_drain(self) -> None:
        """SIGTERM: Evicting (readiness fails, new requests 503), drain up to --drain-timeout, exit 0."""
        if self._draining:
            return
        self._draining = True
        if self.state_machine.state in (State.FAILED, State.DEAD):
            self.request_exit(self.exit_code)
            return
        self.state_machine.try_to(State.EVICTING, "SIGTERM")
        asyncio.get_event_loop().create_task(self._drain())

    async def _drain(self) -> None:
        drained = await self.dataplane.drain(self.config.drain_timeout)
        log.info("drain %s", "complete" if drained else f"timed out after {self.config.drain_timeout}s")
        self.state_machine.try_to(State.DEAD, "drained")
        self.request_exit(0)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):  # shutting down
                await task
        self.worker.close()

    # ---- /stats -------------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The JSON the operator scrapes: ``modelpool_contract.stats.WorkerStats`` (docs/design.md)."""
        dp = self.dataplane
        allocated, reserved = gpu_memory()
        return WorkerStats(
            state=self.state_machine.state.value,
            state_since=self.state_machine.since,
            reason=self.state_machine.reason,
            queue_depth=dp.queue_depth,
            queue_capacity=self.config.queue_capacity,
            in_flight=dp.in_flight,
            last_request_time=dp.last_request_time,
            requests_total=dp.requests_total,
            rejected_total=dp.rejected_total,
            errors_total=dp.errors_total,
            load_error=self.worker.load_error,
            load_progress=self.worker.load_progress,
            load_seconds=self.worker.load_seconds,
            download=self._download(),
            memory=StatsMemory(
                rss_bytes=rss_bytes(),
                gpu_allocated_bytes=allocated,
                gpu_reserved_bytes=reserved,
                gpu_peak_reserved_bytes=gpu_peak_reserved(),
            ),
            model=StatsModel(name=self.config.served_name, task=self.config.task, source=self.config.model),
            time=time.time(),
        ).wire()

    def _download(self) -> StatsDownload | None:
        progress = self.worker.download
        if progress is None:
            return None
        return StatsDownload(downloaded_bytes=progress.downloaded_bytes, total_bytes=progress.total_bytes)
