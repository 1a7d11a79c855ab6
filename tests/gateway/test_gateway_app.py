"""The gateway's request path in-process (its ASGI app), against workers on loopback: bad requests, the
answers when workers refuse, drain or cannot be reached, and bounds.  The registry is filled by hand here
(the watches that fill it are covered by the integration tests); the workers are small HTTP servers of the
test's own that answer what a test needs (a given 429, a 503) or a real echo ``modelpool-server``.  The key
Secrets are given to the key store by hand too; their watch is the integration tests' business."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import orjson
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest

from modelpool_contract import logs, tracing
from modelpool_contract.demand import read_demand
from modelpool_contract.gateway_keys import (
    KEY_FIELD,
    NAMESPACES_FIELD,
    REQUESTS_PER_MINUTE_FIELD,
    TOKENS_PER_MINUTE_FIELD,
)
from modelpool_gateway import access_log
from modelpool_gateway.access_log import access_middleware
from modelpool_gateway.app import Gateway
from modelpool_gateway.assembly import assemble
from modelpool_gateway.cache import Registry
from modelpool_gateway.client import MAX_UPSTREAM_HEADER_BYTES, MAX_UPSTREAM_HEADERS
from modelpool_gateway.config import GatewaySettings
from modelpool_gateway.demand import Answer, LeaseClient
from modelpool_gateway.keys import KeyStore
from modelpool_gateway.state import HostPod, Pool, Worker
from testkit.echo_models import ECHO
from testkit.server import ServerProcess, start_server
from testkit.waiting import wait_for_async
from tests.gateway.rawserver import answering, raw_server, read_request

pytestmark = pytest.mark.slow
NS = "ns"
ADMIN = "gateway-admin"
KEY = "key-of-namespace-ns-0123456789"
OTHER_KEY = "key-of-namespace-other-0123456789"
SECOND_KEY = "second-key-of-namespace-ns-0123456789"
THIRD_KEY = "third-key-of-namespace-ns-0123456789"
LIMITED_KEY = "limited-key-of-namespace-ns-0123456789"


def key_secret(name: str, key: str, **fields: str) -> dict[str, Any]:
    data = {KEY_FIELD: key, **fields}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"metadata": {"namespace": ADMIN, "name": name}, "data": encoded}


@pytest.fixture(scope="module")
def echo() -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", "/", "--task", "text-embedding", "--name", "pool",
        "--handler", ECHO, wait="ready",
    )  # fmt: skip
    yield proc
    proc.stop()


class Harness:
    def __init__(self, **settings: Any) -> None:
        self.settings = GatewaySettings(**settings)
        writes: list[dict[str, Any]] = []
        self.lease_writes = writes

        class NoLeases(LeaseClient):  # the demand writes are the integration tests' business
            def __init__(self) -> None:
                super().__init__(None)

            async def read(self, namespace: str, name: str) -> Answer:
                return Answer(404, None)

            async def create(self, namespace: str, body: dict[str, Any]) -> Answer:
                writes.append(body)  # kept, for what a write reports (the held and refused counts)
                return Answer(201, body)

        self.keys = KeyStore(ADMIN)
        self.keys.set_secret(key_secret("ns", KEY, **{NAMESPACES_FIELD: NS}))
        self.keys.set_secret(key_secret("other", OTHER_KEY, **{NAMESPACES_FIELD: "other"}))
        parts = assemble(self.settings, registry=Registry(), leases=NoLeases(), holder="test", keys=self.keys)
        self.registry, self.metrics, self.holds = parts.registry, parts.metrics, parts.holds
        self.demand, self.upstream, self.app = parts.demand, parts.upstream, parts.app
        self.registry.set_pool(Pool(NS, "pool", served_model_name="Org/alias", activation_timeout_s=1))
        # A gate the tests wait on: set when a request enters the hold.
        self.entered = asyncio.Event()
        enter = self.holds.enter

        def entering(key: Any, priority: int = 0) -> Any:
            waiter = enter(key, priority)
            self.entered.set()
            return waiter

        self.holds.enter = entering  # type: ignore[method-assign]

    def worker(self, name: str, port: int, ip: str = "127.0.0.1") -> None:
        self.registry.set_worker(Worker(NS, name, "pool", ip, port, serving=True, ready=True, deleting=False))

    def client(self, key: str | None = KEY) -> httpx.AsyncClient:
        headers = {"authorization": f"Bearer {key}"} if key is not None else {}
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gw", timeout=30, headers=headers
        )

    def refused(self, reason: str) -> float:
        return float(self.metrics.refused.labels("", reason)._value.get())

    async def embed(self, model: str = "pool", **kwargs: Any) -> httpx.Response:
        async with self.client() as c:
            return await c.post("/v1/embeddings", json={"model": model, "input": ["hello"]}, **kwargs)


@pytest.fixture
async def gw() -> AsyncIterator[Harness]:
    harness = Harness()
    yield harness
    await harness.demand.close()
    harness.upstream.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_bad_requests_get_4xx_in_the_protocols_shape(gw: Harness, echo: ServerProcess) -> None:
    gw.worker("w0", echo.port)
    async with gw.client() as c:
        response = await c.post("/v1/embeddings", content=b"{not json")
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_input"
        response = await c.post("/v1/embeddings", json={"input": ["no model"]})
        assert response.status_code == 400 and "'model'" in response.json()["error"]["message"]
        response = await c.post(
            "/v1/embeddings", json={"model": "pool", "input": ["x"]}, headers={"x-request-timeout": "soon"}
        )
        assert response.status_code == 400 and "x-request-timeout" in response.json()["error"]["message"]
        response = await c.put("/v2/models/pool/infer", content=b"{}")
        assert response.status_code == 405 and set(response.json()) == {"error"}
        response = await c.get("/v1/nothing")
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found"
    big = Harness(max_request_bytes=2048)
    big.worker("w0", echo.port)
    async with big.client() as c:
        response = await c.post("/v1/embeddings", content=b"x" * 4096)
        assert response.status_code == 413 and response.json()["error"]["type"] == "too_large"
    big.upstream.close()


async def test_json_over_its_item_or_depth_bound_is_refused_before_it_is_parsed(gw: Harness) -> None:
    # No worker: a body within the bounds would be held; these never get that far.
    flat = b"[" + b"{}," * 99_999 + b"{}]"  # 300 KB that would parse into 100000 dicts
    deep = b'{"model": "pool", "input": ' + b"[" * 65 + b"]" * 65 + b"}"
    async with gw.client() as c:
        response = await c.post("/v1/embeddings", content=flat)
        assert response.status_code == 413, response.text
        assert response.json()["error"]["type"] == "too_large"
        assert "more than 100000 JSON items" in response.json()["error"]["message"]
        response = await c.post("/v1/chat/completions", content=deep)
        assert response.status_code == 400, response.text
        assert "deeper than 64 levels" in response.json()["error"]["message"]
    assert gw.refused("too_many_items") == 1 and gw.refused("too_deep") == 1


async def test_an_alias_and_namespace_name_reach_the_worker_under_the_pools_name(
    gw: Harness, echo: ServerProcess
) -> None:
    gw.worker("w0", echo.port)
    for model in ("pool", "Org/alias", "ns/pool"):
        response = await gw.embed(model)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "pool" and response.headers["x-modelpool-worker"] == "w0"
    async with gw.client() as c:
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hey"]}]}
        response = await c.post("/v2/models/Org/alias/infer", json=body)
        assert response.status_code == 200 and response.json()["model_name"] == "pool"


async def test_every_worker_refusing_gives_429_with_the_smallest_retry_after(gw: Harness) -> None:
    async with AsyncExitStack() as stack:
        slow = await stack.enter_async_context(raw_server(answering(429, retry_after="7")))
        soon = await stack.enter_async_context(raw_server(answering(429, retry_after="3")))
        gw.worker("slow", slow)
        gw.worker("soon", soon)
        response = await gw.embed()
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert "every serving worker of pool ns/pool is full" in response.json()["error"]["message"]


async def test_a_workers_headers_past_their_bound_are_cut_off_not_relayed(gw: Harness) -> None:
    many = {f"x_h{i}": "v" for i in range(MAX_UPSTREAM_HEADERS + 10)}
    fine = {f"x_h{i}": "v" for i in range(MAX_UPSTREAM_HEADERS - 10)}
    cases = [
        (many, 502),  # too many headers
        ({"x_big": "v" * (MAX_UPSTREAM_HEADER_BYTES + 1)}, 502),  # one header too large
        (fine, 200),  # within both bounds: relayed as it is
    ]
    for headers, expected in cases:
        async with raw_server(answering(200, b"{}", **headers)) as port:
            gw.worker("w0", port)
            response = await gw.embed()
        assert response.status_code == expected, response.text[:200]
        if expected == 502:
            assert response.json()["error"]["type"] == "bad_gateway"
            assert "headers exceed" in response.json()["error"]["message"]
            assert not [h for h in response.headers if h.startswith("x-")]
        else:
            assert response.headers["x-h0"] == "v"


async def test_a_draining_worker_is_retried_once_elsewhere(gw: Harness, echo: ServerProcess) -> None:
    draining = json.dumps({"error": {"message": "draining", "type": "not_ready", "code": 503}}).encode()
    async with raw_server(answering(503, draining, retry_after="2")) as port:
        gw.worker("a-draining", port)
        gw.worker("b-serving", echo.port)
        for _ in range(4):  # whichever the picker tries first, the client gets the serving worker's answer
            response = await gw.embed()
            assert response.status_code == 200 and response.headers["x-modelpool-worker"] == "b-serving"
        gw.registry.delete_worker((NS, "b-serving"))
        response = await gw.embed()
    # The only worker drains: its own 503 is passed on, as it sent it.
    assert response.status_code == 503 and response.json()["error"]["message"] == "draining"
    assert response.headers["retry-after"] == "2"


async def test_an_unreachable_worker_is_retried_once_elsewhere(gw: Harness, echo: ServerProcess) -> None:
    gw.worker("a-gone", _closed_port())
    gw.worker("b-serving", echo.port)
    for _ in range(4):
        response = await gw.embed()
        assert response.status_code == 200 and response.headers["x-modelpool-worker"] == "b-serving"
    gw.registry.delete_worker((NS, "b-serving"))
    gw.worker("c-gone", _closed_port())
    response = await gw.embed()
    assert response.status_code == 503 and response.json()["error"]["type"] == "unavailable"


async def test_a_request_held_for_a_worker_is_released_when_one_becomes_routable(
    gw: Harness, echo: ServerProcess
) -> None:
    async with gw.client() as c:
        pending = asyncio.ensure_future(c.post("/v1/embeddings", json={"model": "pool", "input": ["x"]}))
        await asyncio.wait_for(gw.entered.wait(), 10)
        gw.worker("w0", echo.port)
        response = await pending
    assert response.status_code == 200


async def test_the_gateway_refuses_beyond_its_own_in_flight_bound(echo: ServerProcess) -> None:
    small = Harness(max_in_flight=1)
    async with small.client() as c:
        held = asyncio.ensure_future(c.post("/v1/embeddings", json={"model": "pool", "input": ["x"]}))
        await asyncio.wait_for(small.entered.wait(), 10)
        refused = await c.post("/v1/embeddings", json={"model": "pool", "input": ["x"]})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "too many requests in flight" in refused.json()["error"]["message"]
        expired = await held  # the pool's activation timeout is 1 s
        assert expired.status_code == 503
    await small.demand.close()
    small.upstream.close()


async def test_the_bodies_in_the_gateway_together_are_bounded(echo: ServerProcess) -> None:
    """Each body within ``max_request_bytes``, and their sum within ``max_body_bytes_in_flight``: a held
    request keeps its body; one more whose declared length would pass the sum is refused at once (429,
    the connection closed), one that fits is held, and every byte is given back when they end."""
    body = orjson.dumps({"model": "pool", "input": ["hello"] * 150})  # about 1.3 KB
    small = Harness(max_body_bytes_in_flight=2 * len(body) + 10, max_held_per_pool=10)
    async with small.client() as c:
        json_type = {"content-type": "application/json"}
        held = asyncio.ensure_future(c.post("/v1/embeddings", content=body, headers=json_type))
        await asyncio.wait_for(small.entered.wait(), 10)
        assert small.app.bodies.used == len(body)
        refused = await c.post("/v1/embeddings", content=body + b" " * 1000)
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
        assert "too many request bodies" in refused.json()["error"]["message"]
        assert small.refused("bodies_full") == 1
        assert small.app.bodies.used == len(body), "the refused request took nothing"
        small.entered.clear()
        second = asyncio.ensure_future(c.post("/v1/embeddings", content=body, headers=json_type))
        await asyncio.wait_for(small.entered.wait(), 10)
        small.worker("w0", echo.port)
        answers = await asyncio.gather(held, second)
        assert [r.status_code for r in answers] == [200, 200], answers[0].text
    assert small.app.bodies.used == 0, "every body was given back"
    await small.demand.close()
    small.upstream.close()


async def test_a_refusal_for_a_full_hold_is_reported_with_the_demand() -> None:
    """Follow-up of issue 19: the gateway's own 429 (hold full) counts as load for the autoscaler, like a
    worker's: the demand writes report it (the replica's share, ``modelpool.dev/demand.<replica>``), once."""
    small = Harness(max_held_per_pool=1)
    async with small.client() as c:
        held = asyncio.ensure_future(c.post("/v1/embeddings", json={"model": "pool", "input": ["x"]}))
        await asyncio.wait_for(small.entered.wait(), 10)
        refused = await c.post("/v1/embeddings", json={"model": "pool", "input": ["x"]})
        assert refused.status_code == 429 and "already holds 1 requests" in refused.json()["error"]["message"]
        key = (NS, "pool")
        # Reported by a write that already happened, or pending for the next one: exactly once.
        written = sum((d.refused or 0) for w in small.lease_writes if (d := read_demand(w)) is not None)
        assert written + small.demand.refused_pending(key) == 1
        assert (await held).status_code == 503  # the pool's activation timeout is 1 s
    await small.demand.close()
    small.upstream.close()


async def test_one_key_holds_at_most_its_share_and_another_key_is_still_held() -> None:
    small = Harness(max_held_per_key=2, max_held_per_pool=10)
    small.keys.set_secret(key_secret("ns-second", SECOND_KEY, **{NAMESPACES_FIELD: NS}))
    body = {"model": "pool", "input": ["x"]}
    async with small.client() as c, small.client(SECOND_KEY) as second:
        held = [asyncio.ensure_future(c.post("/v1/embeddings", json=body)) for _ in range(2)]
        while small.holds.held((NS, "pool")) < 2:  # both entered the hold
            await asyncio.wait_for(small.entered.wait(), 10)
            small.entered.clear()
        refused = await c.post("/v1/embeddings", json=body)
        assert refused.status_code == 429, refused.text
        assert refused.headers["retry-after"] == str(small.settings.hold_retry_after_seconds)
        assert "this API key already has 2 requests held" in refused.json()["error"]["message"]
        assert small.metrics.refused.labels(f"{NS}/pool", "key_hold_full")._value.get() == 1
        # Another key's request for the same pool is held as usual.
        other = asyncio.ensure_future(second.post("/v1/embeddings", json=body))
        while small.holds.held((NS, "pool")) < 3:
            await asyncio.wait_for(small.entered.wait(), 10)
            small.entered.clear()
        for response in await asyncio.gather(*held, other):  # the pool's activation timeout is 1 s
            assert response.status_code == 503, response.text
    assert small.app.held_by_caller == {}, "every held request was counted out"
    await small.demand.close()
    small.upstream.close()


async def test_a_hold_ends_at_the_gateways_bound_whatever_the_pools_activation_timeout() -> None:
    small = Harness(max_hold_seconds=0.5)
    small.registry.set_pool(Pool(NS, "pool", served_model_name="org/alias", activation_timeout_s=3600))
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await small.embed()
    took = loop.time() - started
    assert response.status_code == 503 and response.headers["retry-after"] == "5", response.text
    assert "held 0.5 s" in response.json()["error"]["message"]
    assert took < 3, f"held {took:.1f} s"
    await small.demand.close()
    small.upstream.close()


async def test_a_released_request_carries_what_is_left_of_its_deadline(gw: Harness) -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async with raw_server(record) as port, gw.client() as c:
        body = {"model": "pool", "input": ["x"]}
        pending = asyncio.ensure_future(
            c.post("/v1/embeddings", json=body, headers={"x-request-timeout": "10"})
        )
        await asyncio.wait_for(gw.entered.wait(), 10)
        await asyncio.sleep(0.1)  # time passes while the request is held
        gw.worker("w0", port)
        response = await pending
    assert response.status_code == 200
    [request] = seen
    assert b"authorization" not in request.lower(), "the gateway's key went on to the worker"
    [left] = [line.split(b":")[1] for line in request.split(b"\r\n") if line.startswith(b"x-request-timeout")]
    assert 5 < float(left) <= 9.9, left


async def test_a_request_sampled_out_makes_no_span_and_passes_its_trace_on_not_sampled(gw: Harness) -> None:
    """Traces on at ratio 0: a request without a ``traceparent`` and one with an unsampled one make no span
    at all, yet the worker gets a ``traceparent`` of the same trace (not sampled, a span id of the
    gateway's) and the access line names that trace; a client's sampled one is still traced whole."""
    seen: list[bytes] = []
    lines: list[str | None] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(logs.current_trace_id())  # what the formatter writes as the line's trace_id

    def traceparent(request: bytes) -> list[str]:
        [value] = [line.split(b": ")[1] for line in request.split(b"\r\n") if line.startswith(b"traceparent")]
        return value.decode().split("-")

    trace, client_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    exporter, handler = InMemorySpanExporter(), Kept()
    assert tracing.setup("test", None, 0.0, processor=SimpleSpanProcessor(exporter))
    access_log.log.addHandler(handler)
    level, access_log.log.level = access_log.log.level, logging.INFO
    app = access_middleware(gw.app)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=30,
                               headers={"authorization": f"Bearer {KEY}"})  # fmt: skip
    try:
        async with raw_server(record) as port, client as c:
            gw.worker("w0", port)
            for sent in (None, f"00-{trace}-{client_span}-00", f"00-{trace}-{client_span}-01"):
                headers = {"traceparent": sent} if sent else {}
                response = await c.post(
                    "/v1/embeddings", json={"model": "pool", "input": "x"}, headers=headers
                )
                assert response.status_code == 200, response.text
                if sent is None or sent.endswith("-00"):
                    assert exporter.get_finished_spans() == ()
    finally:
        tracing.shutdown()
        access_log.flush()  # the lines pending (written a moment after each answer)
        access_log.log.removeHandler(handler)
        access_log.log.level = level
    (own, own_trace), (unsampled, _), (sampled, _) = (
        (traceparent(r), t) for r, t in zip(seen, lines, strict=True)
    )
    assert own[0] == own[3] == "00" and len(own[1]) == 32 and own_trace == own[1]
    assert unsampled[1] == trace and unsampled[2] != client_span and unsampled[3] == "00"
    assert lines[1] == trace
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"POST /v1/embeddings", "modelpool.relay"}
    relay = spans["modelpool.relay"].get_span_context()
    assert relay is not None and sampled == ["00", trace, f"{relay.span_id:016x}", "01"]


async def test_a_shared_pool_reaches_its_host_under_the_models_name_there(gw: Harness) -> None:
    """OpenAI and v2 requests for a shared pool go to the host pod holding it, named as the host knows the
    model (``placements.host_model_name``: the pool's name), whichever of the pool's names the client used."""
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    gw.registry.set_pool(Pool(NS, "shared", served_model_name="Team/m", host="gpu", activation_timeout_s=1))
    async with raw_server(record) as port, gw.client() as c:
        models = {"shared": "Sleeping", "pool": "Ready"}
        gw.registry.set_host_pod(HostPod(NS, "gpu-0", "gpu", "127.0.0.1", port, True, False, models))
        for name in ("shared", f"{NS}/shared", "Team/m"):
            answer = await c.post("/v1/embeddings", json={"model": name, "input": ["x"]})
            assert answer.status_code == 200 and answer.headers["x-modelpool-worker"] == "gpu-0"
        answer = await c.post("/v2/models/shared/infer", json={"inputs": []})
        assert answer.status_code == 200
    bodies = [json.loads(r.split(b"\r\n\r\n", 1)[1]) for r in seen[:3]]
    assert [b["model"] for b in bodies] == ["shared"] * 3
    assert seen[3].startswith(b"POST /v2/models/shared/infer "), seen[3][:80]


# ---- API keys ----


async def test_without_a_valid_key_every_route_but_health_and_metrics_is_401(gw: Harness) -> None:
    for key, reason in ((None, "missing_key"), ("not-a-key-not-a-key", "invalid_key")):
        async with gw.client(key) as c:
            for method, path, openai in (
                ("POST", "/v1/embeddings", True),
                ("GET", "/v1/models", True),
                ("GET", "/v1/models/pool", True),
                ("POST", "/v2/models/pool/infer", False),
                ("GET", "/v2/models/pool", False),
                ("GET", "/v2", False),
                ("GET", "/nowhere", False),
            ):
                response = await c.request(method, path, json={"model": "pool", "input": ["x"]})
                assert response.status_code == 401, (path, response.text)
                assert response.headers["www-authenticate"] == "Bearer"
                error = response.json()["error"]
                assert (error["type"] == "unauthorized") if openai else isinstance(error, str), error
            for path in ("/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"):
                assert (await c.get(path)).status_code == 200, path
        assert gw.refused(reason) == 7
    assert not gw.entered.is_set(), "an unauthenticated request was held"
    async with gw.client(None) as c:  # another scheme is not a bearer key
        assert (await c.get("/v1/models", headers={"authorization": "Basic " + KEY})).status_code == 401


async def test_a_pool_the_key_does_not_grant_is_the_same_404_as_none_and_never_held(gw: Harness) -> None:
    async with gw.client(OTHER_KEY) as other, gw.client(KEY) as own:
        assert (await other.get("/v1/models")).json()["data"] == []
        assert [m["id"] for m in (await own.get("/v1/models")).json()["data"]] == ["Org/alias"]
        for model in ("pool", "ns/pool", "Org/alias"):
            hidden = await other.post("/v1/embeddings", json={"model": model, "input": ["x"]})
            missing = await other.post("/v1/embeddings", json={"model": model + "x", "input": ["x"]})
            assert hidden.status_code == missing.status_code == 404
            expected = missing.json()["error"]
            expected["message"] = expected["message"].replace(repr(model + "x"), repr(model))
            assert hidden.json()["error"] == expected
        v2 = await other.post("/v2/models/pool/infer", json={"inputs": []})
        v2_missing = await other.post("/v2/models/poolx/infer", json={"inputs": []})
        assert v2.status_code == v2_missing.status_code == 404
        assert v2.json()["error"] == v2_missing.json()["error"].replace("'poolx'", "'pool'")
        for path in ("/v2/models/pool", "/v2/models/pool/ready", "/v1/models/pool"):
            assert (await other.get(path)).status_code == 404, path
    assert not gw.entered.is_set(), "a request for a pool the key does not grant was held"
    # Another namespace's pool of the same name does not make the granted name ambiguous.
    gw.registry.set_pool(Pool("other", "pool"))
    async with gw.client(KEY) as own:
        assert [m["id"] for m in (await own.get("/v1/models")).json()["data"]] == ["Org/alias"]
        assert (await own.get("/v1/models/pool")).json()["modelpool"]["namespace"] == NS


async def test_the_client_port_answers_404_for_metrics_with_a_key_or_without(gw: Harness) -> None:
    gw.metrics.of(gw.metrics.serving_workers, "ns/pool").set(1)  # a series naming a pool exists
    for key in (KEY, OTHER_KEY, None):
        async with gw.client(key) as c:
            response = await c.get("/metrics")
            assert response.status_code == 404, (key, response.text)
            assert "ns/pool" not in response.text and "modelpool_gateway" not in response.text


async def test_a_pool_the_key_does_not_grant_is_counted_as_a_missing_one(gw: Harness) -> None:
    """The refusal counters cannot tell a key holder (or whoever reads them) that a guessed name is
    another tenant's pool: both are ``not_found``, one each."""

    async def refusals(model: str) -> float:
        before = gw.refused("not_found")
        async with gw.client(OTHER_KEY) as other:
            assert (
                await other.post("/v1/embeddings", json={"model": model, "input": ["x"]})
            ).status_code == 404
            assert (await other.post(f"/v2/models/{model}/infer", json={"inputs": []})).status_code == 404
            assert (await other.get(f"/v1/models/{model}")).status_code == 404
        return gw.refused("not_found") - before

    assert await refusals("pool") == await refusals("no-such-pool") == 3
    counted = [
        line for line in generate_latest(gw.metrics.registry).decode().splitlines() if "reason=" in line
    ]
    assert counted and not [line for line in counted if "not_found" not in line], counted


async def test_a_key_revoked_stops_at_once_and_auth_none_lets_everyone_in(gw: Harness) -> None:
    gw.keys.delete_secret((ADMIN, "ns"))
    async with gw.client(KEY) as c:
        assert (await c.get("/v1/models")).status_code == 401
    open_gateway = Harness(auth="none")
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()

    async with raw_server(record) as port, open_gateway.client("the-pools-own-worker-key") as c:
        assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == ["Org/alias"]
        open_gateway.worker("w0", port)
        assert (await c.post("/v1/embeddings", json={"model": "pool", "input": ["x"]})).status_code == 200
    # Without keys of its own the gateway passes the header on (a pool's own worker key, spec.auth).
    assert b"authorization: bearer the-pools-own-worker-key" in seen[0].lower()
    await open_gateway.demand.close()
    open_gateway.upstream.close()


async def _limited_calls(gw: Harness, fields: dict[str, str], texts: list[str]) -> list[httpx.Response]:
    """Embeddings of ``texts`` (one request each) with a key limited by ``fields``, then one v2 call."""
    gw.keys.set_secret(key_secret("limited", LIMITED_KEY, **{NAMESPACES_FIELD: NS, **fields}))
    async with gw.client(LIMITED_KEY) as c:
        out = [await c.post("/v1/embeddings", json={"model": "pool", "input": [t]}) for t in texts]
        out.append(await c.post("/v2/models/pool/infer", json={"inputs": []}))
    return out


def _key_metric(gw: Harness, code: str) -> float:
    return float(gw.metrics.key_requests.labels(f"{ADMIN}/limited", f"{NS}/pool", code)._value.get())


async def test_a_key_over_its_requests_per_minute_gets_429_with_its_own_retry_after(
    gw: Harness, echo: ServerProcess
) -> None:
    gw.worker("w0", echo.port)
    *answers, over, v2 = await _limited_calls(gw, {REQUESTS_PER_MINUTE_FIELD: "2"}, ["a", "b", "c"])
    assert [a.status_code for a in answers] == [200, 200]
    assert over.status_code == 429 and 1 <= int(over.headers["retry-after"]) <= 60
    error = over.json()["error"]
    assert error["type"] == "rate_limit_exceeded" and "limit of 2 requests per minute" in error["message"]
    assert v2.status_code == 429 and isinstance(v2.json()["error"], str)  # KServe's shape
    assert (await gw.embed()).status_code == 200  # another key of the same pool: unaffected
    refused = gw.metrics.refused.labels(f"{NS}/pool", "key_rate_limited")._value.get()
    assert refused == 2 and _key_metric(gw, "429") == 2 and _key_metric(gw, "200") == 2


async def test_a_key_over_its_tokens_per_minute_is_refused_once_its_answers_used_them(
    gw: Harness, echo: ServerProcess
) -> None:
    """The echo worker reports each text's length as its prompt tokens: 8 + 8 reach a limit of 10 only
    after the second answer (a request is admitted while under the limit, then charged)."""
    gw.worker("w0", echo.port)
    calls = await _limited_calls(gw, {TOKENS_PER_MINUTE_FIELD: "10"}, ["8 tokens", "8 tokens", "x"])
    assert [c.status_code for c in calls] == [200, 200, 429, 429]
    assert "limit of 10 tokens per minute" in calls[2].json()["error"]["message"]
    assert 1 <= int(calls[2].headers["retry-after"]) <= 60
    assert gw.metrics.refused.labels(f"{NS}/pool", "key_token_limited")._value.get() == 2


async def test_each_replica_enforces_its_share_of_a_keys_limit(echo: ServerProcess) -> None:
    replica = Harness(replicas=2)
    replica.worker("w0", echo.port)
    calls = await _limited_calls(replica, {REQUESTS_PER_MINUTE_FIELD: "5"}, ["a", "b", "c"])
    assert [c.status_code for c in calls] == [200, 200, 429, 429]
    assert "(2 on each of 2 gateway replicas)" in calls[2].json()["error"]["message"]
    await replica.demand.close()
    replica.upstream.close()


async def test_a_body_slower_than_its_deadline_gets_408_and_frees_its_slot() -> None:
    slow = Harness(request_body_timeout_seconds=0.5)
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/embeddings",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {KEY}".encode()), (b"content-length", b"100")],
    }
    parts = [{"type": "http.request", "body": b'{"model": "pool", ', "more_body": True}]
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop()
        await never.wait()  # the rest of the body never comes
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(slow.app(scope, receive, send), 5)
    assert asyncio.get_running_loop().time() - started < 2
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]
    error = json.loads(sent[1]["body"])["error"]
    assert error["type"] == "timeout" and "did not arrive within 0.5 s" in error["message"]
    assert slow.refused("body_timeout") == 1
    assert slow.app.in_flight == 0
    await slow.demand.close()
    slow.upstream.close()


