"""Prometheus metrics of one worker, whichever of its processes answers the scrape.

Counters and histograms are counted where things happen (the HTTP processes: requests, latency,
rejections; the inference process: batch sizes, compute time, dropped requests).  In a worker the
supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts the processes, so prometheus-client keeps
them in per-process files and every scrape adds them up (its multiprocess mode).  The gauges are read
at scrape time from the worker's shared view (``worker_view``): the real worker-wide queue depth, the
state, the memory of every process.  Without that variable (a test building the parts in one process)
everything lives in this object's own registry.

Names (all prefixed ``modelpool_``): ``queue_depth``, ``queue_capacity``, ``in_flight``,
``requests_total{route,code}``, ``rejected_total{reason}`` (overloaded, timeout, disconnected, not_ready,
too_large, invalid_input...), ``request_latency_seconds{route}``, ``batch_size``, ``compute_seconds``,
``worker_state{state}`` (1 for the current state), ``model_load_seconds``, ``model_warmup_seconds``,
``gpu_memory_bytes{kind=allocated|reserved|peak_reserved}``, ``dropped_total{reason}`` (admitted, then
dropped before compute: timeout, disconnected), ``resident_memory_bytes{process}`` (supervisor, inference,
http-N).  Text generation on the continuous-batching engine: ``time_to_first_token_seconds``,
``inter_token_latency_seconds``, ``generated_tokens_total`` (its rate is tokens per second),
``kv_cache_tokens``, ``kv_cache_reserved_tokens`` and ``generating`` (requests running).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from model_server.state_machine import State, StateMachine
from model_server.worker_view import Field, WorkerView, row_name

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)


def rss_bytes(pid: int | str = "self") -> int:
    """A process's resident set size (Linux /proc; 0 where unavailable or gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def worker_rss(view: WorkerView) -> dict[str, int]:
    """Resident memory of each process of the worker, by name."""
    return {row_name(row): rss_bytes(pid) for row, pid in view.pids()}


def _on(device: str | None) -> str | None:
    """The device torch's memory calls are asked about: ``cuda:<i>`` as named, else the current one."""
    return device if device is not None and device.startswith("cuda:") else None


def gpu_memory(device: str | None = None) -> tuple[int, int]:
    """(allocated, reserved) bytes on ``device`` when it is ``cuda:<i>`` (a model on GPU i of a shared
    host), else on the current CUDA device; (0, 0) when torch/CUDA is not in use.

    Never imports torch itself: until the model's load has imported it there is nothing to report."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0, 0
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return 0, 0
        on = _on(device)
        return int(torch.cuda.memory_allocated(on)), int(torch.cuda.memory_reserved(on))
    except Exception:  # a broken device must not break /metrics
        return 0, 0


def gpu_peak_reserved(device: str | None = None) -> int | None:
    """The most bytes the CUDA caching allocator has reserved on ``device`` (as ``gpu_memory``) since the
    process started (``torch.cuda.max_memory_reserved``): what the worker needed at its worst, e.g. during a
    large batch. None when torch/CUDA is not in use (a CPU worker has no accelerator memory to report)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.max_memory_reserved(_on(device)))
    except Exception:  # a broken device must not break /stats
        return None


class WorkerGauges(Collector):
    """The gauges, read from the shared view at scrape time."""

    def __init__(self, view: WorkerView, state_machine: StateMachine) -> None:
        self.view = view
        self.state_machine = state_machine

    def collect(self) -> Iterator[Metric]:
        view = self.view
        yield _gauge("modelpool_queue_depth", "Requests waiting in the queue", view.door.taken)
        yield _gauge("modelpool_queue_capacity", "Queue capacity (requests)", view.door.capacity)
        yield _gauge("modelpool_in_flight", "Requests being computed", view.get(Field.IN_FLIGHT))
        state = GaugeMetricFamily("modelpool_worker_state", "1 for the current state", labels=["state"])
        current = self.state_machine.state
        for each in State:
            state.add_metric([each.value], 1.0 if each is current else 0.0)
        yield state
        yield _gauge(
            "modelpool_model_load_seconds", "Time the model load took", view.optional(Field.LOAD_SECONDS)
        )
        yield _gauge(
            "modelpool_model_warmup_seconds",
            "Time the warm-up input took",
            view.optional(Field.WARMUP_SECONDS),
        )
        gpu = GaugeMetricFamily("modelpool_gpu_memory_bytes", "CUDA memory", labels=["kind"])
        gpu.add_metric(["allocated"], view.get(Field.GPU_ALLOCATED))
        gpu.add_metric(["reserved"], view.get(Field.GPU_RESERVED))
        gpu.add_metric(["peak_reserved"], view.optional(Field.GPU_PEAK_RESERVED) or 0.0)
        yield gpu
        yield _gauge(
            "modelpool_kv_cache_tokens",
            "The generation engine's KV cache (tokens)",
            view.optional(Field.KV_CACHE_TOKENS),
        )
        yield _gauge(
            "modelpool_kv_cache_reserved_tokens",
            "KV-cache tokens the running generations reserve",
            view.optional(Field.KV_CACHE_RESERVED),
        )
        yield _gauge(
            "modelpool_generating", "Generations running on the engine", view.optional(Field.GENERATING)
        )
        rss = GaugeMetricFamily(
            "modelpool_resident_memory_bytes", "Resident memory of each process", labels=["process"]
        )
        for name, resident in worker_rss(view).items():
            rss.add_metric([name], resident)
        yield rss


def _gauge(name: str, documentation: str, value: float | None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=0.0 if value is None else value)


class Metrics:
    """This process's counters and histograms, and the rendering of the whole worker's metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "modelpool_requests", "HTTP requests by route and status code", ["route", "code"], registry=r
        )
        self.rejected = Counter(
            "modelpool_rejected", "Requests not computed, by reason", ["reason"], registry=r
        )
        self.dropped = Counter(
            "modelpool_dropped", "Admitted requests dropped before compute, by reason", ["reason"], registry=r
        )
        self.latency = Histogram(
            "modelpool_request_latency_seconds",
            "Request latency",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.compute = Histogram(
            "modelpool_compute_seconds",
            "Time a batch spends on the inference thread (tokenize + forward + post-processing)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "modelpool_batch_size", "Items per forward pass", buckets=_BATCH_BUCKETS, registry=r
        )
        self.first_token = Histogram(
            "modelpool_time_to_first_token_seconds",
            "From a generation's arrival in the inference process (its queue included) to its first token",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "modelpool_inter_token_latency_seconds",
            "Between two tokens of one generation",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.generated_tokens = Counter(
            "modelpool_generated_tokens", "Tokens generated on the engine", registry=r
        )

    def render(self, gauges: WorkerGauges) -> bytes:
        """The text exposition of the worker: every process's counters and histograms, and the gauges."""
        return render_worker(gauges, os.environ.get(MULTIPROC_ENV), self.registry)


def render_worker(gauges: WorkerGauges, directory: str | None, own: CollectorRegistry | None = None) -> bytes:
    """The worker's exposition from any of its processes: the counters and histograms every process keeps
    in ``directory`` (the multiprocess files), else those of ``own`` (a worker built in one process),
    and the gauges.  The supervisor's probe port renders it with no counters of its own."""
    registry = CollectorRegistry()
    if directory:
        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    elif own is not None:
        registry.register(_Own(own))
    registry.register(gauges)
    return generate_latest(registry)


class _Own(Collector):
    """This process's registry as one collector (a worker built in one process)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        return iter(self.registry.collect())


__all__ = ["Metrics", "WorkerGauges", "gpu_memory", "render_worker", "rss_bytes", "worker_rss"]
