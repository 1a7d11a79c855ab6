"""The probe port: health, readiness, ``/stats`` and ``/metrics`` answered by the supervisor, apart from
the traffic.

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

A small stdlib server in a thread of the supervisor (``local_http``: keep-alive, no Nagle, IPv6): four GET
routes; the supervisor imports no web stack.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from model_server import worker_stats
from model_server.config import ServerConfig
from model_server.metrics import WorkerGauges, render_worker
from model_server.state_machine import StateMachine
from model_server.supervisor.local_http import LocalHandler, LocalHTTPServer
from model_server.worker_view import WorkerView
from modelpool_contract.stats import LIVE_PATH, METRICS_PATH, READY_PATH, STATS_PATH

# How long without a heartbeat tick (one each ``worker_view.BEAT_PERIOD_S``) makes an HTTP process
# wedged.  A loop that is merely busy (a flood at a low priority) still ticks within a few seconds; the
# kubelet's liveness adds its own failureThreshold x periodSeconds on top.
STALL_AFTER_S = 15.0


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
        self.gauges = WorkerGauges(view, state_machine)

    def metrics(self) -> bytes:
        """``/metrics``: the worker's exposition (``metrics_dir``: the processes' multiprocess files)."""
        return render_worker(self.gauges, self.metrics_dir)


class _Handler(LocalHandler):
    server: ProbeServer

    def do_GET(self) -> None:  # noqa: N802 - the stdlib handler's name
        server = self.server
        path = self.path.split("?", 1)[0]
        if path == METRICS_PATH:
            self.send_body(200, server.metrics(), CONTENT_TYPE_LATEST)
            return
        status, body = answer(path, server.config, server.view, server.state_machine, time.monotonic())
        self.send_body(status, json.dumps(body, separators=(",", ":")).encode(), "application/json")


__all__ = ["STALL_AFTER_S", "ProbeServer", "answer", "stall"]
