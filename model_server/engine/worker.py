"""The worker: loads the model off the event loop and owns it on ONE inference thread.

* ``load`` resolves the source, imports the task module (torch & co. are imported here, in the inference
  process, never in the HTTP processes) and calls ``Task.load`` on the inference thread, then runs the
  task's warm-up input once (``Task.warmup_items``) so that the first request after Ready does not pay
  for first-call set-up.  Failure -> Failed with the reason (the supervisor writes it to the termination
  log) and exit code 3 (``EXIT_LOAD_FAILED``).
* ``run`` executes one unit of work on the same thread.  No lock guards the model: only that thread ever
  touches it, so nothing can be poisoned.  Crash handling (docs/design.md, "Failures"):
    - ``InvalidInput`` passes through (4xx);
    - a CUDA out-of-memory error splits the unit in halves and retries each before failing;
    - an unrecoverable device error (illegal memory access, device-side assert, ...) -> ``FatalDeviceError``
      (the data plane then marks the worker Failed and the process exits non-zero);
    - any other exception -> ``InferenceError`` (500 for that unit; the worker goes on serving).
* ``sleep`` and ``wake`` (a model on a shared host): Ready/Idle with nothing running -> Sleeping, the
  weights parked in host memory (pinned on CUDA; ``engine/parking.py``), the generation engine and its KV
  cache dropped, the device memory returned; Sleeping -> Waking -> Ready, the weights copied back and the
  engine started again.  A sleep that fails (host memory short) puts the weights back and refuses
  (``SleepRefused``); a wake that fails leaves the model unusable: Failed, exit 4.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from model_server.config import ServerConfig
from model_server.cpu_budget import ThreadPlan, set_interop_threads
from model_server.engine import parking, sources
from model_server.engine.adapters import AdapterBank, attach_adapters
from model_server.engine.download import DownloadProgress
from model_server.engine.generation_engine import BatchingEngine, attach
from model_server.engine.heap import HeapTrimmer
from model_server.engine.preload import preload_torch_libraries
from model_server.errors import (
    FatalDeviceError,
    InferenceError,
    InvalidInput,
    ServerError,
    SleepRefused,
    is_fatal_device_error,
    is_oom,
)
from model_server.state_machine import State, StateMachine
from model_server.tasks import task_class
from model_server.tasks.base import Emitter, LoadOptions, Task
from model_server.tasks.generation import watching_cancel
from modelpool_contract.exits import EXIT_DEVICE_FAILED, EXIT_LOAD_FAILED

log = logging.getLogger("modelpool.worker")

# GIL switch interval while the model loads (see ``Worker.load``): short, so health stays responsive.
LOAD_SWITCH_INTERVAL_S = 0.0005
# A worker with no unit running for this long trims its heap once (see model_server/engine/heap.py).
IDLE_TRIM_AFTER_S = 1.0


class WarmupError(RuntimeError):
    """The task's warm-up input failed after the load: the model cannot serve (a load failure)."""


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is visible, else ``cpu`` (imports torch: call on the thread)."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def cuda_index(device: str) -> int | None:
    """Pure: the GPU index ``device`` names (``cuda:1`` -> 1), None for ``cpu``, ``cuda`` and ``auto``."""
    match = re.fullmatch(r"cuda:(\d+)", device)
    return int(match.group(1)) if match else None


def use_device(device: str) -> None:
    """Make ``cuda:<i>`` the current CUDA device of the calling thread (a model on GPU i of a host of
    several): what a library puts on plain ``cuda`` and the CUDA context go there, not to GPU 0."""
    index = cuda_index(device)
    if index is not None:
        import torch

        torch.cuda.set_device(index)


