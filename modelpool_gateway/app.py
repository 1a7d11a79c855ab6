"""The gateway's request path: resolve the model, hold while the pool has no serving worker, forward.

A shared pool's (``spec.host``) workers are the host pods that hold its model (``picker.shared_candidates``:
awake first, else sleeping, the least loaded by this gateway's requests to each pod); its requests carry
the model's name on the host (``placements.host_model_name``) and are otherwise the same.

A text-generation pool's chats and completions go to the worker their prefix hashes to while its load
allows (``prefix``: consistent hashing with bounded load; ``--generation-routing least-loaded`` turns it
off); every other request to the least loaded worker (``picker.pick``).

``Gateway`` is the outermost ASGI app.  The inference routes (``POST /v1/embeddings``, ``/v1/completions``,
``/v1/chat/completions``, ``/v1/images/generations`` and everything under ``/v2/models/``) are handled here
as raw ASGI, which keeps the added latency small; every other route goes to the Starlette app of
``routes``.  Before any of it, ``access`` checks the request's API key (401 without a valid one) and
every model name is resolved among the pools the key grants only (``modelpool_gateway.access``); once
resolved, a request of a key with limits per minute is admitted by its key's windows or answered 429 with
the key's own Retry-After (``limits``), and its answer's tokens are charged to the key when it has ended.
Bounds: ``max_in_flight`` requests in the gateway at once, ``max_request_bytes`` per body and
``max_body_bytes_in_flight`` for all bodies together (``bodies``: 429 past it), each read within
``request_body_timeout_seconds`` (408 after), an OpenAI body parsed only within ``max_json_items`` items and
``max_json_depth`` levels (``jsoncost``: 413/400 before the parse; KServe v2 bodies are not parsed here),
``max_held_per_pool`` held per pool and ``max_held_per_key`` per API key, for at most its activation timeout
within ``max_hold_seconds`` (none for a pool that can never get a worker: 503 at once), a pool whose
workers are all at their ``spec.queue.capacity`` shared between keys by weight in its fair queue
(``fairness``: ``max_queued_per_key`` per key and ``max_queued_per_pool`` per pool, 429 past them),
each worker tried at most once per request, and one retry after a draining (503) or unreachable worker.
A worker's answer that breaks off after its headers went to the client is counted (``relay_errors_total``),
logged on one line, and ended: a streamed (chunked) answer is closed, one with a Content-Length is cut by
closing the connection (the server cannot end it short of its length), never an exception out of the app.

With tracing on (``--otlp-endpoint``: ``modelpool_contract.tracing``), each model route's request is
first sampled (``tracing.decide``: the client's ``traceparent`` decides, else the ratio).  A sampled one is
a server span, child of the client's ``traceparent`` and current while it is served, with a span for each
relay (a client span, whose context goes to the worker as the request's ``traceparent``) and one for a
hold; the key check, the key's limits and each routing choice are attributes, not spans (a span costs the
gateway about 50 us of CPU: the server span gets the key check's and the limits' outcomes, each relay span
its routing choice, the server span a choice that found no worker).  One sampled out (nine in ten at the
default ratio) makes no span object at all: its trace id goes to its log lines and its hand-made
``traceparent`` (not sampled) replaces the client's in the headers relayed, and it is served as with
tracing off.  Whether a request is recorded is decided once (``Call.traced``): off, or sampled out, each
place that would record costs one test of it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

import orjson
from opentelemetry.trace import SpanKind

from modelpool_contract import logs, tracing
from modelpool_gateway.access import Access, caller_of, grant_of, key_name_of, limits_of, share_of
from modelpool_gateway.access_log import served
from modelpool_gateway.bodies import BodyBytes, Ticket
from modelpool_gateway.cache import Registry
from modelpool_gateway.client import Abandoned, Response, Unreachable, UpstreamBroken, UpstreamTimeout
from modelpool_gateway.config import GatewaySettings
from modelpool_gateway.demand import DemandRecorder
from modelpool_gateway.errors import Send, send_error
from modelpool_gateway.fairness import EQUAL_SHARE, FairQueues, Share, pool_capacity
from modelpool_gateway.hold import Baton, Holds, hold_budget, hold_reason, hopeless
from modelpool_gateway.jsoncost import TOO_MANY_ITEMS, json_refusal
from modelpool_gateway.limits import NO_LIMITS, Limiter, Limits
from modelpool_gateway.metrics import Metrics
from modelpool_gateway.names import Resolved, Unresolved, split_v2_path
from modelpool_gateway.picker import Candidate, pick, pick_adapter
from modelpool_gateway.prefix import key_hash, pick_prefix, prefix_key, ring_walk
from modelpool_gateway.proxy import Outbound, Receive, Upstream, forward_headers, relay, watch_disconnect
from modelpool_gateway.state import Key, Worker
from modelpool_gateway.usage import ItemKind, Usage, UsageScanner, items

log = logging.getLogger("modelpool.gateway")

OPENAI_ROUTES = frozenset(
    {"/v1/embeddings", "/v1/completions", "/v1/chat/completions", "/v1/images/generations"}
)
V2_MODELS = "/v2/models/"
TIMEOUT_HEADER = b"x-request-timeout"
# What the metrics count for a client that left while its request was held (nginx's convention).
CLIENT_CLOSED = 499
# The hold span's outcome attribute.
OUTCOME = "modelpool.outcome"
# The server span's outcomes of the key check ("admitted" or why refused) and of the key's limits per
# minute ("admitted" or the refusal's reason; keys with limits only).
ADMISSION, LIMITS = "modelpool.admission", "modelpool.limits"
# A routing choice's attributes: the workers tried before it, a generation pool's prefix placement.
TRIED, PREFIX = "modelpool.tried", "modelpool.prefix"
# In the scope of a request whose spans are recorded (``tracing.decide`` sampled it): ``Call.traced``.
TRACED_SCOPE_KEY = "modelpool.traced"
# The 503 a worker sent, kept to answer with when no other worker can be tried.
_KEPT_BODY_LIMIT = 64 * 1024


class RequestError(Exception):
    """The request cannot be routed as sent: ``status``, error type and message for the client."""

    def __init__(
        self, status: int, kind: str, message: str, *, retry_after: int | None = None, close: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.retry_after = status, kind, retry_after
        # Refused before its body was read whole: the rest of it may still come, so the connection closes.
        self.close = close


class BodyTimeoutError(RequestError):
    """The body did not arrive in time (the connection is closed)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(status, kind, message, close=True)


