"""The server's process tree, built once for both shapes: a dedicated worker (``supervisor.Supervisor``: one
slot, loaded at start) and a shared host (``host.HostSupervisor``: N slots loaded by control calls).

``run`` binds the serving sockets (one per HTTP process, all on the same port with ``SO_REUSEPORT``, so
the kernel spreads new connections over them) and the probe port before any child starts, so a client's
first connection waits in the backlog, never meets a refusal.  SIGTERM and SIGINT stay blocked while the
children are spawned (the mask survives exec: a signal to the whole process group, a pod's deletion or a
Ctrl-C, cannot kill one before it ignores them; the probe port's thread inherits the mask, so such a
signal cannot end the supervisor before ``watch`` has its handlers).  Children are started with spawn
(never fork a process that may hold torch) and each gets a control pipe (``Runtime.spawn``).

``Runtime.watch`` wakes on a child's exit, on a signal (a byte on a self-pipe) or after the shape's
``timeout``, and asks the shape what to do (``Shape.on_signal``, ``Shape.tick``); the shape answers with
the exit code once the server must end.  How it ends is the runtime's, once: ``fail`` marks the shape
Failed (liveness and readiness fail in every HTTP process still up), writes the reason to the
termination log and stops every child; ``stop_all`` tells each child ``stop`` (the model processes first,
then the HTTP processes, whose answers in progress finish), waits ``STOP_TIMEOUT_S`` for all of them
together, and ``kill_all`` kills what is left, waiting ``KILL_TIMEOUT_S`` for all of them together (one
deadline, not one per child: ``modelpool_contract.exits.worst_case_shutdown_s`` holds for any number).
``process_setup.start`` imports each child's module in that child: the supervisor imports neither torch
nor the web stack nor the model's code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Protocol

from model_server import process_setup
from model_server.config import ServerConfig
from model_server.errors import ServerError
from model_server.host_config import HostConfig
from model_server.metrics import MULTIPROC_ENV
from model_server.supervisor.probe_server import LocalHTTPServer
from model_server.worker_view import SPAWN, WorkerView
from modelpool_contract.exits import KILL_TIMEOUT_S, STOP_TIMEOUT_S

log = logging.getLogger("modelpool.supervisor")

LISTEN_BACKLOG = 2048
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}
# How long a control call waits for the watch loop to run work on its thread (a model's process start).
MAIN_WORK_WAIT_S = 600.0


def describe_exit(exitcode: int) -> str:
    """Pure: a process's exit code in words (negative: the signal that killed it)."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def died(name: str, pid: int | None, exitcode: int | None) -> str:
    """Pure: the reason a process that exited unasked gives the server."""
    return f"the {name} process (pid {pid}) died: {describe_exit(exitcode or 0)}"


