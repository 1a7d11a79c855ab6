"""The supervisor: the main process of a worker (what ``modelpool-server`` runs).

It binds the listening sockets (one per HTTP process, all on the same port with ``SO_REUSEPORT``, so the
kernel spreads new connections over them), makes the worker's shared view (``worker_view``) and one
socket pair per HTTP process, and starts, with spawn (never fork a process that may hold torch), the
inference process and ``--http-workers`` HTTP processes.  The sockets listen before any of them starts,
so a client's first connection waits in the backlog for the first HTTP process, never meets a refusal.

Then it watches them, and owns the exit code and the termination log:

* SIGTERM or SIGINT: ``drain`` to the inference process (Evicting: readiness fails, new requests get
  503, everything admitted is computed and answered, bounded by ``--drain-timeout``); once it has
  exited, ``stop`` to the HTTP processes (their answers in progress finish); exit 0, or
  ``EXIT_DRAIN_TIMED_OUT`` when the drain ran out of time (the reason, with the number of requests
  abandoned, in the termination log).  A second signal stops every process at once.  The longest this
  can take is ``modelpool_contract.exits.worst_case_shutdown_s``, which the pod's grace period covers.
* A process that exits unasked: the worker is Failed at once (liveness and readiness fail in every HTTP
  process still up), the reason goes to the termination log, the others are stopped, and the supervisor
  exits with the inference process's code (3 load failure, 4 fatal device error) or
  ``EXIT_PROCESS_DIED``.
* A forward pass running past ``--request-timeout`` + ``--wedge-grace`` (the inference process publishes
  when its current batch started; ``worker_stats.inference_wedged``): the worker is Failed with that
  reason, its processes are stopped and the supervisor exits ``EXIT_INFERENCE_WEDGED``, so that its
  memory is released (the operator never evicts a Processing worker, and charges a Failed one nothing).
  Checked every ``WATCH_PERIOD_S``.

With ``--probe-port`` it answers health, readiness and ``/stats`` on that port itself, from a thread
(``probe_server``: apart from the traffic, at the supervisor's normal CPU priority).

It imports neither torch nor the web stack nor the model's code (``process_setup.start`` imports each
process's module in that process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType

from model_server import process_setup, worker_stats
from model_server.config import ServerConfig
from model_server.state_machine import State, StateMachine
from model_server.supervisor.probe_server import ProbeServer
from model_server.worker_view import (
    INFERENCE_ROW,
    SPAWN,
    SUPERVISOR_ROW,
    Column,
    Field,
    WorkerView,
    http_row,
)
from modelpool_contract.exits import (
    DRAIN_GRACE_S,
    EXIT_DEVICE_FAILED,
    EXIT_DRAIN_TIMED_OUT,
    EXIT_INFERENCE_WEDGED,
    EXIT_LOAD_FAILED,
    EXIT_PROCESS_DIED,
    KILL_TIMEOUT_S,
    STOP_TIMEOUT_S,
)

log = logging.getLogger("modelpool.supervisor")

# How often the supervisor looks for a wedged forward pass (the bound of its detection is
# --request-timeout + --wedge-grace + this).
WATCH_PERIOD_S = 1.0
LISTEN_BACKLOG = 2048
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def describe_exit(exitcode: int) -> str:
    """Pure: a process's exit code in words (negative: the signal that killed it)."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def verdict(name: str, pid: int, exitcode: int, reason: str, draining: bool) -> tuple[int, str]:
    """Pure: the worker's exit code and termination message when process ``name`` has exited.

    The inference process ends a drain with 0 (or 6 when it timed out), and its own failures with 3 or 4,
    the reason in the shared state; anything else (an HTTP process exiting at all, a crash, a signal) is
    a dead process."""
    if name == "inference":
        if exitcode == 0 and draining:
            return 0, ""
        if exitcode == EXIT_DRAIN_TIMED_OUT and draining:
            return exitcode, reason or "drain timed out"
        if exitcode in (EXIT_LOAD_FAILED, EXIT_DEVICE_FAILED):
            return exitcode, reason or f"the inference process exited with {exitcode}"
    return EXIT_PROCESS_DIED, f"the {name} process (pid {pid}) died: {describe_exit(exitcode)}"