async def _call(app: Gateway, body: bytes) -> list[dict[str, Any]]:
    """The messages ``app`` sends for a POST /v1/embeddings of ``body`` (an exception would escape)."""
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/embeddings",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {KEY}".encode())],
    }
    parts = [{"type": "http.request", "body": body, "more_body": False}]
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop()
        await never.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


def _breaking(head: bytes) -> Any:
    """A worker that sends ``head`` (status, headers and the start of a body), then closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head)
        await writer.drain()
        writer.close()

    return handle


async def test_an_answer_that_breaks_off_after_its_headers_is_counted_and_ended(gw: Harness) -> None:
    chunked = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    sized = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    async with AsyncExitStack() as stack:
        streamed = await stack.enter_async_context(raw_server(_breaking(chunked + b"5\r\nhello\r\n")))
        gw.worker("w0", streamed)
        # No exception out of the app (the ASGI transport would raise it here): the stream is ended.
        response = await gw.embed()
        assert response.status_code == 200 and response.content == b"hello"
        gw.registry.delete_worker((NS, "w0"))
        fixed = await stack.enter_async_context(raw_server(_breaking(sized + b'{"data"')))
        gw.worker("w1", fixed)
        # Cut short of its Content-Length: the app returns without ending it (an ASGI server then closes
        # the connection: the client sees a truncated answer, not a complete one).
        sent = await _call(gw.app, b'{"model": "pool", "input": ["x"]}')
        assert sent[0]["status"] == 200
        assert [m.get("body") for m in sent[1:]] == [b'{"data"']
        assert sent[-1]["more_body"]
    assert gw.metrics.relay_errors.labels(f"{NS}/pool", "broken")._value.get() == 2
    assert gw.metrics.requests.labels(f"{NS}/pool", "200")._value.get() == 2


async def test_a_pool_that_can_never_wake_is_answered_503_at_once(gw: Harness) -> None:
    gw.registry.set_pool(Pool(NS, "zero", activation_timeout_s=60, wakes_on_demand=False))
    response = await asyncio.wait_for(gw.embed("zero"), 5)  # not held for the 60 s
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["type"] == "scaled_to_zero" and "scale it up" in error["message"]
    assert not gw.entered.is_set()
    assert gw.metrics.refused.labels(f"{NS}/zero", "scaled_to_zero")._value.get() == 1


# ---- prefix-aware routing (text-generation pools) ----

SYSTEM_PROMPT = "You are the support assistant of a Kubernetes platform; answer in one sentence. " * 5


def _gated(gate: asyncio.Event) -> Any:
    """A worker that answers 200 to each request once ``gate`` is set (so requests stay in flight)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await read_request(reader)
                await gate.wait()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return handle


