"""The server flags the operator passes to every worker, and the defaults both sides share.

``ServerArgs`` is the operator's side of ``modelpool-server``'s command line: field ``x_y`` is flag
``--x-y`` (the server derives its flags from its configuration fields the same way), in the order the
operator writes them.  The defaults of a ModelPool's ``spec.queue`` and of the server's own flags are
the same numbers, defined here once.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Final, Literal, get_args

from modelpool_contract.logs import LogFormat
from modelpool_contract.tasks import TaskName
from modelpool_contract.version import VERSION

#: The weights' dtype (``auto``: float16 on a GPU, float32 on a CPU).
Dtype = Literal["auto", "float32", "float16", "bfloat16"]

#: What an encoder's forward pass runs on (text-embedding): eager torch, or ONNX Runtime on CPUs (the model
#: exported at load from the same weights; the server falls back to torch, saying why, where it cannot).
EncoderRuntime = Literal["torch", "onnxruntime"]
ENCODER_RUNTIMES: Final[tuple[EncoderRuntime, ...]] = get_args(EncoderRuntime)
DEFAULT_ENCODER_RUNTIME: Final[EncoderRuntime] = "torch"


def runtime_setting(runtime: EncoderRuntime | None) -> EncoderRuntime | None:
    """Pure: the runtime a worker (``--runtime``) or a host's load is told for a pool's
    ``spec.model.runtime``: none for the default, so that pools without one keep their workers' arguments
    as they were."""
    return None if runtime == DEFAULT_ENCODER_RUNTIME else runtime


#: The console script the worker container runs.
SERVER_COMMAND: Final = "modelpool-server"
#: The worker image when a pool names none.
DEFAULT_SERVER_IMAGE: Final = f"ghcr.io/modelpool/modelpool-server:{VERSION}"
#: The port worker pods listen on (the operator passes it; the server's own default suits a laptop).
WORKER_PORT: Final = 8000
#: The port a worker's supervisor answers probes, ``/stats`` and ``/metrics`` on, apart from the traffic
#: (``--probe-port``; the server's own default is none: a laptop needs no probes).
WORKER_PROBE_PORT: Final = 8001
#: Where the server writes why it failed (the container's terminationMessagePath).
TERMINATION_LOG: Final = "/dev/termination-log"

# Defaults of the flags below, shared by ``ServerArgs``, the server's own flags and a ModelPool's
# ``spec.queue``.
QUEUE_CAPACITY: Final = 100
#: The most a pool's queue may hold (``spec.queue.capacity``); a shared host makes each model's door this big,
#: and each load sets its pool's own.
MAX_QUEUE_CAPACITY: Final = 100_000
MAX_BATCH_SIZE: Final = 32
BATCH_DELAY_MS: Final = 5
REQUEST_TIMEOUT_S: Final = 30
#: A request's whole body must arrive within this many seconds of its headers, else 408: the server's and
#: the gateway's ``--request-body-timeout-seconds`` (a slow-body client holds a connection, and in the
#: gateway an in-flight slot, while it sends).
REQUEST_BODY_TIMEOUT_S: Final = 30.0
#: Ready -> Idle after this long without a request.
IDLE_AFTER_S: Final = 300
#: After SIGTERM, queued and running work may finish for this long.
DRAIN_TIMEOUT_S: Final = 30
#: At most this many adapters per pool: a worker reports the loaded ones as a bit mask in one float of its
#: shared memory (52 exact bits), and the CEL uniqueness rule's cost is quadratic in the count.
MAX_ADAPTERS = 32
#: Adapters a worker keeps in memory at once unless ``spec.maxLoadedAdapters`` says otherwise (vLLM's
#: ``--max-loras`` default is 1; a few rank-8..64 adapters are megabytes beside a model of gigabytes).
DEFAULT_MAX_LOADED_ADAPTERS = 4
#: The worker's CPU share in millicores, which the operator sets from the pod's CPU request (the downward
#: API, ``resourceFieldRef: {resource: requests.cpu, divisor: 1m}``): the server's ``--cpu-share-millicores``
#: (its settings read ``MODELPOOL_<FLAG>``).  Where no CPU limit caps the pod, the server sizes the model's
#: and the tokenizer's threads to it, so that workers sharing a node do not each run a pool per core.
CPU_SHARE_ENV: Final = "MODELPOOL_CPU_SHARE_MILLICORES"
#: The CPU request of a worker pod whose pool sets no ``spec.resources.cpu`` (and of a ModelHost's pods that
#: set none): the operator's ``default_worker_cpu`` and the chart's ``config.defaultWorkerCpu``.  Without
#: any request each worker sizes its threads to every core of the node: two MiniLM workers sharing a node
#: so served 0.40x one worker alone, and 1.37x with one CPU requested each (issue 29).
DEFAULT_WORKER_CPU: Final = "1"

#: The share of requests without a ``traceparent`` traced when traces are on, unless set: one in ten, so
#: that turning traces on costs a busy gateway little (a sampled request's spans cost about 100 us of
#: its CPU, a sampled-out one makes none, about 3 us: docs/benchmarks.md); a request that comes with a sampled
#: ``traceparent`` is traced whatever the ratio, so one request can always be followed end to end.
DEFAULT_SAMPLE_RATIO = 0.1


@dataclass(frozen=True)
class ServerArgs:
    """What the operator tells one worker's server; ``argv()`` renders the command line."""

    model: str
    task: TaskName
    name: str
    port: int = WORKER_PORT
    probe_port: int | None = WORKER_PROBE_PORT
    queue_capacity: int = QUEUE_CAPACITY
    max_batch_size: int = MAX_BATCH_SIZE
    max_batch_delay_ms: float = BATCH_DELAY_MS
    request_timeout: float = REQUEST_TIMEOUT_S
    idle_after: float = IDLE_AFTER_S
    drain_timeout: float = DRAIN_TIMEOUT_S
    device: str = "auto"
    dtype: Dtype = "auto"
    trust_remote_code: bool = False
    #: Where the claims of ``pvc://`` sources are mounted (``modelpool_contract.mounts``); only passed
    #: for such sources.
    pvc_root: str | None = None
    #: A file holding the API key (``--api-key-file``): requests without the key are answered 401, the
    #: health routes stay open (``/stats`` and ``/metrics`` are open on the probe port). Only for pools
    #: with ``spec.auth.apiKeySecret``.
    api_key_file: str | None = None
    #: The model's CPU threads (``--intra-op-threads``), only for pools with ``spec.resources.cpuThreads``.
    intra_op_threads: int | None = None
    #: Where the worker sends its traces (``--otlp-endpoint``, an OTLP/HTTP base URL) and the share of
    #: untraced requests it samples; only passed when the operator has an endpoint (traces on).
    otlp_endpoint: str | None = None
    trace_sample_ratio: float | None = None
    #: The worker's log format (``--log-format``, ``modelpool_contract.logs``), only when it is not the
    #: server's default (json): so the default adds no flag, and an upgrade rolls no worker for it.
    log_format: LogFormat | None = None
    #: The pool's LoRA adapters, ``NAME=SOURCE`` each (``--adapter``, repeated), only for pools with
    #: ``spec.adapters``; and how many a worker keeps loaded (``--max-adapters``).
    adapter: tuple[str, ...] | None = None
    max_adapters: int | None = None
    #: The encoder's runtime (``--runtime``, a pool's ``spec.model.runtime``), only when it is not the
    #: default (torch): so the default adds no flag, and an upgrade rolls no worker for it.
    runtime: EncoderRuntime | None = None

    def argv(self) -> list[str]:
        """``--flag value`` for every field, in field order; a boolean flag only when true, an optional
        one only when set."""
        args: list[str] = []
        for field in fields(self):
            value = getattr(self, field.name)
            flag = "--" + field.name.replace("_", "-")
            if value is None:
                continue
            if isinstance(value, bool):
                args += [flag] if value else []
            elif isinstance(value, tuple):  # a repeatable flag, once per value
                args += [part for each in value for part in (flag, _render(each))]
            else:
                args += [flag, _render(value)]
        return args


def _render(value: object) -> str:
    # 30.0 -> "30": the server parses both, and whole numbers read better in `kubectl get pod -o yaml`.
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
