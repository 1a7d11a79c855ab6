"""The gateway's Prometheus metrics (``GET /metrics`` on ``--metrics-port``), on a registry of its own.

Served on a port of their own (prometheus-client's server, in a thread, as the operator's), never on the
clients' port: they name every tenant's pools, which a client (whose key grants only some) must not list.

The ``pool`` label is always ``namespace/name`` of a known pool (or empty for a request that named no
known pool, or was refused for its key): never text from the request, so a client cannot grow the label
set.  The usage metrics (``key_*``) are labelled by the key's name, ``namespace/name`` of the key Secret
that holds it (empty without a key: ``--auth none``, or a request refused for its key), never by the key:
the names are the admins' Secrets, so their number is bounded by what they create.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

# Upstream and hold times span sub-millisecond echo answers to minutes of model loading.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)


class Metrics:
    """Every metric the gateway exports."""

    def __init__(self) -> None:
        # Labelled children, looked up once: ``labels()`` takes a lock and validates on every call, a
        # cost the request path pays several times per request otherwise.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._server: object | None = None
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "modelpool_gateway_requests_total",
            "Requests answered, by pool and HTTP status code.",
            ["pool", "code"],
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "modelpool_gateway_upstream_seconds",
            "From sending a request to a worker until its response headers arrived.",
            ["pool"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_attempts = Counter(
            "modelpool_gateway_upstream_attempts_total",
            "Requests sent to workers, by outcome (ok, refused_429, draining_503, unreachable).",
            ["pool", "outcome"],
            registry=r,
        )
        self.hold_seconds = Histogram(
            "modelpool_gateway_hold_seconds",
            "Time requests were held for a pool with no serving worker, by outcome (released, timeout, "
            "disconnected, deleted).",
            ["pool", "outcome"],
            buckets=_HOLD_BUCKETS,
            registry=r,
        )
        self.held = Gauge(
            "modelpool_gateway_held_requests",
            "Requests held now, waiting for a serving worker.",
            ["pool"],
            registry=r,
        )
        self.queued = Gauge(
            "modelpool_gateway_queued_requests",
            "Requests waiting now in a full pool's fair queue (every worker at its spec.queue.capacity).",
            ["pool"],
            registry=r,
        )
        self.in_flight = Gauge(
            "modelpool_gateway_in_flight_requests",
            "Requests being answered by a worker now.",
            ["pool"],
            registry=r,
        )
        self.refused = Counter(
            "modelpool_gateway_refused_total",
            "Requests the gateway refused itself, by reason (hold_full, key_hold_full: one API key's "
            "held requests at their bound, gateway_full, too_large, "
            "too_many_items, too_deep: the body's JSON over its bounds, counted before parsing; "
            "body_timeout: answered 408, the body did not arrive in time; key_queue_full, queue_full, "
            "queue_timeout: answered 429, a full pool's fair queue at its bound per key or per pool, or "
            "the wait for a slot over; scaled_to_zero, invalid_spec: "
            "answered 503 at once for a pool that cannot get a worker; "
            "key_rate_limited, key_token_limited: answered 429, the key over its requestsPerMinute or "
            "tokensPerMinute; missing_key, invalid_key: answered 401; not_found: answered 404 for a model "
            "the key does not reach, whether it exists or not, so the count does not tell). Never by key: "
            "an auth refusal's pool label is empty.",
            ["pool", "reason"],
            registry=r,
        )
        self.relay_errors = Counter(
            "modelpool_gateway_relay_errors_total",
            "Answers that broke off after their headers were sent to the client, by reason (broken: the "
            "worker's connection closed or sent garbage; timeout: the worker went silent).",
            ["pool", "reason"],
            registry=r,
        )
        self.prefix_routed = Counter(
            "modelpool_gateway_prefix_routed_total",
            "Text-generation requests placed by their prefix, by placement (home: the worker the prefix "
            "hashes to; spilled: a later one on the ring, the home being over the load bound or tried).",
            ["pool", "placement"],
            registry=r,
        )
        self.demand_writes = Counter(
            "modelpool_gateway_demand_writes_total",
            "Writes of this replica's share of a pool's demand Lease, by result (ok, error).",
            ["pool", "result"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "modelpool_gateway_watch_restarts_total",
            "Watches restarted, by resource and reason (expired: relisted after 410 Gone; error).",
            ["resource", "reason"],
            registry=r,
        )
        self.serving_workers = Gauge(
            "modelpool_gateway_serving_workers",
            "Workers the gateway routes to, per pool.",
            ["pool"],
            registry=r,
        )
        self.key_requests = Counter(
            "modelpool_gateway_key_requests_total",
            "Requests answered, by key (its Secret's namespace/name), pool and HTTP status code.",
            ["key", "pool", "code"],
            registry=r,
        )
        self.key_tokens = Counter(
            "modelpool_gateway_key_tokens_total",
            "Tokens the answers of a key's requests reported using (their OpenAI usage), by kind (prompt, "
            "completion).",
            ["key", "pool", "kind"],
            registry=r,
        )
        self.key_items = Counter(
            "modelpool_gateway_key_items_total",
            "What a key's answered requests asked to be computed, by kind (embeddings: inputs; images).",
            ["key", "pool", "kind"],
            registry=r,
        )

    def serve(self, host: str, port: int) -> None:
        """Serve ``GET /metrics`` on ``host:port`` in a background thread."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._server = server

    def close(self) -> None:
        shutdown = getattr(self._server, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self._server = None

    def of(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """``metric.labels(*labels)``, cached."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child
