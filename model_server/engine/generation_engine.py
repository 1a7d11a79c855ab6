"""The generation engine: iteration-level scheduling of text-generation requests on transformers'
continuous batching (``model.init_continuous_batching``), with admission in KV-cache tokens.

Chosen once per model at load (``attach``): a causal LM of a family the manager serves (the load probes
it: two greedy tokens of the warm-up prompt must equal ``generate``'s), loaded without remote code, with
``--generation-engine auto|batching``.  Everything else (vision, remote-code models, families the
manager refuses, ``--generation-engine serial``) keeps the serial path: one ``model.generate`` at a time
on the inference thread.  ``/stats`` names the engine (``generation.engine``).

How a request flows: the data plane hands each admitted ``Unit`` to ``BatchingEngine.submit`` on the
inference process's event loop and at once goes on to the next; the engine renders and tokenizes each
item, checks it (``admit``) and adds it to the manager, whose own thread runs the model: every iteration
takes the running requests one token further and prefills new ones.  Every request streams: its new
tokens come back through the manager's output queue, which a reader thread hands to the event loop; the
engine decodes the new tokens incrementally (``Detokenizer``: a window, never the whole completion
again), feeds ``StopText`` (stop strings, held-back tails) and emits what it
releases.  A stop string, ``max_tokens``, end of sequence, a disconnected client or a passed deadline
ends the request: the engine cancels it in the manager, which frees its slot and KV blocks at its next
iteration.

Admission in tokens (the manager's sharp edges made impossible): each request reserves prompt +
``max_tokens`` rounded up to whole cache pages, so the manager never runs out of blocks mid-generation
(it would fail every request in flight).  One that could never fit the cache (``--kv-cache-tokens``) is
400 with the numbers; one that does not fit beside the running ones is 429 with Retry-After.  A cancelled
request's reservation is released only once the manager has dropped it (its blocks are free then).

Prefix sharing (``--prefix-sharing``, on by default; ``prefix_cache.py``): the manager keeps the full
blocks of 32 tokens a request computed, hashed by their tokens, and a later request whose prompt starts
with them takes them instead of prefilling them again (a shared system prompt is computed once).  The
admission above stays exact: a request's blocks, shared or not, are at most its reservation, and blocks
kept for reuse that nobody references count as free (evicted, least recently released first, when a
request needs the room).  Off for a model with LoRA adapters (blocks are hashed on tokens alone, so one
adapter's prefix would be reused for another).

Per request: ``max_tokens``, ``stop``, ``temperature`` (0 is greedy: the lowest temperature and a
``top_p`` of 0 keep only the most likely token, as ``generate``'s greedy search does), ``top_p``.
Global (the manager's): sampling itself and its random generator, so ``seed`` is refused with 400 by
this engine (use temperature 0 for reproducible output, or ``--generation-engine serial``); the model's
own generation-config processors (repetition penalty, top-k...) are not applied.

The supervisor's wedge watch (``Field.BATCH_STARTED``, as for a serial batch): while any generation
runs it holds the time of the manager's last output batch (set at the first admission, refreshed by each
batch; NaN when nothing runs), so a loop stuck in a kernel or a deadlock for longer than
--request-timeout + --wedge-grace fails the worker (InferenceWedged).

If the manager's loop stops on an error anyway, every request in it fails with 500 and the loop is
started again; a fatal device error fails the worker (exit 4).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from model_server.engine.adapters import BASE, AdapterBank
from model_server.engine.prefix_cache import PrefixCache
from model_server.errors import InferenceError, InvalidInput, Overloaded, ServerError, is_fatal_device_error
from model_server.tasks.base import Emitter, GenerationItem, GenerationParams, GenerationResult
from model_server.tasks.generation import Detokenizer, StopText, check_context, eos_ids
from model_server.tasks.params import check_generation_params
from model_server.worker_view import BATCHING, PAGE_TOKENS, SERIAL, Field, WorkerView
from modelpool_contract import logs

if TYPE_CHECKING:
    from model_server.engine.unit import Unit
    from model_server.metrics import Metrics

log = logging.getLogger("modelpool.generation")


@contextlib.contextmanager
def _about(unit: Unit) -> Iterator[None]:
    """Lines logged inside carry ``unit``'s request id and trace id (``modelpool_contract.logs``)."""
    reset = logs.bind(*unit.ids)
    try:
        yield
    finally:
        reset()


