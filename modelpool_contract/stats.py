"""The ``GET /stats`` document: what a worker reports about itself, emitted by the server, read by the
operator; and a shared host's (``HostStats``: its devices' ledgers and one ``WorkerStats`` per model).

One model serves both sides.  The server fills it from its own state (every value well-typed); the
operator parses whatever comes back over the network with ``WorkerStats.parse``, which never raises:
a field it cannot read is unknown (``None``), never an error, because an odd or older server must not
fail a worker (liveness is the kubelet's call).  Times are Unix seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Final

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, ValidatorFunctionWrapHandler
from pydantic.functional_validators import WrapValidator

from modelpool_contract.states import WORKER_STATES, WorkerState

STATS_PATH: Final = "/stats"
#: The worker's probes (the KServe v2 health routes), on both of its ports.
LIVE_PATH: Final = "/v2/health/live"
READY_PATH: Final = "/v2/health/ready"
#: The worker's Prometheus metrics, on its probe port (and, behind the API key, its serving port).
METRICS_PATH: Final = "/metrics"
#: The most bytes of one worker's ``/stats`` answer the operator reads (a document is about 1.3 KiB; a
#: long ``load_error`` adds a few): a longer answer is discarded unread as unknown stats, so a worker
#: cannot make the operator hold or parse much on its behalf.
STATS_MAX_BYTES: Final = 64 * 1024
#: The same for a shared host pod's answer, one document per model it holds (``--max-models``, at most
#: 256): 4 KiB per model.
HOST_STATS_MAX_BYTES: Final = 1024 * 1024
#: Bumped when a field changes meaning; fields are only ever added.
STATS_VERSION: Final = 1
#: What the model's threads were sized from (``/stats`` ``threads.sized_from``): torch's own default (one
#: per core), ``--intra-op-threads`` (a pool's ``resources.cpuThreads``), an ``OMP_NUM_THREADS`` the pod
#: sets, the cgroup's CPU limit, the CPU share the operator passes (the pod's CPU request).
THREAD_SOURCES: Final = ("default", "explicit", "environment", "quota", "share")

_STATE_BY_WORD: dict[str, WorkerState] = {state.lower(): state for state in WORKER_STATES}
# An older server word for Evicting.
_STATE_BY_WORD["draining"] = "Evicting"


def _unknown_when_invalid(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


def _no_bool(value: Any) -> Any:
    # JSON true/false is not a count or a time (pydantic would read it as 1/0).
    return None if isinstance(value, bool) else value


def _state_word(value: Any) -> WorkerState | None:
    return _STATE_BY_WORD.get(value.lower()) if isinstance(value, str) else None


_Lenient = WrapValidator(_unknown_when_invalid)
Count = Annotated[int | None, _Lenient, BeforeValidator(_no_bool)]
Number = Annotated[float | None, _Lenient, BeforeValidator(_no_bool)]
Text = Annotated[str | None, _Lenient]
Names = Annotated[tuple[str, ...] | None, _Lenient]


class _Document(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class StatsMemory(_Document):
    """Memory the server process holds (bytes).

    ``gpu_reserved_bytes`` is what the CUDA caching allocator holds now, ``gpu_peak_reserved_bytes`` the
    most it ever held (None without CUDA); the operator compares the peak with what the worker is charged.
    """

    rss_bytes: Count = None
    gpu_allocated_bytes: Count = None
    gpu_reserved_bytes: Count = None
    gpu_peak_reserved_bytes: Count = None


class StatsDownload(_Document):
    """Bytes of the model's files downloaded so far (``hf://`` sources, while the worker loads).

    Counted in the cache the download writes to: files another worker fetched into a shared cache count
    as downloaded.  ``total_bytes`` is the size of every file the load needs."""

    downloaded_bytes: Count = None
    total_bytes: Count = None


class StatsModel(_Document):
    """The model the worker serves."""

    name: Text = None
    task: Text = None
    source: Text = None


class StatsGeneration(_Document):
    """A text-generation model's engine: ``continuous-batching`` (requests join and leave the running
    batch at token boundaries; its KV cache in tokens, the tokens the running generations reserve, how
    many run) or ``serial`` (one ``generate`` at a time; no cache figures)."""

    engine: Text = None
    kv_cache_tokens: Count = None
    kv_cache_reserved_tokens: Count = None
    running: Count = None
    #: The LoRA adapters held in memory (names; None: the worker declares none).
    adapters: Names = None


class StatsThreads(_Document):
    """The model's CPU threads: torch's intra-op and inter-op pools and the tokenizer's (None: the
    library's own default, or not loaded yet), what they were sized from (``THREAD_SOURCES``), and the
    CPUs that source allowed (None: torch's default, which counts the node's cores)."""

    intra_op: Count = None
    inter_op: Count = None
    tokenizer: Count = None
    sized_from: Text = None
    cpus: Number = None


class WorkerStats(_Document):
    """One ``/stats`` answer.

    The operator reads ``state`` (case-insensitively), ``state_since``, ``queue_depth``, ``in_flight``,
    ``last_request_time``, ``load_error``, ``load_progress``, ``download`` (null when the source needs no
    download) and the accelerator memory (``memory``); the rest is for people and benchmarks.
    The numbers are the whole worker's (every process of it); ``load_seconds`` is the model's load,
    ``warmup_seconds`` the warm-up input run after it, before Ready (None: not run); ``cpu_threads`` the
    model's CPU (torch intra-op) threads once it is loaded (None: not loaded, or a model without torch);
    ``generation`` the engine of a model that generates text (None otherwise); ``threads`` all the model's
    CPU threads and what they were sized from.
    """

    version: Count = STATS_VERSION
    state: Annotated[WorkerState | None, BeforeValidator(_state_word)] = None
    state_since: Number = None
    reason: Text = None
    queue_depth: Count = None
    queue_capacity: Count = None
    in_flight: Count = None
    last_request_time: Number = None
    requests_total: Count = None
    rejected_total: Count = None
    errors_total: Count = None
    load_error: Text = None
    load_progress: Number = None
    load_seconds: Number = None
    download: Annotated[StatsDownload | None, _Lenient] = None
    warmup_seconds: Number = None
    cpu_threads: Count = None
    threads: Annotated[StatsThreads | None, _Lenient] = None
    memory: Annotated[StatsMemory | None, _Lenient] = None
    model: Annotated[StatsModel | None, _Lenient] = None
    generation: Annotated[StatsGeneration | None, _Lenient] = None
    time: Number = None

    @classmethod
    def parse(cls, body: Any) -> WorkerStats | None:
        """The document as the operator sees it: None when ``body`` is not a JSON object at all."""
        return cls.model_validate(dict(body)) if isinstance(body, Mapping) else None

    def wire(self) -> dict[str, Any]:
        """The JSON object the server answers (every field, nulls included)."""
        return self.model_dump(mode="json")


def _non_negative(value: Any) -> Any:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


Index = Annotated[int | None, BeforeValidator(_non_negative)]


class HostModelStats(WorkerStats):
    """One model's document on a shared host: a worker's ``/stats``, and the index of the device it lives
    on (None: unreadable or unnamed, a host of one device)."""

    device: Index = None


class HostDeviceStats(_Document):
    """One device's ledger (bytes): its capacity, what its awake models are charged, what its sleeping
    models park in host memory, what its models' processes hold (each ``model_overhead``) and what is
    free (negative when measurements grew past it), and the models on it."""

    index: Count = None
    device: Text = None
    capacity: Count = None
    awake: Count = None
    asleep: Count = None
    overhead: Count = None
    model_overhead: Count = None
    free: Count = None
    models: Annotated[list[str], BeforeValidator(lambda v: _listed(v, str))] = []


def _listed(value: Any, kind: Any) -> list[Any]:
    """The entries of a JSON list that are of ``kind`` (anything else: none)."""
    return [entry for entry in value if isinstance(entry, kind)] if isinstance(value, list) else []


class HostReport(_Document):
    """The host's own part: its failure (None while it serves) and its devices (an entry that is not a
    JSON object is dropped)."""

    failed: Text = None
    devices: Annotated[list[HostDeviceStats], BeforeValidator(lambda v: _listed(v, Mapping | BaseModel))] = []


def _documents(value: Any) -> Any:
    # A model entry that is not a JSON object is dropped (the others still count).
    if not isinstance(value, Mapping):
        return {}
    return {str(name): doc for name, doc in value.items() if isinstance(doc, Mapping | BaseModel)}


class HostStats(_Document):
    """A shared host pod's ``GET /stats``: ``{"host": {"failed", "devices": [...]}, "models": {name: ...}}``.

    The one definition both sides use: the host builds it (``model_server.supervisor.host``), the
    operator parses what comes back with ``parse``, which never raises (as ``WorkerStats.parse``)."""

    host: Annotated[HostReport, _Lenient] = HostReport()
    models: Annotated[dict[str, HostModelStats], BeforeValidator(_documents)] = {}

    @classmethod
    def parse(cls, body: Any) -> HostStats | None:
        """The document as the operator sees it: None when ``body`` is not a JSON object at all."""
        if not isinstance(body, Mapping):
            return None
        doc = dict(body)
        if not isinstance(doc.get("host"), Mapping):
            doc.pop("host", None)
        return cls.model_validate(doc)

    def wire(self) -> dict[str, Any]:
        """The JSON object the host answers."""
        return self.model_dump(mode="json")
