"""A gateway told to stop keeps serving a while (``--shutdown-delay-seconds``) before it closes its port.

Behind a Service, a replica that stops listening the moment it gets SIGTERM still receives connections
until the endpoints controller and every node's proxy have dropped it (a second or more), and clients
that keep their connections alive keep sending on them: those requests are refused or reset. Kubernetes'
own advice is to keep serving through that window. So, on the first SIGTERM with a delay: readiness fails
at once (``/readyz`` 503, reason ``shutting down``: the endpoints go), every answer carries ``Connection:
close`` (a kept-alive client reconnects, through the Service, to another replica), and after the delay
uvicorn's own shutdown runs (held requests answered 503, those in flight get ``shutdown_grace_seconds``).
A second signal, or a delay of 0, stops at once.
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send


class Draining:
    """Whether this replica is in its shutdown delay, and since when (``time.monotonic()``)."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.since: float | None = None

    @property
    def active(self) -> bool:
        return self.since is not None

    def over(self, now: float) -> bool:
        """Has the delay passed (``now``: ``time.monotonic()``)?"""
        return self.since is not None and now - self.since >= self.delay_s

    def begin(self) -> bool:
        """Enter the delay; False when there is none, or when it had begun (the caller stops now)."""
        if self.delay_s <= 0 or self.since is not None:
            return False
        self.since = time.monotonic()
        return True


class CloseWhenDraining:
    """ASGI middleware: while draining, every answer closes its connection (``Connection: close``)."""

    def __init__(self, app: ASGIApp, draining: Draining) -> None:
        self.app = app
        self.draining = draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and self.draining.active:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


__all__ = ["CloseWhenDraining", "Draining"]
