"""The worker's lifecycle state machine: one transition table, illegal transitions impossible.

Only the server decides its own state (the operator reads it from ``/stats``).  States and edges follow
the contract (``modelpool_contract.states``; docs/design.md, "Worker states"):

    Pending -> Loading -> Ready <-> Processing        Ready/Idle -> Idle/Processing
    Loading -> Failed                                 any running state -> Failed
    Ready/Idle/Processing/Loading -> Evicting (SIGTERM: drain) -> Dead
    Ready/Idle -> Sleeping -> Waking -> Ready         (a model on a shared host: weights parked and back)

Processing/Loading -> Evicting is allowed here because SIGTERM can arrive at any time (pod deletion); the
server then drains its in-flight work.  The *operator* never chooses to evict a Loading or Processing
worker; that rule lives in its planner.  Failed and Dead are terminal.  Sleeping -> Evicting unloads a
sleeping model; Sleeping -> Failed is a host's model whose process died while it slept; Waking ->
Evicting is SIGTERM arriving mid-wake (the wake completes, then the drain).
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol


class State(enum.StrEnum):
    """The ten worker states (contract names, in the contract's order)."""

    PENDING = "Pending"
    LOADING = "Loading"
    READY = "Ready"
    PROCESSING = "Processing"
    IDLE = "Idle"
    SLEEPING = "Sleeping"
    WAKING = "Waking"
    EVICTING = "Evicting"
    DEAD = "Dead"
    FAILED = "Failed"


# The one transition table.  Anything not listed here cannot happen.
TRANSITIONS: Mapping[State, frozenset[State]] = {
    State.PENDING: frozenset({State.LOADING, State.FAILED, State.EVICTING}),
    State.LOADING: frozenset({State.READY, State.FAILED, State.EVICTING}),
    State.READY: frozenset({State.PROCESSING, State.IDLE, State.SLEEPING, State.EVICTING, State.FAILED}),
    State.PROCESSING: frozenset({State.READY, State.EVICTING, State.FAILED}),
    State.IDLE: frozenset({State.PROCESSING, State.READY, State.SLEEPING, State.EVICTING, State.FAILED}),
    State.SLEEPING: frozenset({State.WAKING, State.EVICTING, State.FAILED}),
    State.WAKING: frozenset({State.READY, State.EVICTING, State.FAILED}),
    State.EVICTING: frozenset({State.DEAD, State.FAILED}),
    State.DEAD: frozenset(),
    State.FAILED: frozenset(),
}

# States in which the server accepts inference requests (readiness probe passes).
SERVING: frozenset[State] = frozenset({State.READY, State.PROCESSING, State.IDLE})
# States in which the process is healthy (liveness probe passes).
LIVE: frozenset[State] = frozenset(
    {
        State.PENDING,
        State.LOADING,
        State.READY,
        State.PROCESSING,
        State.IDLE,
        State.SLEEPING,
        State.WAKING,
        State.EVICTING,
    }
)
# States a model may be put to sleep from (contract: SLEEPABLE_STATES): never Loading, Processing, Waking.
SLEEPABLE: frozenset[State] = frozenset({State.READY, State.IDLE})


class IllegalTransition(RuntimeError):  # noqa: N818 - named like errors.py's classes
    """A transition not in ``TRANSITIONS`` was requested (a programming error)."""


def can_transition(src: State, dst: State) -> bool:
    """Pure: is ``src -> dst`` an edge of the table?"""
    return dst in TRANSITIONS[src]


class StateStore(Protocol):
    """Where a state machine keeps its state: in this process (``LocalStore``), or in shared memory so
    that every process of a worker sees one state (``worker_view.SharedStateStore``).  ``read`` is
    lock-free; ``write`` happens only while ``lock()`` is held: a transition is checked and made at once."""

    def lock(self) -> AbstractContextManager[Any]: ...

    def read(self) -> tuple[State, float]: ...

    def reason(self) -> str: ...

    def write(self, state: State, since: float, reason: str) -> None: ...


class LocalStore:
    """The state in this process's memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = (State.PENDING, time.time())
        self._reason = ""

    def lock(self) -> AbstractContextManager[Any]:
        return self._lock

    def read(self) -> tuple[State, float]:
        return self._value

    def reason(self) -> str:
        return self._reason

    def write(self, state: State, since: float, reason: str) -> None:
        self._value, self._reason = (state, since), reason


class StateMachine:
    """The worker's current state, when it was entered and why; safe across threads, and across
    processes over a shared store."""

    def __init__(
        self, on_change: Callable[[State, State], None] | None = None, store: StateStore | None = None
    ) -> None:
        self._store: StateStore = store if store is not None else LocalStore()
        self._on_change = on_change

    @property
    def state(self) -> State:
        return self._store.read()[0]

    @property
    def since(self) -> float:
        """Unix time the current state was entered."""
        return self._store.read()[1]

    @property
    def reason(self) -> str:
        return self._store.reason()

    def to(self, dst: State, reason: str = "") -> None:
        """Move to ``dst`` or raise ``IllegalTransition``; a move to the current state is a no-op."""
        with self._store.lock():
            src = self.state
            if src == dst:
                return
            if not can_transition(src, dst):
                raise IllegalTransition(f"illegal worker transition {src} -> {dst}")
            self._store.write(dst, time.time(), reason)
        if self._on_change is not None:
            self._on_change(src, dst)

    def try_to(self, dst: State, reason: str = "") -> bool:
        """Move to ``dst`` if the table allows it from the current state; return whether it moved."""
        with self._store.lock():
            src = self.state
            if src == dst or not can_transition(src, dst):
                return False
            self._store.write(dst, time.time(), reason)
        if self._on_change is not None:
            self._on_change(src, dst)
        return True

    @property
    def serving(self) -> bool:
        return self.state in SERVING

    @property
    def live(self) -> bool:
        return self.state in LIVE
