"""A slot: one model's place in the server, the same on both shapes (a dedicated worker has one, loaded at
start; a shared host has ``--max-models``, loaded by control calls).

A slot is its model's shared view (``WorkerView``: the state, the door of its bounded queue, its figures
and ``/stats``), its state machine over that view, its inference process (``engine/inference_process``:
the model, its queue, its one inference thread) and what the host's ledger charges it.  The views are
made when the server starts: shared memory and semaphores can only be handed to a process when it is
spawned, so every HTTP process gets every slot's view at its start.

The wedge check is the slot's: a forward pass running past ``--request-timeout`` + ``--wedge-grace``
(``worker_stats.inference_wedged``) makes the model Failed, so its memory is released (the operator
never evicts a Processing model).  A dedicated worker then fails whole, a host kills that model's
process and serves on.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from model_server import host_plan, worker_stats
from model_server.config import ServerConfig
from model_server.state_machine import State, StateMachine
from model_server.supervisor.runtime import Child, Runtime
from model_server.worker_view import INFERENCE_ROW, Column, Field, WorkerView
from modelpool_contract.placements import device_charge

log = logging.getLogger("modelpool.supervisor")

INFERENCE_MODULE = "model_server.engine.inference_process"


@dataclass
class Slot:
    """One model's place on the server."""

    index: int
    view: WorkerView
    config: ServerConfig | None = None
    memory: int = 0  # the declared bytes (charged until the model's own measure is known)
    device: int = 0  # the index of the host's device it lives on
    overhead: int = 0  # its process's charge on the device, awake or asleep (--model-overhead)
    child: Child | None = None
    leaving: bool = False  # an unload (or a drain) is under way: its process's exit is expected
    acting: bool = False  # a sleep or a wake of the watch loop's own is under way
    retry_sleep_at: float = 0.0  # --sleep-idle: not before this (time.monotonic()) after a refusal
    retry_wake_at: float = 0.0  # a request's wake that found no room: not again before this
    no_room_for: float = 0.0  # the request (its WAKE_WANTED) whose wake found no room, logged once
    # The latest request a wake was for (its WAKE_WANTED, Unix time), and until when (time.time()) that
    # request may still be on its way to the model: until it is admitted, the model counts as busy.
    woken_for: float = 0.0
    on_its_way_until: float = 0.0
    state_machine: StateMachine = field(init=False)

    def __post_init__(self) -> None:
        self.state_machine = StateMachine(store=self.view.state_store())

    @property
    def name(self) -> str | None:
        return self.config.served_name if self.config is not None else None

    @property
    def running(self) -> bool:
        """Its model's process runs and is not being unloaded."""
        return self.config is not None and self.child is not None and not self.child.done and not self.leaving

    def load(self, config: ServerConfig, memory: int, device: int, overhead: int) -> None:
        """Take a model: a fresh view (its door as its pool asks), its charge on the ledger."""
        self.view.reset()
        self.view.door.limit(config.queue_capacity)
        self.config, self.memory, self.device, self.overhead = config, memory, device, overhead
        self.leaving, self.woken_for, self.on_its_way_until = False, 0.0, 0.0

    def free(self) -> None:
        self.config, self.child, self.memory, self.overhead = None, None, 0, 0

    def start(self, runtime: Runtime, http_processes: int, *, labelled: bool) -> list[socket.socket]:
        """Start the model's inference process with a socket pair to each HTTP process; the HTTP ends, for
        the caller to hand over and close.  ``labelled``: a host's, its process and metrics named after
        the model."""
        assert self.config is not None
        pairs = [socket.socketpair() for _ in range(http_processes)]
        name, model = (f"inference-{self.name}", self.name) if labelled else ("inference", None)
        try:
            ends = [end for _, end in pairs]
            self.child = runtime.spawn(
                name, INFERENCE_MODULE, self.config, self.view, ends, metrics_model=model
            )
            self.view.put(INFERENCE_ROW, Column.PID, self.child.process.pid or 0)
        finally:
            for _, end in pairs:  # the process holds its own copies now
                end.close()
        return [http_end for http_end, _ in pairs]

    def drain(self) -> Child | None:
        """``drain`` to its process (Evicting: its admitted requests are answered, then it exits)."""
        self.leaving = True
        if self.child is not None and self.child.process.exitcode is None:
            self.child.tell("drain")
        return self.child

    def fail(self, reason: str) -> None:
        """Failed with ``reason``, its process (if any) killed: its memory comes back."""
        log.error("model %s failed: %s", self.name, reason)
        self.state_machine.try_to(State.FAILED, reason)
        if self.child is not None:
            self.child.process.kill()

    def wedged(self, now: float) -> str:
        """Why its forward pass counts as wedged ('' while it does not, or once the model has ended)."""
        if self.config is None or self.state_machine.state in (State.FAILED, State.DEAD):
            return ""
        return worker_stats.inference_wedged(self.config, self.view, now)

    def stats(self) -> dict[str, Any]:
        """Its ``/stats`` document (a worker's; on a host, one entry of ``models``)."""
        assert self.config is not None
        return worker_stats.stats(self.config, self.view, self.state_machine)

    def facts(self) -> host_plan.SlotFacts:
        """What the host's ledger charges it: the larger of its declared and measured bytes."""
        view = self.view
        last_request = view.latest(Column.LAST_REQUEST)
        charge = device_charge(self.memory, int(view.get(Field.GPU_RESERVED)))
        return host_plan.SlotFacts(
            name=self.name or "",
            state=self.state_machine.state,
            device=self.device,
            device_bytes=charge,
            host_bytes=int(view.get(Field.PARKED_BYTES)) or charge,
            last_used=max(last_request, view.get(Field.WAKE_WANTED), self.woken_for),
            busy=bool(view.door.taken or view.get(Field.IN_FLIGHT)) or self._request_on_its_way(last_request),
            overhead=self.overhead,
        )

    def _request_on_its_way(self, last_request: float) -> bool:
        """Woken for a request that has not been admitted yet (it waits for the HTTP process to see the
        model awake): putting the model back to sleep now would leave that request waiting in vain."""
        return last_request < self.woken_for and time.time() < self.on_its_way_until


__all__ = ["INFERENCE_MODULE", "Slot"]
