"""The gateway's configuration: every flag is also a ``MODELPOOL_GATEWAY_*`` environment variable.

Parsed and validated once in ``load_settings``, by the project's one settings loader
(``modelpool_contract.settings``); a flag on the command line wins over its environment variable, which
wins over the default.  Invalid values raise ``ConfigError`` with a one-line reason
(``main`` exits 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from modelpool_contract.flags import DEFAULT_SAMPLE_RATIO, REQUEST_BODY_TIMEOUT_S
from modelpool_contract.logs import DEFAULT_LOG_FORMAT, LogFormat
from modelpool_contract.settings import CommandLine, ConfigError, Flag, load

# ConfigError is the loader's, re-exported for the program's main.
__all__ = ["COMMAND_LINE", "MIB", "ConfigError", "GatewaySettings", "load_settings"]

MIB = 1024 * 1024


class GatewaySettings(BaseSettings):
    """Field ``x_y`` = flag ``--x-y`` = environment variable ``MODELPOOL_GATEWAY_X_Y``."""

    model_config = SettingsConfigDict(env_prefix="MODELPOOL_GATEWAY_", extra="forbid", frozen=True)

    host: str = Field(default="0.0.0.0", description="Listen address")
    port: int = Field(default=8080, ge=1, le=65535, description="Listen port (the clients')")
    metrics_port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="Port of GET /metrics, on the listen address and apart from the clients' port (which "
        "answers 404 there); 0: no metrics endpoint",
    )
    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Namespaces whose pools it routes to (--namespace once per namespace; the variable "
        "is comma-separated); empty: every namespace",
    )
    kubeconfig: Path | None = Field(
        default=None,
        description="Kubeconfig file; unset: the in-cluster service account, else $KUBECONFIG or "
        "~/.kube/config",
    )
    max_held_per_pool: int = Field(
        default=100,
        ge=0,
        le=100_000,
        description="Requests held at most per pool while it has no serving worker; one more gets 429",
    )
    max_held_per_key: int = Field(
        default=50,
        ge=1,
        le=100_000,
        description="Requests held at most per API key, over all pools (with --auth keys); one more gets "
        "429, so one key cannot take a pool's whole hold (--max-held-per-pool) or the gateway's",
    )
    max_queued_per_key: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description="Requests waiting at most per API key and pool in a full pool's fair queue (every "
        "worker at its spec.queue.capacity); one more gets 429",
    )
    max_queued_per_pool: int = Field(
        default=200,
        ge=1,
        le=1_000_000,
        description="Requests waiting at most per pool in its fair queue, all keys together; one more "
        "gets 429. A request waits there at most --max-hold-seconds (within its x-request-timeout)",
    )
    max_hold_seconds: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description="A request is held at most this long, whatever its pool's activationTimeoutSeconds "
        "(then 503 with the reason and Retry-After)",
    )
    hold_retry_after_seconds: int = Field(
        default=5, ge=1, le=3600, description="Retry-After of a 429 for a full hold and of a hold's 503"
    )
    demand_interval_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="While requests are held for a pool, each gateway replica holding them refreshes "
        "its share of the pool's demand Lease once per interval (a share stands for two intervals)",
    )
    max_in_flight: int = Field(
        default=4096,
        ge=1,
        le=1_000_000,
        description="Requests inside the gateway at once (held ones included); one more gets 429",
    )
    max_request_bytes: int = Field(
        default=16 * MIB, ge=1024, description="Larger request bodies are refused with 413"
    )
    max_body_bytes_in_flight: int = Field(
        default=128 * MIB,
        ge=1024,
        description="The request bodies inside the gateway together hold at most this many bytes (a "
        "declared Content-Length is taken whole before the body is read); a request that would pass it "
        "gets 429 with Retry-After at once. Keep it well under the gateway's memory limit",
    )
    max_json_items: int = Field(
        default=100_000,
        ge=1,
        le=10_000_000,
        description="An OpenAI request body with more JSON structural tokens (',', ':', '[', '{' outside "
        "strings, about one parsed object each) is refused with 413 before it is parsed (OpenAI's "
        "largest request, 2048 embedding inputs, has about 2050)",
    )
    max_json_depth: int = Field(
        default=64,
        ge=1,
        le=1000,
        description="An OpenAI request body nested deeper than this is refused with 400 before it is parsed",
    )
    request_body_timeout_seconds: float = Field(
        default=REQUEST_BODY_TIMEOUT_S,
        gt=0,
        le=3600,
        description="A request's whole body must arrive within this (it holds an in-flight slot while it "
        "is read); a slower one gets 408",
    )
    connect_timeout_seconds: float = Field(
        default=2.0, gt=0, le=300, description="TCP connect timeout to a worker"
    )
    upstream_read_timeout_seconds: float = Field(
        default=600.0,
        gt=0,
        le=86_400,
        description="Longest silence while reading a worker's answer (a streamed one included)",
    )
    keepalive_seconds: float = Field(
        default=3.0,
        gt=0,
        le=300,
        description="Idle upstream connections are closed after this (below the workers' 5 s keep-alive)",
    )
    client_keepalive_seconds: int = Field(
        default=75,
        ge=1,
        le=3600,
        description="A client's idle keep-alive connection is closed after this (long, as proxies do: a "
        "busy client that reuses a connection seconds later must not race its closing)",
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="A request's line and headers must arrive within this of its first byte (of the "
        "connection's opening for its first request; an idle new connection is closed after it), else 408 "
        "and the connection is closed",
    )
    max_connections: int = Field(
        default=4096,
        ge=1,
        le=1_000_000,
        description="Client connections open at once; one more is answered 503 (Retry-After: 1) and "
        "closed before a byte of it is parsed",
    )
    watch_timeout_seconds: int = Field(
        default=300, ge=1, le=3600, description="Server-side timeout of each watch request, then renewed"
    )
    watch_backoff_max_seconds: float = Field(
        default=30.0, gt=0, le=600, description="Longest wait before a failed watch or list is retried"
    )
    watch_stale_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="A watch that has failed and not listed or watched successfully again for this long "
        "makes /readyz answer 503 naming it (routing goes on from the state it last saw)",
    )
    shutdown_grace_seconds: float = Field(
        default=25.0, ge=0, le=3600, description="On SIGTERM, requests in flight get this long to finish"
    )
    shutdown_delay_seconds: float = Field(
        default=0.0,
        ge=0,
        le=300,
        description="On SIGTERM, keep serving this long first, not ready and closing each connection "
        "after its answer, so a Service stops sending here before the port closes (the chart: 5)",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level")
    log_format: LogFormat = Field(
        default=DEFAULT_LOG_FORMAT,
        description="json: one JSON object per line, with the request id and trace id of the request it "
        "was logged for (the access lines too); plain: text lines (modelpool_contract.logs)",
    )
    access_log: bool = Field(
        default=True,
        description="One access line per request (logger modelpool.gateway.access, at info: key, pool, "
        "model, status, latency, tokens); off (--no-access-log, or false): none, its record, encoding and "
        "write saved on every request (docs/benchmarks.md, the tenant features' overhead)",
    )
    auth: Literal["keys", "none"] = Field(
        default="keys",
        description="keys: every request but health, readiness and metrics needs 'Authorization: Bearer "
        "<key>' from a key Secret (label modelpool.dev/gateway-key=true) and reaches only the pools that "
        "key grants; none: no check at all, every caller reaches every pool (choose it on purpose)",
    )
    own_namespace: str | None = Field(
        default=None,
        description="The namespace the gateway runs in (the release namespace, the operator's too): its "
        "pools are never routed, even when every namespace is; unset: the pod's namespace (from its "
        "service account), none outside a pod",
    )
    keys_namespace: str | None = Field(
        default=None,
        description="The admin keys' namespace, whose key Secrets may grant any namespace: a namespace of "
        "their own, apart from the release namespace's Secrets; unset: <own namespace>-keys (required "
        "outside a pod without --own-namespace)",
    )
    tenant_keys: bool = Field(
        default=False,
        description="Also read key Secrets in each namespace of --namespace, each granting pools of its "
        "own namespace only (needs --namespace: Secrets are never read cluster-wide)",
    )

    replicas: int = Field(
        default=1,
        ge=1,
        le=10_000,
        description="Gateway replicas behind one Service (the chart: gateway.replicaCount): each enforces "
        "limit / replicas (at least 1) of every key's requestsPerMinute and tokensPerMinute, so the "
        "replicas together allow about the key's limit (less with uneven load)",
    )

    generation_routing: Literal["prefix", "least-loaded"] = Field(
        default="prefix",
        description="prefix: a text-generation pool's chat and completion requests that share a prefix go "
        "to the same worker while its load allows (consistent hashing with bounded load), so its caches "
        "serve them; least-loaded: the least loaded worker, as for every other pool",
    )
    prefix_chars: int = Field(
        default=256,
        ge=1,
        le=100_000,
        description="The prefix routed on: this many leading characters of a chat's messages (with their "
        "roles) or of a completion's prompt",
    )
    prefix_load_factor: float = Field(
        default=1.25,
        ge=1.0,
        le=100.0,
        description="A worker is passed over for a prefix while it would hold more than this times the "
        "pool's mean requests in flight (rounded up); 1: strict balance, larger: more cache hits",
    )

    otlp_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s]+$",
        description="Send traces (OpenTelemetry spans of each inference request: admission, hold, routing, "
        "relay) to this OTLP/HTTP receiver, e.g. http://otel-collector.monitoring:4318 (posted to "
        "<it>/v1/traces); unset: no traces, at no cost",
    )
    trace_sample_ratio: float = Field(
        default=DEFAULT_SAMPLE_RATIO,
        ge=0.0,
        le=1.0,
        description="With --otlp-endpoint: the share of requests without a traceparent whose traces are "
        "recorded; a request with one follows its sampled flag",
    )

    @model_validator(mode="after")
    def _ports_apart(self) -> GatewaySettings:
        # The metrics name every tenant's pools: they are never served where the clients call.
        if self.metrics_port == self.port:
            raise ValueError(f"--metrics-port must differ from --port ({self.port})")
        return self

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        # The environment (and a single flag) carry "a,b,c".
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


#: The gateway's command line: every field is a flag, ``namespaces`` the repeatable ``--namespace``.
COMMAND_LINE = CommandLine(
    prog="modelpool-gateway",
    description="Route OpenAI and KServe v2 requests to ModelPool workers by model name. Every flag "
    "can also be set as MODELPOOL_GATEWAY_<FLAG> (e.g. MODELPOOL_GATEWAY_NAMESPACES=a,b).",
    flags={
        "namespaces": [Flag(names=("--namespace",), append=True, metavar="NAMESPACE")],
        "access_log": [Flag(names=("--no-access-log",), const=False)],
    },
)


def load_settings(argv: Sequence[str] | None = None) -> GatewaySettings:
    """Parse ``argv`` over the ``MODELPOOL_GATEWAY_*`` environment; raise ``ConfigError`` if invalid."""
    return load(GatewaySettings, argv, COMMAND_LINE)[0]
