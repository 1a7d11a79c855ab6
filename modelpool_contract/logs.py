"""How every program of the project logs: the operator, the gateway and the server's processes alike.

* ``set_up(fmt, level, process)``: the root logger writes to stderr, ``json`` (the default: one JSON object
  per line) or ``plain`` (one line of text per event); each program calls it once, with its settings'
  ``log_format`` and ``log_level`` (a worker's processes each with their own name: ``supervisor``,
  ``inference``, ``http-0``, ...).
* ``JsonFormatter``: ``time`` (UTC, milliseconds), ``level``, ``logger``, ``process``, ``message``, then
  the request's ``request_id`` and ``trace_id`` when the line is logged while serving one, the record's
  ``fields`` (a mapping given as ``extra={"fields": {...}}``: the access lines' key, pool, status, ...) and
  an exception's traceback as ``exception``.  ASCII only (non-ASCII text escaped), so no locale or stream
  encoding can break a line, and a message's newlines stay inside its one line.
* ``PlainFormatter``: ``time LEVEL [process] logger message`` and the same fields as ``key=value``; the
  traceback on the lines below.
* The request's ids: ``bind(request_id, trace_id)`` sets them for the current task (contextvars: each
  request of an asyncio server is a task of its own, and what it starts inherits them); ``request_id_of``
  honours a client's ``x-request-id`` (printable ASCII, at most ``MAX_REQUEST_ID``) or makes one;
  ``traceparent_trace_id`` reads a W3C ``traceparent``'s trace-id; ``current_trace_id`` is the one place
  that prefers the running OpenTelemetry span's trace id (when the package is importable and a span is
  recording) over the one the request brought.

Standard library only: OpenTelemetry is imported lazily, once, by ``current_trace_id``.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Final, Literal, TextIO

LogFormat = Literal["json", "plain"]
LOG_FORMATS: Final = ("json", "plain")
DEFAULT_LOG_FORMAT: Final[LogFormat] = "json"

#: The header a request's id comes in (and is answered) with, between client, gateway and worker.
REQUEST_ID_HEADER: Final = b"x-request-id"
#: The W3C trace context header (https://www.w3.org/TR/trace-context/).
TRACEPARENT_HEADER: Final = b"traceparent"
#: A client's request id longer than this, or with other than printable ASCII, is replaced by one of ours
#: (it goes into every log line of the request and on to the worker).
MAX_REQUEST_ID: Final = 128

_REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("modelpool_request_id", default=None)
_TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("modelpool_trace_id", default=None)
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?", re.DOTALL)
_NO_TRACE, _NO_PARENT = b"0" * 32, b"0" * 16


def new_request_id() -> str:
    """32 random hex digits (a version-4 UUID's randomness, without building one)."""
    return os.urandom(16).hex()


def request_id_of(given: bytes | None) -> str:
    """The request's id: the client's ``x-request-id`` when it is 1..``MAX_REQUEST_ID`` printable ASCII
    characters (no spaces: it is one token in a plain line), else a new one."""
    if given and len(given) <= MAX_REQUEST_ID and all(0x21 <= b <= 0x7E for b in given):
        return given.decode("ascii")
    return new_request_id()


def traceparent_trace_id(given: bytes | None) -> str | None:
    """The trace-id field of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``, lower case; a later
    version may add fields after a dash); None when absent or malformed, or when the trace id or the parent
    id is all zeros or the version is ``ff`` (all invalid by the specification)."""
    if not given:
        return None
    found = _TRACEPARENT.fullmatch(given.strip())
    if found is None:
        return None
    version, trace_id, parent_id, extra = found.groups()
    if version == b"ff" or (version == b"00" and extra) or trace_id == _NO_TRACE or parent_id == _NO_PARENT:
        return None
    return trace_id.decode("ascii")


def bind(request_id: str | None, trace_id: str | None) -> Callable[[], None]:
    """Set the request's ids for the current context; the returned function restores the previous ones."""
    request_token, trace_token = _REQUEST_ID.set(request_id), _TRACE_ID.set(trace_id)

    def reset() -> None:
        _TRACE_ID.reset(trace_token)
        _REQUEST_ID.reset(request_token)

    return reset


def current_request_id() -> str | None:
    return _REQUEST_ID.get()


@functools.cache
def _span_getter() -> Callable[[], Any] | None:
    """OpenTelemetry's ``get_current_span``, imported once; None without the package."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace.get_current_span


def current_trace_id() -> str | None:
    """The trace id of what is being served now: the current OpenTelemetry span's when the package is
    importable and the span is valid (a tracer is set up and started one), else the one the request
    brought in its ``traceparent`` (``bind``), else None.  The one place that knows of OpenTelemetry."""
    get_span = _span_getter()
    if get_span is not None:
        context = get_span().get_span_context()
        if context.is_valid:
            return format(context.trace_id, "032x")
    return _TRACE_ID.get()


# ---- formatting ----

_LEVELS = {
    logging.DEBUG: "debug",
    logging.INFO: "info",
    logging.WARNING: "warning",
    logging.ERROR: "error",
    logging.CRITICAL: "critical",
}


@functools.lru_cache(maxsize=2)
def _second(second: int) -> str:
    # Formatted once a second: a busy process logs many lines in one (the gateway's access lines).
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def _utc(record: logging.LogRecord) -> str:
    return f"{_second(int(record.created))}.{int(record.msecs):03d}Z"


def _level(record: logging.LogRecord) -> str:
    return _LEVELS.get(record.levelno) or record.levelname.lower()


class _Base(logging.Formatter):
    """What both formats take from a record: its fields, and the request's ids from the context."""

    def __init__(self, process: str, renamed: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.process = process
        # Record attributes a library sets (Kopf's ``k8s_ref``) and the field each is written as.
        self.renamed = dict(renamed or {})

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        out: dict[str, Any] = {}
        request_id, trace_id = _REQUEST_ID.get(), current_trace_id()
        if request_id is not None:
            out["request_id"] = request_id
        if trace_id is not None:
            out["trace_id"] = trace_id
        for attribute, name in self.renamed.items():
            value = getattr(record, attribute, None)
            if value is not None:
                out[name] = value
        given = getattr(record, "fields", None)
        if isinstance(given, Mapping):
            out.update(given)
        return out

    def traceback(self, record: logging.LogRecord) -> str | None:
        text = ""
        if record.exc_info:
            # Formatted once per record, as logging.Formatter caches it.
            record.exc_text = record.exc_text or self.formatException(record.exc_info)
        if record.exc_text:
            text = record.exc_text
        if record.stack_info:
            text = (text + "\n" if text else "") + self.formatStack(record.stack_info)
        return text or None


class JsonFormatter(_Base):
    """One JSON object per record, on one line (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _utc(record),
            "level": _level(record),
            "logger": record.name,
            "process": self.process,
            "message": record.getMessage(),
        }
        doc.update(self.fields(record))
        traceback = self.traceback(record)
        if traceback is not None:
            doc["exception"] = traceback
        return _ENCODER.encode(doc)


# One encoder for every line (``json.dumps`` with options builds one per call); default=str: a field's value
# the encoder does not know (a Path, an enum) is written as its text.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), default=str)


class PlainFormatter(_Base):
    """``time LEVEL [process] logger message key=value ...`` (module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_utc(record)} {record.levelname} [{self.process}] {record.name} {record.getMessage()}"
        pairs = " ".join(f"{k}={_plain(v)}" for k, v in self.fields(record).items())
        if pairs:
            line += " " + pairs
        traceback = self.traceback(record)
        return line if traceback is None else line + "\n" + traceback


def _plain(value: Any) -> str:
    if isinstance(value, Mapping):  # Kopf's object reference: namespace/name
        return "/".join(str(value[k]) for k in ("namespace", "name") if value.get(k)) or str(dict(value))
    text = str(value)
    return json.dumps(text) if not text or any(c.isspace() or c == '"' for c in text) else text


def formatter(fmt: LogFormat, process: str, renamed: Mapping[str, str] | None = None) -> logging.Formatter:
    return (JsonFormatter if fmt == "json" else PlainFormatter)(process, renamed)


class _Handler(logging.StreamHandler[TextIO]):
    """Ours, so that ``set_up`` called again (a test in one process) replaces it rather than adding one."""


def set_up(
    fmt: LogFormat,
    level: str | int,
    process: str,
    *,
    renamed: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
) -> logging.Handler:
    """The root logger writing ``fmt`` lines to ``stream`` (stderr) at ``level`` and above; other
    handlers on the root logger are removed (a library's ``basicConfig`` would double every line).
    Warnings and uncaught exceptions (the main thread's and other threads') are logged too, rather than
    printed."""
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt, process, renamed))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # What Python itself would print to stderr goes through the format too, one event per line.
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    return handler


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    logging.getLogger("modelpool").critical("uncaught %s", kind.__name__, exc_info=(kind, exc, tb))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is None or isinstance(args.exc_value, SystemExit):
        return
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger("modelpool").error(
        "uncaught %s in thread %s",
        args.exc_type.__name__,
        thread,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


__all__ = [
    "DEFAULT_LOG_FORMAT",
    "LOG_FORMATS",
    "MAX_REQUEST_ID",
    "REQUEST_ID_HEADER",
    "TRACEPARENT_HEADER",
    "JsonFormatter",
    "LogFormat",
    "PlainFormatter",
    "bind",
    "current_request_id",
    "current_trace_id",
    "formatter",
    "new_request_id",
    "request_id_of",
    "set_up",
    "traceparent_trace_id",
]
