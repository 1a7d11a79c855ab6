"""The ``/stats`` scrape is bounded against a worker that answers badly (issue 30, item 5): a real HTTP
server on loopback stands in for the workers and trickles, floods or declares a huge answer.

* an answer that trickles a byte at a time is cut at the scrape's deadline (httpx's read timeout alone is
  per chunk: the trickle would hold the slot for as long as it kept sending);
* an endless or huge answer is dropped once past ``STATS_MAX_BYTES``, with the operator's memory growing
  by about that much, not by what the worker sends;
* one pool whose many workers all trickle costs only its own scrape: another pool's completes within its
  own deadline beside it;
* each dropped answer is counted by reason (``stats_unreadable_total``).
"""

from __future__ import annotations

import asyncio
import gc
import socket
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from modelpool_contract.labels import LABEL_POOL
from modelpool_contract.placements import LABEL_HOST
from modelpool_contract.stats import HOST_STATS_MAX_BYTES, STATS_MAX_BYTES
from modelpool_operator.metrics import OperatorMetrics
from modelpool_operator.observe.stats import StatsScraper, stats_size_bound

_GOOD = b'{"state": "Idle", "queue_depth": 0}'
Behaviour = Callable[[asyncio.StreamWriter], Awaitable[None]]


def _pod(name: str, pool: str, port: int, *, namespace: str = "team") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{pool}-{name}",
            "resourceVersion": "1",
            "labels": {LABEL_POOL: pool},
        },
        "spec": {"containers": [{"ports": [{"name": "probes", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }


async def _good(writer: asyncio.StreamWriter) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (len(_GOOD), _GOOD)
    )
    await writer.drain()


async def _trickle(writer: asyncio.StreamWriter) -> None:
    """A valid beginning, then one byte every 50 ms for ever: each read comes well within any per-read
    timeout."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 60000\r\n\r\n")
    await writer.drain()
    while True:
        writer.write(b" ")
        await writer.drain()
        await asyncio.sleep(0.05)


async def _flood(writer: asyncio.StreamWriter) -> None:
    """A chunked answer that never ends, as fast as the socket takes it."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
    chunk = b"[" + b"0," * 32_767 + b"0"
    while True:
        writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()


async def _declared_huge(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1073741824\r\n\r\n{")
    await writer.drain()
    await asyncio.sleep(30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Server:
    """A raw HTTP/1.1 server on 127.0.0.1 answering every request with ``behaviour``; counts requests."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.port = _free_port()
        self.requests = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            await self.behaviour(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the scraper hung up: what a bounded scrape does
        except asyncio.CancelledError:
            pass  # the test is over (``__aexit__``): the trickles and floods never end by themselves
        finally:
            writer.close()
            self._handlers.discard(task)

    async def __aenter__(self) -> _Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._handlers):  # the trickles and floods never end by themselves
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()


@pytest.fixture
async def metrics() -> AsyncIterator[OperatorMetrics]:
    yield OperatorMetrics()


def _scraper(metrics: OperatorMetrics, *, timeout: float, concurrency: int = 16) -> StatsScraper:
    return StatsScraper(
        interval=30,
        timeout=timeout,
        concurrency=concurrency,
        backoff_cap=60,
        default_port=8001,
        on_unreadable=lambda reason: metrics.stats_unreadable.labels(reason=reason).inc(),
    )


def _dropped(metrics: OperatorMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("modelpool_operator_stats_unreadable_total", {"reason": reason})
    return value or 0.0


async def test_a_trickling_answer_is_cut_at_the_deadline(metrics: OperatorMetrics) -> None:
    scraper = _scraper(metrics, timeout=0.5)
    async with _Server(_trickle) as server:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await asyncio.wait_for(scraper.scrape([_pod("slow-0", "slow", server.port)]), 10)
        took = loop.time() - started
        await scraper.aclose()
    assert result == {"slow-0": None}  # unknown stats, never an error
    # Each byte came within the client's per-read timeout; only the total deadline ended it.
    assert 0.4 < took < 2.0, took
    assert _dropped(metrics, "deadline") == 1


async def test_an_endless_answer_is_dropped_past_the_size_bound_with_memory_bounded(
    metrics: OperatorMetrics,
) -> None:
    scraper = _scraper(metrics, timeout=5.0)
    async with _Server(_flood) as server:
        gc.collect()
        tracemalloc.start()
        try:
            result = await scraper.scrape([_pod("flood-0", "flood", server.port)])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await scraper.aclose()
    assert result == {"flood-0": None}
    assert _dropped(metrics, "too_large") == 1
    # The server sends without end as fast as the socket takes it; the scraper keeps at most the bound
    # plus one socket read (and the client's buffers), not what was sent over the deadline.
    assert peak < 4 * STATS_MAX_BYTES + 1024 * 1024, peak


async def test_a_declared_huge_answer_is_refused_before_its_body(metrics: OperatorMetrics) -> None:
    scraper = _scraper(metrics, timeout=5.0)
    async with _Server(_declared_huge) as server:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await scraper.scrape([_pod("huge-0", "huge", server.port)])
        took = loop.time() - started
        await scraper.aclose()
    assert result == {"huge-0": None}
    assert took < 2.0  # refused at the headers, not after the 5 s deadline
    assert _dropped(metrics, "too_large") == 1


async def test_a_slow_pool_costs_only_its_own_scrape(metrics: OperatorMetrics) -> None:
    """40 workers of one pool trickle, on an operator whose 16 slots they would fill four deep; another
    pool's 3 workers are scraped beside them within one deadline, as if the slow pool were not there."""
    deadline = 1.0
    scraper = _scraper(metrics, timeout=deadline, concurrency=16)
    async with _Server(_trickle) as slow, _Server(_good) as good:
        slow_pods = [_pod(f"slow-{i}", "slow", slow.port, namespace="noisy") for i in range(40)]
        good_pods = [_pod(f"good-{i}", "good", good.port) for i in range(3)]
        scraper.refresh(slow_pods)  # the slow pool's fetches start first and take their slots
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await asyncio.wait_for(scraper.scrape(good_pods), 10)
        took = loop.time() - started
        in_flight_slow = slow.requests
        slow_result = await asyncio.wait_for(scraper.scrape(slow_pods), 30)
        await scraper.aclose()
    assert result == {f"good-{i}": {"state": "Idle", "queue_depth": 0} for i in range(3)}
    assert took < deadline / 2, took
    # The slow pool held at most its own share of the slots while the good pool was scraped.
    assert in_flight_slow <= 8
    assert slow_result == {f"slow-{i}": None for i in range(40)}
    assert _dropped(metrics, "deadline") == 40


def test_a_host_pods_answer_may_hold_one_document_per_model() -> None:
    worker = _pod("w-0", "p", 8001)
    host = _pod("h-0", "host_h", 8001)
    host["metadata"]["labels"][LABEL_HOST] = "h"
    assert stats_size_bound(worker) == STATS_MAX_BYTES
    assert stats_size_bound(host) == HOST_STATS_MAX_BYTES


async def test_with_two_slots_a_slow_pool_holds_one(metrics: OperatorMetrics) -> None:
    """The smallest operator-wide bound that can share: a pool holds at most half the slots."""
    scraper = _scraper(metrics, timeout=1.0, concurrency=2)
    async with _Server(_trickle) as slow, _Server(_good) as good:
        scraper.refresh([_pod(f"slow-{i}", "slow", slow.port) for i in range(2)])
        await asyncio.sleep(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await asyncio.wait_for(scraper.scrape([_pod("good-0", "good", good.port)]), 10)
        took = loop.time() - started
        held = slow.requests
        await scraper.aclose()
    assert result == {"good-0": {"state": "Idle", "queue_depth": 0}}
    assert took < 0.5, took
    assert held == 1
