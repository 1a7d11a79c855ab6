"""Workers that answer ``/stats`` badly or lie in it, against the real operator process and API server
(issue 30, item 5: "Bounded everywhere", the operator's half).

The workers are KWOK pods; each one's ``/stats`` is a small HTTP server bound to its own (loopback) pod IP
and probe port, as in test_memory_measured.py: the one stand-in here. Everything else is real: the API
server, the scheduler, the operator's scrape of the pod IP, its status, Events and evictions.

* One pool whose workers trickle their answer a byte at a time, or flood it without end, costs only its
  own scrape: another pool's worker is scraped beside them (the operator runs with two scrape slots), and
  the operator's memory stays bounded.
* A worker that reports Processing at every scrape (a fresh ``state_since`` each time) is believed for the
  pool's request timeout plus the grace only: then it counts as Idle (``ProcessingNotBelieved``, a Warning
  Event) and a higher-priority pool that needs its memory preempts it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from modelpool_contract.labels import ANNOTATION_EVICTED_IN_STATE, ANNOTATION_EVICTING
from modelpool_contract.stats import WorkerStats
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, wait_for
from tests.operator.integration.opharness import (
    StartOperator,
    events,
    pool_manifest,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster]

Answer = Callable[[BaseHTTPRequestHandler], None]


@contextmanager
def stats_at(ip: str, port: int, answer: Answer) -> Iterator[None]:
    """Answer every GET on the worker's pod IP and port with ``answer``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            # The operator hanging up is what a bounded scrape does.
            with suppress(ConnectionError):
                answer(self)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer((ip, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def json_answer(document: Callable[[], dict[str, Any]]) -> Answer:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        body = json.dumps(document()).encode()
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    return answer


def trickle(stop: threading.Event) -> Answer:
    """A valid start, then a byte every 0.2 s until the operator hangs up (or the test ends)."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", "60000")
        handler.end_headers()
        while not stop.is_set():
            handler.wfile.write(b" ")
            handler.wfile.flush()
            stop.wait(0.2)

    return answer


def flood(stop: threading.Event) -> Answer:
    """An answer without end (no content-length, closed by the server), as fast as it is taken."""

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.end_headers()
        chunk = b"[" + b"0," * 32_767
        while not stop.is_set():
            handler.wfile.write(chunk)

    return answer


def running_ips(cluster: Cluster, namespace: str, pool: str, count: int) -> list[str]:
    return wait_for(
        lambda: (
            ips
            if len(
                ips := [
                    p["status"]["podIP"]
                    for p in worker_pods(cluster, namespace, pool)
                    if (p.get("status") or {}).get("podIP") and p["status"].get("phase") == "Running"
                ]
            )
            == count
            else None
        ),
        timeout=90,
        message=f"{count} running workers of {pool}",
    )


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_trickling_or_flooding_pool_costs_only_its_own_scrape(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    probe_port = free_port()
    operator = start_operator(
        namespace,
        MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(probe_port),
        # Two slots: without a per-pool bound and a whole-answer deadline, the slow pool's two workers
        # would hold both for ever (each byte arrives well within the per-read timeout).
        MODELPOOL_OPERATOR_STATS_CONCURRENCY="2",
        MODELPOOL_OPERATOR_STATS_TIMEOUT_SECONDS="1",
        MODELPOOL_OPERATOR_STATS_INTERVAL_SECONDS="1",
    )
    apply(cluster, pool_manifest("slow", replicas=2), namespace)
    apply(cluster, pool_manifest("good", replicas=1), namespace)
    slow_ips = running_ips(cluster, namespace, "slow", 2)
    (good_ip,) = running_ips(cluster, namespace, "good", 1)
    stop = threading.Event()
    depth = [0]  # the good worker's queue depth, changed once the slow pool's scrapes are under way
    asked = {ip: 0 for ip in slow_ips}

    def good_stats() -> dict[str, Any]:
        return WorkerStats(
            state="Idle", state_since=time.time() - 60, queue_depth=depth[0], in_flight=0
        ).wire()

    def counted(ip: str, answer: Answer) -> Answer:
        def count(handler: BaseHTTPRequestHandler) -> None:
            asked[ip] += 1
            answer(handler)

        return count

    before = rss_bytes(operator.proc.pid)
    with ExitStack() as stack:
        stack.callback(stop.set)
        stack.enter_context(stats_at(slow_ips[0], probe_port, counted(slow_ips[0], trickle(stop))))
        stack.enter_context(stats_at(slow_ips[1], probe_port, counted(slow_ips[1], flood(stop))))
        stack.enter_context(stats_at(good_ip, probe_port, json_answer(good_stats)))
        wait_status(
            cluster,
            namespace,
            "good",
            lambda s: [w.get("queueDepth") for w in s.get("workers") or []] == [0],
            timeout=60,
            message="the good pool's worker scraped (queueDepth 0)",
        )
        # Both slow workers asked: unbounded, their two answers would now hold both slots for ever.
        wait_for(lambda: all(asked.values()) or None, timeout=60, message="both slow workers scraped")
        depth[0] = 3
        status = wait_status(
            cluster,
            namespace,
            "good",
            lambda s: [w.get("queueDepth") for w in s.get("workers") or []] == [3],
            timeout=30,
            message="the good pool's worker scraped again beside the slow pool (queueDepth 3)",
        )
        assert status["workers"][0]["state"] == "Idle"
        # The slow pool's workers keep trickling and flooding: the operator lives, its memory stays
        # bounded, and they are observed with unknown stats (never failed for it).
        slow = wait_status(
            cluster,
            namespace,
            "slow",
            lambda s: (
                len(s.get("workers") or []) == 2 and all(w.get("queueDepth") is None for w in s["workers"])
            ),
            timeout=30,
            message="the slow pool's workers observed with unknown stats",
        )
        assert {w["state"] for w in slow["workers"]} <= {"Ready", "Loading"}
        # Each answer cut at its deadline or bound, and the worker asked again after its backoff.
        wait_for(lambda: min(asked.values()) >= 2 or None, timeout=30, message="the slow workers asked again")
        assert operator.alive()
        grown = rss_bytes(operator.proc.pid) - before
        assert grown < 64 * 1024 * 1024, f"the operator grew {grown} bytes"
    log = operator.log_tail(10**6)
    assert "dropped (no whole answer within 1s)" in log or "dropped (the /stats answer runs past" in log


def test_a_worker_that_always_reports_processing_is_preempted_past_its_bound(
    cluster: Cluster,
    namespace: str,
    start_operator: StartOperator,
    budget: Callable[[str], None],
) -> None:
    probe_port = free_port()
    budget("4Gi")
    start_operator(
        namespace,
        MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(probe_port),
        MODELPOOL_OPERATOR_PROCESSING_GRACE_SECONDS="4",
    )
    low = pool_manifest("low", replicas=1, memory="4Gi", priority=0)
    low["spec"]["queue"]["requestTimeoutSeconds"] = 1  # believed for 1 s plus the 4 s grace
    apply(cluster, low, namespace)
    (ip,) = running_ips(cluster, namespace, "low", 1)

    def processing() -> dict[str, Any]:
        now = time.time()  # "just started", at every scrape
        return WorkerStats(
            state="Processing", state_since=now, queue_depth=0, in_flight=1, last_request_time=now
        ).wire()

    with stats_at(ip, probe_port, json_answer(processing)):
        wait_status(
            cluster,
            namespace,
            "low",
            lambda s: [w["state"] for w in s.get("workers") or []] == ["Processing"],
            timeout=60,
            message="the low pool's worker reported Processing",
        )
        apply(cluster, pool_manifest("high", replicas=1, memory="4Gi", priority=10), namespace)
        told = wait_for(
            lambda: [e for e in events(cluster, namespace, "low") if e["reason"] == "ProcessingNotBelieved"],
            timeout=90,
            message="the ProcessingNotBelieved Event",
        )
        assert told[0]["type"] == "Warning" and "requestTimeoutSeconds plus 4s" in told[0]["message"]
        (victim,) = wait_for(
            lambda: [
                p
                for p in worker_pods(cluster, namespace, "low")
                if (p["metadata"].get("annotations") or {}).get(ANNOTATION_EVICTING) == "Preempted"
            ],
            timeout=60,
            message="the low pool's worker preempted",
        )
        assert victim["metadata"]["annotations"][ANNOTATION_EVICTED_IN_STATE] == "Idle"
    wait_for(
        lambda: worker_pods(cluster, namespace, "high") or None,
        timeout=90,
        message="the high pool's worker admitted in the freed memory",
    )
