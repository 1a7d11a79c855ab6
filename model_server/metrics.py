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
``prompt_tokens_total`` and ``prefix_cache_hit_tokens_total`` (of those prompt tokens, the ones read from
the prefix cache instead of computed: their ratio is the hit rate), ``kv_cache_tokens``,
``kv_cache_reserved_tokens`` and ``generating`` (requests running).

A text-generation worker (``WorkerGauges(picker=True)``) also exports the endpoint picker's protocol
(``picker_rows``: the vLLM engine's names in ``modelpool_contract.picker``): ``vllm:num_requests_waiting``
(the queue depth), ``vllm:num_requests_running`` (in flight), ``vllm:kv_cache_usage_perc`` (the reserved
share of the KV cache, 0..1), ``vllm:cache_config_info{block_size,num_gpu_blocks}`` and
``vllm:lora_requests_info{running_lora_adapters,waiting_lora_adapters,max_lora}`` (no adapters yet).

A shared host (``render_host``, its probe port) exposes the same series for every model it holds, each
labelled ``model="<name>"``, and ``host_device_memory_bytes{device,kind}`` (capacity, awake, asleep,
overhead, free: its ledger, as in its ``/stats``), and each model's ``sleeps_total`` and ``wakes_total``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from model_server.adapter_mask import mask_names
from model_server.state_machine import State, StateMachine
from model_server.worker_view import PAGE_TOKENS, Field, WorkerView, row_name
from modelpool_contract import picker

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


GaugeRow = tuple[str, str, tuple[tuple[str, str], ...], float]


def picker_rows(
    waiting: float,
    running: float,
    kv_tokens: float | None,
    kv_reserved: float | None,
    now: float,
    *,
    lora_running: Sequence[str] = (),
    max_lora: int = 0,
) -> list[GaugeRow]:
    """The endpoint picker's gauges (pure): the queue and in-flight counts, the KV cache in use as a
    0..1 share (0 while the cache is unknown: no continuous-batching engine yet), the cache's geometry in
    pages of ``PAGE_TOKENS`` (the picker's blocks) and the LoRA info (the adapters running requests use,
    comma-separated, and ``--max-adapters``; none waits for an adapter: a request's adapter is loaded when
    the engine takes it), whose value is the time of the sample, as vLLM's is (the picker keeps the newest
    series)."""
    total = kv_tokens or 0.0
    usage = min(1.0, max(0.0, (kv_reserved or 0.0) / total)) if total > 0 else 0.0
    blocks = int(total) // PAGE_TOKENS
    cache = ((picker.CACHE_BLOCK_SIZE, str(PAGE_TOKENS)), (picker.CACHE_NUM_BLOCKS, str(blocks)))
    lora = (
        (picker.LORA_RUNNING, ",".join(lora_running)),
        (picker.LORA_WAITING, ""),
        (picker.LORA_MAX, str(max_lora)),
    )
    return [
        (picker.WAITING, "Requests waiting in the queue (the endpoint picker's name)", (), float(waiting)),
        (picker.RUNNING, "Requests being computed (the endpoint picker's name)", (), float(running)),
        (picker.KV_USAGE, "KV-cache share the running generations reserve, 0..1", (), usage),
        (picker.CACHE_INFO, "The KV cache's pages (block_size tokens each)", cache, 1.0),
        (picker.LORA_INFO, "LoRA adapters running and waiting", lora, now),
    ]


class WorkerGauges(Collector):
    """The gauges, read from the shared view at scrape time (``model``: the label a shared host's model's
    series carry; None for a dedicated worker's, which carry none; ``picker``: also the endpoint picker's
    names, for a dedicated text-generation worker)."""

    def __init__(
        self,
        view: WorkerView,
        state_machine: StateMachine,
        model: str | None = None,
        *,
        picker: bool = False,
        adapters: Sequence[str] = (),
        max_adapters: int = 0,
    ) -> None:
        self.view = view
        self.state_machine = state_machine
        self.model = model
        self.picker = picker
        self.adapters = list(adapters)  # the declared LoRA adapters, in the order of the view's masks
        self.max_adapters = max_adapters

    def collect(self) -> Iterator[Metric]:
        yield from gauge_families(self.rows())
        yield from self.counters()

    def counters(self) -> list[CounterMetricFamily]:
        """A shared host's model's sleeps and wakes so far (``modelpool_sleeps_total``,
        ``modelpool_wakes_total``, labelled with its model; counted in the view by its inference process);
        none for a dedicated worker, which never sleeps."""
        if self.model is None:
            return []
        out = []
        for name, documentation, field in (
            ("modelpool_sleeps_total", "Sleeps completed: the weights parked in host memory", Field.SLEEPS),
            ("modelpool_wakes_total", "Wakes completed: the weights back on the device", Field.WAKES),
        ):
            family = CounterMetricFamily(name, documentation, labels=["model"])
            family.add_metric([self.model], self.view.get(field))
            out.append(family)
        return out

    def rows(self) -> Iterator[GaugeRow]:
        """Every gauge sample: (name, help, labels, value)."""
        own = (("model", self.model),) if self.model is not None else ()
        view = self.view

        def row(name: str, documentation: str, value: float | None, **labels: str) -> GaugeRow:
            return name, documentation, own + tuple(labels.items()), 0.0 if value is None else value

        yield row("modelpool_queue_depth", "Requests waiting in the queue", view.door.taken)
        yield row("modelpool_queue_capacity", "Queue capacity (requests)", view.door.size)
        yield row("modelpool_in_flight", "Requests being computed", view.get(Field.IN_FLIGHT))
        current = self.state_machine.state
        for each in State:
            yield row(
                "modelpool_worker_state", "1 for the current state", float(each is current), state=each.value
            )
        yield row(
            "modelpool_model_load_seconds", "Time the model load took", view.optional(Field.LOAD_SECONDS)
        )
        yield row(
            "modelpool_model_warmup_seconds",
            "Time the warm-up input took",
            view.optional(Field.WARMUP_SECONDS),
        )
        gpu = "modelpool_gpu_memory_bytes", "CUDA memory"
        yield row(*gpu, view.get(Field.GPU_ALLOCATED), kind="allocated")
        yield row(*gpu, view.get(Field.GPU_RESERVED), kind="reserved")
        yield row(*gpu, view.optional(Field.GPU_PEAK_RESERVED), kind="peak_reserved")
        yield row(
            "modelpool_kv_cache_tokens",
            "The generation engine's KV cache (tokens)",
            view.optional(Field.KV_CACHE_TOKENS),
        )
        yield row(
            "modelpool_kv_cache_reserved_tokens",
            "KV-cache tokens the running generations reserve",
            view.optional(Field.KV_CACHE_RESERVED),
        )
        yield row(
            "modelpool_generating", "Generations running on the engine", view.optional(Field.GENERATING)
        )
        for name, resident in worker_rss(view).items():
            yield row(
                "modelpool_resident_memory_bytes", "Resident memory of each process", resident, process=name
            )
        if self.picker:
            yield from picker_rows(
                view.door.taken,
                view.get(Field.IN_FLIGHT),
                view.optional(Field.KV_CACHE_TOKENS),
                view.optional(Field.KV_CACHE_RESERVED),
                time.time(),
                lora_running=mask_names(self.adapters, view.get(Field.ADAPTERS_RUNNING)),
                max_lora=self.max_adapters if self.adapters else 0,
            )


def gauge_families(rows: Iterable[GaugeRow]) -> list[GaugeMetricFamily]:
    """Rows grouped into one family per name (the rows of a name share their label names)."""
    families: dict[str, GaugeMetricFamily] = {}
    for name, documentation, labels, value in rows:
        family = families.get(name)
        if family is None:
            family = families[name] = GaugeMetricFamily(name, documentation, labels=[k for k, _ in labels])
        family.add_metric([v for _, v in labels], value)
    return list(families.values())


M = TypeVar("M", Counter, Histogram)
M_co = TypeVar("M_co", covariant=True)


class Labelled(Protocol[M_co]):
    """A metric with labels, as its users see it: ``labels(reason=...)`` gives the child they count on."""

    def labels(self, **labels: str) -> M_co: ...


class _ForModel(Generic[M]):
    """A labelled metric whose ``model`` label is fixed: one model's counts in a shared host's process."""

    def __init__(self, metric: M, model: str) -> None:
        self.metric: M = metric
        self.model = model

    def labels(self, **labels: str) -> M:
        child: M = self.metric.labels(model=self.model, **labels)
        return child


class Metrics:
    """This process's counters and histograms, and the rendering of the whole worker's metrics.

    ``model``: on a shared host (its HTTP processes count for several models in one process, each with a
    ``Metrics`` of its own) every series carries ``model="<name>"``, so the models' counts never mix in the
    host's multiprocess files; a dedicated worker's carry no such label."""

    def __init__(self, model: str | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        own = ["model"] if model is not None else []

        def labelled(metric: M) -> Labelled[M]:
            return metric if model is None else _ForModel(metric, model)

        def plain(metric: M) -> M:
            if model is None:
                return metric
            child: M = metric.labels(model=model)
            return child

        self.requests = labelled(
            Counter(
                "modelpool_requests",
                "HTTP requests by route and status code",
                [*own, "route", "code"],
                registry=r,
            )
        )
        self.rejected = labelled(
            Counter("modelpool_rejected", "Requests not computed, by reason", [*own, "reason"], registry=r)
        )
        self.dropped = labelled(
            Counter(
                "modelpool_dropped",
                "Admitted requests dropped before compute, by reason",
                [*own, "reason"],
                registry=r,
            )
        )
        self.latency = labelled(
            Histogram(
                "modelpool_request_latency_seconds",
                "Request latency",
                [*own, "route"],
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.compute = plain(
            Histogram(
                "modelpool_compute_seconds",
                "Time a batch spends on the inference thread (tokenize + forward + post-processing)",
                own,
                buckets=_LATENCY_BUCKETS,
                registry=r,
            )
        )
        self.batch_size = plain(
            Histogram(
                "modelpool_batch_size", "Items per forward pass", own, buckets=_BATCH_BUCKETS, registry=r
            )
        )
        self.first_token = plain(
            Histogram(
                "modelpool_time_to_first_token_seconds",
                "From a generation's arrival in the inference process (its queue included) to its first "
                "token",
                own,
                buckets=_TOKEN_BUCKETS,
                registry=r,
            )
        )
        self.inter_token = plain(
            Histogram(
                "modelpool_inter_token_latency_seconds",
                "Between two tokens of one generation",
                own,
                buckets=_TOKEN_BUCKETS,
                registry=r,
            )
        )
        self.generated_tokens = plain(
            Counter("modelpool_generated_tokens", "Tokens generated on the engine", own, registry=r)
        )
        self.prompt_tokens = plain(
            Counter(
                "modelpool_prompt_tokens",
                "Prompt tokens of the generations the engine started",
                own,
                registry=r,
            )
        )
        self.prefix_hit_tokens = plain(
            Counter(
                "modelpool_prefix_cache_hit_tokens",
                "Prompt tokens the engine took from its prefix cache instead of computing them",
                own,
                registry=r,
            )
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
        registry.register(_Families(list(own.collect())))
    registry.register(gauges)
    return generate_latest(registry)


#: A shared host's device gauges: ``modelpool_host_device_memory_bytes{device,kind}``, one per kind.
HOST_DEVICE_KINDS = ("capacity", "awake", "asleep", "overhead", "free")


def device_rows(devices: Iterable[Mapping[str, Any]]) -> list[GaugeRow]:
    """A shared host's devices (its ``/stats`` ``host.devices``) as gauge rows, per device and kind."""
    return [
        (
            "modelpool_host_device_memory_bytes",
            "A shared host's device memory as its ledger counts it",
            (("device", str(device.get("index", 0))), ("kind", kind)),
            float(device.get(kind) or 0),
        )
        for device in devices
        for kind in HOST_DEVICE_KINDS
    ]


def render_host(
    models: Iterable[WorkerGauges], devices: Iterable[Mapping[str, Any]], directory: str
) -> bytes:
    """A shared host's exposition (its probe port): every process's counters and histograms (the host's
    multiprocess files: each series labelled with its model), each model's gauges (``model`` label) and
    the devices' memory."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    models = list(models)
    rows = [row for gauges in models for row in gauges.rows()] + device_rows(devices)
    counters = [family for gauges in models for family in gauges.counters()]
    registry.register(_Families([*gauge_families(rows), *_merged(counters)]))
    return generate_latest(registry)


def _merged(families: Iterable[CounterMetricFamily]) -> list[CounterMetricFamily]:
    """The models' counter families of one name as one family (a name is exposed once)."""
    merged: dict[str, CounterMetricFamily] = {}
    for family in families:
        found = merged.setdefault(
            family.name, CounterMetricFamily(family.name, family.documentation, labels=["model"])
        )
        found.samples.extend(family.samples)
    return list(merged.values())


class _Families(Collector):
    """Families made already, as a collector."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


__all__ = [
    "Metrics",
    "WorkerGauges",
    "device_rows",
    "gpu_memory",
    "picker_rows",
    "render_host",
    "render_worker",
    "rss_bytes",
    "worker_rss",
]
