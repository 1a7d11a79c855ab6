"""Where a pool's Kubernetes Events go: the ``EventSink`` interface and its Kopf implementation.

The planner returns ``Event`` values (``planner.draft``); the pass's effects hand them to an
``EventSink``.  In the operator process that is ``KopfEventSink`` (Kopf posts them on the ModelPool,
batched, in the background); tests pass a sink that records them instead.  Every message is cut to what
the API server takes (``fit_message``): an Event it refuses is lost, with only a warning in the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast

from modelpool_operator.planner.draft import Event

#: The API server refuses an Event whose message passes 1024 bytes (its check counts bytes, not characters).
EVENT_MESSAGE_BYTES = 1024
_CUT = "…"


def fit_message(message: str, limit: int = EVENT_MESSAGE_BYTES) -> str:
    """``message`` cut to at most ``limit`` bytes of UTF-8 (ending with an ellipsis when cut), never in
    the middle of a character."""
    data = message.encode()
    if len(data) <= limit:
        return message
    return data[: limit - len(_CUT.encode())].decode(errors="ignore") + _CUT


class EventSink(Protocol):
    """Where a pool's Events go."""

    def post(self, pool: Mapping[str, Any], event: Event) -> None:
        """Post ``event`` on ``pool`` (the ModelPool object); never blocks, never raises."""
        ...


class KopfEventSink:
    """Posts through ``kopf.event`` (only works inside ``kopf.run``, where Kopf's poster runs)."""

    def post(self, pool: Mapping[str, Any], event: Event) -> None:
        import kopf

        message = fit_message(event.message)
        kopf.event(cast(Any, pool), type=event.type, reason=event.reason, message=message)