class Worker:
    """The model, its loading and the single inference thread."""

    def __init__(
        self,
        config: ServerConfig,
        state_machine: StateMachine,
        on_failed: Callable[[int, str], None],
        on_loaded: Callable[[], None] = lambda: None,
        threads: ThreadPlan | None = None,
    ) -> None:
        """``on_failed(code, reason)``: a fatal error; ``on_loaded()``: the model is loaded and warmed up,
        called before the state turns Ready (what it publishes is there when a request is admitted)."""
        self.config = config
        self.state_machine = state_machine
        self.threads = threads or ThreadPlan(None, "default")
        self._on_failed = on_failed
        self._on_loaded = on_loaded
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self.task: Task[Any, Any] | None = None
        self.task_cls: type[Task[Any, Any]] | None = None
        # The continuous-batching engine of a text-generation model that can use it (generation_engine.py).
        self.engine: BatchingEngine | None = None
        self.adapters: AdapterBank | None = None  # the model's LoRA adapters (--adapter)
        self.load_error: str | None = None
        self.load_progress = 0.0
        self.load_seconds: float | None = None
        # Bytes of an hf:// source's files in the cache so far (None: the source needs no download).
        self.download = DownloadProgress() if config.model.startswith("hf://") else None
        self.warmup_seconds: float | None = None
        self.device = config.device
        self._heap = HeapTrimmer()
        self._units_running = 0
        self._last_unit_end = 0.0
        self._idle_trim: asyncio.TimerHandle | None = None
        # The weights while the model sleeps (None: awake), and the last sleep's and wake's figures.
        self._parked: parking.Parked | None = None
        self._sleep_lock = asyncio.Lock()  # one sleep or wake at a time; a unit waits for it
        self.last_sleep: parking.Parked | None = None
        self.last_wake_seconds: float | None = None
        self.wakes = 0  # wakes completed

    # ---- loading ------------------------------------------------------------------------------------

    async def load(self) -> bool:
        """Load the model off the event loop; True when Ready, False when Failed (exit already requested)."""
        self.state_machine.to(State.LOADING)
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        try:
            with _responsive_event_loop():
                await loop.run_in_executor(self._executor, self._load_sync, started)
        except asyncio.CancelledError:  # shutting down mid-load (SIGTERM): not a load failure
            raise
        except Exception as exc:  # every load failure is a reported Failed state
            reason = f"load failed: {type(exc).__name__}: {exc}"
            self.load_error = reason
            log.error("%s", reason, exc_info=not isinstance(exc, (ServerError, sources.SourceError)))
            self.fail(EXIT_LOAD_FAILED, reason)
            return False
        self.load_progress = 1.0
        self._on_loaded()
        if not self.state_machine.try_to(State.READY):  # SIGTERM arrived while loading
            return False
        log.info(
            "model %s ready in %.2fs on %s (warm-up %.3fs)",
            self.config.served_name, self.load_seconds or 0.0, self.device, self.warmup_seconds or 0.0,
        )  # fmt: skip
        return True

    def _load_sync(self, started: float) -> None:
        if not self.config.model.startswith("hf://"):
            # A local model needs no hub: never let transformers try the network (slow timeouts offline).
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path: Path = sources.resolve(
            self.config.model,
            hf_home=self.config.hf_home,
            pvc_root=self.config.pvc_root,
            progress=self.download,
        )
        self.load_progress = 0.1
        if self.config.handler is None:  # the built-in tasks all import torch (a handler may not)
            preload_torch_libraries()
        cls = task_class(self.config.task, self.config.handler)
        self.task_cls = cls
        self.load_progress = 0.2
        self.device = resolve_device(self.config.device)
        use_device(self.device)
        task = cls()
        task.load(
            LoadOptions(
                path=path,
                device=self.device,
                dtype=self.config.dtype,
                trust_remote_code=self.config.trust_remote_code,
                runtime=self.config.runtime,
            )
        )
        self.adapters = attach_adapters(task, self.config)
        self.load_seconds = time.monotonic() - started
        self.load_progress = 0.9
        if "torch" in sys.modules:  # a handler's model may not use torch at all
            set_interop_threads(self.threads)  # before the warm-up: the first parallel work
        self._warm_up(task)
        self.engine = attach(
            task,
            choice=self.config.generation_engine,
            device=self.device,
            trust_remote_code=self.config.trust_remote_code,
            kv_tokens=self.config.kv_cache_tokens,
            on_fatal=lambda reason: self.fail(EXIT_DEVICE_FAILED, reason),
            prefix_sharing=self.config.prefix_sharing,
        )
        # The model, torch and transformers leave about half a million long-lived objects behind. A
        # full garbage collection walks all of them and stops the inference process's event loop (its
        # channels, the batcher) for 100s of ms: the tail of every latency under load.  Freeze them
        # out of the collector's sight; objects created by requests from now on are still collected.
        # No collection first: on all-MiniLM-L6-v2 it took 400 ms (holding the GIL) to find 121
        # unreachable objects, which the freeze keeps instead.
        gc.freeze()
        self.task = task  # only now: nothing is half-registered on failure

    def _warm_up(self, task: Task[Any, Any]) -> None:
        """Run the task's representative input once before Ready: CUDA's first call (context, kernels,
        library handles, allocator pools) and the lazy parts of a CPU model cost the first request
        seconds on a GPU, tens of milliseconds on a CPU, when nobody has run them yet."""
        items = task.warmup_items()
        if not items or self.config.skip_warmup:
            return
        started = time.monotonic()
        try:
            task.run(items)
        except Exception as exc:
            raise WarmupError(f"the warm-up input failed: {type(exc).__name__}: {exc}") from exc
        self.warmup_seconds = time.monotonic() - started

    # ---- sleep and wake ---------------------------------------------------------------------------------

    @property
    def asleep(self) -> bool:
        return self._parked is not None

    @property
    def parked_bytes(self) -> int:
        """The weights' bytes in host memory while the model sleeps (0 awake)."""
        return self._parked.bytes if self._parked is not None else 0

    async def sleep(self, reason: str = "") -> parking.Parked:
        """Ready/Idle with nothing running -> Sleeping: park the weights, drop the engine and its cache,
        return the device memory.  ``SleepRefused`` when it cannot (nothing changed then)."""
        running = self._units_running or (self.engine is not None and self.engine.running)
        if self.task is None or running or self._parked is not None or self._sleep_lock.locked():
            raise SleepRefused("the model is not loaded, or has work in hand, or is asleep already")
        if not self.state_machine.try_to(State.SLEEPING, reason):
            raise SleepRefused(f"a {self.state_machine.state} model cannot sleep")
        async with self._sleep_lock:
            engine, self.engine = self.engine, None
            loop = asyncio.get_running_loop()
            try:
                parked = await loop.run_in_executor(self._executor, self._park_sync, engine)
            except Exception as exc:  # the park put the weights back: the model serves on, awake
                log.warning("sleep refused: %s: %s", type(exc).__name__, exc)
                await self._back_awake(f"sleep refused: {type(exc).__name__}: {exc}")
                raise SleepRefused(f"{type(exc).__name__}: {exc}") from exc
            self._parked = self.last_sleep = parked
        log.info(
            "model %s asleep: %d bytes parked in host memory, %d bytes of device memory returned",
            self.config.served_name, parked.bytes, parked.freed,
        )  # fmt: skip
        return parked

    def _park_sync(self, engine: BatchingEngine | None) -> parking.Parked:
        if engine is not None:
            engine.close()  # the manager's thread stops and its KV cache is let go
        return parking.park(parking.modules_of(self.task), self.device)

    async def wake(self, reason: str = "") -> float:
        """Sleeping -> Waking -> Ready: the weights back on the device, the engine started again; the
        seconds it took (0 when the model was awake).  A failed wake is Failed, exit 4."""
        async with self._sleep_lock:  # a sleep under way ends first
            if self._parked is None:
                return 0.0
            if not self.state_machine.try_to(State.WAKING, reason):
                raise SleepRefused(f"a {self.state_machine.state} model cannot wake")
            started = time.monotonic()
            try:
                await self._back_awake(reason)
            except Exception as exc:
                self.fail(EXIT_DEVICE_FAILED, f"wake failed: {type(exc).__name__}: {exc}")
                raise
            self.last_wake_seconds = time.monotonic() - started
            self.wakes += 1
            return self.last_wake_seconds

    async def _back_awake(self, reason: str) -> None:
        """Unpark (when parked), start the engine again, then Ready (from Sleeping or Waking)."""
        parked, self._parked = self._parked, None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._unpark_sync, parked)
        self.state_machine.try_to(State.WAKING, reason)
        self.state_machine.try_to(State.READY, reason)

    def _unpark_sync(self, parked: parking.Parked | None) -> None:
        if parked is not None:
            parking.unpark(parked)
        self.engine = attach(
            self.task,
            choice=self.config.generation_engine,
            device=self.device,
            trust_remote_code=self.config.trust_remote_code,
            kv_tokens=self.config.kv_cache_tokens,
            on_fatal=lambda reason: self.fail(EXIT_DEVICE_FAILED, reason),
            prefix_sharing=self.config.prefix_sharing,
        )

    # ---- failure ------------------------------------------------------------------------------------

    def fail(self, exit_code: int, reason: str) -> None:
        """Enter Failed with the reason (the supervisor writes it to the termination log) and ask the
        process to exit with ``exit_code``."""
        self.state_machine.try_to(State.FAILED, reason)
        self._on_failed(exit_code, reason)

    # ---- inference ----------------------------------------------------------------------------------

    async def run(
        self, items: Sequence[Any], emit: Emitter | None = None, cancelled: Callable[[], bool] | None = None
    ) -> list[Any]:
        """Run one unit on the inference thread (see the module docstring for error handling).
        ``cancelled``: polled by a generation after each token; True ends it (nobody waits for it)."""
        if self._parked is not None or self._sleep_lock.locked():
            await self.wake("a request arrived")  # never run a unit on parked weights
        loop = asyncio.get_running_loop()
        self._units_running += 1
        try:
            results = await loop.run_in_executor(self._executor, self._run_sync, items, emit, cancelled)
            if self._heap.after_batch():  # after the answer, not in its way (queued on the same thread)
                loop.run_in_executor(self._executor, self._heap.trim)
            return results
        finally:
            self._units_running -= 1
            self._last_unit_end = time.monotonic()
            if self._idle_trim is None:
                self._idle_trim = loop.call_later(IDLE_TRIM_AFTER_S, self._trim_if_idle, loop)

    def _trim_if_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Timer: once no unit has run for ``IDLE_TRIM_AFTER_S``, trim the heap on the inference thread
        (which is free then, so no request waits for it)."""
        self._idle_trim = None
        if self._units_running:  # the unit's end arms the timer again
            return
        wait = self._last_unit_end + IDLE_TRIM_AFTER_S - time.monotonic()
        if wait > 0:
            self._idle_trim = loop.call_later(wait, self._trim_if_idle, loop)
        elif self._heap.dirty:
            loop.run_in_executor(self._executor, self._heap.trim)

    def _run_sync(
        self, items: Sequence[Any], emit: Emitter | None, cancelled: Callable[[], bool] | None = None
    ) -> list[Any]:
        task = self.task
        if task is None:
            raise InferenceError("model is not loaded")
        try:
            with watching_cancel(cancelled):
                results = self._run_splitting(task, list(items), emit)
        except (InvalidInput, FatalDeviceError):
            raise
        except Exception as exc:
            if is_fatal_device_error(exc):
                raise FatalDeviceError(f"fatal device error: {type(exc).__name__}: {exc}") from exc
            log.exception("forward pass failed")
            raise InferenceError(f"inference failed: {type(exc).__name__}: {exc}") from exc
        if len(results) != len(items):
            raise InferenceError(f"task returned {len(results)} results for {len(items)} items")
        return results

    def _run_splitting(self, task: Task[Any, Any], items: list[Any], emit: Emitter | None) -> list[Any]:
        try:
            return list(task.run(items, emit))
        except Exception as exc:
            if not is_oom(exc) or is_fatal_device_error(exc) or len(items) <= 1:
                raise
            log.warning("out of memory on a unit of %d items; retrying in halves", len(items))
            _empty_cache()
            half = len(items) // 2
            return self._run_splitting(task, items[:half], emit) + self._run_splitting(
                task, items[half:], emit
            )

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self._idle_trim is not None:
            self._idle_trim.cancel()
        self._executor.shutdown(wait=False, cancel_futures=True)


@contextlib.contextmanager
def _responsive_event_loop() -> Iterator[None]:
    """While the model loads on the inference thread, keep the inference process's event loop responsive
    (its channels to the HTTP processes, the supervisor's messages: a drain during a load is answered at
    once).

    * A load holds the GIL for long stretches (imports, pure-Python model construction).  Each time the
      event loop comes back from a syscall it waits up to one switch interval (default 5 ms) for the
      GIL: a short interval keeps its answers in milliseconds.
    * The import of torch and transformers creates most of a million objects, and every few hundred
      thousand allocations a full (generation 2) collection walks them all, holding the GIL for 100+ ms.
      Full collections wait until the load ends (young generations are still collected as usual).
    """
    interval = sys.getswitchinterval()
    thresholds = gc.get_threshold()
    sys.setswitchinterval(LOAD_SWITCH_INTERVAL_S)
    gc.set_threshold(thresholds[0], thresholds[1], 1_000_000)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)


def _empty_cache() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.cuda.empty_cache()
        except Exception:  # best effort before the retry
            log.debug("empty_cache failed", exc_info=True)
