"""The gateway's shutdown delay (``modelpool_gateway.draining``): entered once, over after its delay; no
delay means stop at once; while draining every answer closes its connection, other headers kept."""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

from modelpool_gateway.draining import CloseWhenDraining, Draining


def test_the_delay_is_entered_once_and_is_over_after_its_length() -> None:
    assert not Draining(0).begin()  # no delay: the caller stops now
    draining = Draining(2)
    assert not draining.active and not draining.over(time.monotonic())
    assert draining.begin() and draining.active
    assert not draining.begin()  # a second signal: stop now
    assert draining.since is not None
    assert not draining.over(draining.since + 1.9) and draining.over(draining.since + 2)


async def test_answers_close_their_connection_only_while_draining() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"x", b"1"), (b"Connection", b"keep-alive")],
            }
        )
        await send({"type": "http.response.body", "body": b"ok"})

    draining = Draining(5)
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b""}

    wrapped = CloseWhenDraining(app, draining)
    await wrapped({"type": "http"}, receive, send)
    assert sent[0]["headers"] == [(b"x", b"1"), (b"Connection", b"keep-alive")]
    draining.begin()
    sent.clear()
    await wrapped({"type": "http"}, receive, send)
    assert sent[0]["headers"] == [(b"x", b"1"), (b"connection", b"close")] and sent[1]["body"] == b"ok"