def bind_listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``host:port`` (port 0: one free port for all; IPv6 for an IPv6
    address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
            port = sock.getsockname()[1]
            sock.listen(LISTEN_BACKLOG)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


@dataclass
class Child:
    """A process of the server, and the pipe the supervisor tells it things on."""

    name: str
    process: BaseProcess
    control: Connection
    done: bool = False

    def tell(self, message: object) -> None:
        with contextlib.suppress(OSError):
            self.control.send(message)

    def died(self) -> str:
        return died(self.name, self.process.pid, self.process.exitcode)

    def exited(self) -> bool:
        """Whether it has exited since last asked (each exit is seen once)."""
        if self.done or self.process.exitcode is None:
            return False
        self.done = True
        return True


class Shape(Protocol):
    """What differs between a dedicated worker and a shared host; the runtime does the rest.

    ``views``: every slot's view, unlinked at the end; ``children``: the processes, the models' first
    (they stop first); ``probe_server``: the probe port's server, bound (None: none); ``start``: start the
    children, one HTTP process per listener; ``timeout``: how long the watch loop may sleep;
    ``on_signal`` (SIGTERM or SIGINT) and ``tick`` (the loop's turn: exits, wedged passes, deadlines):
    the exit code once the server has ended; ``mark_failed``: every model Failed, the reason to log."""

    runtime: Runtime

    @property
    def config(self) -> ServerConfig | HostConfig: ...
    def views(self) -> list[WorkerView]: ...
    def children(self) -> list[Child]: ...
    def probe_server(self) -> LocalHTTPServer | None: ...
    def start(self, listeners: list[socket.socket]) -> None: ...
    def timeout(self) -> float: ...
    def on_signal(self, name: str) -> int | None: ...
    def tick(self, now: float) -> int | None: ...
    def mark_failed(self, reason: str) -> str: ...


class Runtime:
    """A shape's process tree: spawns its children, watches them, ends them."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self._signals: list[int] = []
        self._work: queue.Queue[tuple[Callable[[], None], threading.Event]] = queue.Queue()
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        # Every process keeps its counters in files here; any scrape adds them up.  Under TMPDIR: the
        # pod's tmp volume, the root filesystem being read-only.
        self.metrics_dir = tempfile.mkdtemp(prefix="modelpool-metrics-")

    def spawn(self, name: str, module: str, *args: object, duplex: bool = False, **kwargs: object) -> Child:
        """Start ``module``'s ``main(*args, **kwargs, control=...)`` in a spawned process; ``duplex``: a
        unix socket both ways (socket ends can be handed over it), else a pipe from the supervisor."""
        theirs, mine = SPAWN.Pipe(duplex=duplex)
        process = SPAWN.Process(
            target=process_setup.start, args=(module, *args), kwargs={**kwargs, "control": theirs}, name=name
        )
        process.start()
        theirs.close()  # the child holds its own copy now
        return Child(name, process, mine)

    # ---- watch ----------------------------------------------------------------------------------------

    def watch(self) -> int:
        """Until the server ends: signals, exits and the shape's ticks; returns the exit code."""
        wakeup = self._catch_signals()
        while True:
            running = [c.process.sentinel for c in self.shape.children() if not c.done]
            wait([wakeup, *running], self.shape.timeout())
            with contextlib.suppress(BlockingIOError):
                wakeup.recv(4096)
            while self._signals:
                code = self.shape.on_signal(signal.Signals(self._signals.pop(0)).name)
                if code is not None:
                    return code
            self._run_work()
            code = self.shape.tick(time.monotonic())
            if code is not None:
                return code

    def _catch_signals(self) -> socket.socket:
        """Record SIGTERM/SIGINT (a byte on the returned socket wakes ``watch``), then let them in."""
        wakeup_r, wakeup_w = socket.socketpair()
        wakeup_r.setblocking(False)
        wakeup_w.setblocking(False)
        self._wakeup = (wakeup_r, wakeup_w)  # kept open for as long as the handlers may write
        signal.set_wakeup_fd(wakeup_w.fileno())
        for stop in STOP_SIGNALS:
            signal.signal(stop, lambda sig, frame: self._signals.append(sig))
        # Held back while the processes started (see ``run``): a signal that came meanwhile arrives now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return wakeup_r

    def in_main_thread(self, work: Callable[[], None]) -> None:
        """Run ``work`` on the watch loop's thread and wait for it.  A process started from another
        thread would be killed when that thread ends (its parent-death signal follows the thread)."""
        done = threading.Event()
        self._work.put((work, done))
        with contextlib.suppress(OSError, TypeError):
            self._wakeup[1].send(b"\0")  # type: ignore[index]
        if not done.wait(MAIN_WORK_WAIT_S):
            raise ServerError("the supervisor's main loop did not run the work asked of it")

    def _run_work(self) -> None:
        while not self._work.empty():
            work, done = self._work.get_nowait()
            try:
                work()
            finally:
                done.set()

    # ---- how it ends ----------------------------------------------------------------------------------

    def fail(self, code: int, reason: str) -> int:
        """The server has failed: Failed with ``reason``, the termination log, every process stopped."""
        log.error("failed: %s", reason)
        self.write_termination_log(self.shape.mark_failed(reason))
        return self.stop_all(code)

    def write_termination_log(self, reason: str) -> None:
        path = self.shape.config.termination_log
        try:
            path.write_text(reason[:4000] + "\n")
        except OSError as exc:  # the kubelet may not have mounted it (e.g. running locally)
            log.warning("cannot write termination log %s: %s", path, exc)

    def stop_all(self, code: int) -> int:
        """``stop`` to every process still running (the models' first), one deadline, then kill leftovers."""
        children = self.shape.children()
        for child in children:
            if child.process.exitcode is None:
                child.tell("stop")
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in children:
            child.process.join(max(0.0, deadline - time.monotonic()))
        return self.kill_all(code)

    def kill_all(self, code: int) -> int:
        leftovers = [c for c in self.shape.children() if c.process.exitcode is None]
        for child in leftovers:
            log.warning("killing the %s process", child.name)
            child.process.kill()
        deadline = time.monotonic() + KILL_TIMEOUT_S
        for child in leftovers:
            child.process.join(max(0.0, deadline - time.monotonic()))
        return code


def run(shape: Shape) -> int:
    """Listen, start the shape's processes, and return the exit code once the server has ended."""
    config = shape.config
    try:
        listeners = bind_listeners(config.host, config.port, config.http_processes)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc)
        return 1
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # before the probe port's thread: see above
    try:
        probes = shape.probe_server()
    except OSError as exc:
        log.error("cannot listen on the probe port %s:%s: %s", config.host, config.probe_port, exc)
        for sock in listeners:
            sock.close()
        return 1
    if probes is not None:
        probes.serve_in_thread()
    os.environ[MULTIPROC_ENV] = shape.runtime.metrics_dir  # inherited by every process it starts
    port = listeners[0].getsockname()[1]
    shape.start(listeners)
    for sock in listeners:  # the children hold their own copies now
        sock.close()
    log.info(
        "listening on %s:%s (%d HTTP processes), probe port %s",
        config.host, port, len(listeners), probes.server_address[1] if probes is not None else "none",
    )  # fmt: skip
    try:
        return shape.runtime.watch()
    finally:
        if probes is not None:
            probes.shutdown()
            probes.server_close()
        for view in shape.views():
            view.unlink()
        shutil.rmtree(shape.runtime.metrics_dir, ignore_errors=True)


__all__ = ["Child", "Runtime", "Shape", "bind_listeners", "describe_exit", "died", "run"]
