"""Kubernetes Events about a pool: what the planner decides to tell, and the interface that posts them.

The planner returns ``Event`` values; the reconciliation pass hands them to an ``EventSink``.  In the
operator process that is ``KopfEventSink`` (Kopf posts them on the ModelPool, batched, in the
background); tests pass a sink that records them instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the pool."""

    type: EventType
    reason: str
    message: str


class EventSink(Protocol):
    """Where a pool's Events go."""

    def post(self, pool: Mapping[str, Any], event: Event) -> None:
        """Post ``event`` on ``pool`` (the ModelPool object); never blocks, never raises."""
        ...


class KopfEventSink:
    """Posts through ``kopf.event`` (only works inside ``kopf.run``, where Kopf's poster runs)."""

    def post(self, pool: Mapping[str, Any], event: Event) -> None:
        import kopf

        kopf.event(cast(Any, pool), type=event.type, reason=event.reason, message=event.message)
