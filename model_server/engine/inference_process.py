"""The inference process: owns the model, the device, the one inference thread and the batcher.

The supervisor starts it (spawn) with the worker's shared view, one connected socket per HTTP process and
a control pipe.  Its asyncio loop runs the channels to the HTTP processes (requests in; answers and
streamed pieces out), the queue owner (``DataPlane.run``), the idle watcher, the publisher of its
figures into the shared view, and the load; the model runs on the worker's single inference thread
(``Worker``).  It moves the worker's lifecycle state, which every HTTP process reads.

How it ends: ``drain`` on the control pipe (the supervisor got SIGTERM): Evicting, finish everything
admitted (bounded by ``--drain-timeout``), Dead, exit 0; a drain that runs out of time answers what is
left 503 and exits 6 (``EXIT_DRAIN_TIMED_OUT``, the number abandoned in the reason).  A load failure or
a fatal device error: Failed with the reason, the waiting requests answered, exit 3 or 4 (the
supervisor writes the reason to the termination log and exits with the same code).  ``stop``, or the
control pipe closing: exit at once.

``sleep`` and ``wake`` on the control pipe (a model on a shared host): the model sleeps when it is Ready
or Idle with nothing queued, in flight or on its way (``Worker.sleep``: Sleeping, the weights parked in
host memory; counted in ``Field.SLEEPS`` once done), else the sleep is refused and counted
(``Field.SLEEPS_REFUSED``); ``wake`` brings it back
(Waking, Ready).  What they did is in the shared view (``PARKED_BYTES``, ``SLEEP_FREED_BYTES``,
``WAKE_SECONDS``) beside the state, where the supervisor reads it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import sys
import weakref
from collections.abc import Coroutine
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

from model_server import ipc
from model_server.config import ServerConfig
from model_server.cpu_budget import ThreadPlan, size_threads
from model_server.engine.dataplane import DataPlane
from model_server.engine.download import DownloadProgress
from model_server.engine.generation_engine import engine_name
from model_server.engine.unit import Outcome, Unit
from model_server.engine.worker import Worker
from model_server.errors import SleepRefused
from model_server.metrics import Metrics, gpu_memory, gpu_peak_reserved
from model_server.process_setup import exit_now, set_up, trace_as
from model_server.state_machine import State, StateMachine
from model_server.worker_view import ENGINE_CODES, Field, WorkerView
from modelpool_contract.exits import EXIT_DRAIN_TIMED_OUT, EXIT_LOAD_FAILED, INFERENCE_FLUSH_S
from modelpool_contract.stats import THREAD_SOURCES

log = logging.getLogger("modelpool.inference")

# How often the load's progress and the GPU memory are copied into the shared view.
PUBLISH_EVERY_S = 0.25
# After a failure, how long the failing batch's answers get to reach their clients before the exit.
FAIL_GRACE_S = 0.2
# The exit code when a part of this process stopped on a bug (the supervisor reports a dead process).
EXIT_BROKEN = 1


class Endpoint:
    """The inference process's end of one HTTP process's channel."""

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.channel = ipc.Channel(self.on_message, self.on_lost)
        # The requests this HTTP process may still cancel; a request leaves when nothing holds it.
        self._units: weakref.WeakValueDictionary[int, Unit] = weakref.WeakValueDictionary()

    def on_message(self, message: ipc.ToEngine) -> None:
        if type(message) is ipc.Submit:
            rid = message.id
            emit = partial(self._piece, rid) if message.streaming else None
            unit = Unit(
                ipc.unpack(message.items),
                message.deadline,
                partial(self._reply, rid),
                lengths=message.lengths,
                emit=emit,
                trace=message.trace,
                ids=message.ids,
            )
            self._units[rid] = unit
            self.dataplane.submit(unit)
        elif type(message) is ipc.Cancel:
            cancelled = self._units.get(message.id)
            if cancelled is not None:
                self.dataplane.cancel(cancelled, message.reason)

    def on_lost(self) -> None:
        log.warning("an HTTP process closed its channel")  # the supervisor ends the worker

    def _reply(self, rid: int, outcome: Outcome) -> None:
        if isinstance(outcome, list):
            self.channel.send(ipc.Result(rid, ipc.pack(outcome)))
        else:
            self.channel.send(ipc.Failure(rid, outcome))

    def _piece(self, rid: int, text: str) -> None:
        """A streamed piece of text, from the inference thread."""
        self.channel.send_threadsafe(ipc.Piece(rid, text))


class InferenceProcess:
    """The model, its queue and the channels to the HTTP processes."""

    def __init__(
        self,
        config: ServerConfig,
        view: WorkerView,
        threads: ThreadPlan | None = None,
        metrics_model: str | None = None,
    ) -> None:
        self.config = config
        self.view = view
        self.metrics = Metrics(model=metrics_model)  # a shared host's model: its counters carry its name
        self.state_machine = StateMachine(on_change=self._on_state, store=view.state_store())
        self.threads = threads or ThreadPlan(None, "default")
        self.worker = Worker(
            config, self.state_machine, on_failed=self._on_failed, on_loaded=self._on_loaded, threads=threads
        )
        self.dataplane = DataPlane(config, self.worker, self.state_machine, self.metrics, view)
        self._endpoints: list[Endpoint] = []
        self._exit: asyncio.Future[int] | None = None
        self._draining = False

    async def serve(self, sockets: list[socket.socket], control: Connection) -> int:
        """Run until the worker drains, fails or is stopped; returns the exit code."""
        loop = asyncio.get_running_loop()
        self._exit = loop.create_future()
        for sock in sockets:
            endpoint = Endpoint(self.dataplane)
            await ipc.connect(sock, endpoint.channel)
            self._endpoints.append(endpoint)
        loop.add_reader(control.fileno(), self._on_control, control)
        self._publish_threads()
        tasks = [
            asyncio.create_task(self.dataplane.run(), name="queue-owner"),
            asyncio.create_task(self.dataplane.watch_idle(), name="idle-watch"),
            asyncio.create_task(self._publish(), name="publish"),
            asyncio.create_task(self._load(), name="load"),
        ]
        for task in tasks:
            task.add_done_callback(self._task_ended)
        code = await self._exit
        loop.remove_reader(control.fileno())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*(e.channel.drained(INFERENCE_FLUSH_S) for e in self._endpoints))
        self.worker.close()
        return code

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A part that should run for ever (the queue owner above all) stopped with an error: the
        worker must not limp on without it (the supervisor sees the exit and fails the worker)."""
        if not task.cancelled() and task.exception() is not None:
            log.critical("%s stopped", task.get_name(), exc_info=task.exception())
            self._finish(EXIT_BROKEN)

    def _on_state(self, old: State, new: State) -> None:
        log.info("worker state %s -> %s", old, new)

    async def _load(self) -> None:
        await self.worker.load()
        self._publish_load()

    def _on_loaded(self) -> None:
        """The model is loaded: its figures into the shared view before the state turns Ready, so an HTTP
        process that sees Ready also sees the task loaded; and the model's CPU threads, read once torch is
        wholly imported (a handler's model may not use torch at all)."""
        self._publish_load()
        self._publish_engine()
        torch = sys.modules.get("torch")
        if torch is not None:
            self.view.set(Field.CPU_THREADS, torch.get_num_threads())
            self.view.set(Field.INTEROP_THREADS, torch.get_num_interop_threads())

    def _publish_threads(self) -> None:
        """The thread plan into the shared view, for ``/stats``."""
        plan = self.threads
        self.view.set(Field.THREADS_FROM, THREAD_SOURCES.index(plan.sized_from))
        self.view.set(Field.THREAD_CPUS, float("nan") if plan.cpus is None else plan.cpus)
        self.view.set(Field.TOKENIZER_THREADS, float("nan") if plan.threads is None else plan.threads)

    def _publish_engine(self) -> None:
        """Which generation engine serves the model, and its cache, for ``/stats``."""
        engine = self.worker.engine
        name = engine_name(self.worker.task, engine)
        self.view.set(Field.GENERATION_ENGINE, ENGINE_CODES[name] if name else math.nan)
        self.view.set(Field.KV_CACHE_TOKENS, engine.capacity if engine is not None else math.nan)

    def _publish_load(self) -> None:
        worker, view = self.worker, self.view
        view.set(Field.LOAD_PROGRESS, worker.load_progress)
        view.set(Field.TASK_IMPORTED, float(worker.task_cls is not None))
        view.set(Field.TASK_LOADED, float(worker.task is not None))
        if worker.load_seconds is not None:
            view.set(Field.LOAD_SECONDS, worker.load_seconds)
        if worker.warmup_seconds is not None:
            view.set(Field.WARMUP_SECONDS, worker.warmup_seconds)
        if worker.download is not None:
            publish_download(view, worker.download)

    async def _publish(self) -> None:
        while True:
            self._publish_load()
            self._publish_sleep()
            # The model's own device (cuda:<i> on a host of several GPUs): this thread's current one is 0.
            allocated, reserved = gpu_memory(self.worker.device)
            self.view.set(Field.GPU_ALLOCATED, allocated)
            self.view.set(Field.GPU_RESERVED, reserved)
            peak = gpu_peak_reserved(self.worker.device)
            self.view.set(Field.GPU_PEAK_RESERVED, float("nan") if peak is None else peak)
            await asyncio.sleep(PUBLISH_EVERY_S)

    # ---- how it ends --------------------------------------------------------------------------------

    def _on_control(self, control: Connection) -> None:
        try:
            message = control.recv()
        except (EOFError, OSError):  # the supervisor is gone
            message = "stop"
        if message == "drain":
            self._begin_drain()
        elif message == "stop":
            self.dataplane.fail_all("the worker is stopping")
            self._finish(0)
        elif message in ("sleep", "wake"):
            coroutine = self._sleep() if message == "sleep" else self._wake()
            asyncio.get_running_loop().create_task(coroutine, name=message)

    async def _sleep(self) -> None:
        """Park the model's weights unless it has work in hand (then refuse, and count the refusal)."""
        try:
            if self.dataplane.busy or self._draining:
                raise SleepRefused("the model has work in hand")
            await self.worker.sleep("asked to sleep")
            self.view.set(Field.SLEEPS, self.view.get(Field.SLEEPS) + 1)
        except SleepRefused as exc:
            log.info("sleep refused: %s", exc)
            self.view.set(Field.SLEEPS_REFUSED, self.view.get(Field.SLEEPS_REFUSED) + 1)
        self._publish_sleep()
        self._publish_engine()

    async def _wake(self) -> None:
        """Bring the weights back (a failed wake has failed the worker already: ``Worker.wake``)."""
        try:
            await self.worker.wake("asked to wake")
        except SleepRefused as exc:
            log.info("wake refused: %s", exc)
        except Exception:
            log.exception("wake failed")
        self._publish_sleep()
        self._publish_engine()

    def _publish_sleep(self) -> None:
        """The sleep's figures into the shared view (a unit may wake the model too: published each round)."""
        worker, view = self.worker, self.view
        view.set(Field.PARKED_BYTES, worker.parked_bytes)
        if worker.last_sleep is not None:
            view.set(Field.SLEEP_FREED_BYTES, worker.last_sleep.freed)
        if worker.last_wake_seconds is not None:
            view.set(Field.WAKE_SECONDS, worker.last_wake_seconds)
        view.set(Field.WAKES, worker.wakes)

    def _begin_drain(self) -> None:
        """Evicting (readiness fails, new requests 503), finish what was admitted, Dead, exit 0."""
        if self._draining:
            return
        self._draining = True
        if self.state_machine.state in (State.FAILED, State.DEAD):
            return  # its exit is already on its way
        self.state_machine.try_to(State.EVICTING, "SIGTERM")
        asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        abandoned = await self.dataplane.drain(self.config.drain_timeout)
        if not abandoned:
            log.info("drain complete")
            self.state_machine.try_to(State.DEAD, "drained")
            self._finish(0)
            return
        reason = drain_timed_out(self.config.drain_timeout, abandoned)
        log.error("%s", reason)
        self.state_machine.try_to(State.DEAD, reason)  # the supervisor's termination message
        self._finish(EXIT_DRAIN_TIMED_OUT)

    def _on_failed(self, exit_code: int, reason: str) -> None:
        """Failed (load error or fatal device error): answer what waits with 503, then exit non-zero."""
        if exit_code == EXIT_LOAD_FAILED:
            self.view.set(Field.LOAD_FAILED, 1.0)
        self.dataplane.fail_all(reason)
        # A short grace period so the failing batch's answers reach their clients.
        asyncio.get_running_loop().call_later(FAIL_GRACE_S, self._finish, exit_code)

    def _finish(self, code: int) -> None:
        if self._exit is not None and not self._exit.done():
            self._exit.set_result(code)


