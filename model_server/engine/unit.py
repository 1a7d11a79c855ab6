"""One admitted request in the inference process (``Unit``), as the data plane queues it and the
generation engine runs it: its own module, so that neither imports the other for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from model_server.errors import ServerError
from model_server.tasks.base import Emitter

Outcome = list[Any] | ServerError
Piece = tuple["Unit", int]


@dataclass(eq=False)
class Unit:
    """One admitted request in the inference process: its items (and their length hints), its deadline
    (monotonic) and how to answer it (once)."""

    items: list[Any]
    deadline: float
    reply: Callable[[Outcome], None]
    lengths: Sequence[int] = ()
    emit: Emitter | None = None
    abandoned: str | None = None  # why the client's side gave up ("timeout", "disconnected")
    on_abandon: Callable[[], None] | None = None  # told when it gives up (the engine stops generating)
    answered: bool = False
    results: list[Any] = field(default_factory=list)
    remaining: int = 0
    # When it reached this process (time.monotonic()), before the queue: time to first token counts from here.
    arrived: float = field(default_factory=time.monotonic)
    # Tracing: the HTTP process's server span (a traceparent; None: untraced), and the compute this unit
    # was part of: when it began, its items and its requests (``spans.record_unit`` reads them).
    trace: str | None = None
    computed: tuple[float, int, int] | None = None
    # Its request id and trace id as the HTTP process had them (``ipc.Submit.ids``), for its log lines.
    ids: tuple[str | None, str | None] = (None, None)

    def answer(self, outcome: Outcome) -> None:
        if not self.answered:
            self.answered = True
            self.reply(outcome)

    def gone(self) -> bool:
        """Does nobody wait for this request any more (its client left, or its deadline passed)?"""
        return self.abandoned is not None or time.monotonic() >= self.deadline

    def hints(self) -> Sequence[int]:
        return self.lengths if len(self.lengths) == len(self.items) else [0] * len(self.items)


__all__ = ["Outcome", "Piece", "Unit"]
