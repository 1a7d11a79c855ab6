"""An HTTP process: uvicorn serving every route on its own listening socket.

It parses and validates requests, decodes them (the KServe v2 codec, the OpenAI bodies), admits or
refuses them at the door, sends the admitted ones to the inference process and answers.  Health,
readiness, ``/stats`` and ``/metrics`` come from the worker's shared memory, so they answer however busy
the model is.  It never imports torch.  It stops when the supervisor says so (``stop`` on its control
pipe, or the pipe closing): uvicorn's graceful shutdown lets the answers in progress finish.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from multiprocessing.connection import Connection
from types import FrameType

import uvicorn

from model_server import ipc
from model_server.config import ServerConfig
from model_server.frontend.endpoints import build_app
from model_server.frontend.endpoints.refusal import protocol_for
from model_server.frontend.server import ModelServer
from model_server.process_setup import exit_now, set_up
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


class HTTPServer(uvicorn.Server):
    """uvicorn, connected to the inference process once listening, stopped by the supervisor."""

    def __init__(self, config: uvicorn.Config, server: ModelServer, sock: socket.socket, control: Connection):
        super().__init__(config)
        self.model_server = server
        self._sock = sock
        self._control = control

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signals are the supervisor's to act on (a pod's deletion signals the whole process group)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        await ipc.connect(self._sock, self.model_server.inference.channel())
        loop.add_reader(self._control.fileno(), self._on_control)
        # The task's module (a handler's too) is imported off the event loop, ahead of the first request.
        loop.run_in_executor(None, self._import_task)
        await super().startup(sockets)
        server = self.model_server
        self._beat()
        server.view.put(server.inference.row, Column.UP, 1.0)

    def _beat(self) -> None:
        """The event loop's heartbeat (the probe port's liveness fails when it stops)."""
        server = self.model_server
        server.view.put(server.inference.row, Column.BEAT, time.monotonic())
        asyncio.get_running_loop().call_later(BEAT_PERIOD_S, self._beat)

    def _import_task(self) -> None:
        try:
            self.model_server.inference.import_task()
        except Exception as exc:  # the inference process fails the load and reports why
            log.debug("cannot import the task: %s", exc)

    def _on_control(self) -> None:
        try:
            message = self._control.recv()
        except (EOFError, OSError):  # the supervisor is gone
            message = "stop"
        if message == "stop":
            asyncio.get_running_loop().remove_reader(self._control.fileno())
            self.should_exit = True


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
    set_up(f"http-{index}", config.log_level, nice=HTTP_NICE)
    server = ModelServer(config, view, index)
    http = HTTPServer(
        uvicorn.Config(
            build_app(server),
            log_level=config.log_level,
            access_log=False,
            # No access log, so X-Forwarded-* would never be read: skip that per-request middleware.
            proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            lifespan="off",
            # httptools, answering a full worker's inference requests at their headers (``refusal``).
            http=protocol_for(server),
        ),
        server,
        sock,
        control,
    )
    http.run(sockets=[listener])
    exit_now(0)


__all__ = ["HTTPServer", "main"]
