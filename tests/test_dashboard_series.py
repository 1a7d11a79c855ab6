"""The dashboards' panels that need a text-generation pool or a shared host (``needs``: generation, host),
asked of a real Prometheus (Debian's ``prometheus``) that scrapes the real metric objects of the programs
that export their series, fed as a generation worker, a ModelHost's operator and a host pod feed them:
every such panel's every query returns series.  And every series a panel reads is one those programs
export (the operator's and the gateway's are checked in e2e/test_monitoring.py; the workers' here).

Why not in the end-to-end check (e2e/test_images.py, which fills the panels that need only a serving
pool from a kind cluster running the released images): its release serves one embedding pool, and a
generation model and a ModelHost there would add image builds and minutes to every run, for the same
series the same objects export here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from model_server.metrics import Metrics, WorkerGauges, render_host, render_worker
from model_server.state_machine import State, StateMachine
from model_server.worker_view import SUPERVISOR_ROW, Column, Field, WorkerView
from modelpool_contract.api import HostDeviceStatus, HostModelStatus, HostPodStatus, ModelHostStatus
from modelpool_operator.metrics import OperatorMetrics
from testkit import dashboards
from testkit.prometheus import prometheus, series_read
from testkit.waiting import wait_for

GIB = 1 << 30
# A label, not a series: the PodMonitor's podTargetLabels put each worker's pool on its series by it.
POD_LABEL = "modelpool_dev_pool"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@contextmanager
def served(render: Callable[[], bytes]) -> Iterator[str]:
    """``GET /metrics`` on a loopback port answering ``render()`` (a scrape target's ``host:port``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def generation_worker() -> Callable[[], bytes]:
    """A dedicated text-generation worker's exposition after a generation: its engine's first token, token
    gaps and tokens counted, its KV cache reserved, as the engine records them."""
    view = WorkerView(16, http_processes=1)
    machine = StateMachine(store=view.state_store())
    for state in (State.LOADING, State.READY):
        machine.to(state)
    metrics = Metrics()
    metrics.first_token.observe(0.08)
    for gap in (0.01, 0.012, 0.011):
        metrics.inter_token.observe(gap)
    metrics.generated_tokens.inc(4)
    view.set(Field.KV_CACHE_TOKENS, 4096)
    view.set(Field.KV_CACHE_RESERVED, 512)
    view.set(Field.GENERATING, 1)
    gauges = WorkerGauges(view, machine, picker=True)
    return lambda: render_worker(gauges, None, metrics.registry)


def host_pod(folder: Path) -> Callable[[], bytes]:
    """A shared host's exposition (``render_host``, its probe port) holding two models, one that slept and
    woke (the counts its inference process keeps in the view), and one device."""
    gauges = []
    for name, sleeps, wakes in (("tiny", 2, 1), ("other", 0, 0)):
        view = WorkerView(16, http_processes=1)
        machine = StateMachine(store=view.state_store())
        for state in (State.LOADING, State.READY):
            machine.to(state)
        view.set(Field.SLEEPS, sleeps)
        view.set(Field.WAKES, wakes)
        gauges.append(WorkerGauges(view, machine, model=name))
    device = {"index": 0, "capacity": 8 * GIB, "awake": 3 * GIB, "asleep": GIB, "overhead": 0}
    device["free"] = 5 * GIB
    folder.mkdir()
    return lambda: render_host(gauges, [device], str(folder))


def operator_of_a_host() -> OperatorMetrics:
    """The operator's metrics after a ModelHost pass wrote its status and a sleep was ordered."""
    device = HostDeviceStatus(
        index=0, capacity="8Gi", capacity_bytes=8 * GIB, awake="3Gi", awake_bytes=3 * GIB, asleep="1Gi",
        asleep_bytes=GIB, free="5Gi", free_bytes=5 * GIB,
    )  # fmt: skip
    models = [
        HostModelStatus(namespace="team", pool="awake", state="Ready"),
        HostModelStatus(namespace="team", pool="parked", state="Sleeping"),
    ]
    pod = HostPodStatus(name="gpu-0", state="Ready", devices=[device], models=models)
    metrics = OperatorMetrics()
    metrics.host_written("team", "gpu", ModelHostStatus(hosts=[pod]))
    metrics.placement_call("sleep", ok=True)
    metrics.placement_call("load", ok=True)
    return metrics


def test_every_generation_and_host_panel_returns_series(tmp_path: Path) -> None:
    operator = operator_of_a_host()
    with (
        served(generation_worker()) as worker,
        served(host_pod(tmp_path / "multiprocess")) as host,
        served(lambda: generate_latest(operator.registry)) as ops,
        prometheus([worker, host, ops], [], tmp_path / "prometheus") as prom,
    ):
        wait_for(lambda: set(prom.targets_up().values()) == {"up"}, timeout=30, message="every target up")
        panels = [p for d in dashboards.DASHBOARDS for p in d.panels if p.needs in ("generation", "host")]
        assert {p.needs for p in panels} == {"generation", "host"}
        wakes = prom.query("modelpool_wakes_total")
        assert {(w["metric"]["model"], w["value"][1]) for w in wakes} == {("tiny", "1"), ("other", "0")}
        for panel in panels:
            for query in panel.queries:
                # rate() and increase() need two scrapes of a series: a second or two.
                wait_for(lambda: prom.query(query.expr), timeout=30, message=f"{panel.title}: {query.expr}")  # noqa: B023


def _exported(registry: CollectorRegistry) -> set[str]:
    return {
        family.name + suffix for family in registry.collect() for suffix in _SUFFIXES.get(family.type, ("",))
    }


def test_the_workers_series_the_panels_read_are_exported() -> None:
    worker = Metrics()
    view = WorkerView(16, http_processes=1)
    view.put(SUPERVISOR_ROW, Column.PID, os.getpid())  # a process to measure (resident memory)
    registry = CollectorRegistry()
    registry.register(WorkerGauges(view, StateMachine(store=view.state_store()), model="m"))
    exported = _exported(worker.registry) | _exported(registry)
    exprs = [q.expr for d in dashboards.DASHBOARDS for p in d.panels for q in p.queries]
    read = {
        name
        for expr in exprs
        for name in series_read(expr)
        if not name.startswith(("modelpool_operator_", "modelpool_gateway_")) and name != POD_LABEL
    }
    assert {"modelpool_wakes_total", "modelpool_time_to_first_token_seconds_bucket"} <= read
    assert read - exported == set(), "series no worker exports (a renamed metric?)"
