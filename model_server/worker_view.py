"""What every process of one worker sees of the others, in shared memory: the lifecycle state, the door
(the one queue capacity of the whole worker), and the numbers ``/stats`` and ``/metrics`` report.

The supervisor makes one ``WorkerView`` before it starts the processes and hands it to each of them
(spawn pickles its parts: two RawArrays, a Lock and a BoundedSemaphore).  Who writes what:

* the state (``SharedStateStore``): whoever moves it, under the lock (the inference process; the
  supervisor when a process dies); every process reads it without the lock;
* the door: an HTTP process takes a slot before it admits a request (never blocking: no slot left is a
  429 at once); the inference process gives the slot back when the request leaves its queue.  Requests
  on their way between the processes hold their slot, so the capacity holds end to end, whatever the
  number of HTTP processes;
* each process's counter row (requests admitted, rejected, failed; the last request's time; its pid):
  that process only;
* the inference figures (in flight, backlog, service time per item, load and warm-up seconds, download
  progress, GPU memory, when the running batch started): the inference process only.

Single values are 8-byte aligned doubles, written and read whole; a reader may see a figure one update
old, never a torn one.
"""

from __future__ import annotations

import contextlib
import enum
import math
import multiprocessing
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from model_server.state_machine import State

# Everything a worker shares is made for processes started with spawn (never fork after torch).
SPAWN = multiprocessing.get_context("spawn")
REASON_BYTES = 4096


class Field(enum.IntEnum):
    """The worker-wide figures (slots of ``WorkerView.numbers`` before the per-process rows)."""

    STATE = 0
    STATE_SINCE = enum.auto()
    IN_FLIGHT = enum.auto()  # requests taken from the queue, not yet answered
    BACKLOG_ITEMS = enum.auto()  # items queued or in flight in the inference process (Retry-After)
    SECONDS_PER_ITEM = enum.auto()  # recent service time per item (Retry-After)
    LOAD_PROGRESS = enum.auto()
    LOAD_SECONDS = enum.auto()  # NaN until the load has finished
    WARMUP_SECONDS = enum.auto()  # NaN until the warm-up has run
    LOAD_FAILED = enum.auto()  # 1: the reason is the load error
    TASK_IMPORTED = enum.auto()  # 1: the task's class is importable (metadata can be answered)
    TASK_LOADED = enum.auto()  # 1: the model is loaded (the v2 codec can be used)
    GPU_ALLOCATED = enum.auto()
    GPU_RESERVED = enum.auto()
    GPU_PEAK_RESERVED = enum.auto()  # NaN: no CUDA in use
    DOWNLOADED_BYTES = enum.auto()  # an hf:// source's bytes in the cache so far
    DOWNLOAD_TOTAL_BYTES = enum.auto()  # NaN until the file list is known
    CPU_THREADS = enum.auto()  # torch's intra-op threads in the inference process; NaN until it is loaded
    BATCH_STARTED = enum.auto()  # time.monotonic() when the running forward pass began; NaN: none runs
    GENERATION_ENGINE = enum.auto()  # ENGINE_CODES; NaN: not loaded or generates no text
    KV_CACHE_TOKENS = enum.auto()  # the continuous-batching engine's KV cache; NaN: no such engine
    KV_CACHE_RESERVED = enum.auto()  # tokens of it the running generations reserve
    GENERATING = enum.auto()  # generations running on the engine
    INTEROP_THREADS = enum.auto()  # torch's inter-op threads; NaN until it is loaded
    TOKENIZER_THREADS = enum.auto()  # RAYON_NUM_THREADS as planned; NaN: the tokenizer's default
    THREADS_FROM = enum.auto()  # index of what the threads were sized from (stats.THREAD_SOURCES)
    THREAD_CPUS = enum.auto()  # the CPUs that source allows; NaN: it says none
    PARKED_BYTES = enum.auto()  # the weights' bytes parked in host memory while the model sleeps; 0 awake
    SLEEP_FREED_BYTES = enum.auto()  # device bytes the last sleep returned; NaN: it never slept
    WAKE_SECONDS = enum.auto()  # how long the last wake took; NaN: it never woke
    SLEEPS = enum.auto()  # sleeps completed (the weights parked)
    SLEEPS_REFUSED = enum.auto()  # sleeps asked for and refused (not Ready/Idle, work in hand, park failed)
    WAKE_WANTED = (
        enum.auto()
    )  # a shared host: Unix time a request asked this sleeping model to wake (0: none)
    ADAPTERS_LOADED = enum.auto()  # LoRA adapters in memory, a bit mask over --adapter's order
    ADAPTERS_RUNNING = enum.auto()  # LoRA adapters running requests use, the same mask
    WAKES = enum.auto()  # wakes completed (the weights back on the device)


