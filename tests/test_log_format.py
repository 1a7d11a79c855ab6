"""The one log format of the operator, the gateway and the server (``modelpool_contract.logs``) and the
request ids' middleware (``modelpool_contract.request_ids``): one JSON object per line whatever the
message holds, an exception as a field, the request's ids in every line logged while it is served, plain
lines with the plain setting; a client's ``x-request-id`` honoured (a bad one replaced), a
``traceparent``'s trace id."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from modelpool_contract import logs
from modelpool_contract.request_ids import RequestIds

TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """The root logger writing JSON into a buffer; the previous handlers, level and hooks restored after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hooks = sys.excepthook, threading.excepthook
    out = io.StringIO()
    logs.set_up("json", "debug", "test", stream=out)
    yield out
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)
    sys.excepthook, threading.excepthook = hooks


def lines(out: io.StringIO) -> list[dict[str, Any]]:
    text = out.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def test_a_record_is_one_json_object_on_one_line(stream: io.StringIO) -> None:
    logging.getLogger("modelpool.test").warning("two\nlines and a %s", "quote\"'")
    [line] = lines(stream)
    assert line["message"] == "two\nlines and a quote\"'"
    assert line["level"] == "warning"
    assert line["logger"] == "modelpool.test"
    assert line["process"] == "test"
    assert line["time"].endswith("Z") and len(line["time"]) == len("2026-12-07T00:20:32.544Z")
    assert "request_id" not in line and "trace_id" not in line


def test_non_ascii_text_is_escaped_and_reads_back(stream: io.StringIO) -> None:
    text = "héllo ✓ 日本 \u2028 \udcff"  # a line separator and a lone surrogate (undecodable bytes)
    # Only to our handler: pytest's capture on the root would keep the lone surrogate in the test's report,
    # which pytest-xdist cannot send between processes (make test runs two).
    log = logging.getLogger("modelpool.test.surrogate")
    log.handlers = [h for h in logging.getLogger().handlers if getattr(h, "stream", None) is stream]
    log.propagate = False
    try:
        log.info("%s", text)
    finally:
        log.handlers, log.propagate = [], True
    assert stream.getvalue().isascii()
    [line] = lines(stream)
    assert line["message"] == text


def test_an_exception_is_a_field_of_its_line(stream: io.StringIO) -> None:
    try:
        raise ValueError("bad ünicode")
    except ValueError:
        logging.getLogger("modelpool.test").exception("failed")
    [line] = lines(stream)
    assert line["message"] == "failed"
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert line["exception"].endswith("ValueError: bad ünicode")


def test_warnings_and_a_threads_uncaught_exception_are_lines_too(stream: io.StringIO) -> None:
    warnings.warn("deprecated thing", DeprecationWarning, stacklevel=1)

    def fail() -> None:
        raise RuntimeError("in a thread")

    thread = threading.Thread(target=fail, name="failing")
    thread.start()
    thread.join()
    warned, failed = lines(stream)
    assert warned["logger"] == "py.warnings" and "deprecated thing" in warned["message"]
    assert failed["message"] == "uncaught RuntimeError in thread failing"
    assert failed["exception"].endswith("RuntimeError: in a thread")


def test_fields_and_renamed_attributes_are_top_level(stream: io.StringIO) -> None:
    logging.getLogger().handlers[0].setFormatter(logs.formatter("json", "operator", {"k8s_ref": "object"}))
    ref = {"kind": "ModelPool", "namespace": "ns", "name": "p"}
    logging.getLogger("kopf.objects").info("x", extra={"k8s_ref": ref, "fields": {"status": 200}})
    [line] = lines(stream)
    assert line["object"] == ref
    assert line["status"] == 200


def test_the_request_ids_are_in_every_line_while_bound(stream: io.StringIO) -> None:
    reset = logs.bind("req-1", TRACE_ID)
    logging.getLogger("a").info("one")
    logging.getLogger("b").error("two")
    reset()
    logging.getLogger("c").info("after")
    first, second, after = lines(stream)
    assert (first["request_id"], first["trace_id"]) == ("req-1", TRACE_ID)
    assert (second["request_id"], second["trace_id"]) == ("req-1", TRACE_ID)
    assert "request_id" not in after and "trace_id" not in after