EngineChoice = Literal["auto", "batching", "serial"]
ENGINE_CHOICES: tuple[EngineChoice, ...] = ("auto", "batching", "serial")

# Tokens one iteration may process (prefill chunks beyond this are split over iterations).
MAX_BATCH_TOKENS = 1024
# Greedy through a sampling manager: this temperature and a top_p of 0 keep only the most likely token.
GREEDY_TEMPERATURE = 1e-5
# The CPU default of --kv-cache-tokens: this share of the memory the pod's limit leaves beside the model.
CPU_CACHE_SHARE = 0.25
# On an accelerator: this share of the memory left free after the weights.
GPU_CACHE_SHARE = 0.5
# Without a memory limit: enough for this many requests using the whole context window.
UNLIMITED_CONTEXTS = 16
# How long the load's probe may wait for its two tokens.
PROBE_TIMEOUT_S = 60.0
# How often the reader thread wakes to see whether the manager's loop is still running.
READER_POLL_S = 0.1

Done = Callable[["Unit", "list[GenerationResult] | ServerError | None"], None]
# An item rendered and tokenized: the item, and its prompt's token ids and their count.
_Prepared = tuple[GenerationItem, tuple[list[int], int]]


# ---- pure decisions ---------------------------------------------------------------------------------


def pages(tokens: int, page: int = PAGE_TOKENS) -> int:
    """Pure: the whole cache pages ``tokens`` tokens occupy."""
    return -(-tokens // page)


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Pure: bytes of K and V one token takes in every layer of the model described by ``config``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def number(*names: str, default: int) -> int:
        for name in names:
            value = getattr(text, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return default

    layers = number("num_hidden_layers", "n_layer", default=1)
    heads = number("num_attention_heads", "n_head", default=1)
    kv_heads = number("num_key_value_heads", default=heads)
    head_dim = number("head_dim", default=number("hidden_size", "n_embd", default=heads) // heads)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def default_kv_cache_tokens(
    *, bytes_per_token: int, context: int | None, budget_bytes: int | None, share: float
) -> int:
    """Pure: the cache size in tokens when ``--kv-cache-tokens`` is not given.  ``budget_bytes`` is the
    memory left beside the model (the pod's limit on a CPU, the accelerator's free memory on a GPU;
    None: no limit known); never less than one page, never more than ``UNLIMITED_CONTEXTS`` windows."""
    ceiling = UNLIMITED_CONTEXTS * (context or 2048)
    if budget_bytes is None:
        return ceiling
    return max(PAGE_TOKENS, min(ceiling, int(budget_bytes * share) // max(1, bytes_per_token)))


def admission_error(
    requests: Sequence[tuple[int, int]], *, capacity: int, reserved: int, retry_after_s: int
) -> ServerError | None:
    """Pure: why a request of generations (prompt tokens, ``max_tokens``) cannot start now (None: it can).
    400 when it could never fit the cache, 429 when the running requests' reservations leave too little.
    Each generation holds whole pages."""
    prompt_tokens, max_tokens = sum(p for p, _ in requests), sum(m for _, m in requests)
    need = sum(pages(p + m) * PAGE_TOKENS for p, m in requests)
    if need > capacity:
        return InvalidInput(
            f"this request needs {prompt_tokens + max_tokens} tokens of KV cache ({prompt_tokens} in the "
            f"prompt + {max_tokens} max_tokens, {need} in whole pages of {PAGE_TOKENS}) but the whole cache "
            f"holds {capacity} (--kv-cache-tokens); shorten the prompt or lower max_tokens"
        )
    if reserved + need > capacity:
        return Overloaded(
            f"KV cache full: running generations hold {reserved} of {capacity} tokens and this request "
            f"needs {need}",
            retry_after_s,
        )
    return None


def sampling(params: GenerationParams) -> dict[str, float]:
    """Pure: the manager's per-request processor arguments for ``params`` (temperature 0 is greedy)."""
    if params.temperature == 0.0:
        return {"temperature": GREEDY_TEMPERATURE, "top_p": 0.0}
    return {"temperature": float(params.temperature), "top_p": float(params.top_p)}


def refusal(params: GenerationParams) -> InvalidInput | None:
    """Pure: what this engine cannot honour per request, answered 400 with the reason."""
    if params.seed is not None and params.temperature > 0.0:  # greedy needs no random generator
        return InvalidInput(
            "seed is not supported by this model's continuous-batching engine (its random generator is "
            "shared by every request in the batch); omit seed, or use temperature 0 for reproducible output"
        )
    return None


def finish_reason(
    ids: Sequence[int], max_tokens: int, eos: set[int], stopped: bool
) -> Literal["stop", "length"]:
    """Pure: OpenAI's finish reason of a completion of ``ids`` (``stopped``: a stop string ended it)."""
    ended_on_eos = bool(ids) and ids[-1] in eos
    return "length" if len(ids) >= max_tokens and not stopped and not ended_on_eos else "stop"


def cgroup_memory_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The pod's memory limit in bytes from cgroup v2 (``memory.max``) or v1; None when unlimited."""
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (root / name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes a huge number for "no limit"
            return int(text)
        return None
    return None


def resident_bytes() -> int:
    """This process's resident memory (the model's weights among it)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# ---- the engine ---------------------------------------------------------------------------------------


class GenerativeModel(Protocol):
    """What ``attach`` needs of the text-generation task."""

    _model: Any
    _tokenizer: Any
    _context: int | None
    adapters: Any

    def render(self, item: GenerationItem) -> tuple[str, bool]: ...


@dataclass(eq=False)
class _Job:
    """One item of a unit, running in the manager as request ``rid``."""

    unit: Unit
    index: int
    rid: str
    reserved: int
    max_tokens: int
    prompt_tokens: int
    emit: Emitter | None
    text: StopText
    detokenizer: Detokenizer
    adapter: str | None = None  # its LoRA adapter, pinned in the bank while the manager holds it
    last_token: float | None = None  # when its last token arrived

    @property
    def ids(self) -> list[int]:
        """The completion's token ids so far."""
        return self.detokenizer.ids


@dataclass(eq=False)
class _Running:
    """A unit in the engine: its jobs still running and the results of those done."""

    unit: Unit
    done: Done
    jobs: list[_Job]
    results: list[GenerationResult | None]


class BatchingEngine:
    """Continuous batching over one model (see the module docstring).  ``submit`` and ``abandon`` run on
    the inference process's event loop, and so does every output (the reader thread hands them over)."""

    name = BATCHING

    def __init__(
        self,
        task: GenerativeModel,
        manager: Any,
        capacity: int,
        on_fatal: Callable[[str], None],
        prefix: PrefixCache | None = None,
    ):
        self._task = task
        self._tokenizer = task._tokenizer
        self._manager = manager
        self.capacity = capacity
        self._on_fatal = on_fatal
        self._eos = eos_ids(task._model, task._tokenizer)
        self._jobs: dict[str, _Job] = {}
        self._units: dict[int, _Running] = {}
        self._cancelling: dict[str, int] = {}  # cancelled in the manager, not yet dropped by it
        self.reserved = 0
        self._ids = 0
        self._loop: Any = None
        self._reader: threading.Thread | None = None
        self._closing = threading.Event()
        self._seconds_per_token = 0.01  # EWMA of the time between a request's tokens (Retry-After)
        self.metrics: Metrics | None = None  # where time to first token and inter-token latency go
        # Where the supervisor's wedge watch looks (``Field.BATCH_STARTED``); set by the data plane.
        self.view: WorkerView | None = None
        self._last_output = time.monotonic()
        self._adapters: AdapterBank | None = task.adapters
        self._adapter_of: dict[str, str] = {}  # request id -> its adapter (read by the manager's thread)
        self._loading: set[Any] = set()  # units waiting for their adapters to load
        self.prefix = prefix  # prefix sharing's hooks on the manager's cache (None: sharing off)
        if self._adapters is not None:
            self._adapters.batch_names = self._batch_adapters

    # ---- figures -----------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Requests (items) generating now."""
        return len(self._jobs)

    def tables(self) -> dict[str, int]:
        """The sizes of every table that holds a request, the engine's and the manager's, and the cache's
        free capacity: all back to their idle values once nothing runs (tests compare them)."""
        processor = self._manager.batch_processor
        scheduler = processor.scheduler if processor is not None else None
        cache = processor.cache if processor is not None else None
        return {
            "jobs": len(self._jobs),
            "units": len(self._units),
            "cancelling": len(self._cancelling),
            "reserved": self.reserved,
            "active": len(scheduler.active_requests) if scheduler else 0,
            "waiting": len(scheduler.waiting_requests) if scheduler else 0,
            "waiting_order": len(scheduler.waiting_requests_order) if scheduler else 0,
            "to_cancel": len(scheduler._requests_to_cancel) if scheduler else 0,
            # Blocks kept for a prefix count as free (``PrefixCache``): nobody holds them.
            "free_cache_bytes": int(cache.compute_free_capacity(relative=False)) if cache else 0,
            "block_tables": sum(len(a.block_table) for a in cache.cache_allocators.values()) if cache else 0,
            "outputs_queued": self._manager.output_router.output_queue.qsize(),
            "handlers": len(self._manager.output_router.result_handlers),
        }

    # ---- requests in ---------------------------------------------------------------------------------

    def submit(self, unit: Unit, done: Done) -> None:
        """Start every item of ``unit``, or answer it at once (400, 429) through ``done``."""
        import asyncio

        self._bind(asyncio.get_running_loop())
        try:
            prepared = [self._prepare(item) for item in unit.items]
        except ServerError as exc:
            done(unit, exc)
            return
        except Exception as exc:  # a tokenizer's or template's bug fails this request alone
            with _about(unit):
                log.exception("cannot prepare a generation")
            done(unit, InferenceError(f"the request could not be prepared: {type(exc).__name__}: {exc}"))
            return
        error = self._admission(prepared)
        if error is not None:
            done(unit, error)
            return
        missing = self._pin(prepared)
        if missing:  # loaded off the event loop, then started (or answered)
            task = asyncio.ensure_future(self._load_then_start(unit, done, prepared, missing))
            self._loading.add(task)  # held until done: the loop keeps only weak references to tasks
            task.add_done_callback(self._loading.discard)
            return
        self._start(unit, done, prepared)

    def _admission(self, prepared: list[_Prepared]) -> ServerError | None:
        return admission_error(
            [(count, item.params.max_tokens) for item, (_, count) in prepared],
            capacity=self.capacity,
            reserved=self.reserved,
            retry_after_s=self._retry_after(),
        )

    def _pin(self, prepared: list[_Prepared]) -> list[str]:
        """Pin each item's loaded adapter; the adapters not loaded (each once), which are not pinned."""
        missing: list[str] = []
        for item, _ in prepared:
            name = item.adapter
            if name is None:
                continue
            if self._adapters is None:
                raise AssertionError("an adapter request reached a model without adapters")
            if name in missing or not self._adapters.acquire(name):
                missing.append(name)
        return missing

    async def _load_then_start(
        self, unit: Unit, done: Done, prepared: list[_Prepared], missing: list[str]
    ) -> None:
        """Load the adapters ``missing`` (each pinned once per item that needs it), then start the unit,
        unless its client left meanwhile or the cache no longer has room (429)."""
        assert self._adapters is not None
        pinned = [n for item, _ in prepared if (n := item.adapter) is not None and n not in missing]
        try:
            for name in missing:
                for item, _ in prepared:
                    if item.adapter == name:
                        await self._adapters.ensure_async(name)
                        pinned.append(name)
            gone = unit.abandoned is not None or unit.deadline <= time.monotonic()
            error = None if gone else self._admission(prepared)
        except ServerError as exc:
            gone, error = False, exc
        except Exception as exc:  # an adapter that cannot be read fails this request alone
            log.exception("cannot load an adapter")
            gone, error = (
                False,
                InferenceError(f"the adapter could not be loaded: {type(exc).__name__}: {exc}"),
            )
        if gone or error is not None:
            for name in pinned:
                self._adapters.release(name)
            done(unit, None if gone else error)
            return
        self._start(unit, done, prepared)

    def _start(self, unit: Unit, done: Done, prepared: list[_Prepared]) -> None:
        """Add every item of an admitted unit (its adapters pinned) to the manager."""
        running = _Running(unit, done, [], [None] * len(unit.items))
        self._units[id(unit)] = running
        idle = not self._jobs
        emit = unit.emit if len(unit.items) == 1 else None
        for index, (item, (ids, count)) in enumerate(prepared):
            self._ids += 1
            job = _Job(
                unit, index, f"u{self._ids}", pages(count + item.params.max_tokens) * PAGE_TOKENS,
                item.params.max_tokens, count, emit, StopText(item.params.stop), Detokenizer(self._tokenizer),
            )  # fmt: skip
            job.adapter = item.adapter
            if item.adapter is not None:
                self._adapter_of[job.rid] = item.adapter
            self._jobs[job.rid] = job
            running.jobs.append(job)
            self.reserved += job.reserved
            self._manager.add_request(
                ids,
                request_id=job.rid,
                max_new_tokens=item.params.max_tokens,
                streaming=True,
                eos_token_id=sorted(self._eos) or None,
                **sampling(item.params),
            )
        if idle:  # the loop has work from now on: the wedge watch starts counting (outputs refresh it)
            self._progress(time.monotonic())
        if emit is not None:
            emit("")  # no text: the route may send its headers (the request is admitted)

    def _batch_adapters(self) -> list[str]:
        """The adapter of each request in the batch being computed (on the manager's thread, before the
        forward pass: ``AdapterBank`` turns them into one name per token)."""
        states = self._manager.batch_processor.inputs_and_outputs.requests_in_batch
        return [self._adapter_of.get(state.state.request_id, BASE) for state in states]

    def _release(self, rid: str) -> None:
        """The manager no longer holds request ``rid``: its adapter's pin goes."""
        if self.prefix is not None:
            self.prefix.hits.pop(rid, None)
        name = self._adapter_of.pop(rid, None)
        if name is not None and self._adapters is not None:
            self._adapters.release(name)

    def _prepare(self, item: GenerationItem) -> _Prepared:
        """Validate, render and tokenize one item (400 for what this engine cannot serve)."""
        check_generation_params(item.params)
        refused = refusal(item.params)
        if refused is not None:
            raise refused
        text, templated = self._task.render(item)
        if not text.strip():
            raise InvalidInput("the prompt is empty")
        ids = [int(i) for i in self._tokenizer(text, add_special_tokens=not templated)["input_ids"]]
        check_context(len(ids), item.params.max_tokens, self._task._context)
        return item, (ids, len(ids))

    def abandon(self, unit: Unit) -> None:
        """The client's side gave up (disconnected, deadline): stop its generations now."""
        running = self._units.get(id(unit))
        if running is not None:
            self._end_unit(running, None)

    # ---- outputs -------------------------------------------------------------------------------------

    def _bind(self, loop: Any) -> None:
        if self._loop is None:
            self._loop = loop
            self._reader = threading.Thread(target=self._read, name="generation-outputs", daemon=True)
            self._reader.start()

    def _read(self) -> None:
        """The reader thread: hand the manager's outputs to the event loop, a batch per hop; restart the
        manager's loop if it stopped on an error."""
        outputs = self._manager.output_router.output_queue
        while not self._closing.is_set():
            try:
                batch = [outputs.get(timeout=READER_POLL_S)]
            except queue.Empty:
                if not self._manager.is_running() and not self._closing.is_set():
                    try:
                        self._loop.call_soon_threadsafe(self._loop_stopped)
                    except RuntimeError:  # the event loop is closed: the process is ending
                        return
                    self._closing.wait(READER_POLL_S)
                continue
            while True:
                try:
                    batch.append(outputs.get_nowait())
                except queue.Empty:
                    break
            try:
                self._loop.call_soon_threadsafe(self._on_outputs, batch)
            except RuntimeError:  # the event loop is closed: the process is ending
                return

    def _on_outputs(self, outputs: list[Any]) -> None:
        now = time.monotonic()
        if self._jobs:
            gap = (now - self._last_output) / max(1, len(outputs))
            self._seconds_per_token = 0.8 * self._seconds_per_token + 0.2 * min(gap * len(self._jobs), 10.0)
        self._last_output = now
        for output in outputs:
            job = self._jobs.get(output.request_id)
            if job is None:
                continue  # ended already (cancelled, failed): its late tokens go nowhere
            try:
                self._on_output(job, output, now)
            except Exception as exc:  # a decoding bug fails this request alone
                with _about(job.unit):
                    log.exception("a generation's output failed")
                running = self._units.get(id(job.unit))
                if running is not None:
                    self._end_unit(running, InferenceError(f"generation failed: {type(exc).__name__}: {exc}"))
        self._confirm_cancels()
        self._progress(now)

    def _progress(self, now: float) -> None:
        """Tell the supervisor's wedge watch that the manager's loop is alive: ``BATCH_STARTED`` is when
        it last produced an iteration's tokens (``now``) while any generation runs, NaN when none runs.
        A loop stuck in a kernel or a deadlock produces nothing, so the time stands still and, past
        --request-timeout + --wedge-grace, the supervisor fails the worker (as for a serial batch)."""
        if self.view is not None:
            self.view.set(Field.BATCH_STARTED, now if self._jobs else math.nan)

    def _on_output(self, job: _Job, output: Any, now: float) -> None:
        from transformers.generation.continuous_batching.requests import RequestStatus

        running = self._units[id(job.unit)]
        if job.unit.abandoned is not None or job.unit.deadline <= now:
            self._end_unit(running, None)
            return
        if output.status == RequestStatus.FAILED:
            self._end_unit(running, InferenceError(f"generation failed: {output.error}"))
            return
        tokens = output.generated_tokens
        new = len(tokens) - len(job.ids)
        if new > 0:
            job.ids.extend(int(t) for t in tokens[len(tokens) - new :])
            self._observe(job, new, now)
        finished = output.status == RequestStatus.FINISHED
        if not finished and job.emit is None and not job.text.stops:
            return  # nothing to stream or watch for: decode once, at the end
        piece = job.text.push(job.detokenizer.text(final=finished), final=finished)
        if piece and job.emit is not None:
            job.emit(piece)
        if finished or job.text.stopped:
            self._finish_job(running, job, cancel=not finished)

    def _observe(self, job: _Job, new: int, now: float) -> None:
        """Time to first token (from the request's arrival, so its wait in the queue counts, as a client
        sees it), inter-token latency (the gap shared by the tokens that arrived together)."""
        metrics = self.metrics
        if metrics is None:
            return
        if job.last_token is None:
            metrics.first_token.observe(now - job.unit.arrived)
            metrics.prompt_tokens.inc(job.prompt_tokens)
            if self.prefix is not None:  # the prefill is over: its match is known
                metrics.prefix_hit_tokens.inc(self.prefix.hits.pop(job.rid, 0))
        else:
            gap = (now - job.last_token) / new
            for _ in range(new):
                metrics.inter_token.observe(gap)
        job.last_token = now
        metrics.generated_tokens.inc(new)

    def _finish_job(self, running: _Running, job: _Job, *, cancel: bool) -> None:
        self._drop_job(job, cancel)
        running.results[job.index] = GenerationResult(
            text=job.text.sent,
            finish_reason=finish_reason(job.ids, job.max_tokens, self._eos, job.text.stopped),
            prompt_tokens=job.prompt_tokens,
            completion_tokens=len(job.ids),
        )
        running.jobs.remove(job)
        if not running.jobs:
            del self._units[id(running.unit)]
            # After the pieces just emitted: those go out through call_soon_threadsafe, in this order.
            self._loop.call_soon(running.done, running.unit, [r for r in running.results if r is not None])

    def _end_unit(self, running: _Running, outcome: ServerError | None) -> None:
        """Stop every job of a unit and answer it with ``outcome`` (None: nobody waits for it)."""
        for job in running.jobs:
            self._drop_job(job, cancel=True)
        running.jobs.clear()
        self._units.pop(id(running.unit), None)
        self._loop.call_soon(running.done, running.unit, outcome)

    def _drop_job(self, job: _Job, cancel: bool) -> None:
        """The job leaves; a job the manager still runs is cancelled there and keeps its reservation until
        the manager has dropped it (its KV blocks are free only then)."""
        if self._jobs.pop(job.rid, None) is None:
            return  # left already
        if not self._jobs:
            self._progress(math.nan)  # nothing runs: nothing to watch
        if cancel:
            self._manager.cancel_request(job.rid)
            self._cancelling[job.rid] = job.reserved
            self._loop.call_later(0.005, self._confirm_cancels)
        else:
            self.reserved -= job.reserved
            self._release(job.rid)

    def _confirm_cancels(self) -> None:
        """Release the reservations of cancelled requests the manager no longer holds."""
        processor = self._manager.batch_processor
        if not self._cancelling or processor is None:
            return
        scheduler = processor.scheduler
        for rid in list(self._cancelling):
            held = (
                rid in scheduler.active_requests
                or rid in scheduler.waiting_requests
                or rid in scheduler._requests_to_cancel
                or any(state.request_id == rid for state in list(self._manager.input_queue.queue))
            )
            if not held:
                self.reserved -= self._cancelling.pop(rid)
                self._release(rid)
        if self._cancelling:
            self._loop.call_later(0.005, self._confirm_cancels)

    def _retry_after(self) -> int:
        """Seconds until the request closest to its end has generated what is left of its max_tokens."""
        left = [job.max_tokens - len(job.ids) for job in self._jobs.values()]
        return max(1, math.ceil(min(left, default=1) * self._seconds_per_token))

    def _loop_stopped(self) -> None:
        """The manager's loop ended on an error: fail what ran in it, then start it again (or fail the
        worker on a fatal device error)."""
        if self._closing.is_set() or self._manager.is_running():
            return

        error = self._manager.background_thread_status.fatal_error
        reason = f"the generation loop stopped: {type(error).__name__}: {error}"
        log.error("%s", reason)
        for running in list(self._units.values()):
            self._end_unit(running, InferenceError(reason))
        for rid in self._cancelling:
            self._release(rid)
        self._cancelling.clear()
        self.reserved = 0
        if error is not None and is_fatal_device_error(error):
            self._closing.set()
            self._on_fatal(reason)
            return
        self._manager.start()

    def close(self) -> None:
        self._closing.set()
        if self._manager.is_running():
            self._manager.stop(block=True, timeout=5.0, hard_stop=True)


# ---- choosing the engine at load ------------------------------------------------------------------


def kv_cache_tokens(task: GenerativeModel, device: str, given: int | None) -> int:
    """``--kv-cache-tokens``, else the default for the device (see ``default_kv_cache_tokens``)."""
    if given is not None:
        return given
    model = task._model
    per_token = kv_bytes_per_token(model.config, model.dtype.itemsize)
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return default_kv_cache_tokens(
            bytes_per_token=per_token, context=task._context, budget_bytes=free, share=GPU_CACHE_SHARE
        )
    limit = cgroup_memory_limit()
    budget = None if limit is None else max(0, limit - resident_bytes())
    return default_kv_cache_tokens(
        bytes_per_token=per_token, context=task._context, budget_bytes=budget, share=CPU_CACHE_SHARE
    )


def attach(
    task: Any,
    *,
    choice: EngineChoice,
    device: str,
    trust_remote_code: bool,
    kv_tokens: int | None,
    on_fatal: Callable[[str], None],
    prefix_sharing: bool = True,
) -> BatchingEngine | None:
    """The batching engine for a loaded task when it can serve the model (on the inference thread, after
    the warm-up), else None (the serial path).  ``choice`` ``batching`` makes a refusal a load failure;
    ``prefix_sharing`` (``--prefix-sharing``) reuses prompts' cached prefixes, except with adapters."""
    from model_server.tasks.text_generation import TextGenerationTask

    if choice == "serial" or not isinstance(task, TextGenerationTask):
        return None
    why = None if not trust_remote_code else "the model runs remote code"
    engine = None
    if why is None:
        try:
            sharing = prefix_sharing and task.adapters is None
            if prefix_sharing and not sharing:
                log.info("generation: prefix sharing off: blocks are hashed on tokens, not on the adapter")
            engine = _start(task, device, kv_cache_tokens(task, device, kv_tokens), on_fatal, sharing)
        except Exception as exc:  # a family the manager refuses: the serial path serves it
            why = f"{type(exc).__name__}: {exc}"
    if engine is not None:
        return engine
    if choice == "batching":
        raise RuntimeError(f"--generation-engine batching: the model cannot use it ({why})")
    log.info("generation: the serial engine serves this model (%s)", why)
    return None


def _start(
    task: Any, device: str, capacity: int, on_fatal: Callable[[str], None], sharing: bool
) -> BatchingEngine:
    """Create and start the manager, then probe it: two greedy tokens must equal ``generate``'s.  With
    ``sharing``, the cache gets prefix sharing's hooks once the probe has made it."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model, tokenizer = task._model, task._tokenizer
    pad = model.generation_config.pad_token_id
    eos = sorted(eos_ids(model, tokenizer))
    # Any temperature and top_p other than 1 make the manager build their per-request processors.
    generation = GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=True,
        temperature=0.5,
        top_p=0.5,
        top_k=None,
        pad_token_id=pad,
        eos_token_id=eos or -1,
        max_new_tokens=16,
    )
    config = ContinuousBatchingConfig(
        page_size=PAGE_TOKENS,
        num_blocks=pages(capacity),
        max_batch_tokens=MAX_BATCH_TOKENS,
        per_request_processors=True,
        # On: full blocks are hashed and kept for the next request with the same prefix (PrefixCache).
        # Off: a finished request's blocks go back to the free pool at once.
        allow_block_sharing=sharing,
        use_async_batching=False,  # a cancelled request leaves between two iterations, never during one
        # A graph would replay the first batch's adapter assignment (Python hooks do not run in a replay).
        use_cuda_graph=False if not device.startswith("cuda") or task.adapters is not None else None,
    )
    ids = [int(i) for i in tokenizer("Hello")["input_ids"]] or [0]
    with torch.inference_mode():
        want = model.generate(
            torch.tensor([ids], device=model.device),
            attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=model.device),
            max_new_tokens=2,
            min_new_tokens=2,
            do_sample=False,
        )[0, len(ids) :].tolist()
    manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=config)
    if set(manager.logit_processor.supported_keys) != {"temperature", "top_p"}:
        raise RuntimeError("the manager cannot set temperature and top_p per request")
    with torch.inference_mode():
        manager.start()
        try:
            _probe(manager, ids, want)
        except Exception:
            manager.stop(block=True, timeout=5.0, hard_stop=True)
            raise
    # The probe's batch made the cache; the manager keeps that cache across a restart of its loop.
    cache = manager.batch_processor.cache
    prefix = PrefixCache.install(cache) if cache.use_prefix_sharing else None
    log.info(
        "generation: continuous batching, KV cache %d tokens in pages of %d, prefix sharing %s",
        capacity,
        PAGE_TOKENS,
        "on" if prefix is not None else "off",
    )
    return BatchingEngine(task, manager, pages(capacity) * PAGE_TOKENS, on_fatal, prefix)


def _probe(manager: Any, ids: list[int], want: list[int]) -> None:
    """The manager's two greedy tokens of ``ids`` must be ``want`` (``generate``'s)."""
    params = sampling(GenerationParams(temperature=0.0))
    manager.add_request(ids, request_id="probe", max_new_tokens=2, eos_token_id=-1, **params)
    output = manager.get_result(request_id="probe", timeout=PROBE_TIMEOUT_S)
    got = None if output is None else [int(t) for t in output.generated_tokens]
    if got != want:
        raise RuntimeError(f"its greedy tokens {got} differ from generate's {want}")


def engine_name(task: Any, engine: BatchingEngine | None) -> str | None:
    """The engine serving a loaded task's generations (None: a task that generates no text)."""
    if engine is not None:
        return engine.name
    from model_server.tasks.generation import GenerativeTask

    return SERIAL if isinstance(task, GenerativeTask) else None


__all__ = [
    "BATCHING",
    "ENGINE_CHOICES",
    "PAGE_TOKENS",
    "SERIAL",
    "BatchingEngine",
    "admission_error",
    "attach",
    "default_kv_cache_tokens",
    "engine_name",
    "finish_reason",
    "sampling",
]
