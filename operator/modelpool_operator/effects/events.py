"""Where a pool's Kubernetes Events go: the ``EventSink`` interface and its Kopf implementation.

The planner returns ``Event`` values (``planner.draft``); the pass's effects hand them to an
``EventSink``.  In the operator process that is ``KopfEventSink`` (Kopf posts them on the ModelPool,
batched, in the background); tests pass a sink that records them instead.  Every message is cut to what
the API server takes (``modelpool_contract.messages.fit_message``), so no producer cuts its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, cast

from modelpool_contract.messages import fit_message
from modelpool_operator.planner.draft import Event


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