def bind_listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` listening sockets on ``host:port`` (port 0: one free port for all)."""
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
    """A process of the worker, and the pipe the supervisor tells it things on."""

    name: str
    process: BaseProcess
    control: Connection
    done: bool = False

    def tell(self, message: object) -> None:
        with contextlib.suppress(OSError):
            self.control.send(message)


class Supervisor:
    """Starts the worker's processes, watches them, and decides how the worker ends."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.view = WorkerView(config.queue_capacity, config.http_processes)
        self.state_machine = StateMachine(store=self.view.state_store())
        self.children: list[Child] = []
        self._signals: list[int] = []
        self._draining = False
        # Under TMPDIR: the pod's tmp volume, the root filesystem being read-only.
        self.metrics_dir = tempfile.mkdtemp(prefix="modelpool-metrics-")

    # ---- start --------------------------------------------------------------------------------------

    def start(self, listeners: list[socket.socket]) -> None:
        """Start the inference process and one HTTP process per listener."""
        # Every process keeps its counters in files here; any scrape adds them up.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = self.metrics_dir
        pairs = [socket.socketpair() for _ in listeners]
        control_r, control_w = SPAWN.Pipe(duplex=False)
        inference = SPAWN.Process(
            target=process_setup.start,
            args=(
                "model_server.engine.inference_process",
                self.config,
                self.view,
                [p[1] for p in pairs],
                control_r,
            ),
            name="inference",
        )
        self._spawn(Child("inference", inference, control_w), INFERENCE_ROW)
        control_r.close()
        for index, (listener, (http_end, _)) in enumerate(zip(listeners, pairs, strict=True)):
            control_r, control_w = SPAWN.Pipe(duplex=False)
            process = SPAWN.Process(
                target=process_setup.start,
                args=("model_server.frontend.http_process", self.config, self.view),
                kwargs={"index": index, "listener": listener, "sock": http_end, "control": control_r},
                name=f"http-{index}",
            )
            self._spawn(Child(f"http-{index}", process, control_w), http_row(index))
            control_r.close()
        # The children hold their own copies now.
        for sock in [*listeners, *(s for pair in pairs for s in pair)]:
            sock.close()
        self.view.put(SUPERVISOR_ROW, Column.PID, os.getpid())

    def _spawn(self, child: Child, row: int) -> None:
        child.process.start()
        self.view.put(row, Column.PID, child.process.pid or 0)
        self.children.append(child)

    # ---- watch --------------------------------------------------------------------------------------

    def watch(self) -> int:
        """Until the worker ends: act on signals and on processes that exit; returns the exit code."""
        wakeup = self._catch_signals()
        drain_deadline: float | None = None
        while True:
            timeout = WATCH_PERIOD_S
            if drain_deadline is not None:
                timeout = min(timeout, max(0.0, drain_deadline - time.monotonic()))
            wait([wakeup, *(c.process.sentinel for c in self.children if not c.done)], timeout)
            with contextlib.suppress(BlockingIOError):
                wakeup.recv(4096)
            while self._signals:
                name = signal.Signals(self._signals.pop(0)).name
                if self._draining:
                    log.warning("second signal (%s): stopping every process now", name)
                    return self._kill_all(0)
                log.info("%s: draining", name)
                self._draining = True
                drain_deadline = time.monotonic() + self.config.drain_timeout + DRAIN_GRACE_S
                self._child("inference").tell("drain")
            for child in self.children:
                if not child.done and child.process.exitcode is not None:
                    child.done = True
                    return self._ended(child)
            wedged = self._wedged()
            if wedged:
                return self._fail(EXIT_INFERENCE_WEDGED, wedged)
            if drain_deadline is not None and time.monotonic() >= drain_deadline:
                waited = self.config.drain_timeout + DRAIN_GRACE_S
                return self._fail(
                    EXIT_DRAIN_TIMED_OUT,
                    f"drain timed out: the inference process had not exited {waited:g} s after SIGTERM;"
                    f" stopped with {self.view.door.taken + int(self.view.get(Field.IN_FLIGHT))} requests"
                    " abandoned",
                )

    def _wedged(self) -> str:
        """Why the forward pass counts as wedged ('' while it does not), unless the worker has ended."""
        if self.state_machine.state in (State.FAILED, State.DEAD):
            return ""
        return worker_stats.inference_wedged(self.config, self.view, time.monotonic())

    def _catch_signals(self) -> socket.socket:
        """Record SIGTERM/SIGINT (a byte on the returned socket wakes ``watch``), then let them in."""
        wakeup_r, wakeup_w = socket.socketpair()
        wakeup_r.setblocking(False)
        wakeup_w.setblocking(False)
        self._wakeup = (wakeup_r, wakeup_w)  # kept open for as long as the handlers may write
        signal.set_wakeup_fd(wakeup_w.fileno())
        for stop in STOP_SIGNALS:
            signal.signal(stop, self._on_signal)
        # Held back while the processes started (see ``run``): a signal that came meanwhile arrives now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return wakeup_r

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        self._signals.append(sig)

    def _child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def _ended(self, child: Child) -> int:
        """A process has exited: the drain is complete, or the worker has failed."""
        exitcode = child.process.exitcode or 0
        code, reason = verdict(
            child.name, child.process.pid or 0, exitcode, self.state_machine.reason, self._draining
        )
        if code == 0:
            log.info("drained; stopping the HTTP processes")
            return self._stop_all(0)
        if code == EXIT_DRAIN_TIMED_OUT:
            log.error("%s; stopping the HTTP processes", reason)
            self._write_termination_log(reason)
            return self._stop_all(code)
        return self._fail(code, reason)

    def _fail(self, code: int, reason: str) -> int:
        """The worker has failed: Failed with ``reason``, the termination log, every process stopped."""
        log.error("worker failed: %s", reason)
        # Failed at once in every HTTP process still up: liveness and readiness fail from now on.
        if not self.state_machine.try_to(State.FAILED, reason) and self.state_machine.state is State.FAILED:
            reason = self.state_machine.reason or reason
        self._write_termination_log(reason)
        return self._stop_all(code)

    def _write_termination_log(self, reason: str) -> None:
        try:
            self.config.termination_log.write_text(reason[:4000] + "\n")
        except OSError as exc:  # the kubelet may not have mounted it (e.g. running locally)
            log.warning("cannot write termination log %s: %s", self.config.termination_log, exc)

    # ---- stop ---------------------------------------------------------------------------------------

    def _stop_all(self, code: int) -> int:
        """``stop`` to every process still running (the inference process first), wait, kill leftovers."""
        for child in self.children:
            if child.process.exitcode is None:
                child.tell("stop")
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in self.children:
            child.process.join(max(0.0, deadline - time.monotonic()))
        return self._kill_all(code)

    def _kill_all(self, code: int) -> int:
        leftovers = [c for c in self.children if c.process.exitcode is None]
        for child in leftovers:
            log.warning("killing the %s process", child.name)
            child.process.kill()
        deadline = time.monotonic() + KILL_TIMEOUT_S
        for child in leftovers:
            child.process.join(max(0.0, deadline - time.monotonic()))
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return code


def run(config: ServerConfig) -> int:
    """Listen, start the worker's processes, and return the exit code once the worker has ended."""
    try:
        listeners = bind_listeners(config.host, config.port, config.http_processes)
    except OSError as exc:
        log.error("cannot listen on %s:%s: %s", config.host, config.port, exc)
        return 1
    port = listeners[0].getsockname()[1]
    supervisor = Supervisor(config)
    # The processes start with SIGTERM and SIGINT blocked (the mask survives exec), so a signal to the
    # whole process group (a pod's deletion, Ctrl-C) cannot kill one before it ignores them; the
    # supervisor's own copy waits until ``watch`` is ready for it.  Blocked before the probe port's
    # thread starts, which inherits the mask: a signal delivered to that thread would otherwise take the
    # default action (the end of the supervisor) before ``watch`` has its handlers in place.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        probes = start_probe_server(config, supervisor)
    except OSError as exc:
        log.error("cannot listen on the probe port %s:%s: %s", config.host, config.probe_port, exc)
        for sock in listeners:
            sock.close()
        return 1
    supervisor.start(listeners)
    log.info(
        "listening on %s:%s: %d HTTP processes and the inference process", config.host, port, len(listeners)
    )
    try:
        return supervisor.watch()
    finally:
        if probes is not None:
            probes.shutdown()
            probes.server_close()
        supervisor.view.unlink()


def start_probe_server(config: ServerConfig, supervisor: Supervisor) -> ProbeServer | None:
    """With ``--probe-port``: health, readiness, /stats and /metrics on it, from a thread of this process
    (its socket listens before any other process starts, so the first probe never meets a refusal)."""
    if config.probe_port is None:
        return None
    probes = ProbeServer(
        (config.host, config.probe_port),
        config,
        supervisor.view,
        supervisor.state_machine,
        metrics_dir=supervisor.metrics_dir,
    )
    probes.serve_in_thread()
    log.info("probes, /stats and /metrics on %s:%s", config.host, config.probe_port)
    return probes


__all__ = ["Supervisor", "bind_listeners", "describe_exit", "run", "start_probe_server", "verdict"]
