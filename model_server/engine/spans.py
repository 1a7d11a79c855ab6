"""The inference process's spans of one request, recorded once it is answered (tracing on).

The data plane notes monotonic instants as it goes (``Unit.arrived``, ``Unit.computed``); when a traced
request (``Unit.trace``: its HTTP process's server span) gets its outcome, ``record_unit`` writes, after
the fact, ``modelpool.inference`` (arrival to answer, child of that server span) and its two children:
``modelpool.queue`` (arrival until its compute began) and ``modelpool.batch`` (the forward pass of the
batch it was in, with the batch's items and requests; ``modelpool.generate`` on the continuous-batching
engine, which batches at the token level).  So the inference thread never touches a span, and a batch of
many requests appears in each request's trace."""

from __future__ import annotations

import time

from model_server.engine.unit import Outcome, Unit
from modelpool_contract import tracing


def record_unit(unit: Unit, outcome: Outcome) -> None:
    """Record a traced request's spans (module docstring); nothing with tracing off or untraced."""
    parent = tracing.remote(unit.trace)
    if parent is None or not tracing.on():
        return
    clock = tracing.Clock()
    now = time.monotonic()
    error = not isinstance(outcome, list)
    attributes: dict[str, str | int] = {"modelpool.items": len(unit.items)}
    if error:
        attributes["modelpool.error"] = getattr(outcome, "reason", type(outcome).__name__)
    arrived = clock.ns(unit.arrived)
    inference = tracing.record("modelpool.inference", parent, arrived, clock.ns(now), attributes, error=error)
    if unit.computed is None:  # failed before any compute (the worker failing, a drain)
        return
    began, items, requests = unit.computed
    tracing.record("modelpool.queue", inference, arrived, clock.ns(began))
    batch = {"modelpool.batch.items": items, "modelpool.batch.requests": requests}
    name = "modelpool.batch" if requests else "modelpool.generate"
    tracing.record(name, inference, clock.ns(began), clock.ns(now), batch if requests else {}, error=error)


__all__ = ["record_unit"]
