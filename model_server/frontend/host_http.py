"""An HTTP process of a shared host: one uvicorn, every model's routes, chosen by the model's name.

Each loaded model has here what a dedicated worker's HTTP process has (a ``ModelServer`` over the model's
shared view: its door, its state, its figures; its channel to the model's inference process; the same
ASGI app, ``endpoints.build_app``), so admission, 429/413/408, the codecs and the errors are the
dedicated worker's.  In front of them, ``HostRouter`` picks the model: ``/v2/models/{name}/...`` by the
path, an OpenAI body by its ``model`` field (the body is read once, bounded, and replayed), ``GET
/v1/models`` lists every model.  A request for a sleeping model asks the host to wake it (``WAKE_WANTED``
in the model's view) and waits for it to serve, at most ``--wake-timeout`` (then 503 with Retry-After).

With ``--api-key-file`` the key is checked first (``endpoints.auth.ApiKeyMiddleware``, health open).
The supervisor says which model a slot holds on the control pipe (a unix socket): ``("load", index,
config)`` followed by this process's end of a fresh socket pair to the model's inference process,
``("unload", index)``, ``"stop"``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from multiprocessing.connection import Connection
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from model_server import host_plan
from model_server.config import ServerConfig
from model_server.frontend.endpoints import build_app
from model_server.frontend.endpoints.auth import ApiKeyMiddleware
from model_server.frontend.endpoints.limits import read_bounded, replay
from model_server.frontend.http_process import HTTP_NICE, ControlledServer, connect
from model_server.frontend.server import ModelServer
from model_server.host_config import HostConfig
from model_server.process_setup import set_up, trace_as
from model_server.state_machine import SERVING, State
from model_server.worker_view import Column, Field, WorkerView, http_row
from modelpool_contract.http_limits import BoundedHeadersProtocol
from modelpool_contract.stats import LIVE_PATH, READY_PATH

log = logging.getLogger("modelpool.http")

# How often a request waiting for a wake looks at the model's state.
WAKE_POLL_S = 0.01
# How long the socket handed over after a load message may take to arrive.
HANDLE_TIMEOUT_S = 5.0


class HostRouter:
    """The ASGI app of a host's HTTP process: routes each request to its model's app."""

    def __init__(self, config: HostConfig, views: list[WorkerView], index: int):
        self.config = config
        self.views = views
        self.index = index
        self.models: dict[str, tuple[int, ModelServer, ASGIApp]] = {}

    # ---- models come and go ---------------------------------------------------------------------------

    async def load(self, slot: int, config: ServerConfig, sock: socket.socket) -> None:
        server = ModelServer(config, self.views[slot], self.index, metrics_model=config.served_name)
        await connect(server, sock)
        self.models[config.served_name] = (slot, server, build_app(server))
        view = self.views[slot]
        view.put(http_row(self.index), Column.PID, float(os.getpid()))
        view.put(http_row(self.index), Column.BEAT, time.monotonic())
        view.put(http_row(self.index), Column.UP, 1.0)

    def unload(self, slot: int) -> None:
        for name, (index, server, _) in list(self.models.items()):
            if index == slot:
                del self.models[name]
                server.inference.on_lost()  # whatever still waits is answered 503
                channel = server.inference._channel
                if channel is not None and channel._transport is not None:
                    channel._transport.close()

    def beat(self, now: float) -> None:
        for slot, _, _ in self.models.values():
            self.views[slot].put(http_row(self.index), Column.BEAT, now)

    # ---- routing --------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path in (LIVE_PATH, READY_PATH):
            return await _json(send, 200, {"live": True} if path == LIVE_PATH else {"ready": True})
        if path == "/v1/models" and scope["method"] == "GET":
            data = [{"id": name, "object": "model", "owned_by": "modelpool"} for name in sorted(self.models)]
            return await _json(send, 200, {"object": "list", "data": data})
        body: bytes | None = None
        name = host_plan.model_of(path, None)
        if name is None and path.startswith("/v1/") and scope["method"] == "POST":
            try:  # bounded, as a dedicated worker's LimitsMiddleware reads it: a slow body never holds on
                async with asyncio.timeout(self.config.request_body_timeout_seconds):
                    body, _, connected = await read_bounded(receive, self.config.max_request_bytes)
            except TimeoutError:
                bound = f"{self.config.request_body_timeout_seconds:g} s (--request-body-timeout-seconds)"
                error = f"the request body did not arrive within {bound}"
                return await _json(send, 408, {"error": error}, close=True)
            if not connected:
                return  # the client went away mid-body: nobody to answer
            if body is None:
                return await _json(send, 413, {"error": "request body too large"})
            name = host_plan.model_of(path, body)
        entry = self.models.get(name or "")
        if entry is None:
            return await _json(send, 404, {"error": f"model {name!r} is not served by this host"})
        slot, server, app = entry
        if not await self._awake(slot, server):
            return await _json(
                send, 503, {"error": f"model {name!r} is asleep and did not wake in time"}, retry_after=1
            )
        await app(scope, replay(body, receive) if body is not None else receive, send)

    async def _awake(self, slot: int, server: ModelServer) -> bool:
        """A sleeping (or waking) model: ask the host to wake it and wait, bounded, until it serves."""
        life = server.state_machine
        if life.state not in (State.SLEEPING, State.WAKING):
            return True
        view = self.views[slot]
        view.set(Field.WAKE_WANTED, time.time())
        deadline = time.monotonic() + self.config.wake_timeout
        while life.state in (State.SLEEPING, State.WAKING):
            if time.monotonic() >= deadline:
                return False
            if life.state is State.SLEEPING and not view.get(Field.WAKE_WANTED):
                # The host woke it and it is asleep again before this request saw it awake (or the
                # host's wake gave up): ask again.
                view.set(Field.WAKE_WANTED, time.time())
            await asyncio.sleep(WAKE_POLL_S)
        return life.state in SERVING


async def _json(
    send: Send, status: int, document: Any, retry_after: int | None = None, *, close: bool = False
) -> None:
    payload = json.dumps(document).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:  # the rest of a body that never came must not be read as the next request
        headers.append((b"connection", b"close"))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def receive_socket(control: Connection) -> socket.socket:
    """The socket the supervisor hands over on ``control`` right after a load message.  The event loop
    made the pipe non-blocking, and the socket may be a moment behind the message: wait, bounded."""
    with socket.fromfd(control.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as channel:
        channel.settimeout(HANDLE_TIMEOUT_S)
        _, fds, _, _ = socket.recv_fds(channel, 1, 1)
    return socket.socket(fileno=fds[0])


class HostHTTPServer(ControlledServer):
    """The router's server; the supervisor's control messages load and unload models here."""

    def __init__(self, app: Any, router: HostRouter, control: Connection):
        super().__init__(app, router.config, BoundedHeadersProtocol, control)
        self.router = router

    def beat(self, now: float) -> None:
        self.router.beat(now)

    def on_message(self, message: object) -> None:
        if isinstance(message, tuple) and message[0] == "load":
            sock = receive_socket(self._control)  # sent right after the message
            asyncio.get_running_loop().create_task(self.router.load(message[1], message[2], sock))
        elif isinstance(message, tuple) and message[0] == "unload":
            self.router.unload(message[1])


def main(
    config: HostConfig,
    views: list[WorkerView],
    *,
    index: int,
    listener: socket.socket,
    control: Connection,
) -> None:
    """The process's entry point (the host supervisor's spawn target)."""
    set_up(f"http-{index}", config, nice=HTTP_NICE)
    trace_as(config)  # each model's app (``build_app``) then has its tracing middleware
    router = HostRouter(config, views, index)
    app: Any = router
    if config.api_key is not None:  # outermost, before any model is chosen (as on a dedicated worker)
        app = ApiKeyMiddleware(router, config.api_key, on_reject=lambda reason: None)
    HostHTTPServer(app, router, control).serve_on(listener)


__all__ = ["HostHTTPServer", "HostRouter", "main"]
