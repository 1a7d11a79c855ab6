"""What the operator keeps per pod and per pool (issue 19: its memory at 1,000 pools x 10 workers).

The pods index holds one value per worker pod of every pool: ``slim_pod`` keeps only the fields the
operator reads, with shared (interned) keys and short strings, and the worker it describes is the one
the whole body describes."""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import inspect
import json
import os
import ssl
import sys
from dataclasses import replace
from typing import Any

import pytest
from kubernetes_asyncio import client

from modelpool_operator import heap
from modelpool_operator.effects.kube import Kube
from modelpool_operator.observe.observation import slim_pod
from modelpool_operator.observe.stats import StatsScraper, stats_url
from modelpool_operator.observe.worker_state import LifecycleSettings, observe_worker
from testkit.environment import free_port
from tests.operator.unit.op_pods import GI, at, pod, running, stats, terminated, waiting


def kwok_pod(index: int) -> dict[str, Any]:
    """A worker pod as a KWOK node reports it (what the watch delivers in bench.controlplane): managed
    fields, four conditions with probe times, a container status with its image, the pod IPs, QoS."""
    name = f"pool-{index // 10:03d}-43b18-{index % 10}"
    body = pod(name, pool=f"pool-{index // 10:03d}", ready=True)
    body["metadata"]["resourceVersion"] = str(1000 + index)
    body["metadata"]["managedFields"] = [
        {"manager": "kwok", "operation": "Update", "fieldsV1": {"f:status": {"f:conditions": {}}}}
    ]
    body["spec"]["containers"][0]["ports"] = [
        {"containerPort": 8000, "name": "http", "protocol": "TCP"},
        {"containerPort": 8001, "name": "probes", "protocol": "TCP"},
    ]
    body["spec"]["containers"][0]["image"] = "ghcr.io/modelpool/modelpool-server:0.1.0"
    body["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
    status = body["status"]
    probe = {"lastProbeTime": None, "lastTransitionTime": "2026-01-01T12:00:30Z", "status": "True"}
    status["conditions"] = [
        {**probe, "type": kind} for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    status["containerStatuses"][0].update(
        image="ghcr.io/modelpool/modelpool-server:0.1.0", imageID="", lastState={}, started=True
    )
    ip = f"127.80.{index // 250}.{index % 250 + 1}"
    status.update(
        podIP=ip,
        podIPs=[{"ip": ip}],
        hostIP="10.0.0.1",
        qosClass="Burstable",
        startTime="2026-01-01T12:00:00Z",
    )
    return body


def test_slim_pod_keeps_only_what_the_operator_reads() -> None:
    slim = slim_pod(kwok_pod(7))
    assert set(slim) == {"metadata", "spec", "status"}
    assert "managedFields" not in slim["metadata"]
    assert set(slim["status"]) == {"phase", "podIP", "conditions", "containerStatuses"}
    assert [c["type"] for c in slim["status"]["conditions"]] == ["Ready", "PodScheduled"]
    assert all("lastProbeTime" not in c for c in slim["status"]["conditions"])
    # ``lastState: {}`` reads as no last state: not kept
    assert set(slim["status"]["containerStatuses"][0]) == {"name", "ready", "restartCount", "state"}
    assert set(slim["spec"]) == {"nodeName", "containers"}
    assert slim["spec"]["containers"][0]["ports"] == [
        {"name": "http", "containerPort": 8000},
        {"name": "probes", "containerPort": 8001},
    ]


def test_slim_pods_share_their_keys_and_repeated_strings() -> None:
    """Each watch event is a new JSON document; the index values of two pods parsed apart share one copy
    of each key and of each repeated short value."""
    first, second = (slim_pod(json.loads(json.dumps(kwok_pod(i)))) for i in (1, 2))
    key_first = next(k for k in first["status"]["conditions"][0] if k == "lastTransitionTime")
    key_second = next(k for k in second["status"]["conditions"][0] if k == "lastTransitionTime")
    assert key_first is key_second
    assert first["status"]["phase"] is second["status"]["phase"]
    assert first["metadata"]["namespace"] is second["metadata"]["namespace"]


def retained_bytes(values: list[Any]) -> int:
    """The bytes the objects reachable from ``values`` take, each object once (shared keys and strings
    count once for all)."""
    seen: set[int] = set()
    total, stack = 0, list(values)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend([*obj.keys(), *obj.values()])
        elif isinstance(obj, list | tuple):
            stack.extend(obj)
    return total


def test_slim_pod_retains_at_most_4_kib() -> None:
    """1,000 pools x 10 workers: 10,000 index values (a copy of the read parts retained 8.3 KiB each)."""
    kept = [slim_pod(json.loads(json.dumps(kwok_pod(i)))) for i in range(500)]
    per_pod = retained_bytes(kept) / len(kept)
    assert per_pod <= 4 * 1024, f"{per_pod:.0f} bytes per pod"


SHAPES = [
    pod(ready=True),
    pod(ready=False),
    pod(
        phase="Pending",
        node=None,
        conditions=[
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}
        ],
    ),
    pod(phase="Pending", state=waiting("ContainerCreating")),
    pod(state=waiting("CrashLoopBackOff", "back-off"), last_state=terminated(1, "Error", "boom"), restarts=3),
    pod(
        phase="Failed", state=terminated(137, "OOMKilled"), pod_reason="Evicted", pod_message="node pressure"
    ),
    pod(phase="Succeeded", state=terminated(0, "Completed")),
    pod(ready=True, deleted=50, evicting="ScaleDown", evicting_since=40),
    pod(ready=True, memory=3 * GI, state=running(5)),
    pod(
        phase="Running",
        conditions=[
            {
                "type": "Ready",
                "status": "False",
                "reason": "NodeLost",
                "lastTransitionTime": "2026-01-01T12:00:40Z",
            }
        ],
    ),
    kwok_pod(3),
]


@pytest.mark.parametrize("body", SHAPES, ids=range(len(SHAPES)))
@pytest.mark.parametrize("report", [None, stats("Ready", last_request=45), stats("Loading")])
def test_the_slim_pod_is_the_same_worker(body: dict[str, Any], report: dict[str, Any] | None) -> None:
    settings = LifecycleSettings()
    for now in (at(60), at(3600)):
        assert observe_worker(slim_pod(body), report, now, settings) == observe_worker(
            body, report, now, settings
        )
    assert stats_url(slim_pod(body), 9999) == stats_url(body, 9999)


def test_the_scraper_keeps_no_finished_fetch() -> None:
    """Each pod's scrape state holds its fetch only while it runs: 10,000 KWOK pods (refused, backing off
    for minutes) held 10,000 finished tasks, each with its coroutine, context and anyio's task state."""
    port = free_port()  # nothing listens there: each fetch is refused at once

    def kwok(index: int) -> dict[str, Any]:
        return {
            "metadata": {"name": f"kwok-{index}", "uid": f"u{index}", "resourceVersion": "1"},
            "spec": {"containers": [{"ports": [{"name": "probes", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        }

    async def scrape() -> list[Any]:
        scraper = StatsScraper(interval=5, timeout=1, concurrency=4, backoff_cap=30, default_port=port)
        try:
            assert await scraper.scrape([kwok(i) for i in range(20)]) == dict.fromkeys(
                (f"kwok-{i}" for i in range(20)), None
            )
            return [entry.task for entry in scraper._entries.values()]
        finally:
            await scraper.aclose()

    assert asyncio.run(scrape()) == [None] * 20


def test_an_observed_worker_has_no_instance_dict() -> None:
    """One per worker pod in the observation cache and in each pool's last observation: slots, not a
    dict of 36 entries each."""
    worker = observe_worker(slim_pod(kwok_pod(1)), None, at(60))
    assert not hasattr(worker, "__dict__")
    assert replace(worker, state="Failed").state == "Failed"


def test_the_heap_gives_freed_memory_back() -> None:
    """What a burst frees goes back to the system (the C allocator keeps it otherwise): 200 MiB of 1 KiB
    blocks (above Python's small-object allocator: from malloc) with one in 64 left alive."""
    blocks = [bytes(1024) + i.to_bytes(4, "little") for i in range(200 * 1024)]
    kept = blocks[::64]
    del blocks
    before = rss_bytes()
    assert heap.trim()
    freed = before - rss_bytes()
    assert freed > 100 * 2**20, f"{freed / 2**20:.0f} MiB given back"
    assert len(kept) == 3200


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_tls_connection_reads_into_a_64_kib_buffer() -> None:
    """asyncio gives each TLS connection a 256 KiB read buffer (318 KiB a connection with OpenSSL's, for
    the 130 connections the operator held at 300 and 1,000 pools): the operator's main shrinks it."""
    default = asyncio.sslproto.SSLProtocol.max_size
    try:
        heap.shrink_tls_buffers()
        loop = asyncio.new_event_loop()
        try:
            context = ssl.create_default_context()
            # No waiter (typeshed's signature asks for one) and asyncio's own buffer, which typeshed omits.
            protocol = asyncio.sslproto.SSLProtocol(loop, asyncio.Protocol(), context, None)  # type: ignore[arg-type]
            assert len(protocol._ssl_buffer) == 64 * 1024  # type: ignore[attr-defined]
        finally:
            loop.close()
    finally:
        asyncio.sslproto.SSLProtocol.max_size = default


def test_api_requests_start_only_when_a_connection_is_free() -> None:
    """The generated client serializes a request's body when the request starts, then waits for one of
    its connections: a 1,000-pool scale-up held thousands of pod bodies twice over behind 100 connections.
    The operator's requests start only as connections are free (two here), and one that waits for a free
    connection past the request timeout fails without ever starting."""

    async def scenario() -> tuple[list[int], list[int], bool]:
        api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
        api.configuration.connection_pool_maxsize = 2
        kube = Kube(api, request_timeout=0.2)
        started: list[int] = []
        release = asyncio.Event()

        async def request(index: int) -> None:
            started.append(index)
            await release.wait()

        try:
            sent = [asyncio.create_task(kube._took_effect("create_pod", request(i))) for i in range(6)]
            for _ in range(20):  # every task runs as far as it can
                await asyncio.sleep(0)
            at_once = list(started)
            assert at_once == [0, 1]
            release.set()
            await asyncio.gather(*sent)
            release.clear()
            holding = [asyncio.create_task(kube._took_effect("create_pod", request(i))) for i in (6, 7)]
            for _ in range(20):  # both connections taken
                await asyncio.sleep(0)
            assert len(started) == 8
            late = request(99)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(5):  # the test's own bound
                    await kube._took_effect("create_pod", late)
            assert 99 not in started
            release.set()
            await asyncio.gather(*holding)
            return at_once, sorted(started), inspect.getcoroutinestate(late) == inspect.CORO_CLOSED
        finally:
            await api.close()

    at_once, all_started, closed = asyncio.run(scenario())
    assert at_once == [0, 1]
    assert all_started == [0, 1, 2, 3, 4, 5, 6, 7]  # the one that timed out never started
    assert closed
