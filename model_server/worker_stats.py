"""The worker's health and ``/stats`` document, read from its shared memory (``worker_view``).

Both places that answer them use these functions: every HTTP process (on the serving port) and the
supervisor's probe server (``probe_server``, on the probe port).  Nothing here imports the web stack or
touches the model.
"""

from __future__ import annotations

import time
from typing import Any

from model_server.adapter_mask import mask_names
from model_server.config import ServerConfig
from model_server.metrics import worker_rss
from model_server.state_machine import StateMachine
from model_server.worker_view import ENGINE_NAMES, Column, Field, WorkerView
from modelpool_contract.stats import (
    THREAD_SOURCES,
    StatsDownload,
    StatsGeneration,
    StatsMemory,
    StatsModel,
    StatsThreads,
    WorkerStats,
)


def ready(state_machine: StateMachine, view: WorkerView) -> bool:
    """Readiness: the worker serves, and every HTTP process accepts connections (until then some of the
    connections the kernel hands out would wait for one still starting)."""
    return state_machine.serving and view.http_up()


def wedged_batch(started: float | None, now: float, request_timeout: float, grace: float) -> str:
    """Pure: why the forward pass that began at ``started`` (``time.monotonic()``; None: none runs)
    counts as wedged at ``now``, or '' while it does not.  No client of a batch waits longer than
    ``request_timeout`` (every deadline is capped by it, a streamed generation's too), so a batch still
    running ``grace`` seconds after that is stuck (in a kernel, a deadlock): nobody is waiting for it."""
    if started is None:
        return ""
    running = now - started
    if running <= request_timeout + grace:
        return ""
    return (
        f"inference wedged: batch running for {running:.0f} s, over the {request_timeout:g} s request"
        f" timeout + {grace:g} s grace"
    )


def inference_wedged(config: ServerConfig, view: WorkerView, now: float) -> str:
    """``wedged_batch`` for the batch the inference process runs now (``now``: ``time.monotonic()``)."""
    return wedged_batch(view.optional(Field.BATCH_STARTED), now, config.request_timeout, config.wedge_grace)


def liveness(state_machine: StateMachine, wedged: str = "") -> tuple[int, dict[str, Any]]:
    """``GET /v2/health/live``: status and body (``wedged``: why a process of the worker is stuck)."""
    ok = state_machine.live and not wedged
    body: dict[str, Any] = {"live": ok, "state": state_machine.state.value}
    if wedged:
        body["reason"] = wedged
    return (200 if ok else 503), body


def readiness(state_machine: StateMachine, view: WorkerView) -> tuple[int, dict[str, Any]]:
    """``GET /v2/health/ready``: status and body."""
    ok = ready(state_machine, view)
    return (200 if ok else 503), {"ready": ok, "state": state_machine.state.value}


def stats(config: ServerConfig, view: WorkerView, state_machine: StateMachine) -> dict[str, Any]:
    """The JSON the operator scrapes: ``modelpool_contract.stats.WorkerStats`` (docs/design.md), for the
    whole worker (every process's counters and memory)."""
    failed_to_load = view.flag(Field.LOAD_FAILED)
    last = view.latest(Column.LAST_REQUEST)
    return WorkerStats(
        state=state_machine.state.value,
        state_since=state_machine.since,
        reason=state_machine.reason,
        queue_depth=view.door.taken,
        queue_capacity=config.queue_capacity,
        in_flight=int(view.get(Field.IN_FLIGHT)),
        last_request_time=last or None,
        requests_total=view.total(Column.REQUESTS),
        rejected_total=view.total(Column.REJECTED),
        errors_total=view.total(Column.ERRORS),
        load_error=state_machine.reason if failed_to_load else None,
        load_progress=view.get(Field.LOAD_PROGRESS),
        load_seconds=view.optional(Field.LOAD_SECONDS),
        warmup_seconds=view.optional(Field.WARMUP_SECONDS),
        cpu_threads=_count(view.optional(Field.CPU_THREADS)),
        threads=_threads(view),
        download=_download(config, view),
        memory=StatsMemory(
            rss_bytes=sum(worker_rss(view).values()),
            gpu_allocated_bytes=int(view.get(Field.GPU_ALLOCATED)),
            gpu_reserved_bytes=int(view.get(Field.GPU_RESERVED)),
            gpu_peak_reserved_bytes=_count(view.optional(Field.GPU_PEAK_RESERVED)),
        ),
        model=StatsModel(name=config.served_name, task=config.task, source=config.model),
        generation=_generation(view, list(config.adapters)),
        time=time.time(),
    ).wire()


def _generation(view: WorkerView, adapters: list[str]) -> StatsGeneration | None:
    """The generation engine's figures (None: not loaded, or a task that generates no text), and the
    LoRA adapters in memory (None: none declared)."""
    code = view.optional(Field.GENERATION_ENGINE)
    if code is None:
        return None
    batching = view.optional(Field.KV_CACHE_TOKENS) is not None
    return StatsGeneration(
        engine=ENGINE_NAMES.get(code),
        kv_cache_tokens=_count(view.optional(Field.KV_CACHE_TOKENS)),
        kv_cache_reserved_tokens=int(view.get(Field.KV_CACHE_RESERVED)) if batching else None,
        running=int(view.get(Field.GENERATING)) if batching else None,
        adapters=tuple(mask_names(adapters, view.get(Field.ADAPTERS_LOADED))) if adapters else None,
    )


def _download(config: ServerConfig, view: WorkerView) -> StatsDownload | None:
    """An hf:// source's download progress (the inference process measures it), else None."""
    if not config.model.startswith("hf://"):
        return None
    return StatsDownload(
        downloaded_bytes=int(view.get(Field.DOWNLOADED_BYTES)),
        total_bytes=_count(view.optional(Field.DOWNLOAD_TOTAL_BYTES)),
    )


def _threads(view: WorkerView) -> StatsThreads:
    """The model's threads and what they were sized from (the inference process publishes them)."""
    source = view.optional(Field.THREADS_FROM)
    return StatsThreads(
        intra_op=_count(view.optional(Field.CPU_THREADS)),
        inter_op=_count(view.optional(Field.INTEROP_THREADS)),
        tokenizer=_count(view.optional(Field.TOKENIZER_THREADS)),
        sized_from=None if source is None else THREAD_SOURCES[int(source)],
        cpus=view.optional(Field.THREAD_CPUS),
    )


def _count(value: float | None) -> int | None:
    """A count read from the view (None: not known)."""
    return None if value is None else int(value)


__all__ = ["inference_wedged", "liveness", "readiness", "ready", "stats", "wedged_batch"]