def drain_timed_out(drain_timeout: float, abandoned: int) -> str:
    """Pure: the termination message of a drain that ran out of time."""
    requests = "1 request" if abandoned == 1 else f"{abandoned} requests"
    return f"drain timed out after {drain_timeout:g} s: {requests} abandoned"


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """Run ``main`` on uvloop when it is installed (as uvicorn does), else asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main(
    config: ServerConfig,
    view: WorkerView,
    sockets: list[socket.socket],
    control: Connection,
    metrics_model: str | None = None,
) -> None:
    """The process's entry point (the supervisor's spawn target; a shared host's names the model its
    metrics are labelled with)."""
    set_up("inference", config)
    trace_as(config)
    threads = size_threads(config.intra_op_threads, config.cpu_share_millicores)  # before torch's import
    process = InferenceProcess(config, view, threads, metrics_model=metrics_model)
    exit_now(run_loop(process.serve(sockets, control)))


__all__ = ["Endpoint", "InferenceProcess", "drain_timed_out", "main"]


def publish_download(view: WorkerView, progress: DownloadProgress) -> None:
    """An hf:// download's progress into the shared view, where every HTTP process's ``/stats`` reads it."""
    view.set(Field.DOWNLOADED_BYTES, progress.downloaded_bytes)
    total = progress.total_bytes
    view.set(Field.DOWNLOAD_TOTAL_BYTES, float("nan") if total is None else total)
