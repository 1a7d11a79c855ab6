"""The gateway under 10x overload (429 with Retry-After, never a 5xx, memory bounded) and a gateway killed
and started again while the cluster changes (it rebuilds everything from its watches)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, is_ready, wait_for
from tests.gateway.integration.conftest import StartGateway
from tests.gateway.integration.gwharness import GatewayProcess, echo_pool
from tests.operator.integration.opharness import POOLS, OperatorProcess, worker_pods

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

StartOperator = Callable[..., OperatorProcess]
MIB = 2**20


class RssPeak:
    """The gateway's largest RSS, sampled in a thread while a run goes on."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.gateway, self.peak = gateway, gateway.rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self.gateway.rss_bytes())


async def _overload(
    gateway: GatewayProcess, clients: int, seconds: float
) -> tuple[Counter[int], list[httpx.Response]]:
    """``clients`` loops sending as fast as answers come back (no client honours Retry-After)."""
    codes: Counter[int] = Counter()
    refused: list[httpx.Response] = []
    stop = time.monotonic() + seconds
    body = {"model": "busy", "input": ["hello"]}

    async def loop(client: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            response = await client.post(gateway.url + "/v1/embeddings", json=body, headers=gateway.headers)
            codes[response.status_code] += 1
            if response.status_code == 429 and len(refused) < 50:
                refused.append(response)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        await asyncio.gather(*(loop(client) for _ in range(clients)))
    return codes, refused


def test_ten_times_overload_is_refused_with_429_never_5xx_and_memory_stays_bounded(
    crds: Cluster, namespace: str, start_operator: StartOperator, start_gateway: StartGateway
) -> None:
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(free_port()))
    # One worker computing one request at a time for 50 ms, 10 waiting at most: 11 requests fit, and
    # 110 clients are 10x that.
    pool = echo_pool("busy", env={"HANDLER_RUN_SECONDS": "0.05"}, queue_capacity=10)
    pool["spec"]["queue"]["maxBatchSize"] = 1
    apply(crds, pool, namespace)
    # Every client sends with one key: the pool's fair queue (test_gateway_fairness) holds one of its
    # requests at most, so what is measured is the refusals, as when the workers refused them.
    gateway = start_gateway([namespace], "--max-queued-per-key", "1")
    gateway.wait_serving("busy", 1)
    warm, _ = asyncio.run(_overload(gateway, 20, 2))  # connections, buffers and metrics warmed up
    assert warm[200] > 0
    before = gateway.rss_bytes()

    with RssPeak(gateway) as rss:
        codes, refused = asyncio.run(_overload(gateway, 110, 15))
    after = gateway.rss_bytes()

    assert set(codes) <= {200, 429}, codes
    assert codes[429] > codes[200] > 0, codes
    for response in refused:
        assert int(response.headers["retry-after"]) >= 1
        assert response.json()["error"]["type"] == "overloaded"
    assert rss.peak - before < 64 * MIB, f"peak RSS grew by {(rss.peak - before) / MIB:.1f} MiB"
    assert after - before < 32 * MIB, f"RSS grew by {(after - before) / MIB:.1f} MiB"
    # Afterwards nothing is left in flight, and a request is served at once.
    wait_for(
        lambda: gateway.metric("modelpool_gateway_in_flight_requests") == 0,
        timeout=10,
        message="nothing in flight",
    )
    assert (
        httpx.post(
            gateway.url + "/v1/embeddings", json={"model": "busy", "input": ["x"]}, headers=gateway.headers
        ).status_code
        == 200
    )


def test_a_gateway_killed_and_started_again_rebuilds_everything_from_its_watches(
    crds: Cluster, namespace: str, start_operator: StartOperator, start_gateway: StartGateway
) -> None:
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(free_port()))
    apply(crds, echo_pool("first"), namespace)
    first = start_gateway([namespace])
    first.wait_serving("first", 1)
    assert (
        httpx.post(
            first.url + "/v1/embeddings", json={"model": "first", "input": ["x"]}, headers=first.headers
        ).status_code
        == 200
    )
    first.kill()

    # While no gateway runs: a new pool, and the first one grows to two workers.
    apply(crds, echo_pool("second"), namespace)
    crds.kubectl("scale", POOLS, "first", "-n", namespace, "--replicas=2")

    def ready_pods(pool: str) -> int:
        return sum(1 for p in worker_pods(crds, namespace, pool) if is_ready(p))

    wait_for(
        lambda: ready_pods("first") == 2 and ready_pods("second") == 1, timeout=180, message="pods ready"
    )

    again = start_gateway([namespace])
    # Ready means listed: everything is known at once, without waiting for further events.
    models = again.models()
    assert models["first"]["modelpool"]["servingWorkers"] == 2
    assert models["second"]["modelpool"]["servingWorkers"] == 1
    served = Counter(
        httpx.post(
            again.url + "/v1/embeddings", json={"model": "first", "input": ["x"]}, headers=again.headers
        ).headers["x-modelpool-worker"]
        for _ in range(10)
    )
    assert len(served) == 2, served
    assert (
        httpx.post(
            again.url + "/v1/embeddings", json={"model": "second", "input": ["x"]}, headers=again.headers
        ).status_code
        == 200
    )

    # And it keeps following the cluster: a deleted pool is gone from it.
    crds.kubectl("delete", POOLS, "second", "-n", namespace, "--timeout=60s")
    wait_for(lambda: "second" not in again.models(), timeout=30, message="the deleted pool is gone")
    response = httpx.post(
        again.url + "/v1/embeddings", json={"model": "second", "input": ["x"]}, headers=again.headers
    )
    assert response.status_code == 404
