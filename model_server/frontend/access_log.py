"""An HTTP process's access log: one line per request, logger ``modelpool.access`` (uvicorn's is off).

Each line has the method, path, ``status`` (0: the client left before an answer started),
``latency_ms`` and the ``model`` the request was served as: the served name, or the LoRA adapter's name an
OpenAI generation request selected (empty when the route names no model, or the name is not served here);
the request id and trace id come with it and with every other line logged while the request is served
(``modelpool_contract.request_ids``: the gateway's ``x-request-id``, forwarded here, or one made here for a
client calling the worker directly).  The ops routes (health, readiness, ``/metrics``, ``/stats``) get no
line: pollers call them all the time, and the worker logs its state changes where they happen.

The route tells the model it resolved (``note_model``, called by ``endpoints.common.check_model``, the one
place every model route resolves its name) into the request's note: a context variable that
``with_access_log`` sets for the request, holding a mutable note, so a task the framework starts for the
route (which gets a copy of the context) still writes into the same note.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from modelpool_contract.request_ids import App, with_note
from modelpool_contract.stats import LIVE_PATH, METRICS_PATH, READY_PATH, STATS_PATH

log = logging.getLogger("modelpool.access")

QUIET_PATHS = frozenset({LIVE_PATH, READY_PATH, METRICS_PATH, STATS_PATH})


@dataclass
class _Note:
    model: str = ""


_NOTE: contextvars.ContextVar[_Note | None] = contextvars.ContextVar("modelpool_access_note", default=None)


def note_model(name: str) -> None:
    """The model the current request is served as, for its access line (nothing outside a request)."""
    note = _NOTE.get()
    if note is not None:
        note.model = name


def access_fields(
    method: str, path: str, status: int, seconds: float, model: str = ""
) -> dict[str, Any] | None:
    """The fields of a request's line; None for an ops route (pure)."""
    if path in QUIET_PATHS:
        return None
    return {
        "method": method,
        "path": path,
        "status": status,
        "latency_ms": round(seconds * 1000, 3),
        "model": model,
    }


def _done(scope: MutableMapping[str, Any], status: int, seconds: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    note = _NOTE.get()
    model = note.model if note is not None else ""
    fields = access_fields(scope["method"], scope["path"], status, seconds, model)
    if fields is not None:
        message = f"{fields['method']} {fields['path']} {status} {fields['latency_ms']:g} ms"
        log.info(message, extra={"fields": fields})


def with_access_log(app: App) -> App:
    """``app`` behind the request ids and the access line."""
    return with_note(app, _done, _NOTE, _Note)


__all__ = ["QUIET_PATHS", "access_fields", "note_model", "with_access_log"]