class Column(enum.IntEnum):
    """One process's row."""

    PID = 0
    REQUESTS = enum.auto()  # admitted
    REJECTED = enum.auto()  # refused or given up on (4xx, 429, 503, 504, disconnected)
    ERRORS = enum.auto()  # computed and failed (500)
    LAST_REQUEST = enum.auto()  # Unix time of the last admitted request (0: none)
    UP = enum.auto()  # 1: an HTTP process that accepts connections
    BEAT = enum.auto()  # an HTTP process's event loop: time.monotonic() of its last tick


_GLOBALS = len(Field)
_COLUMNS = len(Column)
_STATES = tuple(State)
# The generation engines' names (``engine.generation_engine``), and each as a number in the view (NaN: the
# task generates nothing); here, beside the view, because the frontend and the supervisor read them too.
BATCHING = "continuous-batching"
SERIAL = "serial"
ENGINE_CODES = {SERIAL: 1.0, BATCHING: 2.0}
ENGINE_NAMES = {code: name for name, code in ENGINE_CODES.items()}
# Tokens per KV-cache page of the continuous-batching engine (a request holds whole pages, so admission
# rounds its need up to pages); here because the probe port reports the cache in pages too
# (``metrics.picker_rows``: the endpoint picker's ``block_size``).
PAGE_TOKENS = 32
# How often an HTTP process's event loop ticks its heartbeat (``frontend.http_process``); the probe
# server (``supervisor.probe_server``) judges a loop wedged after its STALL_AFTER_S without a tick.
BEAT_PERIOD_S = 1.0
SUPERVISOR_ROW = 0
INFERENCE_ROW = 1


def http_row(index: int) -> int:
    """The row of HTTP process ``index`` (0-based)."""
    return 2 + index


# How long a process waits for the state lock before it goes on without it (see ``_held``).
LOCK_TIMEOUT_S = 1.0


@contextlib.contextmanager
def _held(lock: Any) -> Iterator[None]:
    """Hold the view's lock, but never wait for it for ever: a process killed while holding it (it is
    held for microseconds, but SIGKILL comes when it comes) must not freeze the others, and the
    supervisor must still be able to mark the worker Failed."""
    acquired = lock.acquire(timeout=LOCK_TIMEOUT_S)
    try:
        yield
    finally:
        if acquired:
            lock.release()


class SharedStateStore:
    """A ``state_machine.StateStore`` in the view: the state, since when, and why."""

    def __init__(self, view: WorkerView) -> None:
        self._view = view

    def lock(self) -> AbstractContextManager[Any]:
        return _held(self._view.lock)

    def read(self) -> tuple[State, float]:
        numbers = self._view.numbers
        return _STATES[int(numbers[Field.STATE])], numbers[Field.STATE_SINCE]

    def reason(self) -> str:
        with _held(self._view.lock):
            return bytes(self._view.reason.value).decode("utf-8", "replace")

    def write(self, state: State, since: float, reason: str) -> None:
        numbers = self._view.numbers
        self._view.reason.value = reason.encode("utf-8")[: REASON_BYTES - 1]
        numbers[Field.STATE_SINCE] = since
        numbers[Field.STATE] = float(_STATES.index(state))


class Door:
    """The worker's one queue capacity: a counting semaphore of ``capacity`` slots, of which at most
    ``size`` may be taken (a shared host's slot is made with the most any model may ask for, and each
    load sets its model's own, ``limit``; a dedicated worker's door is its capacity)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.semaphore = SPAWN.BoundedSemaphore(capacity)
        # Shared with every process, as the semaphore is (handed over when they are spawned).
        self._size = SPAWN.RawValue("q", capacity)

    @property
    def size(self) -> int:
        """How many requests may be in the door at once."""
        return int(self._size.value)

    def limit(self, size: int) -> None:
        """Admit at most ``size`` (1..capacity) from now on: a shared host's slot before its model starts."""
        if not 1 <= size <= self.capacity:
            raise ValueError(f"a door of {self.capacity} cannot admit {size}")
        self._size.value = size

    def take(self) -> bool:
        """Take a slot if one is free (never waits). Past ``size`` it is given back at once: a take is
        kept only when, with it, at most ``size`` are taken, so racing takes never admit more (at worst
        both refuse when one would have fit)."""
        if not self.semaphore.acquire(False):
            return False
        if self.taken > self.size:
            self.semaphore.release()
            return False
        return True

    def give_back(self, count: int = 1) -> None:
        for _ in range(count):
            self.semaphore.release()

    @property
    def taken(self) -> int:
        """Requests admitted and not yet out of the queue: the worker-wide queue depth."""
        return self.capacity - self.semaphore.get_value()

    @property
    def full(self) -> bool:
        return self.taken >= self.size


