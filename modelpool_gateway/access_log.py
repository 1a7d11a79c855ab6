"""The gateway's access log (issue 34 item 5): one line per request, logger ``modelpool.gateway.access``.

Each line names who called (``key``: the key's Secret as ``namespace/name``, never the key: empty with
``--auth none`` or a refused key), the pool (``namespace/name``) and the ``model`` it asked for, the
``status`` answered (499: the client left first), the ``latency_ms`` from the request's arrival to the
app's return, the answer's ``prompt_tokens`` and ``completion_tokens`` when its usage object gave them,
method and path; the request id and trace id come with every line logged while serving
(``modelpool_contract.logs``).  The health and readiness probes get no line: the kubelet calls them all
the time, and the gateway logs why it is not ready where that happens.

The app tells what it learnt while serving into the request's ``Served`` note (``served()``: a context
variable, set by ``access_middleware`` for the request's task, so ``Gateway`` needs no scope to reach it);
``access_fields`` builds a line's fields from it (pure).  A line is formatted and written ``DEFER_S``
(2 ms) after its request ended, with the others due then (``_Later``): off the path of the next request
on the connection.  ``--no-access-log`` (the chart's ``gateway.accessLog: false``) writes none: the
request ids stay.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from modelpool_contract.request_ids import App, with_note
from modelpool_gateway.access import key_name_of
from modelpool_gateway.usage import Usage

log = logging.getLogger("modelpool.gateway.access")

#: A line for these would say nothing but that the kubelet asked.
PROBES = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
# nginx's code for a request whose client left before it was answered.
CLIENT_CLOSED = 499


@dataclass
class Served:
    """What the app learnt of one request while serving it."""

    pool: str = ""
    model: str = ""
    status: int = 0  # the app's own word on the outcome (499 when nothing was sent); 0: the status sent
    usage: Usage | None = None

    def answered(self, pool: str, status: int) -> None:
        self.pool, self.status = pool or self.pool, status


_SERVED: contextvars.ContextVar[Served | None] = contextvars.ContextVar("modelpool_served", default=None)


def served() -> Served:
    """The current request's note; a throwaway one outside a request (the app's unit tests)."""
    return _SERVED.get() or Served()


def logged(path: str) -> bool:
    """Whether a request gets an access line: everything but the probes."""
    return path not in PROBES


def access_fields(
    method: str, path: str, status: int, seconds: float, *, key: str, note: Served
) -> dict[str, Any]:
    """The fields of one access line (module docstring): the status the app reports over the one sent,
    and 499 when nothing was sent at all."""
    fields: dict[str, Any] = {
        "method": method,
        "path": path,
        "status": note.status or status or CLIENT_CLOSED,
        "latency_ms": round(seconds * 1000, 3),
        "key": key,
        "pool": note.pool,
        "model": note.model,
    }
    if note.usage is not None:
        fields["prompt_tokens"] = note.usage.prompt_tokens
        fields["completion_tokens"] = note.usage.completion_tokens
    return fields


def message(fields: dict[str, Any]) -> str:
    """The line's message: ``POST /v1/embeddings 200 4.1 ms`` (the fields carry the rest)."""
    return f"{fields['method']} {fields['path']} {fields['status']} {fields['latency_ms']:g} ms"


#: How long after its request's answer an access line is written (``_Later``).
DEFER_S = 0.002


class _Later:
    """Access lines written ``DEFER_S`` after their requests' answers, together: the record is made when
    the request ends (its time, status and latency are that moment's), its formatting and write (most of
    a line's cost) a moment later, in the request's own context (its request and trace ids), so that the
    client's next request on the connection, which often arrives meanwhile, does not wait behind them.
    ``flush`` writes what is pending at once (at shutdown)."""

    def __init__(self) -> None:
        self.pending: list[tuple[contextvars.Context, logging.LogRecord]] = []
        self.timer: asyncio.TimerHandle | None = None

    def add(self, record: logging.LogRecord) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not in a server: written now
            log.handle(record)
            return
        self.pending.append((contextvars.copy_context(), record))
        if self.timer is None:
            self.timer = loop.call_later(DEFER_S, self.flush)

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        pending, self.pending = self.pending, []
        for context, record in pending:
            context.run(log.handle, record)


_LATER = _Later()
#: Write the access lines still pending now (the gateway calls it as it stops).
flush = _LATER.flush


def _done(scope: MutableMapping[str, Any], status: int, seconds: float) -> None:
    note = _SERVED.get() or Served()
    path: str = scope["path"]
    if not logged(path) or not log.isEnabledFor(logging.INFO):
        return
    fields = access_fields(scope["method"], path, status, seconds, key=key_name_of(scope), note=note)
    # ``log.info`` less its search of the stack for the caller's file and line, which no format writes.
    line = message(fields)
    _LATER.add(log.makeRecord(log.name, logging.INFO, "", 0, line, (), None, extra={"fields": fields}))


def _unlogged(scope: MutableMapping[str, Any], status: int, seconds: float) -> None:
    """The access line turned off (``--no-access-log``)."""


def access_middleware(app: App, *, lines: bool = True) -> App:
    """``app`` behind the request ids (``modelpool_contract.request_ids``) and, unless not ``lines``, the
    access line."""
    return with_note(app, _done if lines else _unlogged, _SERVED, Served)


__all__ = ["PROBES", "Served", "access_fields", "access_middleware", "flush", "logged", "message", "served"]
