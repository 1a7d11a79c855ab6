"""The supervisor's guards on both shapes of server: a dedicated worker (``supervisor.Supervisor`` and its
probe port, ``probe_server``) and a shared host (``supervisor.host.HostSupervisor`` and its probe port,
``host_control``). Each was once written twice and the host's copy lost five (issue 32): an IPv6 probe
port, no Nagle on ``/stats``, liveness failing on a stalled HTTP process, a wedged forward pass failing
(the whole worker; on a host, that model alone) and the 64 KiB header bound (``test_host.py``, on the real
host's serving port; ``test_fuzz.py`` on a dedicated worker's)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import cast

import httpx
import pytest

from model_server.config import ServerConfig
from model_server.frontend.host_http import HostHTTPServer, HostRouter
from model_server.frontend.http_process import ControlledServer, HTTPServer
from model_server.frontend.server import ModelServer
from model_server.host_config import HostConfig
from model_server.state_machine import State, StateMachine
from model_server.supervisor.host import HostSupervisor
from model_server.supervisor.host_control import HostControlServer, host_liveness
from model_server.supervisor.probe_server import (
    STALL_AFTER_S,
    LocalHandler,
    LocalHTTPServer,
    ProbeServer,
    answer,
)
from model_server.supervisor.runtime import Child
from model_server.supervisor.slot import Slot
from model_server.supervisor.supervisor import Supervisor
from model_server.worker_view import SPAWN, Column, Field, WorkerView, http_row
from modelpool_contract.http_limits import BoundedHeadersProtocol

LIVE = "/v2/health/live"
NO_PIPE = cast(Connection, None)  # the servers are built, not run


def _config(**fields: object) -> ServerConfig:
    return ServerConfig(model="/", task="text-embedding", name="echo", **fields)  # type: ignore[arg-type]


def _host() -> HostSupervisor:
    return HostSupervisor(HostConfig(device_memory="1Gi", max_models=2, gpus=1))  # type: ignore[arg-type]


@pytest.fixture
def worker_view() -> WorkerView:
    # Its semaphores are unlinked by multiprocessing's own finalizer in this process (``unlink`` is for a
    # supervisor whose exit skips it).
    return WorkerView(4, http_processes=1)


def _probe_server(address: tuple[str, int], view: WorkerView) -> LocalHTTPServer:
    return ProbeServer(address, _config(), view, StateMachine(store=view.state_store()))


def _host_server(address: tuple[str, int], view: WorkerView) -> LocalHTTPServer:
    return HostControlServer(address, _host())


MakeServer = Callable[[tuple[str, int], WorkerView], LocalHTTPServer]
SHAPES = pytest.mark.parametrize("make", [_probe_server, _host_server], ids=["worker", "host"])


@SHAPES
def test_the_probe_port_listens_on_ipv6_keeps_connections_alive_and_sends_without_nagle(
    make: MakeServer, worker_view: WorkerView
) -> None:
    server = make(("::1", 0), worker_view)
    server.serve_in_thread()
    try:
        handler = server.RequestHandlerClass  # typed by socketserver as any callable making a handler
        assert isinstance(handler, type) and issubclass(handler, LocalHandler)
        assert handler.disable_nagle_algorithm  # the head and body in one round trip
        with httpx.Client(base_url=f"http://[::1]:{server.server_address[1]}", timeout=5) as client:
            first = client.get(LIVE)
            again = client.get("/stats")
        assert first.status_code in (200, 503) and again.status_code == 200
        assert first.headers.get("connection") != "close"  # HTTP/1.1 keep-alive
    finally:
        server.shutdown()
        server.server_close()


def _stall(view: WorkerView, now: float) -> None:
    """HTTP process 0 accepts connections but its event loop last ticked ``STALL_AFTER_S`` + 1 ago."""
    view.put(http_row(0), Column.UP, 1.0)
    view.put(http_row(0), Column.BEAT, now - STALL_AFTER_S - 1)


def test_a_stalled_http_process_fails_a_dedicated_workers_liveness(worker_view: WorkerView) -> None:
    machine = StateMachine(store=worker_view.state_store())
    machine.to(State.LOADING)
    machine.to(State.READY)
    now = time.monotonic()
    worker_view.put(http_row(0), Column.UP, 1.0)
    worker_view.put(http_row(0), Column.BEAT, now)
    assert answer(LIVE, _config(), worker_view, machine, now)[0] == 200
    _stall(worker_view, now)
    status, body = answer(LIVE, _config(), worker_view, machine, now)
    assert status == 503 and body["reason"].startswith("HTTP process 0 has not run its event loop"), body


def _running(host: HostSupervisor, index: int, process: BaseProcess, **fields: object) -> Slot:
    """Slot ``index`` of ``host`` as a load leaves it: its config, and its model's process."""
    slot = host.slots[index]
    slot.config = _config(**fields)
    slot.child = Child(f"inference-{index}", process, cast(Connection, None))
    for state in (State.LOADING, State.READY):
        slot.state_machine.to(state)
    return slot