async def _generation_workers(gw: Harness, stack: AsyncExitStack, gate: asyncio.Event, n: int = 3) -> None:
    gw.registry.set_pool(Pool(NS, "gen", task="text-generation", activation_timeout_s=1))
    for i in range(n):
        port = await stack.enter_async_context(raw_server(_gated(gate)))
        gw.registry.set_worker(Worker(NS, f"gen-{i}", "gen", "127.0.0.1", port, True, True, False))


def _chat(question: str, system: str = SYSTEM_PROMPT) -> dict[str, Any]:
    return {
        "model": "gen",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }


@pytest.mark.parametrize("routing", ["prefix", "least-loaded"])
async def test_a_shared_system_prompt_keeps_one_worker_and_distinct_prompts_spread(routing: str) -> None:
    """One after another, chats under one long system prompt all reach one worker (least-loaded would
    rotate them over the three); chats under distinct system prompts reach every worker."""
    gw = Harness(generation_routing=routing)
    gate = asyncio.Event()
    gate.set()
    try:
        async with AsyncExitStack() as stack, gw.client() as c:
            await _generation_workers(gw, stack, gate)
            shared = [
                (await c.post("/v1/chat/completions", json=_chat(f"question {i}"))).headers[
                    "x-modelpool-worker"
                ]
                for i in range(12)
            ]
            completions = [
                (
                    await c.post("/v1/completions", json={"model": "gen", "prompt": SYSTEM_PROMPT + str(i)})
                ).headers["x-modelpool-worker"]
                for i in range(6)
            ]
            distinct = {
                (await c.post("/v1/chat/completions", json=_chat("hi", f"system prompt {i}"))).headers[
                    "x-modelpool-worker"
                ]
                for i in range(30)
            }
    finally:
        await gw.demand.close()
        gw.upstream.close()
    assert len(distinct) == 3  # either way: 30 prompts over 3 workers
    if routing == "prefix":
        assert len(set(shared)) == 1 and len(set(completions)) == 1, (shared, completions)
        assert gw.metrics.prefix_routed.labels(f"{NS}/gen", "home")._value.get() == 12 + 6 + 30
    else:
        assert len(set(shared)) == 3, shared


