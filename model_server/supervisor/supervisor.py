"""A dedicated worker (what ``modelpool-server`` runs): the runtime (``runtime``) with one slot
(``slot.Slot``), its model loaded at start: its inference process and ``--http-workers`` HTTP processes,
a socket pair between each.  How the worker ends:

* SIGTERM or SIGINT: ``drain`` to the inference process (Evicting: readiness fails, new requests get
  503, everything admitted is answered, bounded by ``--drain-timeout``); once it has exited, ``stop`` to
  the HTTP processes; exit 0, or ``EXIT_DRAIN_TIMED_OUT`` when the drain ran out of time (the reason, with
  the number of requests abandoned, in the termination log).  A second signal kills every process at
  once.  The longest this can take is ``modelpool_contract.exits.worst_case_shutdown_s``, which the pod's
  grace period covers.
* A process that exits unasked: the worker fails (``Runtime.fail``) with the inference process's code (3
  load failure, 4 fatal device error) or ``EXIT_PROCESS_DIED``.
* A wedged forward pass (``Slot.wedged``, checked every ``WATCH_PERIOD_S``): the worker fails with
  ``EXIT_INFERENCE_WEDGED``, having nothing else to serve.

With ``--probe-port`` it answers health, readiness, ``/stats`` and ``/metrics`` on that port itself
(``probe_server``: apart from the traffic, at the supervisor's normal CPU priority).
"""

from __future__ import annotations

import logging
import os
import socket
import time

from model_server.config import ServerConfig
from model_server.state_machine import State
from model_server.supervisor.probe_server import ProbeServer
from model_server.supervisor.runtime import Child, Runtime, describe_exit, died
from model_server.supervisor.slot import Slot
from model_server.worker_view import SUPERVISOR_ROW, Column, Field, WorkerView, http_row
from modelpool_contract.exits import (
    DRAIN_GRACE_S,
    EXIT_DEVICE_FAILED,
    EXIT_DRAIN_TIMED_OUT,
    EXIT_INFERENCE_WEDGED,
    EXIT_LOAD_FAILED,
    EXIT_PROCESS_DIED,
)

log = logging.getLogger("modelpool.supervisor")

# How often the supervisor looks for a wedged forward pass (the bound of its detection is
# --request-timeout + --wedge-grace + this).
WATCH_PERIOD_S = 1.0
HTTP_MODULE = "model_server.frontend.http_process"


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
    return EXIT_PROCESS_DIED, died(name, pid, exitcode)


class Supervisor:
    """The dedicated shape: one slot, loaded at start; the worker ends with it."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.slot = Slot(0, WorkerView(config.queue_capacity, config.http_processes), config=config)
        self.view, self.state_machine = self.slot.view, self.slot.state_machine
        self.http: list[Child] = []
        self.runtime = Runtime(self)
        self._drain_deadline: float | None = None

    def views(self) -> list[WorkerView]:
        return [self.view]

    def children(self) -> list[Child]:
        return [*([self.slot.child] if self.slot.child is not None else []), *self.http]

    def probe_server(self) -> ProbeServer | None:
        if self.config.probe_port is None:
            return None
        address = (self.config.host, self.config.probe_port)
        return ProbeServer(address, self.config, self.view, self.state_machine, self.runtime.metrics_dir)

    def start(self, listeners: list[socket.socket]) -> None:
        """The inference process, then one HTTP process per listener, a socket pair between each."""
        ends = self.slot.start(self.runtime, len(listeners), labelled=False)
        for index, (listener, http_end) in enumerate(zip(listeners, ends, strict=True)):
            child = self.runtime.spawn(
                f"http-{index}", HTTP_MODULE, self.config, self.view, index=index, listener=listener,
                sock=http_end,
            )  # fmt: skip
            self.view.put(http_row(index), Column.PID, child.process.pid or 0)
            self.http.append(child)
        for sock in ends:  # the HTTP processes hold their own copies now
            sock.close()
        self.view.put(SUPERVISOR_ROW, Column.PID, os.getpid())

    def timeout(self) -> float:
        if self._drain_deadline is None:
            return WATCH_PERIOD_S
        return min(WATCH_PERIOD_S, max(0.0, self._drain_deadline - time.monotonic()))

    def on_signal(self, name: str) -> int | None:
        if self._drain_deadline is not None:
            log.warning("second signal (%s): stopping every process now", name)
            return self.runtime.kill_all(0)
        log.info("%s: draining", name)
        self._drain_deadline = time.monotonic() + self.config.drain_timeout + DRAIN_GRACE_S
        self.slot.drain()
        return None

    def tick(self, now: float) -> int | None:
        for child in self.children():
            if child.exited():
                return self._ended(child)
        wedged = self.slot.wedged(now)
        if wedged:
            return self.runtime.fail(EXIT_INFERENCE_WEDGED, wedged)
        if self._drain_deadline is not None and now >= self._drain_deadline:
            waited = self.config.drain_timeout + DRAIN_GRACE_S
            abandoned = self.view.door.taken + int(self.view.get(Field.IN_FLIGHT))
            return self.runtime.fail(
                EXIT_DRAIN_TIMED_OUT,
                f"drain timed out: the inference process had not exited {waited:g} s after SIGTERM;"
                f" stopped with {abandoned} requests abandoned",
            )
        return None

    def _ended(self, child: Child) -> int:
        """A process has exited: the drain is complete, or the worker has failed."""
        draining = self._drain_deadline is not None
        pid, exitcode = child.process.pid or 0, child.process.exitcode or 0
        code, reason = verdict(child.name, pid, exitcode, self.state_machine.reason, draining)
        if code == 0:
            log.info("drained; stopping the HTTP processes")
            return self.runtime.stop_all(0)
        if code == EXIT_DRAIN_TIMED_OUT:
            log.error("%s; stopping the HTTP processes", reason)
            self.runtime.write_termination_log(reason)
            return self.runtime.stop_all(code)
        return self.runtime.fail(code, reason)

    def mark_failed(self, reason: str) -> str:
        """Failed at once in every HTTP process still up: liveness and readiness fail from now on (a
        worker that had failed already keeps its first reason)."""
        if not self.state_machine.try_to(State.FAILED, reason) and self.state_machine.state is State.FAILED:
            return self.state_machine.reason or reason
        return reason


__all__ = ["WATCH_PERIOD_S", "Supervisor", "describe_exit", "verdict"]
