"""An HTTP process: uvicorn serving every route on its own listening socket.

It parses and validates requests, decodes them (the KServe v2 codec, the OpenAI bodies), admits or
refuses them at the door, sends the admitted ones to the inference process and answers.  Health,
readiness, ``/stats`` and ``/metrics`` come from the worker's shared memory, so they answer however busy
the model is.  It never imports torch.  It stops when the supervisor says so (``stop`` on its control
pipe, or the pipe closing): uvicorn's graceful shutdown lets the answers in progress finish.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

import uvicorn

from model_server import ipc
from model_server.config import ServerConfig, ServingConfig
from model_server.frontend.access_log import with_access_log
from model_server.frontend.endpoints import build_app
from model_server.frontend.endpoints.refusal import protocol_for
from model_server.frontend.server import ModelServer
from model_server.process_setup import exit_now, set_up, trace_as
from model_server.worker_view import BEAT_PERIOD_S, Column, WorkerView

log = logging.getLogger("modelpool.http")

# How long uvicorn's graceful shutdown waits for answers in progress.
GRACEFUL_SHUTDOWN_S = 5
# The HTTP processes' nice value: when they and the model want the same cores, the model's work goes
# first.  Under a flood of clients that resend at once, the HTTP side would otherwise take all the CPU it
# is offered (the faster it refuses, the faster they resend) and the model's goodput would fall to a
# fraction of normal (on 2 cores: 0.10x at nice 0, 0.62-0.79x at 5, 0.74-1.03x at 10; docs/server.md).
# Slower 429s cost nothing by comparison; the probes that must not wait go to the supervisor's probe
# port (``probe_server``), which keeps its normal priority.
HTTP_NICE = 10


class ControlledServer(uvicorn.Server):
    """The uvicorn set-up of both shapes' HTTP processes: signals left to the supervisor (a pod's deletion
    signals the whole process group), stopped by it (``stop`` on the control pipe, or the pipe closing:
    uvicorn's graceful shutdown lets the answers in progress finish), the header bound, and an event loop
    that ticks its heartbeat (``beat``: the probe port's liveness fails when it stops)."""

    def __init__(
        self, app: Any, config: ServingConfig, protocol: type[asyncio.Protocol], control: Connection
    ) -> None:
        super().__init__(
            uvicorn.Config(
                # The request ids and our access line (``access_log``) replace uvicorn's access log.
                with_access_log(app),
                log_level=config.log_level,
                log_config=None,  # uvicorn's own lines go through the process's format (``logs``)
                access_log=False,
                # No uvicorn access log, so X-Forwarded-* would never be read: skip that middleware.
                proxy_headers=False,
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
                lifespan="off",
                http=protocol,  # httptools with the 64 KiB header bound (431)
            )
        )
        self._control = control

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signals are the supervisor's to act on."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().add_reader(self._control.fileno(), self._on_control)
        await super().startup(sockets)
        self._beat()

    def _beat(self) -> None:
        self.beat(time.monotonic())
        asyncio.get_running_loop().call_later(BEAT_PERIOD_S, self._beat)

    def beat(self, now: float) -> None:
        """Tick the heartbeat into the views this process serves."""
        raise NotImplementedError

    def _on_control(self) -> None:
        try:
            message = self._control.recv()
        except (EOFError, OSError):  # the supervisor is gone
            message = "stop"
        if message == "stop":
            asyncio.get_running_loop().remove_reader(self._control.fileno())
            self.should_exit = True
        else:
            self.on_message(message)

    def on_message(self, message: object) -> None:
        """A control message other than ``stop`` (a host's loads and unloads)."""

    def serve_on(self, listener: socket.socket) -> None:
        """Serve until stopped, then end the process."""
        self.run(sockets=[listener])
        exit_now(0)


async def connect(server: ModelServer, sock: socket.socket) -> None:
    """To the model's inference process; its task's module imported off the loop, before any request."""
    await ipc.connect(sock, server.inference.channel())
    asyncio.get_running_loop().run_in_executor(None, _import_task, server)


def _import_task(server: ModelServer) -> None:
    try:
        server.inference.import_task()
    except Exception as exc:  # the inference process fails the load and reports why
        log.debug("cannot import the task: %s", exc)
    # What the process has made by now (the app, its imports, the task's module: about 65,000 objects)
    # lives as long as the process.  A full collection walks all of it, holding the event loop (50-100 ms
    # measured on the 2-core machine): a latency spike of every request in flight each time one runs.
    # Frozen out of the collector's sight, as the inference process freezes its model; what requests
    # make from now on is collected as usual.
    gc.freeze()


class HTTPServer(ControlledServer):
    """A dedicated worker's: connected to the inference process once listening."""

    def __init__(self, server: ModelServer, sock: socket.socket, control: Connection):
        super().__init__(build_app(server), server.config, protocol_for(server), control)
        self.model_server = server
        self._sock = sock

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        server = self.model_server
        await connect(server, self._sock)
        await super().startup(sockets)
        server.view.put(server.inference.row, Column.UP, 1.0)

    def beat(self, now: float) -> None:
        server = self.model_server
        server.view.put(server.inference.row, Column.BEAT, now)


def main(
    config: ServerConfig,
    view: WorkerView,
    *,
    index: int,
    listener: socket.socket,
    sock: socket.socket,
    control: Connection,
) -> None:
    """The process's entry point (the supervisor's spawn target)."""
    set_up(f"http-{index}", config, nice=HTTP_NICE)
    trace_as(config)  # before the app is built: its tracing middleware is there only when on
    HTTPServer(ModelServer(config, view, index), sock, control).serve_on(listener)


__all__ = ["ControlledServer", "HTTPServer", "connect", "main"]
