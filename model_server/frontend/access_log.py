"""An HTTP process's access log: one line per request, logger ``modelpool.access`` (uvicorn's is off).

Each line has the method, path, ``status`` (0: the client left before an answer started) and
``latency_ms``; the request id and trace id come with it and with every other line logged while the
request is served (``modelpool_contract.request_ids``: the gateway's ``x-request-id``, forwarded here,
or one made here for a client calling the worker directly).  The ops routes (health, readiness,
``/metrics``, ``/stats``) get no line: pollers call them all the time, and the worker logs its state
changes where they happen.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

from modelpool_contract.request_ids import App, RequestIds
from modelpool_contract.stats import LIVE_PATH, METRICS_PATH, READY_PATH, STATS_PATH

log = logging.getLogger("modelpool.access")

QUIET_PATHS = frozenset({LIVE_PATH, READY_PATH, METRICS_PATH, STATS_PATH})


def access_fields(method: str, path: str, status: int, seconds: float) -> dict[str, Any] | None:
    """The fields of a request's line; None for an ops route (pure)."""
    if path in QUIET_PATHS:
        return None
    return {"method": method, "path": path, "status": status, "latency_ms": round(seconds * 1000, 3)}


def _done(scope: MutableMapping[str, Any], status: int, seconds: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    fields = access_fields(scope["method"], scope["path"], status, seconds)
    if fields is not None:
        message = f"{fields['method']} {fields['path']} {status} {fields['latency_ms']:g} ms"
        log.info(message, extra={"fields": fields})


def with_access_log(app: App) -> App:
    """``app`` behind the request ids and the access line."""
    return RequestIds(app, _done)


__all__ = ["QUIET_PATHS", "access_fields", "with_access_log"]
