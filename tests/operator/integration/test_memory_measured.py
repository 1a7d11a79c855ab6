"""Declared against measured memory on the real API server, with the real operator process.

A GPU worker whose server reports more accelerator memory than the worker is charged gets the condition
MemoryExceedsCharge with the numbers, a Warning Event, its measured memory in ``status.workers[]`` and the
pool's MEASURED column (``kubectl get -o wide``).

This machine has no GPU, so no real ``modelpool-server`` can report accelerator memory here; the one
stand-in of this suite is therefore the ``/stats`` answer of a KWOK worker: a small HTTP server bound to
the worker's own (loopback) pod IP and probe port, answering the document the real server emits
(``modelpool_contract.stats.WorkerStats``) with GPU figures. Everything else is real: the API server, the
scheduler, the operator's scrape of the pod IP, its status and Events, kubectl. (The CPU side, a real
server that reports no accelerator memory and raises nothing, is in test_operator_real_server.py.)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from modelpool_contract.stats import StatsMemory, WorkerStats
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, wait_for
from tests.operator.integration.opharness import (
    GI,
    POOLS,
    StartOperator,
    condition,
    events,
    pool_manifest,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster]


def gpu_stats(reserved: int, peak: int) -> dict[str, Any]:
    """What a real server on a GPU answers: Ready, with its CUDA allocator's bytes."""
    return WorkerStats(
        state="Ready",
        state_since=time.time() - 60,
        queue_depth=0,
        queue_capacity=100,
        in_flight=0,
        memory=StatsMemory(
            rss_bytes=2 * GI,
            gpu_allocated_bytes=reserved,
            gpu_reserved_bytes=reserved,
            gpu_peak_reserved_bytes=peak,
        ),
        time=time.time(),
    ).wire()


@contextmanager
def stats_at(ip: str, port: int, document: dict[str, Any]) -> Iterator[None]:
    """Answer GET /stats on the worker's pod IP and port with ``document``."""
    body = json.dumps(document).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/stats" else 404)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer((ip, port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_a_worker_above_its_charge_is_reported_with_the_numbers(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    port, probe_port = free_port(), free_port()
    start_operator(
        namespace,
        MODELPOOL_OPERATOR_SERVER_PORT=str(port),
        MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(probe_port),
    )
    apply(cluster, pool_manifest("llm", replicas=1, memory="4Gi"), namespace)
    (pod,) = wait_for(
        lambda: [p for p in worker_pods(cluster, namespace, "llm") if (p.get("status") or {}).get("podIP")],
        timeout=60,
        message="the worker's pod IP",
    )
    # Every check runs while the worker reports its memory (an unknown /stats is no measurement).
    # The operator scrapes /stats on the worker's probe port.
    with stats_at(pod["status"]["podIP"], probe_port, gpu_stats(reserved=5 * GI, peak=6 * GI)):
        status = wait_status(
            cluster,
            namespace,
            "llm",
            lambda s: condition(s, "MemoryExceedsCharge").get("status") == "True",
            timeout=60,
            message="MemoryExceedsCharge=True",
        )
        found = condition(status, "MemoryExceedsCharge")
        assert found["reason"] == "MeasuredAboveCharge"
        assert "needed 6Gi of accelerator memory but is charged 4Gi" in found["message"]
        assert "raise spec.resources.memory to at least 6Gi" in found["message"]
        (worker,) = status["workers"]
        assert worker["acceleratorMemory"] == {
            "reserved": "5Gi",
            "reservedBytes": 5 * GI,
            "peak": "6Gi",
            "peakBytes": 6 * GI,
        }
        assert (status["memory"]["declared"], status["memory"]["measuredPeak"]) == ("4Gi", "6Gi")
        warnings = wait_for(
            lambda: [e for e in events(cluster, namespace, "llm") if e["reason"] == "MemoryExceedsCharge"],
            timeout=30,
            message="the Warning Event",
        )
        assert [e["type"] for e in warnings] == ["Warning"] and "charged 4Gi" in warnings[0]["message"]
        wide = cluster.kubectl("get", POOLS, "llm", "-n", namespace, "-o", "wide").stdout.splitlines()
        assert wide[0].split()[-3:] == ["DECLARED", "MEASURED", "TOKENS"]
        declared = wide[0].index("DECLARED")
        assert wide[1][declared:].split() == ["4Gi", "6Gi"]  # no generation figures: TOKENS prints nothing
