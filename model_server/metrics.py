"""Prometheus metrics of one server (its own registry, so tests can start several in one process).

Names (all prefixed ``modelpool_``): ``queue_depth``, ``queue_capacity``, ``in_flight``,
``requests_total{route,code}``, ``rejected_total{reason}`` (overloaded, timeout, disconnected, not_ready,
too_large, invalid_input...), ``request_latency_seconds{route}``, ``batch_size``, ``worker_state{state}``
(1 for the current state), ``model_load_seconds``,
``gpu_memory_bytes{kind=allocated|reserved|peak_reserved}``, ``dropped_total{reason}`` (admitted, then
dropped before compute: timeout, disconnected), ``process_resident_memory_bytes`` (from
prometheus-client's process collector).
"""

from __future__ import annotations

import os
import sys

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.process_collector import ProcessCollector

from model_server.state_machine import State

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def gpu_memory() -> tuple[int, int]:
    """(allocated, reserved) bytes on the current CUDA device; (0, 0) when torch/CUDA is not in use.

    Never imports torch itself: until the model's load has imported it there is nothing to report."""
    torch = sys.modules.get("torch")
    if torch is None:
        return 0, 0
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return 0, 0
        return int(torch.cuda.memory_allocated()), int(torch.cuda.memory_reserved())
    except Exception:  # a broken device must not break /metrics
        return 0, 0


def gpu_peak_reserved() -> int | None:
    """The most bytes the CUDA caching allocator has reserved on the current device since the process
    started (``torch.cuda.max_memory_reserved``): what the worker needed at its worst, e.g. during a
    large batch. None when torch/CUDA is not in use (a CPU worker has no accelerator memory to report)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return None
        return int(torch.cuda.max_memory_reserved())
    except Exception:  # a broken device must not break /stats
        return None


class Metrics:
    """All the server's metric objects; the data plane and worker update them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.queue_depth = Gauge("modelpool_queue_depth", "Requests waiting in the queue", registry=r)
        self.queue_capacity = Gauge("modelpool_queue_capacity", "Queue capacity (requests)", registry=r)
        self.in_flight = Gauge("modelpool_in_flight", "Requests being computed", registry=r)
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
        self.worker_state = Gauge("modelpool_worker_state", "1 for the current state", ["state"], registry=r)
        self.load_seconds = Gauge("modelpool_model_load_seconds", "Time the model load took", registry=r)
        self.gpu_memory = Gauge("modelpool_gpu_memory_bytes", "CUDA memory", ["kind"], registry=r)
        for state in State:
            self.worker_state.labels(state=state.value).set(1 if state is State.PENDING else 0)

    def set_state(self, old: State, new: State) -> None:
        self.worker_state.labels(state=old.value).set(0)
        self.worker_state.labels(state=new.value).set(1)

    def render(self) -> bytes:
        allocated, reserved = gpu_memory()
        self.gpu_memory.labels(kind="allocated").set(allocated)
        self.gpu_memory.labels(kind="reserved").set(reserved)
        self.gpu_memory.labels(kind="peak_reserved").set(gpu_peak_reserved() or 0)
        return generate_latest(self.registry)
