"""The probe port of both shapes: health, readiness, ``/stats`` and ``/metrics`` answered by the
supervisor, apart from the traffic (a shared host's adds its control API there: ``host_control``).

The HTTP processes run at a lower CPU priority than the model (``http_process.HTTP_NICE``), so that a
flood of clients cannot take the model's cores; the price is that anything they answer waits behind the
model when the cores are busy (tens of milliseconds, and hundreds under a flood).  The kubelet's probes
and the operator's ``/stats`` scrape must not wait behind a flood: a worker that is busy refusing is
alive.  So the supervisor, which has no other work and keeps its normal priority, answers them on a port
of their own (``--probe-port``) from the worker's shared memory, with the same bodies as the serving port.

``/stats`` (the model's source, a load error) and ``/metrics`` answer here without a key, and on the
serving port only with it (``endpoints.auth``): the probe port is for the kubelet, the operator and
Prometheus, and a NetworkPolicy can keep it theirs, while the serving port is open to clients.
``/metrics`` is the serving port's exposition: every process's counters (the multiprocess files the
supervisor's ``metrics_dir`` holds) and the gauges read from the shared view.

A wedged HTTP process must still fail liveness, as it would on the serving port: each one's event loop
ticks a heartbeat into the shared view, and liveness fails while one that accepts connections has not
ticked for ``STALL_AFTER_S`` (``stall``, the rule a shared host's liveness uses too); so must a wedged
forward pass (``worker_stats.inference_wedged``).

A small stdlib server in a thread of the supervisor (the supervisor imports no web stack), defined once
for both shapes (``LocalHTTPServer``, ``LocalHandler``), as each lost a guard when they were two copies:
an IPv6 listener when the address is one (``--host ::``), as the serving port has; keep-alive (HTTP/1.1),
as a scraper's connection pool expects; no Nagle (the head and the body go out in two writes, and with
Nagle's algorithm the second waits for the client's delayed ACK of the first: 40 ms measured on
``/stats``); no access log (a probe every two seconds).
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from collections.abc import Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from model_server import worker_stats
from model_server.config import ServerConfig
from model_server.metrics import WorkerGauges, render_worker
from model_server.state_machine import StateMachine
from model_server.worker_view import WorkerView
from modelpool_contract.picker import speaks_picker
from modelpool_contract.stats import LIVE_PATH, METRICS_PATH, READY_PATH, STATS_PATH

log = logging.getLogger("modelpool.probes")

# How long without a heartbeat tick (one each ``worker_view.BEAT_PERIOD_S``) makes an HTTP process
# wedged.  A loop that is merely busy (a flood at a low priority) still ticks within a few seconds; the
# kubelet's liveness adds its own failureThreshold x periodSeconds on top.
STALL_AFTER_S = 15.0


class LocalHTTPServer(ThreadingHTTPServer):
    """A threading HTTP server on ``address`` (IPv6 when the host is an IPv6 address) that
    ``serve_in_thread`` runs until ``shutdown``."""

    daemon_threads = True
    thread_name = "probe-port"

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request that raised, logged in the worker's format (socketserver prints a traceback to stderr,
        which would break a JSON log's one object per line); a caller that hung up (a probe's timeout, a
        scraper gone) only at debug level."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("probe port: %s hung up: %s", client_address, exc)
        else:
            log.warning("probe port: a request from %s failed", client_address, exc_info=True)

    def serve_in_thread(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name=self.thread_name, daemon=True)
        thread.start()
        return thread


class LocalHandler(BaseHTTPRequestHandler):
    """Keep-alive, no Nagle, no access log; ``send_body`` answers."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def send_body(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(HTTPStatus(status))
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        """No access log: the probes come every few seconds."""


def stall(views: Iterable[WorkerView], now: float) -> str:
    """Why an HTTP process counts as stalled ('' while none does): one that accepts connections and has
    not ticked into any of ``views`` for ``STALL_AFTER_S``."""
    stalled = sorted({i for view in views for i in view.stalled_http(now, STALL_AFTER_S)})
    if not stalled:
        return ""
    return f"HTTP process {stalled[0]} has not run its event loop for {STALL_AFTER_S:.0f} s"


def answer(
    path: str, config: ServerConfig, view: WorkerView, state_machine: StateMachine, now: float
) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of ``GET path`` (``now``: ``time.monotonic()``)."""
    if path == LIVE_PATH:
        wedged = stall([view], now) or worker_stats.inference_wedged(config, view, now)
        return worker_stats.liveness(state_machine, wedged)
    if path == READY_PATH:
        return worker_stats.readiness(state_machine, view)
    if path == STATS_PATH:
        return 200, worker_stats.stats(config, view, state_machine)
    routes = f"health, readiness, {STATS_PATH} and {METRICS_PATH} only"
    return 404, {"error": f"no route {path!r} on the probe port ({routes})"}


class ProbeServer(LocalHTTPServer):
    """The probe port's server; ``serve_in_thread`` runs it until ``shutdown``."""

    def __init__(
        self,
        address: tuple[str, int],
        config: ServerConfig,
        view: WorkerView,
        state_machine: StateMachine,
        metrics_dir: str | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.config = config
        self.view = view
        self.state_machine = state_machine
        self.metrics_dir = metrics_dir
        # A text-generation worker's probe port is where the endpoint picker scrapes its protocol.
        self.gauges = WorkerGauges(
            view,
            state_machine,
            picker=speaks_picker(config.task),
            adapters=list(config.adapters),
            max_adapters=config.max_adapters,
        )

    def metrics(self) -> bytes:
        """``/metrics``: the worker's exposition (``metrics_dir``: the processes' multiprocess files)."""
        return render_worker(self.gauges, self.metrics_dir)


class _Handler(LocalHandler):
    server: ProbeServer

    def do_GET(self) -> None:
        server = self.server
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            self.send_body(200, server.metrics(), CONTENT_TYPE_LATEST)
            return
        status, body = answer(path, server.config, server.view, server.state_machine, time.monotonic())
        self.send_body(status, json.dumps(body, separators=(",", ":")).encode(), "application/json")


__all__ = ["STALL_AFTER_S", "LocalHTTPServer", "LocalHandler", "ProbeServer", "answer", "stall"]
