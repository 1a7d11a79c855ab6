"""A shared host (``modelpool-server --shared-host``): the runtime (``runtime``) with ``--max-models``
slots (``slot.Slot``), each loaded and unloaded by the control API (``host_control``, on the probe port).

A slot's view is made when the host starts, so the HTTP processes get every slot's view at their start
and learn on their control pipe (a unix socket) which model a slot holds: ``("load", index, config)``
followed by the HTTP end of a fresh socket pair to the model's process
(``multiprocessing.reduction.send_handle``), and ``("unload", index)``.

Isolation: an exception in one model's forward pass fails only that batch; a model whose process dies (a
crash, an OOM kill) or whose forward pass is wedged turns that model Failed, the others serve on (its
channels end with it: what waits is answered 503); a fatal device error (the inference process's exit
4) fails the host: every model Failed, exit 4.  An HTTP process that dies fails the host (exit 5).

The control API calls ``load``, ``unload``, ``sleep`` and ``wake`` from its threads; a request for a
sleeping model (an HTTP process sets ``Field.WAKE_WANTED`` in its slot) is woken by the watch loop.  A
host has one device or several (``--gpus``: a ledger each, of ``--device-memory``); a load goes on the
device its body names (the operator's choice; else the one with the most room), and its inference
process runs there (``cuda:<i>``).  Before a load or a wake, the least recently used idle models of THAT
device are put to sleep when its ledger (each loaded model is charged its weights while awake and its
process's ``--model-overhead`` awake or asleep) is short (``host_plan.make_room``); a request's wake that
finds no room (those models have work in hand) is tried again while the request waits, and a model woken
for a request counts as busy until that request is admitted (never put back to sleep first).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing import reduction
from typing import Any

from model_server import host_plan
from model_server.errors import ModelNotFound, ServerError, SleepRefused
from model_server.host_config import HostConfig, parse_load_body, slot_config
from model_server.metrics import WorkerGauges, render_host
from model_server.state_machine import SERVING, State
from model_server.supervisor.host_control import HostControlServer
from model_server.supervisor.probe_server import stall
from model_server.supervisor.runtime import Child, Runtime
from model_server.supervisor.slot import Slot
from model_server.worker_view import INFERENCE_ROW, Column, Field, WorkerView
from modelpool_contract.exits import (
    DRAIN_GRACE_S,
    EXIT_DEVICE_FAILED,
    EXIT_LOAD_FAILED,
    EXIT_PROCESS_DIED,
    KILL_TIMEOUT_S,
)
from modelpool_contract.flags import MAX_QUEUE_CAPACITY
from modelpool_contract.stats import HostDeviceStats, HostModelStats, HostReport, HostStats

log = logging.getLogger("modelpool.host")

HTTP_MODULE = "model_server.frontend.host_http"
# The watch loop's period: how soon a request's wish to wake a sleeping model is acted on.
HOST_WATCH_S = 0.05
# How long a control call waits for a model to reach the state it asked for (a load: its whole load).
LOAD_WAIT_S = 600.0
SLEEP_WAIT_S = 60.0
# --sleep-idle: how long after a refused sleep an Idle model is asked again.
RETRY_SLEEP_S = 5.0
# A request's wake that found no room (the models that could make it had work in hand) is tried again this
# often while the request still waits (at most --wake-timeout after it asked).
RETRY_WAKE_S = 0.1


class Conflict(ServerError):  # noqa: N818 - KServe-style names
    """The model is loaded already, or the host cannot take another one now."""

    status = 409
    reason = "conflict"


class NoRoom(ServerError):  # noqa: N818 - KServe-style names
    """The device's ledger has no room for the model, even with every idle model asleep."""

    status = 507
    reason = "no_room"


