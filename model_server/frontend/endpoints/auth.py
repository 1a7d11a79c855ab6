"""Optional API-key auth (``--api-key-file``): one pure ASGI layer, outermost.

With a key configured, every request must carry ``Authorization: Bearer <key>`` (what the openai client
sends for ``api_key=...``; tritonclient sends it with ``headers=...``), or it is answered 401 in the
route's error shape (``{"error": {...}}`` on ``/v1``, ``{"error": "..."}`` elsewhere) before anything
else runs, so an unauthenticated client never takes a place in the queue.  The key is compared in
constant time.

Open without a key: only the probes, ``/v2/health/live`` and ``/v2/health/ready``, which carry nothing
but the state.  ``/stats`` (the model's source, a load error) and ``/metrics`` need the key here like any
other route: the operator and Prometheus read them on the probe port (``probe_server``), which a client
of the serving port has no reason to reach.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from model_server.frontend.endpoints.common import error_response
from modelpool_contract.stats import LIVE_PATH, READY_PATH

OPEN_PATHS = frozenset({LIVE_PATH, READY_PATH})
REASON = "unauthorized"


def authorized(header: bytes | None, key: bytes) -> bool:
    """Pure: does the ``Authorization`` header carry ``Bearer <key>``?  (Constant time in the key.)"""
    scheme, _, token = (header or b"").partition(b" ")
    # compare_digest on both checks alike, so a wrong scheme is not told apart by its timing either.
    return hmac.compare_digest(token.strip(), key) & (scheme.lower() == b"bearer")


class ApiKeyMiddleware:
    """401 for any HTTP request outside ``OPEN_PATHS`` without the key; ``on_reject(reason)`` counts it."""

    def __init__(self, app: ASGIApp, key: str, on_reject: Callable[[str], None]) -> None:
        self.app = app
        self.key = key.encode()
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if authorized(header, self.key):
            await self.app(scope, receive, send)
            return
        self.on_reject(REASON)
        message = "missing API key" if header is None else "invalid API key"
        response = error_response(
            scope["path"],
            401,
            REASON,
            f"{message}: send the header 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)