def test_plain_lines_carry_the_same_fields_as_text() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.formatter("plain", "gateway"))
    logger = logging.getLogger("modelpool.plain")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    reset = logs.bind("req-2", None)
    try:
        logger.info("GET /x 200", extra={"fields": {"key": "keys/team-a", "model": "a b"}})
    finally:
        reset()
        logger.removeHandler(handler)
        logger.propagate = True
    line = out.getvalue().rstrip("\n")
    assert not line.startswith("{")
    assert "\n" not in line
    assert " INFO [gateway] modelpool.plain GET /x 200 " in line
    assert line.endswith('request_id=req-2 key=keys/team-a model="a b"')


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        (b"abc-123", True),
        (b"x" * logs.MAX_REQUEST_ID, True),
        (b"x" * (logs.MAX_REQUEST_ID + 1), False),
        (b"has space", False),
        (b"new\nline", False),
        ("ünï".encode(), False),
        (b"", False),
        (None, False),
    ],
)
def test_a_clients_request_id_is_kept_only_when_sane(given: bytes | None, kept: bool) -> None:
    request_id = logs.request_id_of(given)
    assert (request_id == (given or b"").decode("utf-8")) is kept
    assert request_id.isascii() and 0 < len(request_id) <= logs.MAX_REQUEST_ID


@pytest.mark.parametrize(
    ("given", "trace_id"),
    [
        (TRACEPARENT, TRACE_ID),
        (b"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future", TRACE_ID),  # a later version
        (b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", None),
        (b"00-00000000000000000000000000000000-b7ad6b7169203331-01", None),
        (b"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", None),
        (b"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", None),
        (b"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", None),
        (b"00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01", None),
        (b"garbage", None),
        (None, None),
    ],
)
def test_the_trace_id_of_a_traceparent(given: bytes | None, trace_id: str | None) -> None:
    assert logs.traceparent_trace_id(given) == trace_id


def test_without_a_recording_span_the_trace_id_is_the_requests() -> None:
    # No tracer is set up here: OpenTelemetry's current span is invalid, so the bound id is the one.
    reset = logs.bind("r", TRACE_ID)
    try:
        assert logs.current_trace_id() == TRACE_ID
    finally:
        reset()
    assert logs.current_trace_id() is None


# ---- the middleware, around a small ASGI app ----


def call(headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, Any], list[dict[str, Any]], list[Any]]:
    """One request through ``RequestIds``: what the app saw (scope, ids), what was sent, what ``done`` got."""
    seen: dict[str, Any] = {}
    sent: list[dict[str, Any]] = []
    done: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen["headers"] = list(scope["headers"])
        seen["ids"] = (logs.current_request_id(), logs.current_trace_id())
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-request-id", b"up")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(message)

    def finished(scope: Any, status: int, seconds: float) -> None:
        done.append((status, seconds >= 0, logs.current_request_id()))

    scope = {"type": "http", "method": "GET", "path": "/", "headers": headers}
    asyncio.run(RequestIds(app, finished)(scope, receive, send))
    return seen, sent, done


def test_the_clients_request_id_is_bound_and_answered() -> None:
    seen, sent, done = call([(b"x-request-id", b"abc"), (b"traceparent", TRACEPARENT)])
    assert seen["ids"] == ("abc", TRACE_ID)
    assert seen["headers"].count((b"x-request-id", b"abc")) == 1
    # The answer carries the request's id, not the one the app's upstream answered with.
    assert sent[0]["headers"] == [(b"x-request-id", b"abc")]
    assert done == [(201, True, "abc")]


def test_a_request_without_an_id_gets_one_forwarded_and_answered() -> None:
    seen, sent, _ = call([(b"x-request-id", b"bad id")])
    request_id, trace_id = seen["ids"]
    assert request_id != "bad id" and trace_id is None
    assert [v for k, v in seen["headers"] if k == b"x-request-id"] == [request_id.encode()]
    assert sent[0]["headers"] == [(b"x-request-id", request_id.encode())]