class HostSupervisor:
    """The shared shape: N slots and the control calls (the runtime starts and ends the processes)."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        # Each device's ``--device`` for its models, by index (one on a CPU host or a one-GPU host).
        self.devices = config.device_names()
        self.slots = [
            # Each model's door as big as any pool may ask (its load sets its own: ``Door.limit``).
            Slot(i, WorkerView(max(config.queue_capacity, MAX_QUEUE_CAPACITY), config.http_processes))
            for i in range(config.max_models)
        ]
        self.http: list[Child] = []
        self.lock = threading.RLock()  # the control API's threads and the watch loop
        self.failed = ""  # the host's failure, once it has failed
        self.runtime = Runtime(self)

    # ---- the runtime's shape --------------------------------------------------------------------------

    def views(self) -> list[WorkerView]:
        return [s.view for s in self.slots]

    def children(self) -> list[Child]:
        """The models' processes first: they stop before the HTTP processes that answer for them."""
        return [*(s.child for s in self.slots if s.child is not None), *self.http]

    def probe_server(self) -> HostControlServer:
        return HostControlServer((self.config.host, self.config.probe_port), self)

    def start(self, listeners: list[socket.socket]) -> None:
        """The HTTP processes, with every slot's view; a unix socket each, so that socket ends to a
        model's process can be handed over it at its load."""
        views = [s.view for s in self.slots]
        for index, listener in enumerate(listeners):
            child = self.runtime.spawn(
                f"http-{index}", HTTP_MODULE, self.config, views, duplex=True, index=index, listener=listener
            )
            self.http.append(child)

    def timeout(self) -> float:
        return HOST_WATCH_S

    # ---- the control API's operations -----------------------------------------------------------------

    def slot_of(self, name: str) -> Slot:
        slot = next((s for s in self.slots if s.name == name), None)
        if slot is None:
            raise ModelNotFound(f"model {name!r} is not loaded on this host")
        return slot

    def load(self, name: str, body: bytes) -> Slot:
        """Load a model into a free slot on its device (after making room there); wait until it serves or
        fails."""
        settings, memory, device = parse_load_body(body, len(self.devices))
        with self.lock:
            if any(s.name == name for s in self.slots):
                raise Conflict(f"model {name!r} is loaded already")
            slot = next((s for s in self.slots if s.config is None), None)
            if slot is None:
                raise Conflict(f"the host holds {self.config.max_models} models (--max-models)")
            if device is None:
                loaded = [s.facts() for s in self.slots if s.config is not None]
                device = host_plan.roomiest_device(len(self.devices), self.config.device_memory, loaded)
            config = slot_config(self.config, name, settings, slot.index, self.devices[device])
            # Its process will hold the overhead on the device from its start, asleep or awake.
            self._make_room(memory + self.config.overhead, device, keep=None)
            slot.load(config, memory, device, self.config.overhead)
            self.runtime.in_main_thread(lambda: self._start_slot(slot))
        _wait_until(lambda: slot.state_machine.state not in (State.PENDING, State.LOADING), LOAD_WAIT_S)
        return slot

    def _start_slot(self, slot: Slot) -> None:
        """Connect the HTTP processes to the model's new process; one that cannot start is that model's
        failure, not the host's."""
        ends: list[socket.socket] = []
        try:
            ends = slot.start(self.runtime, len(self.http), labelled=True)
            for child, http_end in zip(self.http, ends, strict=True):
                child.tell(("load", slot.index, slot.config))
                reduction.send_handle(child.control, http_end.fileno(), child.process.pid or 0)
        except Exception as exc:
            log.exception("cannot start the process of %s", slot.name)
            slot.fail(f"cannot start its process: {type(exc).__name__}: {exc}")  # not connected: no use
        finally:
            for sock in ends:  # the HTTP processes hold their own copies now
                sock.close()

    def unload(self, name: str) -> None:
        """Drain the model (its admitted requests are answered) and free its slot."""
        with self.lock:
            slot = self.slot_of(name)
            child = slot.drain()
        if child is not None and child.process.exitcode is None:
            assert slot.config is not None
            child.process.join(slot.config.drain_timeout + DRAIN_GRACE_S)
            if child.process.exitcode is None:
                child.process.kill()
                child.process.join(KILL_TIMEOUT_S)
        with self.lock:
            for http in self.http:
                http.tell(("unload", slot.index))
            slot.free()
        if child is not None and child.process.pid is not None:
            forget_process_metrics(self.runtime.metrics_dir, child.process.pid)

    def sleep(self, name: str) -> Slot:
        with self.lock:
            slot = self.slot_of(name)
            self._sleep(slot)
        return slot

    def _sleep(self, slot: Slot) -> None:
        facts = [s.facts() for s in self.slots if s.config is not None]
        refusal = host_plan.sleep_refusal(slot.facts(), self.config.host_memory, facts)
        if refusal:
            raise SleepRefused(refusal)
        slept, refused = slot.view.get(Field.SLEEPS), slot.view.get(Field.SLEEPS_REFUSED)
        assert slot.child is not None
        slot.child.tell("sleep")
        _wait_until(
            lambda: (
                slot.view.get(Field.SLEEPS) > slept
                or slot.view.get(Field.SLEEPS_REFUSED) > refused
                or slot.state_machine.state is State.FAILED
            ),
            SLEEP_WAIT_S,
        )
        if slot.state_machine.state is not State.SLEEPING:
            raise SleepRefused(f"the model did not sleep ({slot.state_machine.state})")

    def wake(self, name: str) -> Slot:
        with self.lock:
            slot = self.slot_of(name)
            self._wake(slot)
        return slot

    def _wake(self, slot: Slot) -> None:
        if slot.state_machine.state is not State.SLEEPING:
            return
        # ``keep`` leaves the model out of the ledger: its overhead, which it holds asleep too, is asked back.
        self._make_room(slot.facts().device_bytes + slot.overhead, slot.device, keep=slot)
        assert slot.child is not None
        slot.child.tell("wake")
        _wait_until(lambda: slot.state_machine.state in SERVING | {State.FAILED}, SLEEP_WAIT_S)

    def _make_room(self, need: int, device: int, keep: Slot | None) -> None:
        """Put the least recently used idle models of ``device`` to sleep until ``need`` bytes fit there."""
        facts = [s.facts() for s in self.slots if s.config is not None and s is not keep]
        chosen = host_plan.make_room(need, device, self.config.device_memory, self.config.host_memory, facts)
        if chosen is None:
            raise NoRoom(
                f"{need} bytes do not fit on device {device} ({self.config.device_memory} bytes, "
                f"{host_plan.device_used(device, facts)} in use awake, "
                f"{host_plan.device_overhead(device, facts)} held by the models' processes) even with every "
                "idle model there asleep"
            )
        for name in chosen:
            log.info("making room: %s goes to sleep", name)
            self._sleep(self.slot_of(name))

    # ---- what the control API shows -------------------------------------------------------------------

    def index(self) -> list[dict[str, Any]]:
        with self.lock:
            return [
                {
                    "name": s.name,
                    "state": s.state_machine.state.value,
                    "reason": s.state_machine.reason,
                    "device": s.device,
                    "bytes": s.facts().device_bytes,
                    "pid": int(s.view.get_row(INFERENCE_ROW, Column.PID)),
                }
                for s in self.slots
                if s.config is not None
            ]

    def metrics(self) -> bytes:
        """``/metrics``: every process's counters, each model's gauges (labelled ``model``), the devices."""
        with self.lock:
            gauges = [
                WorkerGauges(s.view, s.state_machine, model=s.config.served_name)
                for s in self.slots
                if s.config is not None
            ]
            devices = self._device_reports()
        return render_host(gauges, devices, self.runtime.metrics_dir)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            loaded = [s for s in self.slots if s.config is not None]
            devices = self._device_reports()
            # Each model's document is a worker's /stats, and the index of the device it lives on.
            models = {s.name: HostModelStats(**s.stats(), device=s.device) for s in loaded if s.name}
        report = HostReport(failed=self.failed or None, devices=[HostDeviceStats(**d) for d in devices])
        return HostStats(host=report, models=models).wire()

    def _device_reports(self) -> list[dict[str, Any]]:
        """Each device's ledger (``/stats`` ``host.devices``); the caller holds the lock."""
        facts = [s.facts() for s in self.slots if s.config is not None]
        return [
            host_plan.device_report(i, name, self.config.device_memory, self.config.overhead, facts)
            for i, name in enumerate(self.devices)
        ]

    # ---- watch ----------------------------------------------------------------------------------------

    def on_signal(self, name: str) -> int:
        log.info("%s: draining every model", name)
        return self._drain_all()

    def tick(self, now: float) -> int | None:
        code = self._reap()
        if code is not None:
            return code
        self._fail_wedged(now)
        self._wake_wanted()
        if self.config.sleep_idle:
            self._sleep_idle()
        return None

    def _reap(self) -> int | None:
        """Act on processes that exited unasked: the host's exit code when the host must end."""
        for child in self.http:
            if child.exited():
                return self.runtime.fail(EXIT_PROCESS_DIED, child.died())
        # Without the lock: a control call may hold it for a whole sleep or wake, and a crash must be
        # acted on at once (``leaving`` is set before an unload asks the process to end).
        for slot in self.slots:
            process = slot.child
            if process is None or slot.leaving or not process.exited():
                continue
            exitcode = process.process.exitcode or 0
            if exitcode == EXIT_DEVICE_FAILED:
                reason = slot.state_machine.reason or "fatal device error"
                return self.runtime.fail(EXIT_DEVICE_FAILED, reason)
            reason = process.died()
            if exitcode == EXIT_LOAD_FAILED:
                reason = slot.state_machine.reason or reason
            slot.fail(reason)  # its process has exited already
        return None

    def _fail_wedged(self, now: float) -> None:
        """A model whose forward pass is wedged (``worker_stats.inference_wedged``, a dedicated worker's
        rule) fails alone: Failed with the reason, its process killed, so its device memory comes back and
        the others serve on (a dedicated worker fails whole: it has nothing else to serve)."""
        for slot in (s for s in self.slots if s.running):
            wedged = slot.wedged(now)
            if wedged:
                slot.fail(wedged)

    def stall(self, now: float) -> str:
        """Why an HTTP process counts as stalled ('' while none does): each ticks into the view of every
        model it serves (``host_http.HostRouter.beat``), so the running models' views tell."""
        return stall([s.view for s in self.slots if s.running], now)

    def _wake_wanted(self) -> None:
        """A request waits for a sleeping model: wake it (in a thread: making room may take a while)."""
        now = time.monotonic()
        for slot in self.slots:
            wanted = slot.state_machine.state is State.SLEEPING and slot.view.get(Field.WAKE_WANTED) > 0
            if wanted and now >= slot.retry_wake_at:
                self._act(slot, self._wake_for_request, "wake it for a request")

    def _wake_for_request(self, slot: Slot) -> None:
        """Wake the model; when there is no room now (the models that could make it have work in hand),
        try again every ``RETRY_WAKE_S`` while the request still waits: room comes as soon as one of them
        is idle, and the request is then answered, not refused once its ``--wake-timeout`` has passed."""
        asked = slot.view.get(Field.WAKE_WANTED)
        waiting = False
        try:
            self._wake(slot)
            slot.woken_for, slot.on_its_way_until = asked, asked + self.config.wake_timeout
        except (NoRoom, SleepRefused) as exc:
            waiting = time.time() - asked < self.config.wake_timeout
            if not waiting:
                raise
            slot.retry_wake_at = time.monotonic() + RETRY_WAKE_S
            if slot.no_room_for != asked:  # once per request, not at every try
                slot.no_room_for = asked
                log.info("cannot wake %s for a request yet, tried again while it waits: %s", slot.name, exc)
        finally:  # woken (or given up): a request that comes later asks again
            if not waiting:
                slot.view.set(Field.WAKE_WANTED, 0.0)

    def _sleep_idle(self) -> None:
        """``--sleep-idle``: a model that has turned Idle goes to sleep (a refused one is asked again after
        ``RETRY_SLEEP_S``)."""
        now = time.monotonic()
        for slot in self.slots:
            if slot.state_machine.state is State.IDLE and now >= slot.retry_sleep_at:
                self._act(slot, self._sleep_or_wait, "put it to sleep, Idle")

    def _sleep_or_wait(self, slot: Slot) -> None:
        try:
            self._sleep(slot)
        except SleepRefused:
            slot.retry_sleep_at = time.monotonic() + RETRY_SLEEP_S
            raise

    def _act(self, slot: Slot, action: Callable[[Slot], None], what: str) -> None:
        """Run ``action`` on ``slot`` in a thread of its own, one at a time per slot, under the lock."""
        if slot.acting or slot.config is None:
            return
        slot.acting = True

        def run() -> None:
            try:
                with self.lock:
                    action(slot)
            except ServerError as exc:
                log.info("cannot %s (%s): %s", what, slot.name, exc)
            finally:
                slot.acting = False

        threading.Thread(target=run, name=f"host-{slot.name}", daemon=True).start()

    # ---- how it ends ----------------------------------------------------------------------------------

    def mark_failed(self, reason: str) -> str:
        """The host has failed: every model Failed with the reason."""
        self.failed = reason
        for slot in self.slots:
            if slot.config is not None:
                slot.state_machine.try_to(State.FAILED, f"the host failed: {reason}")
        return reason

    def _drain_all(self) -> int:
        for slot in self.slots:
            if slot.config is not None:
                slot.drain()
        deadline = time.monotonic() + max(
            [s.config.drain_timeout for s in self.slots if s.config is not None], default=0.0
        )
        for slot in self.slots:
            if slot.child is not None:
                slot.child.process.join(max(0.0, deadline + DRAIN_GRACE_S - time.monotonic()))
        return self.runtime.stop_all(0)


def forget_process_metrics(directory: str, pid: int) -> None:
    """Drop the metric files of an unloaded model's ended process: its series leave ``/metrics`` (its
    requests' counters stay in the HTTP processes' files), and files of ended processes do not pile up."""
    for path in glob.glob(os.path.join(directory, f"*_{pid}.db")):
        with contextlib.suppress(OSError):
            os.remove(path)


def _wait_until(condition: Callable[[], bool], timeout: float) -> bool:
    """Poll ``condition`` (shared memory) until it holds or ``timeout`` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


__all__ = ["Conflict", "HostSupervisor", "NoRoom", "Slot"]
