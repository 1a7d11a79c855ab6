"""The gateway's access line (``modelpool_gateway.access_log``, pure): its fields from what the app noted,
the status the app reports over the one sent (499 when nothing was), tokens only where the answer's usage
gave them, no line for the probes; none at all with ``--no-access-log``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any

from modelpool_contract import logs
from modelpool_gateway.access_log import (
    Served,
    access_fields,
    access_middleware,
    flush,
    log,
    logged,
    message,
    served,
)
from modelpool_gateway.config import load_settings
from modelpool_gateway.usage import Usage
from testkit.waiting import wait_for_async


def test_an_answered_request_names_key_pool_model_status_latency_and_tokens() -> None:
    note = Served(model="chat")
    note.answered("team-a/chat", 200)
    note.usage = Usage(prompt_tokens=12, completion_tokens=5)
    fields = access_fields("POST", "/v1/chat/completions", 200, 0.0123456, key="keys/team-a", note=note)
    assert fields == {
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": 200,
        "latency_ms": 12.346,
        "key": "keys/team-a",
        "pool": "team-a/chat",
        "model": "chat",
        "prompt_tokens": 12,
        "completion_tokens": 5,
    }
    assert message(fields) == "POST /v1/chat/completions 200 12.346 ms"


def test_without_a_usage_object_no_tokens_are_claimed() -> None:
    note = Served(model="emb")
    note.answered("ns/emb", 429)
    fields = access_fields("POST", "/v1/embeddings", 429, 0.001, key="keys/k", note=note)
    assert "prompt_tokens" not in fields and "completion_tokens" not in fields


def test_the_apps_status_wins_and_a_client_that_left_is_499() -> None:
    left = Served()
    left.answered("ns/p", 499)  # nothing was sent to the client
    assert access_fields("POST", "/v1/embeddings", 0, 1.0, key="", note=left)["status"] == 499
    # Refused before the app noted anything (401 at the key check): the status sent.
    assert access_fields("POST", "/v1/embeddings", 401, 0.0, key="", note=Served())["status"] == 401
    # Nothing sent and nothing noted (an error out of the app): still a line, 499.
    assert access_fields("GET", "/v1/models", 0, 0.0, key="", note=Served())["status"] == 499


def test_a_pool_noted_once_is_kept_when_a_later_answer_names_none() -> None:
    note = Served()
    note.answered("ns/p", 503)
    note.answered("", 503)
    assert note.pool == "ns/p"


def test_the_probes_get_no_line() -> None:
    assert not logged("/healthz") and not logged("/readyz") and not logged("/v2/health/ready")
    assert logged("/v1/models") and logged("/v2/models/x/infer") and logged("/metrics")


def test_outside_a_request_the_note_is_a_throwaway() -> None:
    served().model = "x"
    assert served().model == ""


def _lines(on: bool) -> list[dict[str, Any]]:
    """The access lines' fields of one request answered 200 through ``access_middleware(lines=on)``."""

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b""}

    async def ignore(message: MutableMapping[str, Any]) -> None:
        pass

    async def request() -> None:
        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "headers": []}
        await access_middleware(app, lines=on)(scope, receive, ignore)
        flush()  # written a moment after the answer (``DEFER_S``): now

    kept: list[dict[str, Any]] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record.__dict__["fields"])

    handler, level = Kept(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        asyncio.run(request())
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return kept


def test_the_line_can_be_turned_off() -> None:
    [line] = _lines(True)
    assert (line["path"], line["status"]) == ("/v1/embeddings", 200)
    assert _lines(False) == []
    assert load_settings([]).access_log is True
    assert load_settings(["--no-access-log"]).access_log is False


def test_a_line_is_written_a_moment_later_with_its_requests_ids() -> None:
    """The line is formatted and written ``DEFER_S`` after the answer, off the next request's path, in
    the request's own context: the request id (and trace id) every formatter reads from it are still its."""
    seen: list[tuple[str | None, str]] = []

    class Kept(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((logs.current_request_id(), record.__dict__["fields"]["path"]))

    async def app(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def request() -> None:
        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings",
                 "headers": [(b"x-request-id", b"req-1")]}  # fmt: skip
        await access_middleware(app)(scope, None, ignore)  # type: ignore[arg-type]
        assert seen == []  # not yet: after the answer, the timer
        await wait_for_async(lambda: seen or None, 5)

    async def ignore(message: MutableMapping[str, Any]) -> None:
        pass

    handler, level = Kept(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        asyncio.run(request())
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert seen == [("req-1", "/v1/embeddings")] and logs.current_request_id() is None
