"""The server's configuration: every command-line flag, also as a ``MODELPOOL_*`` environment variable.

Parsed and validated once, in ``load_config`` (never at import time), by the project's one settings loader
(``modelpool_contract.settings``): a flag given on the command line wins over its environment variable,
which wins over the default.  Anything invalid raises ``ConfigError`` with a one-line reason; ``main``
turns that into exit code 2.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from model_server.cpu_budget import available_cpus, default_http_workers
from modelpool_contract.flags import (
    BATCH_DELAY_MS,
    DEFAULT_MAX_LOADED_ADAPTERS,
    DEFAULT_SAMPLE_RATIO,
    DRAIN_TIMEOUT_S,
    IDLE_AFTER_S,
    MAX_ADAPTERS,
    MAX_BATCH_SIZE,
    QUEUE_CAPACITY,
    REQUEST_BODY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    TERMINATION_LOG,
    Dtype,
    EncoderRuntime,
)
from modelpool_contract.logs import DEFAULT_LOG_FORMAT, LogFormat
from modelpool_contract.mounts import PVC_MOUNT_ROOT
from modelpool_contract.settings import CommandLine, ConfigError, Flag, build_parser, flag_name, load
from modelpool_contract.tasks import TASK_NAMES, TaskName

# ConfigError is the loader's, re-exported for the program's main.
__all__ = ["COMMAND_LINE", "ConfigError", "ServerConfig", "ServingConfig", "load_config"]

# How long a forward pass may run beyond --request-timeout (which bounds what any client of the batch
# still waits for, a streamed generation's included) before the worker counts it as wedged.
WEDGE_GRACE_S = 30.0

_HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_SOURCE_SCHEMES = ("file://", "hf://", "pvc://")


class ServingConfig(BaseSettings):
    """What a dedicated worker (``ServerConfig``) and a shared host (``host_config.HostConfig``) both take,
    each field defined here once: where it listens, the device, what a request may be and wait, the failure
    reason file, the log level, the API key of the serving port (field ``x_y`` = flag ``--x-y`` = env
    ``MODELPOOL_X_Y``). ``validate_default`` keeps float fields floats where the shared default is a whole
    number."""

    model_config = SettingsConfigDict(env_prefix="MODELPOOL_", frozen=True, validate_default=True)

    host: str = Field(default="0.0.0.0", description="Listen address")
    port: int = Field(
        default=8080, ge=1, le=65535, description="Listen port (inference; on a shared host every model's)"
    )
    queue_capacity: int = Field(
        default=QUEUE_CAPACITY,
        ge=1,
        le=10**6,
        description="Requests that may wait (on a shared host: in each model's own queue)",
    )
    request_timeout: float = Field(default=REQUEST_TIMEOUT_S, gt=0, le=86_400, description="Max deadline (s)")
    wedge_grace: float = Field(
        default=WEDGE_GRACE_S,
        gt=0,
        le=86_400,
        description="A forward pass running longer than --request-timeout + this is wedged: a worker fails "
        "(liveness too) and exits 7; on a shared host, that model fails alone",
    )
    device: Literal["auto", "cpu", "cuda"] | str = Field(
        default="auto", description="auto|cpu|cuda[:N] (on a shared host: the device every model lives on)"
    )
    max_request_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, description="Larger bodies -> 413")
    request_body_timeout_seconds: float = Field(
        default=REQUEST_BODY_TIMEOUT_S,
        gt=0,
        le=3600,
        description="A request's whole body must arrive within this of its headers; a slower one gets 408",
    )
    termination_log: Path = Field(default=Path(TERMINATION_LOG), description="Failure reason file")
    api_key_file: Path | None = Field(
        default=None, description="File holding the API key clients must send (Authorization: Bearer)"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level")
    otlp_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s]+$",
        description="Send traces (OpenTelemetry spans of each inference request: admission, queue wait, "
        "batch and forward pass) to this OTLP/HTTP receiver, posted to <it>/v1/traces; unset: none",
    )
    trace_sample_ratio: float = Field(
        default=DEFAULT_SAMPLE_RATIO,
        ge=0.0,
        le=1.0,
        description="With --otlp-endpoint: the share of requests without a traceparent whose traces are "
        "recorded; a request with one (from the gateway) follows its sampled flag",
    )
    log_format: LogFormat = Field(
        default=DEFAULT_LOG_FORMAT,
        description="json: one JSON object per line, with the request id and trace id of the request it "
        "was logged for; plain: text lines (every process of the worker)",
    )

    #: The fields naming a key file, each read once when the configuration is validated.
    _key_files: ClassVar[tuple[str, ...]] = ("api_key_file",)
    _keys: dict[str, SecretStr] = PrivateAttr(default_factory=dict)

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        if value in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", value):
            return value
        raise ValueError("must be auto, cpu, cuda or cuda:N")

    @model_validator(mode="after")
    def _read_keys(self) -> ServingConfig:
        for field in self._key_files:
            key = _read_key_file(getattr(self, field), flag_name(field))
            if key is not None:
                self._keys[field] = key
        return self

    def key(self, field: str) -> str | None:
        """The key read from the file of ``field`` (one of ``_key_files``), or None without one."""
        key = self._keys.get(field)
        return key.get_secret_value() if key is not None else None

    @property
    def api_key(self) -> str | None:
        """The key clients must send on the serving port, or None when it is open (no ``--api-key-file``)."""
        return self.key("api_key_file")


class ServerConfig(ServingConfig):
    """Validated server settings: ``ServingConfig``'s and a dedicated worker's own.

    The defaults of the flags the operator passes (``modelpool_contract.flags.ServerArgs``) are the
    contract's.
    """

    model_config = SettingsConfigDict(extra="forbid")

    model: str = Field(
        description="Model source: a local directory, file://PATH, hf://org/name[@rev], "
        "or pvc://claim/sub/path"
    )
    task: TaskName = Field(description="One of: " + ", ".join(TASK_NAMES))
    name: str | None = Field(default=None, description="Served model name (default: last path segment)")
    probe_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Health, /stats and /metrics also here, served by the supervisor",
    )
    max_batch_size: int = Field(default=MAX_BATCH_SIZE, ge=1, le=65536, description="Items per forward pass")
    max_batch_delay_ms: float = Field(default=BATCH_DELAY_MS, ge=0, le=10_000, description="Batch fill wait")
    idle_after: float = Field(default=IDLE_AFTER_S, gt=0, description="Ready -> Idle after this many seconds")
    drain_timeout: float = Field(default=DRAIN_TIMEOUT_S, ge=0, description="SIGTERM: drain for this long")
    dtype: Dtype = Field(default="auto", description="Weights")
    max_request_items: int = Field(default=2048, ge=1, description="More items in one request -> 413")
    handler: str | None = Field(default=None, description="module:Class implementing the Task interface")
    trust_remote_code: bool = Field(default=False, description="Allow the model repo's own code")
    hf_home: Path | None = Field(default=None, description="Download cache for hf:// (default: HF_HOME)")
    pvc_root: Path = Field(default=Path(PVC_MOUNT_ROOT), description="pvc://claim/p -> PVC_ROOT/claim/p")
    http_workers: int | None = Field(
        default=None, ge=1, le=64, description="HTTP processes (default: half the CPUs, 1 to 4)"
    )
    skip_warmup: bool = Field(default=False, description="No warm-up input before Ready")
    intra_op_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="The model's CPU threads: torch's intra-op and inter-op pools and the tokenizer's "
        "(default: the CPU limit, else --cpu-share-millicores, rounded down; else torch's default)",
    )
    cpu_share_millicores: int | None = Field(
        default=None,
        ge=0,
        le=10**7,
        description="The worker's share of the node's CPUs, in millicores (the operator passes the pod's CPU "
        "request): the model's threads are sized to it when no CPU limit is set (0: none)",
    )
    generation_engine: Literal["auto", "batching", "serial"] = Field(
        default="auto",
        description="text-generation: continuous batching where the model allows it (auto), always "
        "(batching: a model it cannot serve fails to load) or one request at a time (serial)",
    )
    runtime: EncoderRuntime = Field(
        default="torch",
        description="text-embedding: the encoder's forward pass on torch (eager) or onnxruntime (CPUs: the "
        "model exported at load; the onnx extra; eager torch, with the reason logged, where it cannot serve)",
    )
    kv_cache_tokens: int | None = Field(
        default=None,
        ge=1,
        le=10**8,
        description="The continuous-batching KV cache in tokens (default: a share of the accelerator "
        "memory left after the weights, or of the pod's memory limit on a CPU)",
    )
    prefix_sharing: bool = Field(
        default=True,
        description="text-generation on continuous batching: keep the cache blocks of computed prompts so a "
        "request with the same prefix (a shared system prompt) reuses them instead of prefilling them again "
        "(--no-prefix-sharing: off; always off with adapters)",
    )

    adapter: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="text-generation: a LoRA adapter NAME=SOURCE (hf://org/name[@rev], pvc://claim/path or "
        "a local folder) served under its name, the request's model field (repeatable; the variable is "
        "comma-separated)",
    )
    max_adapters: int = Field(
        default=DEFAULT_MAX_LOADED_ADAPTERS,
        ge=1,
        le=MAX_ADAPTERS,
        description="LoRA adapters kept in memory at once (the least recently used idle one makes room)",
    )

    @field_validator("adapter", mode="before")
    @classmethod
    def _split_adapters(cls, value: Any) -> Any:
        # The environment (and a single flag) carry "a=hf://x/a,b=hf://x/b".
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("adapter")
    @classmethod
    def _adapters(cls, value: list[str]) -> list[str]:
        names = [parse_adapter(each)[0] for each in value]
        if len(set(names)) != len(names):
            raise ValueError("adapter names must be unique")
        if len(names) > MAX_ADAPTERS:
            raise ValueError(f"at most {MAX_ADAPTERS} adapters")
        return value

    @field_validator("handler")
    @classmethod
    def _handler(cls, value: str | None) -> str | None:
        if value is not None and not _HANDLER_RE.match(value):
            raise ValueError("must look like 'package.module:ClassName'")
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        if "://" in value and not value.startswith(_SOURCE_SCHEMES):
            raise ValueError("unsupported scheme; use a path, file://, hf:// or pvc://")
        return value

    @model_validator(mode="after")
    def _name_default(self) -> ServerConfig:
        if self.name is None:
            tail = self.model.rstrip("/").split("/")[-1].split("@")[0] or "model"
            object.__setattr__(self, "name", tail)
        return self

    @model_validator(mode="after")
    def _adapters_generate(self) -> ServerConfig:
        if self.adapter and self.task != "text-generation":
            raise ValueError("--adapter needs --task text-generation (LoRA adapters of a causal LM)")
        return self

    @property
    def http_processes(self) -> int:
        """``--http-workers``, or the default for the CPUs this process may use."""
        return self.http_workers or default_http_workers(available_cpus())

    @property
    def adapters(self) -> dict[str, str]:
        """The LoRA adapters, name -> source, in the order given (their bit in the shared view)."""
        return dict(parse_adapter(each) for each in self.adapter)

    @property
    def served_name(self) -> str:
        """The model name clients use (``--name`` or the source's last segment)."""
        assert self.name is not None
        return self.name


def parse_adapter(value: str) -> tuple[str, str]:
    """Pure: ``NAME=SOURCE`` -> (name, source); a ``ValueError`` saying what is wrong."""
    name, equals, source = value.partition("=")
    name, source = name.strip(), source.strip()
    if not equals or not name or not source:
        raise ValueError(f"adapter must be NAME=SOURCE, got {value!r}")
    if "://" in source and not source.startswith(_SOURCE_SCHEMES):
        raise ValueError(f"adapter {name!r}: unsupported scheme; use a path, file://, hf:// or pvc://")
    return name, source


def _read_key_file(path: Path | None, flag: str) -> SecretStr | None:
    """The key in the file of ``flag`` (None without one); a ``ValueError`` naming the flag when it cannot
    be used."""
    if path is None:
        return None
    try:
        return SecretStr(_read_key(path))
    except ValueError as exc:
        raise ValueError(f"{flag} {exc}") from None


def _read_key(path: Path) -> str:
    """The key in ``path`` (surrounding whitespace, e.g. a Secret's trailing newline, dropped)."""
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not key:
        raise ValueError(f"{path} is empty")
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        # It travels in an HTTP header: whitespace or control characters could never match.
        raise ValueError(f"{path} must hold one key without whitespace")
    return key


#: The server's command line: every field is a flag (``modelpool_contract.settings``).
COMMAND_LINE = CommandLine(
    prog="modelpool-server",
    flags={
        "adapter": [Flag(append=True, metavar="NAME=SOURCE")],
        "prefix_sharing": [
            Flag(const=True, group="prefix_sharing"),
            Flag(names=("--no-prefix-sharing",), const=False, group="prefix_sharing", help="Turn it off"),
        ],
    },
    description="Serve one model behind a bounded queue (KServe v2 + OpenAI-compatible APIs). "
    "Every flag can also be set as MODELPOOL_<FLAG> (e.g. MODELPOOL_QUEUE_CAPACITY).",
)


def _parser() -> argparse.ArgumentParser:
    return build_parser(ServerConfig, COMMAND_LINE)


def load_config(argv: Sequence[str] | None = None) -> ServerConfig:
    """Parse ``argv`` (flags) over the ``MODELPOOL_*`` environment; raise ``ConfigError`` if invalid."""
    return load(ServerConfig, argv, COMMAND_LINE)[0]