class WorkerView:
    """The shared memory of one worker: ``numbers`` (figures, then one row per process), the reason text,
    the lock that guards state transitions, and the door."""

    def __init__(self, capacity: int, http_processes: int) -> None:
        self.http_processes = http_processes
        self.rows = 2 + http_processes
        self.numbers = SPAWN.RawArray("d", _GLOBALS + self.rows * _COLUMNS)
        self.reason = SPAWN.RawArray("c", REASON_BYTES)
        self.lock = SPAWN.Lock()
        self.door = Door(capacity)
        _initial_figures(self.numbers)

    def reset(self) -> None:
        """Back to a fresh view (Pending, no figures): a shared host's slot, before it takes a new model
        (every process that shares it has let go of the previous one)."""
        for i in range(len(self.numbers)):
            self.numbers[i] = 0.0
        self.reason.value = b""
        _initial_figures(self.numbers)
        # A process that died with requests in its queue never gave their slots back.
        self.door.give_back(self.door.taken)
        self.door.limit(self.door.capacity)

    def unlink(self) -> None:
        """Remove the semaphores' names (the supervisor, once every process is gone; the exit, which skips
        multiprocessing's own clean-up, would leave them to its resource tracker, which warns)."""
        from multiprocessing.synchronize import SemLock

        for lock in (self.lock, self.door.semaphore):
            name = getattr(getattr(lock, "_semlock", None), "name", None)
            if name is not None:
                with contextlib.suppress(OSError):
                    SemLock._cleanup(name)  # type: ignore[attr-defined]

    def state_store(self) -> SharedStateStore:
        return SharedStateStore(self)

    # ---- worker-wide figures ----------------------------------------------------------------------------

    def get(self, field: Field) -> float:
        return float(self.numbers[field])

    def set(self, field: Field, value: float) -> None:
        self.numbers[field] = value

    def optional(self, field: Field) -> float | None:
        """A figure that may be unknown (NaN) yet."""
        value = float(self.numbers[field])
        return None if math.isnan(value) else value

    def flag(self, field: Field) -> bool:
        return bool(self.numbers[field] != 0.0)

    # ---- per-process rows --------------------------------------------------------------------------------

    def _slot(self, row: int, column: Column) -> int:
        return _GLOBALS + row * _COLUMNS + column

    def add(self, row: int, column: Column, amount: float = 1.0) -> None:
        """Count in this process's own row (no other process writes it)."""
        self.numbers[self._slot(row, column)] += amount

    def put(self, row: int, column: Column, value: float) -> None:
        self.numbers[self._slot(row, column)] = value

    def get_row(self, row: int, column: Column) -> float:
        return float(self.numbers[self._slot(row, column)])

    def total(self, column: Column) -> int:
        return int(sum(self.numbers[self._slot(row, column)] for row in range(self.rows)))

    def latest(self, column: Column) -> float:
        return float(max(self.numbers[self._slot(row, column)] for row in range(self.rows)))

    def http_up(self) -> bool:
        """Does every HTTP process accept connections (the kernel may hand any of them the next one)?"""
        return all(self.numbers[self._slot(http_row(i), Column.UP)] for i in range(self.http_processes))

    def stalled_http(self, now: float, bound: float) -> list[int]:
        """The HTTP processes (indexes) that accept connections but whose event loop has not ticked for
        ``bound`` seconds (``now``: ``time.monotonic()``, one clock for every process of the machine)."""
        return [
            i
            for i in range(self.http_processes)
            if self.numbers[self._slot(http_row(i), Column.UP)]
            and now - self.numbers[self._slot(http_row(i), Column.BEAT)] > bound
        ]

    def pids(self) -> Iterator[tuple[int, int]]:
        """(row, pid) of every process that has registered."""
        for row in range(self.rows):
            pid = int(self.numbers[self._slot(row, Column.PID)])
            if pid:
                yield row, pid


def _initial_figures(numbers: Any) -> None:
    """A fresh view's figures: Pending since now, the unknown ones NaN."""
    numbers[Field.STATE] = float(_STATES.index(State.PENDING))
    numbers[Field.STATE_SINCE] = time.time()
    numbers[Field.SECONDS_PER_ITEM] = 0.01
    for unknown in (
        Field.LOAD_SECONDS,
        Field.WARMUP_SECONDS,
        Field.GPU_PEAK_RESERVED,
        Field.DOWNLOAD_TOTAL_BYTES,
        Field.CPU_THREADS,
        Field.BATCH_STARTED,
        Field.GENERATION_ENGINE,
        Field.KV_CACHE_TOKENS,
        Field.INTEROP_THREADS,
        Field.TOKENIZER_THREADS,
        Field.THREADS_FROM,
        Field.THREAD_CPUS,
        Field.SLEEP_FREED_BYTES,
        Field.WAKE_SECONDS,
    ):
        numbers[unknown] = float("nan")


def row_name(row: int) -> str:
    """How a row's process is called in metrics and logs."""
    if row == SUPERVISOR_ROW:
        return "supervisor"
    if row == INFERENCE_ROW:
        return "inference"
    return f"http-{row - 2}"


__all__ = [
    "BATCHING",
    "BEAT_PERIOD_S",
    "ENGINE_CODES",
    "ENGINE_NAMES",
    "INFERENCE_ROW",
    "PAGE_TOKENS",
    "SERIAL",
    "SPAWN",
    "SUPERVISOR_ROW",
    "Column",
    "Door",
    "Field",
    "SharedStateStore",
    "WorkerView",
    "http_row",
    "row_name",
]
