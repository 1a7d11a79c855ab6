"""Kubernetes Events about a pool: what the planner decides to tell, and the interface that posts them.

The planner returns ``Event`` values; the reconciliation pass hands them to an ``EventSink``.  In the
operator process that is ``KopfEventSink`` (Kopf posts them on the ModelPool, batched, in the
background); tests pass a sink that records them instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    """A Kubernetes Event to post on the pool."""

    type: EventType
    reason: str
    message: str


#: Kopf cuts a longer message in its middle; a coalesced one ends with how many it left out instead.
MAX_MESSAGE_CHARS = 1000


def coalesce(events: Iterable[Event]) -> list[Event]:
    """One Event per reason for the Normal Events of one pass, their messages joined in order (pure).

    A pass that creates ten workers told ten CreatingWorker Events, and a scale-up of 300 pools posted
    6,000 Events, one API request each, while the operator and the API server had the scale-up to do.
    Warnings are kept one by one: each failure is told on its own. Each coalesced Event stands where the
    first of its reason stood; its message stays within ``MAX_MESSAGE_CHARS``, saying how many it left out.
    """
    events = list(events)
    messages: dict[str, list[str]] = {}
    for event in events:
        if event.type == "Normal":
            messages.setdefault(event.reason, []).append(event.message)
    out: list[Event] = []
    for event in events:
        if event.type != "Normal":
            out.append(event)
        elif event.reason in messages:
            out.append(Event("Normal", event.reason, _joined(messages.pop(event.reason))))
    return out


def _joined(messages: list[str]) -> str:
    text = messages[0]
    for count, message in enumerate(messages[1:], start=1):
        more = f"; and {len(messages) - count} more"
        if len(text) + 2 + len(message) + len(more) > MAX_MESSAGE_CHARS:
            return text + more
        text = f"{text}; {message}"
    return text


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
