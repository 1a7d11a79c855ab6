"""A shared host's configuration (``modelpool-server --shared-host``), and each model's, from the control
API's load body.

The host's flags are its own settings class, loaded by the project's one loader like ``ServerConfig``
(``MODELPOOL_*`` variables, flags win), on the same base (``config.ServingConfig``: listen address and
port, device, queue capacity, request limits and timeouts, failure reason file, log level, API key), so
that each of those is defined once; ``slot_config`` turns a load's settings (``{"source", "task",
"memory", "device", ...}``, the ServerArgs-like document of ``POST /v2/repository/models/{name}/load``)
into the model's ``ServerConfig``, with its device's ``--device`` (``host_plan.device_names``), its pool's
queue capacity and request timeout (``queue_capacity``, ``request_timeout``; else the host's flags) and the
host's other limits.

A host has ``--gpus`` devices (unset: the GPUs it sees, ``host_plan.visible_gpus``; a CPU host has one,
the CPU), each with ``--device-memory`` for its ledger; a load's ``device`` is the index the operator
chose (``LoadBody.device``; absent: the host picks the one with the most free room).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from model_server import host_plan
from model_server.config import ServerConfig, ServingConfig
from modelpool_contract.api import MODELHOST_MAX_GPUS_PER_HOST
from modelpool_contract.flags import MAX_QUEUE_CAPACITY
from modelpool_contract.host_control import LoadConfig
from modelpool_contract.placements import (
    DEFAULT_CPU_MODEL_OVERHEAD,
    DEFAULT_GPU_MODEL_OVERHEAD,
    default_model_overhead,
)
from modelpool_contract.quantity import parse_quantity
from modelpool_contract.settings import CommandLine, load


class HostConfig(ServingConfig):
    """A shared host's settings: ``ServingConfig``'s and a host's own (field ``x_y`` = flag ``--x-y`` = env
    ``MODELPOOL_X_Y``). ``probe_port`` and ``http_workers`` are its own, not the base's: a host always has
    a probe port (its control API) and one HTTP process unless told, where a dedicated worker has none and
    sizes them to its CPUs."""

    model_config = SettingsConfigDict(extra="ignore")

    shared_host: bool = Field(default=False, description="Serve several models, loaded by the control API")
    probe_port: int = Field(default=8001, ge=0, le=65535, description="Health, /stats and the control API")
    http_workers: int = Field(default=1, ge=1, le=64, description="HTTP processes (route by model name)")
    max_models: int = Field(default=8, ge=1, le=256, description="Models the host may hold at once")
    device_memory: int = Field(description="Each device's memory the ledger may hand out (bytes or 8Gi)")
    gpus: int | None = Field(
        default=None,
        ge=1,
        le=MODELHOST_MAX_GPUS_PER_HOST,
        description="The GPUs the host serves, models on GPU i run on cuda:i (unset: the GPUs it sees, "
        "CUDA_VISIBLE_DEVICES or /dev/nvidia*; with --device cpu or cuda:N: one)",
    )
    host_memory: int | None = Field(default=None, description="Host memory for sleeping models' weights")
    model_overhead: int | None = Field(
        default=None,
        description="Each model's charge on the device beyond its weights, awake or asleep: its process's "
        f"CUDA context (default {DEFAULT_GPU_MODEL_OVERHEAD}) or, with --device cpu, its RAM "
        f"(default {DEFAULT_CPU_MODEL_OVERHEAD}); 0: none",
    )
    sleep_idle: bool = Field(
        default=False, description="Put each model to sleep once it turns Idle (after its idle_after)"
    )
    wake_timeout: float = Field(default=30.0, gt=0, le=3600, description="A request waits this for a wake")
    control_key_file: Path | None = Field(
        default=None, description="A file holding the key the control API's POSTs must carry (Bearer)"
    )

    _key_files: ClassVar[tuple[str, ...]] = (*ServingConfig._key_files, "control_key_file")

    @property
    def control_key(self) -> str | None:
        """The key the control API's calls must carry, or None (no ``--control-key-file``)."""
        return self.key("control_key_file")

    @field_validator("device_memory", "host_memory", "model_overhead", mode="before")
    @classmethod
    def _quantity(cls, value: Any) -> Any:
        return None if value is None else parse_quantity(value)

    @model_validator(mode="after")
    def _gpus_need_a_gpu_device(self) -> HostConfig:
        if (self.gpus or 1) > 1 and (self.device == "cpu" or self.device.startswith("cuda:")):
            raise ValueError(
                f"--gpus {self.gpus} needs --device auto or cuda (the models of GPU i run on cuda:i); "
                f"--device {self.device} is one device"
            )
        return self

    def device_names(
        self, environ: dict[str, str] | None = None, dev: list[str] | None = None
    ) -> tuple[str, ...]:
        """Each device's ``--device`` for its models, by index (``host_plan.device_names``): ``--gpus``
        devices, else the GPUs visible (``environ``/``dev``: ``os.environ`` and ``/dev`` unless given)."""
        if self.device == "cpu" or self.device.startswith("cuda:"):
            return (self.device,)
        count = self.gpus
        if count is None:
            environ = dict(os.environ) if environ is None else environ
            if dev is None:
                try:
                    dev = os.listdir("/dev")
                except OSError:
                    dev = []
            count = host_plan.visible_gpus(environ.get("CUDA_VISIBLE_DEVICES"), dev)
        return host_plan.device_names(self.device, max(count, 1))

    @property
    def overhead(self) -> int:
        """What the ledger charges each loaded model on the device beyond its weights, awake or asleep
        (``--model-overhead``, else the contract's default: a CPU's unless ``--device`` may be a GPU)."""
        if self.model_overhead is not None:
            return self.model_overhead
        return default_model_overhead(gpu=self.device != "cpu")

    @property
    def http_processes(self) -> int:
        return self.http_workers


