"""A shared host's probe port: health, ``/stats`` and the control API (Triton's model-repository shape).

    GET  /v2/health/live, /v2/health/ready      200 while the host has not failed (ready: its HTTP
                                                processes are up)
    GET  /stats                                 {"host": {"devices": [...]}, "models": {name: WorkerStats}}
    GET  /metrics                               Prometheus text: every model's series (label ``model``)
                                                and the devices' memory
    POST /v2/repository/index                   [{"name", "state", "reason", "device", "bytes"}]
    POST /v2/repository/models/{name}/load      {"parameters": {"config": "<json: source, task, memory>"}}
    POST /v2/repository/models/{name}/unload
    POST /v2/repository/models/{name}/sleep     (extension) park its weights, return its device memory
    POST /v2/repository/models/{name}/wake      (extension) bring them back (making room first)

With ``--control-key-file``, every POST must carry ``Authorization: Bearer <key>`` (else 401); health,
``/stats`` and ``/metrics`` stay open, as on a dedicated worker's probe port.  Errors are
``{"error": "..."}`` with the status of the ``ServerError`` (400 a bad load body, 404 an unknown model,
409 loaded already or a refused sleep, 507 no room on the device).  Liveness fails while an HTTP process
is stalled, as a dedicated worker's.  A stdlib server in a thread of the host's supervisor
(``probe_server.LocalHTTPServer``, as a dedicated worker's probe port: keep-alive, no Nagle, IPv6); each
call runs on its own thread, and the supervisor's lock orders them.
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST

from model_server.errors import InvalidInput, ServerError
from model_server.host_config import HostConfig, LoadError
from model_server.supervisor.probe_server import LocalHandler, LocalHTTPServer
from model_server.supervisor.runtime import Child
from model_server.supervisor.slot import Slot
from modelpool_contract.host_control import INDEX_PATH, parse_model_action
from modelpool_contract.stats import LIVE_PATH, METRICS_PATH, READY_PATH, STATS_PATH

MAX_CONTROL_BODY = 1 << 20


class Host(Protocol):
    """What the control API calls: ``host.HostSupervisor`` (and ``testkit.hostsim.SimHost``)."""

    @property
    def config(self) -> HostConfig: ...

    @property
    def failed(self) -> str: ...

    http: list[Child]

    def stall(self, now: float) -> str: ...
    def index(self) -> list[dict[str, Any]]: ...
    def stats(self) -> dict[str, Any]: ...
    def metrics(self) -> bytes: ...
    def load(self, name: str, body: bytes) -> Slot: ...
    def unload(self, name: str) -> None: ...
    def sleep(self, name: str) -> object: ...
    def wake(self, name: str) -> object: ...


def _model_document(host: Host, name: str) -> dict[str, Any]:
    entry = next((e for e in host.index() if e["name"] == name), None)
    return entry or {"name": name, "state": None}


def control(host: Host, method: str, path: str, body: bytes) -> tuple[int, Any]:
    """The status and JSON body of one probe-port call."""
    if method == "GET" and path == LIVE_PATH:
        return host_liveness(host, time.monotonic())
    if method == "GET" and path == READY_PATH:
        up = not host.failed and all(c.process.exitcode is None for c in host.http)
        return (200 if up else 503), {"ready": up}
    if method == "GET" and path == STATS_PATH:
        return 200, host.stats()
    if method == "POST" and path == INDEX_PATH:
        return 200, host.index()
    named = parse_model_action(path)
    if method != "POST" or named is None:
        return 404, {"error": f"no route {method} {path}"}
    name, action = named
    try:
        if action == "load":
            slot = host.load(name, body)
            if slot.state_machine.state.value == "Failed":
                return 500, {"error": slot.state_machine.reason or "the model failed to load"}
        elif action == "unload":
            host.unload(name)
            return 200, {"name": name, "state": None}
        elif action == "sleep":
            host.sleep(name)
        else:
            host.wake(name)
    except LoadError as exc:
        return InvalidInput.status, {"error": str(exc)}
    except ServerError as exc:
        return exc.status, {"error": str(exc)}
    return 200, _model_document(host, name)


def host_liveness(host: Host, now: float) -> tuple[int, dict[str, Any]]:
    """``GET /v2/health/live``: 503 once the host has failed, or while one of its HTTP processes has not
    run its event loop for a while (``probe_server.stall``, a dedicated worker's rule; a model's wedged
    forward pass fails that model alone: ``HostSupervisor``)."""
    reason = host.failed or host.stall(now)
    body: dict[str, Any] = {"live": not reason}
    if reason:
        body["reason"] = reason
    return (503 if reason else 200), body


def authorized(header: str | None, key: str | None) -> bool:
    """Pure: does ``header`` (``Authorization``) carry ``key`` (None: no key needed)?  Constant time."""
    if key is None:
        return True
    scheme, _, token = (header or "").partition(" ")
    return hmac.compare_digest(token.strip().encode(), key.encode()) & (scheme.lower() == "bearer")


class _Handler(LocalHandler):
    server: HostControlServer

    def _answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if method == "POST" and not authorized(self.headers.get("Authorization"), self.server.key):
            status, document = 401, {"error": "the control API needs its key (Authorization: Bearer)"}
        elif length > MAX_CONTROL_BODY:
            status, document = 413, {"error": "control body too large"}
        elif method == "GET" and self.path.split("?", 1)[0] == METRICS_PATH:
            return self.send_body(200, self.server.host.metrics(), CONTENT_TYPE_LATEST)
        else:
            body = self.rfile.read(length) if length else b""
            status, document = control(self.server.host, method, self.path.split("?", 1)[0], body)
        self.send_body(status, json.dumps(document).encode(), "application/json")

    def do_GET(self) -> None:  # noqa: N802 - the stdlib handler's name
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802 - the stdlib handler's name
        self._answer("POST")


class HostControlServer(LocalHTTPServer):
    thread_name = "host-control"

    def __init__(self, address: tuple[str, int], host: Host) -> None:
        super().__init__(address, _Handler)
        self.host = host
        self.key = host.config.control_key


__all__ = ["Host", "HostControlServer", "authorized", "control", "host_liveness"]
