"""POST /v2/models/{name}/infer: KServe v2 JSON and binary tensor extension (tritonclient's dialect)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from model_server.errors import InvalidInput
from model_server.frontend import kserve_codec
from model_server.frontend.endpoints.common import check_model, disconnect_watch, header_timeout
from model_server.frontend.server import ModelServer

HEADER_LENGTH = "inference-header-content-length"

_TENSOR = {
    "type": "object",
    "required": ["name", "shape", "datatype"],
    "properties": {
        "name": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "datatype": {"type": "string", "enum": sorted(kserve_codec.DTYPES)},
        "parameters": {"type": "object"},
        "data": {"type": "array"},
    },
}
INFER_SCHEMA: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["inputs"],
                    "properties": {
                        "id": {"type": "string"},
                        "parameters": {"type": "object"},
                        "inputs": {"type": "array", "items": _TENSOR},
                        "outputs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
                            },
                        },
                    },
                }
            }
        },
    }
}


InferHandler = Callable[[Request, str], Awaitable[Response]]


def earliest(*timeouts: float | None) -> float | None:
    """The shortest of the deadlines given (None: none given)."""
    given = [t for t in timeouts if t is not None]
    return min(given) if given else None


def infer_handler(server: ModelServer) -> InferHandler:
    """The v2 infer endpoint as a plain coroutine function (FastAPI registers it, and the outermost
    middleware calls it directly on the hot path: see ``endpoints.LimitsMiddleware``)."""

    inference = server.inference

    async def infer(request: Request, name: str) -> Response:
        check_model(server, name)
        inference.check_ready()
        task = inference.loaded_task()
        body = await request.body()
        parsed = kserve_codec.decode_request(body, request.headers.get(HEADER_LENGTH))
        timeout = earliest(header_timeout(request), parsed.timeout_s)
        # Decoding tensors into items is cheap (no tokenisation): it stays on the event loop.  It also
        # checks the request's parameters, so bad ones are refused before the request is queued.
        items = task.decode_v2(parsed.inputs, parsed.parameters)
        async with disconnect_watch(request) as gone:
            results = await inference.infer(items, timeout=timeout, gone=gone)
        outputs = task.encode_v2(results)
        payload, header_len = kserve_codec.encode_response(server.config.served_name, parsed, outputs)
        if header_len is None:
            return Response(payload, media_type="application/json")
        return Response(
            payload,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(header_len)},
        )

    return infer


def register(app: FastAPI, server: ModelServer) -> None:
    infer = infer_handler(server)
    app.add_api_route(
        "/v2/models/{name}/infer", infer, methods=["POST"], tags=["v2"], openapi_extra=INFER_SCHEMA
    )

    async def infer_version(request: Request, name: str, version: str) -> Response:
        if version not in ("", "1"):
            raise InvalidInput(f"model {name!r} has only version 1, not {version!r}")
        return await infer(request, name)

    app.add_api_route(
        "/v2/models/{name}/versions/{version}/infer",
        infer_version,
        methods=["POST"],
        include_in_schema=False,
    )