HOST_COMMAND_LINE = CommandLine(
    prog="modelpool-server --shared-host",
    description="A shared host: several models, each with its own queue and state, loaded, unloaded, put "
    "to sleep and woken through the control API on the probe port.",
)


def load_host_config(argv: list[str] | None) -> HostConfig:
    """The host's settings (``ConfigError`` when invalid)."""
    return load(HostConfig, argv, HOST_COMMAND_LINE)[0]


class LoadError(ValueError):
    """A load body that is not a valid model configuration (the message names the field)."""


class LoadBody(NamedTuple):
    """A load's settings (``ServerConfig`` fields), its declared memory (bytes) and its device index
    (None: it names none)."""

    settings: dict[str, Any]
    memory: int
    device: int | None = None


def parse_load_body(body: bytes, devices: int = 1) -> LoadBody:
    """The load settings (``modelpool_contract.host_control.LoadConfig``, under the server's names), the
    declared memory (bytes) and the device index of ``{"parameters": {"config": "<json>"}}`` on a host of
    ``devices`` devices (an index it does not have is refused, naming it)."""
    try:
        document = json.loads(body or b"{}")
        config = document.get("parameters", {}).get("config", "{}")
        settings = json.loads(config) if isinstance(config, str) else config
    except (ValueError, AttributeError) as exc:
        raise LoadError(f"parameters.config must be a JSON object: {exc}") from None
    if not isinstance(settings, dict):
        raise LoadError("parameters.config must be a JSON object")
    try:
        load = LoadConfig.model_validate(settings)
    except ValidationError as exc:
        raise LoadError(_load_refusal(exc)) from None
    try:
        memory = parse_quantity(load.memory)
    except ValueError as exc:
        raise LoadError(f"parameters.config.memory: {exc}") from None
    if load.device is not None and (refusal := host_plan.device_refusal(load.device, devices)):
        raise LoadError(f"parameters.config.device: {refusal}")
    return LoadBody(load.server_settings(), memory, load.device)


def _load_refusal(exc: ValidationError) -> str:
    unknown = sorted(str(e["loc"][0]) for e in exc.errors() if e["type"] == "extra_forbidden")
    if unknown:
        return f"parameters.config: unknown field(s) {', '.join(unknown)}"
    error = exc.errors()[0]
    return f"parameters.config.{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"


def slot_config(
    host: HostConfig, name: str, settings: dict[str, Any], index: int, device: str | None = None
) -> ServerConfig:
    """The model's ``ServerConfig`` on this host, on ``device`` (its device's ``--device``; None: the
    host's own) (``LoadError`` naming the field when invalid)."""
    fixed = {
        "name": name,
        "device": device or host.device,
        "queue_capacity": settings.get("queue_capacity", host.queue_capacity),
        "request_timeout": settings.get("request_timeout", host.request_timeout),
        "wedge_grace": host.wedge_grace,
        "max_request_bytes": host.max_request_bytes,
        "http_workers": host.http_workers,
        "log_level": host.log_level,
        "otlp_endpoint": host.otlp_endpoint,
        "trace_sample_ratio": host.trace_sample_ratio,
        "termination_log": host.termination_log.with_name(f"{host.termination_log.name}.{index}"),
    }
    most = max(host.queue_capacity, MAX_QUEUE_CAPACITY)  # the size of each model's door on this host
    if isinstance(fixed["queue_capacity"], int) and fixed["queue_capacity"] > most:
        raise LoadError(f"parameters.config.queue_capacity: at most {most} on this host")
    try:
        return ServerConfig(**{**settings, **fixed})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        wire = LoadConfig.wire_name(where)
        raise LoadError(f"parameters.config.{wire}: {error['msg']}") from None


__all__ = [
    "HOST_COMMAND_LINE",
    "HostConfig",
    "LoadBody",
    "LoadError",
    "load_host_config",
    "parse_load_body",
    "slot_config",
]