@dataclass(frozen=True)
class Call:
    """One request to forward: its pool, the protocol's error shape, what goes upstream, its deadline."""

    key: Key
    openai: bool
    out: Outbound
    client_timeout_s: float | None
    caller: bytes | None = None  # the API key's digest (``access.caller_of``): held requests count per key
    # A generation request's prefix key's ring position (``prefix``); None: the least loaded worker.
    prefix: int | None = None
    key_name: str = ""  # the key's Secret (``access.key_name_of``): what the usage metrics count per
    items: tuple[ItemKind, int] | None = None  # what it asks to compute (``usage.items``)
    limits: Limits = NO_LIMITS  # its key's limits per minute (``access.limits_of``)
    adapter: str | None = None  # the LoRA adapter its model names: workers holding it are preferred
    share: Share = EQUAL_SHARE  # its key's weight and priority (``access.share_of``)
    traced: bool = False  # its spans are recorded (tracing on and the request sampled)

    @property
    def label(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"


@dataclass
class _Failure:
    """The last answer that was not passed on yet (a worker's 503, or an unreachable worker)."""

    status: int
    kind: str
    message: str
    response: tuple[list[tuple[bytes, bytes]], bytes] | None = None


def traced_route(scope: MutableMapping[str, Any]) -> str | None:
    """Pure: the route a request's server span is named by (low cardinality: no model name), for the model
    routes only; None for the rest (health, listings), which are never traced."""
    path: str = scope["path"]
    if path in OPENAI_ROUTES:
        return path
    if path.startswith(V2_MODELS) and len(path) > len(V2_MODELS):
        return "/v2/models/{model}" + ("/infer" if path.endswith("/infer") else "")
    return None


def admission_attributes(key: str, refused: str | None) -> dict[str, str]:
    """Pure: the key check on the server span: its outcome, and the key's name (its Secret, never the key)
    when it names one."""
    attributes = {ADMISSION: "admitted" if refused is None else refused}
    if key:
        attributes[tracing.KEY] = key
    return attributes


def route_attributes(pool: str, worker: Worker | None, tried: int, placement: str | None) -> dict[str, Any]:
    """Pure: one routing choice as span attributes (the relay span's of the worker it picked; the server
    span's when it found none): the worker ("" for none), how many were tried before, the prefix placement."""
    attributes: dict[str, Any] = {
        tracing.POOL: pool,
        tracing.WORKER: worker.name if worker else "",
        TRIED: tried,
    }
    if worker is not None:
        attributes["server.address"], attributes["server.port"] = worker.ip or "", worker.port
    if placement is not None:
        attributes[PREFIX] = placement
    return attributes


def _client_timeout(headers: list[tuple[bytes, bytes]]) -> float | None:
    for name, value in headers:
        if name == TIMEOUT_HEADER:
            try:
                seconds = float(value)
            except ValueError:
                seconds = math.nan
            if not 0 < seconds < math.inf:
                raise RequestError(400, "invalid_input", "header x-request-timeout must be a positive number")
            return seconds
    return None


def _retry_after(resp: Response) -> int:
    try:
        return max(1, math.ceil(float(resp.header(b"retry-after") or b"1")))
    except ValueError:
        return 1


def fair_queues(settings: GatewaySettings, registry: Registry) -> FairQueues:
    """The fair queues of ``registry``'s pools, within the settings' bounds."""
    return FairQueues(
        settings.max_queued_per_key,
        settings.max_queued_per_pool,
        lambda key: pool_capacity(registry.pool(key), len(registry.routable(key))),
    )


def _sampled_out(scope: MutableMapping[str, Any], unsampled: tracing.Unsampled) -> None:
    """A model route's request sampled out: no span; its trace id on its log lines (the access line's
    too) and its own ``traceparent``, not sampled, to the worker (the module docstring)."""
    logs.bind(logs.current_request_id(), unsampled.trace_id)
    scope["headers"] = tracing.with_traceparent(scope["headers"], unsampled.traceparent)


class Gateway:
    """The ASGI application (see the module docstring)."""

    def __init__(
        self,
        *,
        settings: GatewaySettings,
        registry: Registry,
        holds: Holds,
        demand: DemandRecorder,
        upstream: Upstream,
        metrics: Metrics,
        access: Access,
        fallback: Any,
        limiter: Limiter | None = None,
        fair: FairQueues | None = None,
    ) -> None:
        self.settings = settings
        self.access = access
        self.registry = registry
        self.holds = holds
        self.demand = demand
        self.upstream = upstream
        self.metrics = metrics
        self.fallback = fallback
        # The keys' windows (``limits``); the key store forgets a key's windows with its last Secret.
        self.limiter = limiter or Limiter(settings.replicas)
        # A full pool's slots shared out by key weight (``fairness``); main calls its ``changed`` too.
        self.fair = fair or fair_queues(settings, registry)
        # This gateway's requests in flight to each worker (the picker's load), and in the gateway at all.
        self.loads: dict[Key, int] = {}
        self.in_flight = 0
        self.bodies = BodyBytes(settings.max_body_bytes_in_flight)
        # Requests held now per caller (API key digest): at most ``max_held_per_key`` each.
        self.held_by_caller: dict[bytes, int] = {}
        self._turn = 0

    async def __call__(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        if tracing.on() and (route := traced_route(scope)) is not None:
            decision = tracing.decide(scope["headers"])
            if isinstance(decision, tracing.Sampled):
                await self._traced(scope, receive, send, route, decision)
                return
            _sampled_out(scope, decision)
        refused = await self.access.check(scope, send)
        if refused is not None:
            self.metrics.of(self.metrics.refused, "", refused).inc()
            return
        await self._dispatch(scope, receive, send)

    async def _dispatch(self, scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        if path in OPENAI_ROUTES and scope["method"] == "POST":
            await self._entry(scope, receive, send, openai=True)
            return
        if path.startswith(V2_MODELS) and len(path) > len(V2_MODELS):
            if scope["method"] not in ("GET", "POST"):  # what the workers serve there
                message = f"{scope['method']} is not allowed on {path}"
                await send_error(send, False, 405, "invalid_request", message)
                return
            await self._entry(scope, receive, send, openai=False)
            return
        await self.fallback(scope, receive, send)

    async def _traced(
        self,
        scope: MutableMapping[str, Any],
        receive: Receive,
        send: Send,
        route: str,
        sampled: tracing.Sampled,
    ) -> None:
        """A model route's sampled request: the server span (child of the client's ``traceparent``), current
        while the request is served, with the key check's outcome on it (``modelpool.admission``)."""
        status = CLIENT_CLOSED
        scope[TRACED_SCOPE_KEY] = True

        async def sending(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        attributes = {tracing.METHOD: scope["method"], tracing.PATH: scope["path"]}
        with tracing.request_span(f"{scope['method']} {route}", sampled, attributes) as span:
            # The access line is written once this span has ended (``access_log``, outside this app): it
            # names this trace (a new one when the client sent no traceparent). Not reset here: the request
            # ids' own reset, after that line, restores what was before the request.
            if (context := span.get_span_context()).is_valid:
                logs.bind(logs.current_request_id(), format(context.trace_id, "032x"))
            try:
                refused = await self.access.check(scope, sending)
                span.set_attributes(admission_attributes(key_name_of(scope), refused))
                if refused is not None:
                    self.metrics.of(self.metrics.refused, "", refused).inc()
                    return
                await self._dispatch(scope, receive, sending)
            finally:
                tracing.answered(span, status)

    async def _entry(
        self, scope: MutableMapping[str, Any], receive: Receive, send: Send, openai: bool
    ) -> None:
        label = ""
        if self.in_flight >= self.settings.max_in_flight:
            self.metrics.of(self.metrics.refused, label, "gateway_full").inc()
            code = await send_error(
                send, openai, 429, "overloaded", "the gateway has too many requests in flight", retry_after=1
            )
            self._answered(scope, label, code)
            return
        self.in_flight += 1
        ticket = Ticket()
        try:
            try:
                call = await (self._openai_call if openai else self._v2_call)(scope, receive, ticket)
            except RequestError as exc:
                close = [(b"connection", b"close")] if exc.close else None
                code = await send_error(
                    send, openai, exc.status, exc.kind, str(exc), retry_after=exc.retry_after, headers=close
                )
            else:
                label = call.label
                if call.traced:
                    tracing.annotate({tracing.POOL: label, tracing.MODEL: self._model_name(call.key)})
                code = await self._admitted(call, send, receive, scope["method"] == "POST")
        finally:
            self.in_flight -= 1
            self.bodies.give_back(ticket)
        self._answered(scope, label, code)

    def _answered(self, scope: MutableMapping[str, Any], label: str, code: int) -> None:
        served().answered(label, code)  # for the access line (``access_log``)
        self.metrics.of(self.metrics.requests, label, str(code)).inc()
        self.metrics.of(self.metrics.key_requests, key_name_of(scope), label, str(code)).inc()

    async def _admitted(self, call: Call, send: Send, receive: Receive, may_hold: bool) -> int:
        """Route the request if its key's limits admit it, else 429 with the key's own Retry-After."""
        if call.caller is None:  # --auth none: no key, no limits
            return await self._route(call, send, receive, may_hold)
        # A key without limits passes at once (and any windows it had before its limits went are dropped).
        refusal = self.limiter.admit(call.caller, call.limits, time.monotonic_ns())
        if call.limits.any and call.traced:  # on the server span, for a key with limits only
            tracing.annotate({LIMITS: "admitted" if refusal is None else refusal.reason})
        if refusal is None:
            return await self._route(call, send, receive, may_hold)
        self.metrics.of(self.metrics.refused, call.label, refusal.reason).inc()
        message = f"this API key is over its limit of {refusal.limit} {refusal.unit} per minute"
        if refusal.share != refusal.limit:
            message += f" ({refusal.share} on each of {self.limiter.replicas} gateway replicas)"
        message += f"; retry after {refusal.retry_after} s"
        return await send_error(
            send, call.openai, 429, "rate_limit_exceeded", message, retry_after=refusal.retry_after
        )

    def _used(self, call: Call, used: Usage) -> None:
        """What an answered (200) request used, on its key's usage metrics, its token window and the
        access line."""
        served().usage = used
        if call.caller is not None:
            tokens = used.prompt_tokens + used.completion_tokens
            self.limiter.charge_tokens(call.caller, call.limits, tokens, time.monotonic_ns())
        if call.items is not None:
            item, count = call.items
            self.metrics.of(self.metrics.key_items, call.key_name, call.label, item).inc(count)
        for kind, tokens in (("prompt", used.prompt_tokens), ("completion", used.completion_tokens)):
            if tokens:
                self.metrics.of(self.metrics.key_tokens, call.key_name, call.label, kind).inc(tokens)

    # ---- reading and resolving ----

    async def _body(self, scope: MutableMapping[str, Any], receive: Receive, ticket: Ticket) -> bytes:
        limit = self.settings.max_request_bytes
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit():
                if int(value) > limit:
                    self.metrics.of(self.metrics.refused, "", "too_large").inc()
                    raise RequestError(413, "too_large", f"the request body exceeds {limit} bytes")
                self._take(ticket, int(value))
        # One deadline for the whole body: a client sending a byte at a time holds an in-flight slot too.
        seconds = self.settings.request_body_timeout_seconds
        try:
            async with asyncio.timeout(seconds):
                return await self._read_body(receive, limit, ticket)
        except TimeoutError:
            self.metrics.of(self.metrics.refused, "", "body_timeout").inc()
            raise BodyTimeoutError(
                408, "timeout", f"the request body did not arrive within {seconds:g} s"
            ) from None

    async def _read_body(self, receive: Receive, limit: int, ticket: Ticket) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                self.metrics.of(self.metrics.refused, "", "too_large").inc()
                raise RequestError(413, "too_large", f"the request body exceeds {limit} bytes")
            if size > ticket.taken:  # no Content-Length (or more than it said): taken as it comes
                self._take(ticket, size - ticket.taken)
            chunks.append(chunk)
            if not message.get("more_body"):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _take(self, ticket: Ticket, size: int) -> None:
        if not self.bodies.take(ticket, size):
            self.metrics.of(self.metrics.refused, "", "bodies_full").inc()
            message = "the gateway holds too many request bodies at once; retry shortly"
            raise RequestError(429, "overloaded", message, retry_after=1, close=True)

    def _check_cost(self, body: bytes) -> None:
        """Refuse a body whose parse would cost more than its bounds allow, before parsing it."""
        items, depth = self.settings.max_json_items, self.settings.max_json_depth
        refusal = json_refusal(body, max_items=items, max_depth=depth)
        if refusal is None:
            return
        self.metrics.of(self.metrics.refused, "", refusal).inc()
        if refusal == TOO_MANY_ITEMS:
            raise RequestError(413, "too_large", f"the request body has more than {items} JSON items")
        raise RequestError(400, "invalid_input", f"the request body nests JSON deeper than {depth} levels")

    async def _openai_call(self, scope: MutableMapping[str, Any], receive: Receive, ticket: Ticket) -> Call:
        body = await self._body(scope, receive, ticket)
        self._check_cost(body)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise RequestError(400, "invalid_input", "the request body must be a JSON object") from None
        model = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(model, str) or not model:
            raise RequestError(
                400, "invalid_input", "the request body needs a 'model' (GET /v1/models lists them)"
            )
        served().model = model
        resolved = self.access.index(grant_of(scope)).resolve(model)
        if isinstance(resolved, Unresolved):
            raise self._not_found(resolved)
        key = resolved.key
        # A worker knows its pool's name and its adapters' names only.
        upstream = resolved.adapter or self._model_name(key)
        if model != upstream:  # an alias or namespace/name
            doc["model"] = upstream
            body = orjson.dumps(doc)
        headers = self.access.upstream_headers(forward_headers(scope["headers"]))
        out = Outbound(scope["method"], scope["path"], headers, body)
        # An adapter's requests go where it is loaded (``picker.pick_adapter``), not by prefix.
        prefix = None if resolved.adapter else self._prefix(key, scope["path"], doc)
        asks = items(scope["path"], doc)
        timeout = _client_timeout(scope["headers"])
        caller, name = caller_of(scope), key_name_of(scope)
        limits, share, traced = limits_of(scope), share_of(scope), TRACED_SCOPE_KEY in scope
        return Call(
            key, True, out, timeout, caller, prefix, name, asks, limits, resolved.adapter, share, traced
        )

    def _prefix(self, key: Key, path: str, doc: Any) -> int | None:
        """The ring position a text-generation pool's request is routed by (``prefix``), else None."""
        if self.settings.generation_routing != "prefix":
            return None
        pool = self.registry.pool(key)
        if pool is None or pool.task != "text-generation":
            return None
        found = prefix_key(path, doc, self.settings.prefix_chars)
        return key_hash(found) if found is not None else None

    async def _v2_call(self, scope: MutableMapping[str, Any], receive: Receive, ticket: Ticket) -> Call:
        rest = scope["path"][len(V2_MODELS) :]
        resolved, suffix = split_v2_path(self.access.index(grant_of(scope)), rest)
        if isinstance(resolved, Resolved) and resolved.adapter is not None:
            # The workers apply adapters on the OpenAI routes only: v2 would answer with the base model.
            resolved = Unresolved(
                f"model {resolved.adapter!r} is a LoRA adapter: use /v1/completions or chat"
            )
        if isinstance(resolved, Unresolved):
            raise self._not_found(resolved)
        body = await self._body(scope, receive, ticket)
        name = self._model_name(resolved.key)
        served().model = name
        path = V2_MODELS + quote(name, safe="") + ("/" + quote(suffix) if suffix else "")
        if scope.get("query_string"):
            path += "?" + scope["query_string"].decode("latin-1")
        headers = self.access.upstream_headers(forward_headers(scope["headers"]))
        out = Outbound(scope["method"], path, headers, body)
        timeout = _client_timeout(scope["headers"])
        return Call(
            resolved.key,
            False,
            out,
            timeout,
            caller_of(scope),
            key_name=key_name_of(scope),
            limits=limits_of(scope),
            share=share_of(scope),
            traced=TRACED_SCOPE_KEY in scope,
        )

    def _model_name(self, key: Key) -> str:
        """The name the upstream knows the model by: the pool's (a worker), or the model's on a host."""
        pool = self.registry.pool(key)
        return pool.model_name if pool is not None else key[1]

    def _not_found(self, resolved: Unresolved) -> RequestError:
        """The 404 for a name the caller's grant does not resolve: the same answer and the same count
        (``not_found``) whether the pool is not granted or does not exist, so neither tells a key holder
        that a guessed name is another tenant's pool."""
        self.metrics.of(self.metrics.refused, "", "not_found").inc()
        return RequestError(404, "model_not_found", resolved.message)

    # ---- holding and forwarding ----

    async def _route(self, call: Call, send: Send, receive: Receive, may_hold: bool) -> int:
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        deadline: float | None = None
        while True:
            baton: Baton | None = None
            if self.holds.busy(call.key) or not self.registry.has_routable(call.key):
                pool = self.registry.pool(call.key)
                if pool is None:
                    return await send_error(send, call.openai, 404, "model_not_found", "the pool was deleted")
                routable = self.registry.has_routable(call.key)
                placed = self.registry.placed(call.key)
                if not may_hold and not routable:
                    reason = hold_reason(pool, datetime.now(UTC), placed)
                    return await send_error(
                        send,
                        call.openai,
                        503,
                        reason.kind,
                        reason.message,
                        retry_after=self.settings.hold_retry_after_seconds,
                    )
                if (
                    may_hold
                    and not routable
                    and (never := hopeless(pool, datetime.now(UTC), placed)) is not None
                ):
                    self.metrics.of(self.metrics.refused, call.label, never.kind).inc()
                    return await send_error(send, call.openai, 503, never.kind, never.message)
                if may_hold:
                    if deadline is None:
                        most = min(pool.activation_timeout_s, self.settings.max_hold_seconds)
                        budget = hold_budget(most, call.client_timeout_s)
                        deadline = loop.time() + budget
                    with tracing.span("modelpool.hold", {tracing.POOL: call.label}):
                        held = await self._hold(call, deadline, send, receive)
                    if isinstance(held, int):
                        return held
                    baton = held
                    if call.client_timeout_s is not None:  # the worker gets what is left of the deadline
                        left = max(0.001, call.client_timeout_s - (loop.time() - arrived))
                        call = replace(call, out=call.out.with_header(TIMEOUT_HEADER, b"%.3f" % left))
            if not may_hold:  # a GET (metadata): not queued by a worker, so not by the fair queue
                code = await self._forward(call, send, receive, baton)
            else:
                if deadline is None:
                    budget = hold_budget(self.settings.max_hold_seconds, call.client_timeout_s)
                    deadline = arrived + budget
                slot = await self._fair_slot(call, deadline, send, receive, baton)
                if slot == "again":  # the pool has no capacity now: route again (held, or gone)
                    continue
                if slot != "slot":
                    return slot
                try:
                    code = await self._forward(call, send, receive, baton)
                finally:
                    self.fair.done(call.key)
            if code is not None:
                return code
            # The worker that released this request went away at once: hold again, same deadline.

    async def _hold(self, call: Call, deadline: float, send: Send, receive: Receive) -> Baton | int:
        """Wait for a serving worker (at most ``max_held_per_key`` held per caller); a baton when
        released, else the status already answered."""
        caller = call.caller
        if caller is None:
            return await self._held(call, deadline, send, receive)
        held = self.held_by_caller.get(caller, 0)
        if held >= self.settings.max_held_per_key:
            message = f"this API key already has {held} requests held, waiting for workers"
            return await self._refuse_hold(call, "key_hold_full", message, send)
        self.held_by_caller[caller] = held + 1
        try:
            return await self._held(call, deadline, send, receive)
        finally:
            left = self.held_by_caller[caller] - 1
            if left:
                self.held_by_caller[caller] = left
            else:
                del self.held_by_caller[caller]

    async def _fair_slot(
        self, call: Call, deadline: float, send: Send, receive: Receive, baton: Baton | None
    ) -> Literal["slot", "again"] | int:
        """A slot of the pool (``fairness``): "slot" at once, or after a wait in its fair queue while every
        worker is full; "again": route again without one; else the status already answered."""
        if self.fair.try_start(call.key):
            return "slot"
        if baton is not None:  # the next held request need not wait behind this one's queueing
            baton.passed()
        slot = self.fair.enter(call.key, call.caller, call.share)
        if isinstance(slot, str):
            bound = self.settings.max_queued_per_key if slot == "key_queue_full" else self.fair.max_per_pool
            whose = "this API key has" if slot == "key_queue_full" else "it has"
            message = f"every worker of pool {call.label} is full and {whose} {bound} requests waiting"
            return await self._refuse_hold(call, slot, message, send)
        loop = asyncio.get_running_loop()
        started, used = loop.time(), False
        gone = asyncio.ensure_future(watch_disconnect(receive))
        self.metrics.of(self.metrics.queued, call.label).inc()
        try:
            if (remaining := deadline - loop.time()) > 0:
                await asyncio.wait(
                    (slot.future, gone), timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            if gone.done():
                return CLIENT_CLOSED
            if slot.future.done():
                used = slot.future.result()
                return "slot" if used else "again"
            message = (
                f"every worker of pool {call.label} stayed full for {loop.time() - started:.1f} s "
                "(waiting in its fair queue)"
            )
            return await self._refuse_hold(call, "queue_timeout", message, send)
        finally:
            gone.cancel()
            if not used:
                self.fair.leave(call.key, slot)
            self.metrics.of(self.metrics.queued, call.label).dec()

    async def _refuse_hold(self, call: Call, reason: str, message: str, send: Send) -> int:
        """A request that may not be held (a bound of the hold is reached): counted by ``reason``, 429."""
        self.metrics.of(self.metrics.refused, call.label, reason).inc()
        return await send_error(
            send, call.openai, 429, "overloaded", message, retry_after=self.settings.hold_retry_after_seconds
        )

    async def _held(self, call: Call, deadline: float, send: Send, receive: Receive) -> Baton | int:
        loop = asyncio.get_running_loop()
        waiter = self.holds.enter(call.key, call.share.effective_priority)
        if waiter is None:
            self.demand.refused(call.key)  # reported with the demand: the operator counts it as load
            message = (
                f"pool {call.label} has no serving worker and already holds "
                f"{self.holds.max_per_pool} requests waiting for one"
            )
            return await self._refuse_hold(call, "hold_full", message, send)
        started, outcome = loop.time(), "timeout"
        self.metrics.of(self.metrics.held, call.label).inc()
        gone = asyncio.ensure_future(watch_disconnect(receive))
        self.demand.note(call.key)
        try:
            if (remaining := deadline - loop.time()) > 0:
                await asyncio.wait(
                    (waiter.future, gone), timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
            if waiter.future.done():
                baton = waiter.future.result()
                outcome = "released" if baton is not None else "abandoned"
                return baton if baton is not None else await self._abandoned(call, send)
            if gone.done():
                outcome = "disconnected"
                return CLIENT_CLOSED
            placed = self.registry.placed(call.key)
            reason = hold_reason(self.registry.pool(call.key), datetime.now(UTC), placed)
            message = (
                f"{reason.message} (held {loop.time() - started:.1f} s, no worker served pool {call.label})"
            )
            return await send_error(
                send,
                call.openai,
                503,
                reason.kind,
                message,
                retry_after=self.settings.hold_retry_after_seconds,
            )
        finally:
            if call.traced:  # the hold's span: how it ended (released: a worker serves the pool now)
                tracing.annotate({OUTCOME: outcome})
            self.holds.leave(call.key, waiter)
            gone.cancel()
            self.metrics.of(self.metrics.held, call.label).dec()
            self.metrics.of(self.metrics.hold_seconds, call.label, outcome).observe(loop.time() - started)

    async def _abandoned(self, call: Call, send: Send) -> int:
        if self.registry.pool(call.key) is None:
            return await send_error(send, call.openai, 404, "model_not_found", "the pool was deleted")
        return await send_error(
            send, call.openai, 503, "shutting_down", "the gateway is shutting down", retry_after=1
        )

    def _next_worker(self, call: Call, tried: set[Key]) -> tuple[Worker | None, dict[str, Any]]:
        """The next worker to try (``_choose``) and, tracing on, the choice's attributes for its relay span
        (none when not traced); a first choice that found no worker puts them on the server span instead."""
        worker, placement = self._choose(call.key, tried, call.prefix, call.adapter)
        if not call.traced:
            return worker, {}
        routed = route_attributes(call.label, worker, len(tried), placement)
        if worker is None and not tried:
            tracing.annotate(routed)
        return worker, routed

    def _choose(
        self, key: Key, tried: set[Key], prefix: int | None = None, adapter: str | None = None
    ) -> tuple[Worker | None, str | None]:
        """The worker to try next among those not ``tried`` (None: no more), and for a prefix-routed
        request where it lies from its prefix's home ("home" or "spilled")."""
        placement: str | None = None
        workers = self.registry.routable(key)
        pool = self.registry.pool(key)
        depths = pool.queue_depths if pool is not None else {}
        candidates = [Candidate(w.key, self.loads.get(w.key, 0), depths.get(w.name)) for w in workers]
        if adapter is not None and pool is not None:
            self._turn += 1
            holders = pool.holders(adapter)
            held = [w.key for w in workers if w.name in holders]
            factor = self.settings.prefix_load_factor
            chosen = pick_adapter(candidates, held, tried, self._turn, load_factor=factor)
        elif prefix is not None:
            factor = self.settings.prefix_load_factor
            chosen = pick_prefix(candidates, prefix, tried, load_factor=factor)
            if chosen is not None:
                home = next(ring_walk([c.key for c in candidates], prefix), None)
                placement = "home" if chosen == home else "spilled"
                self.metrics.of(self.metrics.prefix_routed, f"{key[0]}/{key[1]}", placement).inc()
        else:
            self._turn += 1
            chosen = pick(candidates, tried, self._turn)
        return next((w for w in workers if w.key == chosen), None), placement

    async def _forward(self, call: Call, send: Send, receive: Receive, baton: Baton | None) -> int | None:
        """Try the pool's workers, least loaded first; None when it had no worker to try at all."""
        tried: set[Key] = set()
        refusals: list[int] = []
        failure: _Failure | None = None
        # Done when the client leaves: its request is abandoned at the worker, its answer not relayed.
        gone = asyncio.ensure_future(watch_disconnect(receive))
        try:
            while True:
                worker, routed = self._next_worker(call, tried)
                if worker is None:
                    break
                tried.add(worker.key)
                self.loads[worker.key] = self.loads.get(worker.key, 0) + 1
                self.metrics.of(self.metrics.in_flight, call.label).inc()
                try:
                    outcome = await self._attempt(
                        call, worker, routed, send, gone, baton=baton, retried=failure is not None
                    )
                finally:
                    self._unload(worker.key)
                    self.metrics.of(self.metrics.in_flight, call.label).dec()
                if isinstance(outcome, int):
                    return outcome
                if isinstance(outcome, _Failure):
                    failure = outcome
                else:
                    refusals.append(outcome[1])
            if refusals:
                message = f"every serving worker of pool {call.label} is full"
                return await send_error(
                    send, call.openai, 429, "overloaded", message, retry_after=min(refusals)
                )
            if failure is not None:
                return await self._send_failure(call, send, failure)
            return None
        finally:
            gone.cancel()
            if baton is not None:
                baton.passed()

    def _unload(self, key: Key) -> None:
        left = self.loads[key] - 1
        if left:
            self.loads[key] = left
        else:
            del self.loads[key]

    async def _attempt(
        self,
        call: Call,
        worker: Worker,
        routed: dict[str, Any],
        send: Send,
        gone: asyncio.Future[None],
        *,
        baton: Baton | None,
        retried: bool,
    ) -> int | _Failure | tuple[str, int]:
        """One try (``_try``); with tracing on, in a client span (``modelpool.relay``) whose context goes to
        the worker as the request's ``traceparent``, with its routing choice's attributes (``routed``)."""
        if not call.traced:
            return await self._try(call, worker, send, gone, baton=baton, retried=retried)
        with tracing.span("modelpool.relay", routed, SpanKind.CLIENT) as relay_span:
            out = call.out
            call = replace(call, out=Outbound(out.method, out.path, tracing.inject(out.headers), out.body))
            outcome = await self._try(call, worker, send, gone, baton=baton, retried=retried)
            status = outcome.status if isinstance(outcome, _Failure) else outcome
            tracing.answered(relay_span, status if isinstance(status, int) else 429, server=False)
            return outcome

    async def _try(
        self,
        call: Call,
        worker: Worker,
        send: Send,
        gone: asyncio.Future[None],
        *,
        baton: Baton | None,
        retried: bool,
    ) -> int | _Failure | tuple[str, int]:
        """One try: the status relayed, a failure worth one retry elsewhere, or a 429's Retry-After."""
        started = time.perf_counter()
        try:
            resp = await self.upstream.open(
                worker, call.out, on_sent=baton.passed if baton else None, abandon=gone
            )
        except Abandoned:
            self.metrics.of(self.metrics.upstream_attempts, call.label, "abandoned").inc()
            return CLIENT_CLOSED
        except Unreachable as exc:
            self.metrics.of(self.metrics.upstream_attempts, call.label, "unreachable").inc()
            log.info("%s", exc)
            failure = _Failure(503, "unavailable", f"no worker of pool {call.label} could be reached")
            return failure if not retried else await self._send_failure(call, send, failure)
        except UpstreamTimeout as exc:
            return await send_error(send, call.openai, 504, "timeout", f"worker {worker.name}: {exc}")
        except UpstreamBroken as exc:
            return await send_error(send, call.openai, 502, "bad_gateway", f"worker {worker.name}: {exc}")
        finally:
            if baton is not None:
                baton.passed()
        self.metrics.of(self.metrics.upstream_seconds, call.label).observe(time.perf_counter() - started)
        if resp.status == 429:
            self.metrics.of(self.metrics.upstream_attempts, call.label, "refused_429").inc()
            resp.release()
            return ("refused", _retry_after(resp))
        if resp.status == 503 and not retried:
            self.metrics.of(self.metrics.upstream_attempts, call.label, "draining_503").inc()
            return await self._kept(resp, call)
        self.metrics.of(self.metrics.upstream_attempts, call.label, "ok").inc()
        scanner = UsageScanner() if call.openai and resp.status == 200 else None
        try:
            whole = await relay(resp, worker, send, gone, scanner)
        except (UpstreamBroken, UpstreamTimeout) as exc:
            await self._broke_off(call, worker, resp, send, exc)
            return resp.status
        if scanner is not None and whole:  # a client gone mid-answer: no usage object came
            self._used(call, scanner.usage())
        return resp.status

    async def _broke_off(
        self, call: Call, worker: Worker, resp: Response, send: Send, exc: Exception
    ) -> None:
        """The worker's answer broke off after its headers went out: count, log, end (module docstring)."""
        reason = "timeout" if isinstance(exc, UpstreamTimeout) else "broken"
        self.metrics.of(self.metrics.relay_errors, call.label, reason).inc()
        log.warning("pool %s: the answer of worker %s broke off: %s", call.label, worker.name, exc)
        if resp.content_length is None:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _kept(self, resp: Response, call: Call) -> _Failure:
        """A worker's 503, kept to pass on if no other worker can be tried."""
        kept = None
        try:
            body = await resp.read(_KEPT_BODY_LIMIT)
            kept = ([(k, v) for k, v in resp.headers if k != b"transfer-encoding"], body)
        except (UpstreamBroken, UpstreamTimeout):
            pass
        return _Failure(503, "not_ready", f"the worker of pool {call.label} is not ready", kept)

    async def _send_failure(self, call: Call, send: Send, failure: _Failure) -> int:
        if failure.response is None:
            return await send_error(
                send, call.openai, failure.status, failure.kind, failure.message, retry_after=1
            )
        headers, body = failure.response
        await send({"type": "http.response.start", "status": failure.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return failure.status