def test_a_stalled_http_process_fails_a_hosts_liveness() -> None:
    host = _host()
    slot = _running(host, 0, cast(BaseProcess, object()))
    now = time.monotonic()
    slot.view.put(http_row(0), Column.UP, 1.0)
    slot.view.put(http_row(0), Column.BEAT, now)
    assert host_liveness(host, now) == (200, {"live": True})
    _stall(slot.view, now)
    status, body = host_liveness(host, now)
    assert status == 503 and body["reason"].startswith("HTTP process 0 has not run its event loop"), body
    slot.leaving = True  # an unload stops the HTTP processes' beats for it: not a stall
    assert host_liveness(host, now)[0] == 200


def _sleeper() -> BaseProcess:
    process = SPAWN.Process(target=time.sleep, args=(120,), daemon=True)
    process.start()
    return process


def test_a_wedged_forward_pass_on_a_host_fails_that_model_alone_and_kills_its_process(
    tmp_path: Path,
) -> None:
    host = _host()
    wedged_process, fine_process = _sleeper(), _sleeper()
    try:
        wedged = _running(host, 0, wedged_process, request_timeout=1, wedge_grace=1)
        fine = _running(host, 1, fine_process, request_timeout=1, wedge_grace=1)
        now = time.monotonic()
        wedged.view.set(Field.BATCH_STARTED, now - 2.5)  # past 1 s + 1 s
        fine.view.set(Field.BATCH_STARTED, now - 1.5)  # within the bound
        host._fail_wedged(now)
        assert wedged.state_machine.state is State.FAILED
        assert wedged.state_machine.reason.startswith("inference wedged: batch running for 2 s")
        wedged_process.join(10)
        assert wedged_process.exitcode is not None  # killed: its device memory comes back
        assert fine.state_machine.state is State.READY and fine_process.exitcode is None
        assert not host.failed  # the host serves on
    finally:
        for process in (wedged_process, fine_process):
            process.kill()
            process.join(10)


def _fake_child(name: str) -> Child:
    return Child(name, cast(BaseProcess, object()), cast(Connection, None))


def test_both_shapes_stop_their_model_processes_before_their_http_processes() -> None:
    """The runtime stops ``children()`` in order: a model's process drains and ends before the HTTP
    processes that answer for it (the host once stopped its HTTP processes first)."""
    worker = Supervisor(_config())
    worker.slot.child, worker.http = _fake_child("inference"), [_fake_child("http-0")]
    host = _host()
    _running(host, 1, cast(BaseProcess, object()))
    host.http = [_fake_child("http-0")]
    for shape in (worker, host):
        assert [c.name for c in shape.children()][-1] == "http-0", shape
        assert shape.children()[0].name.startswith("inference")


def test_both_shapes_http_processes_share_one_uvicorn_set_up_with_the_header_bound(
    worker_view: WorkerView,
) -> None:
    """Both shapes' HTTP processes are one ``ControlledServer`` (signals left to the supervisor, stopped on
    the control pipe, a heartbeat), each with the 64 KiB header bound (431)."""
    dedicated = HTTPServer(ModelServer(_config(), worker_view, 0), cast(socket.socket, None), NO_PIPE)
    config = HostConfig(device_memory="1Gi", max_models=1, gpus=1)  # type: ignore[arg-type]
    router = HostRouter(config, [worker_view], 0)
    shared = HostHTTPServer(router, router, NO_PIPE)
    for server in (dedicated, shared):
        assert isinstance(server, ControlledServer)
        assert issubclass(server.config.http, BoundedHeadersProtocol)  # type: ignore[arg-type]
        assert server.config.access_log is False and server.config.lifespan == "off"
