"""An HTTP process's access line (``model_server.frontend.access_log``): method, path, status, latency and
the model the request was served as (the served name, or the LoRA adapter an OpenAI body selected, as the
route resolved it in ``check_model``); none for the ops routes that pollers call all the time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any

import pytest

from model_server.config import ServerConfig
from model_server.errors import ModelNotFound
from model_server.frontend.access_log import access_fields, with_access_log
from model_server.frontend.endpoints.common import check_model
from model_server.frontend.server import ModelServer


def test_a_request_line() -> None:
    assert access_fields("POST", "/v1/embeddings", 200, 0.002, "emb") == {
        "method": "POST",
        "path": "/v1/embeddings",
        "status": 200,
        "latency_ms": 2.0,
        "model": "emb",
    }


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/metrics", "/stats"])
def test_the_ops_routes_get_no_line(path: str) -> None:
    assert access_fields("GET", path, 503, 0.0) is None


def _served(server: ModelServer, path: str, asked: str | None) -> tuple[list[dict[str, Any]], list[str]]:
    """One request through ``with_access_log`` to an app that resolves ``asked`` as a route does (in a task
    of its own, as the framework may run it); the access lines' fields and the route's outcome."""
    outcome: list[str] = []

    async def route(scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        async def resolve() -> None:
            try:
                outcome.append(repr(check_model(server, asked, adapters=True)))
            except ModelNotFound:
                outcome.append("404")

        await asyncio.create_task(resolve())
        status = 404 if outcome == ["404"] else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def ignore(message: Any) -> None:
        pass

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b""}

    async def request(scope: MutableMapping[str, Any]) -> None:
        await with_access_log(route)(scope, receive, ignore)

    kept = _Kept()
    access = logging.getLogger("modelpool.access")
    access.addHandler(kept)
    level = access.level
    access.setLevel(logging.INFO)
    try:
        scope = {"type": "http", "method": "POST", "path": path, "headers": []}
        asyncio.run(request(scope))
    finally:
        access.removeHandler(kept)
        access.setLevel(level)
    return kept.fields, outcome


class _Kept(logging.Handler):
    """The access lines' fields, as logged."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.fields.append(record.__dict__["fields"])


@pytest.fixture(scope="module")
def tiny() -> ModelServer:
    adapters = ["sql=hf://loras/sql"]
    return ModelServer(ServerConfig(model="/", task="text-generation", name="tiny", adapter=adapters))


@pytest.mark.parametrize(
    ("asked", "model", "status"),
    [("tiny", "tiny", 200), (None, "tiny", 200), ("sql", "sql", 200), ("other", "", 404)],
)
def test_the_line_names_the_model_or_adapter_the_route_served(
    tiny: ModelServer, asked: str | None, model: str, status: int
) -> None:
    [fields], _ = _served(tiny, "/v1/completions", asked)
    assert (fields["model"], fields["status"]) == (model, status)