async def test_a_hot_prefix_spills_over_within_the_load_bound(gw: Harness) -> None:
    """Twelve chats under one system prompt at once: the prefix's worker takes them up to the bound
    (ceil(1.25 * in flight / 3)), the next ones go on round the ring; none passes the bound."""
    gate = asyncio.Event()
    async with AsyncExitStack() as stack, gw.client() as c:
        await _generation_workers(gw, stack, gate)
        sent = [asyncio.ensure_future(c.post("/v1/chat/completions", json=_chat(f"q{i}"))) for i in range(12)]
        await wait_for_async(lambda: sum(gw.app.loads.values()) == 12, within=10, message="12 in flight")
        loads = sorted(gw.app.loads.values())
        gate.set()
        answers = await asyncio.gather(*sent)
    assert [a.status_code for a in answers] == [200] * 12
    assert len(loads) >= 2 and loads[-1] <= math.ceil(1.25 * 12 / 3), loads
    placed = {p: gw.metrics.prefix_routed.labels(f"{NS}/gen", p)._value.get() for p in ("home", "spilled")}
    assert placed["home"] == loads[-1] and placed["spilled"] == 12 - loads[-1], (placed, loads)


async def test_a_full_pool_queues_by_key_within_its_bounds_and_answers_429_past_them() -> None:
    """Fair shares (``fairness``): a pool of one worker of capacity 1; a second request waits in the fair
    queue, a key's second waiting one is refused (per key), another key's is queued until the pool's
    bound, a wait past the client's deadline is refused; then every waiting one is served."""
    small = Harness(max_queued_per_key=1, max_queued_per_pool=2)
    small.registry.set_pool(Pool(NS, "pool", queue_capacity=1))
    small.keys.set_secret(key_secret("ns-second", SECOND_KEY, **{NAMESPACES_FIELD: NS}))
    small.keys.set_secret(key_secret("ns-third", THIRD_KEY, **{NAMESPACES_FIELD: NS, "weight": "2"}))
    pool, gate = (NS, "pool"), asyncio.Event()
    body = {"model": "pool", "input": ["x"]}
    async with raw_server(_gated(gate)) as port:
        small.worker("w0", port)
        async with small.client() as c, small.client(SECOND_KEY) as second, small.client(THIRD_KEY) as third:
            running = asyncio.ensure_future(c.post("/v1/embeddings", json=body))
            await wait_for_async(lambda: small.app.fair.running(pool) == 1, 10, message="one running")
            waiting = [asyncio.ensure_future(c.post("/v1/embeddings", json=body))]
            await wait_for_async(lambda: small.app.fair.queued(pool) == 1, 10, message="one waiting")
            refused = await c.post("/v1/embeddings", json=body)
            assert refused.status_code == 429 and refused.json()["error"]["type"] == "overloaded"
            assert "this API key has 1 requests waiting" in refused.json()["error"]["message"]
            assert refused.headers["retry-after"] == str(small.settings.hold_retry_after_seconds)
            waiting.append(asyncio.ensure_future(second.post("/v1/embeddings", json=body)))
            await wait_for_async(lambda: small.app.fair.queued(pool) == 2, 10, message="two waiting")
            full = await third.post("/v2/models/pool/infer", json={"inputs": []})
            assert full.status_code == 429 and "it has 2 requests waiting" in full.json()["error"]
            assert small.metrics.refused.labels(f"{NS}/pool", "key_queue_full")._value.get() == 1
            assert small.metrics.refused.labels(f"{NS}/pool", "queue_full")._value.get() == 1
            assert small.metrics.queued.labels(f"{NS}/pool")._value.get() == 2
            gate.set()
            for response in await asyncio.gather(running, *waiting):
                assert response.status_code == 200, response.text
            # Alone again: a request whose deadline passes while the pool stays full is refused.
            gate.clear()
            running = asyncio.ensure_future(c.post("/v1/embeddings", json=body))
            await wait_for_async(lambda: small.app.fair.running(pool) == 1, 10, message="one running")
            late = await third.post("/v1/embeddings", json=body, headers={"x-request-timeout": "0.2"})
            assert late.status_code == 429 and "stayed full" in late.json()["error"]["message"]
            gate.set()
            assert (await running).status_code == 200
    assert small.app.fair.running(pool) == 0 and small.app.fair.queued(pool) == 0
    await small.demand.close()
    small.upstream.close()
