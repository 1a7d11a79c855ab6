"""OpenAI-compatible routes: thin wiring of ``openai_codec`` (bodies -> items, results -> responses) to
HTTP and the data plane.  A route the model's task cannot serve is a 400 with the reason."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from model_server.errors import InvalidInput, ServerError
from model_server.frontend.endpoints.common import (
    ORJSONResponse,
    check_model,
    disconnect_watch,
    header_timeout,
    require_task,
)
from model_server.frontend.inference_client import ClientGone, InferenceClient
from model_server.frontend.openai_codec import (
    SSE_DONE,
    ChatBody,
    Completion,
    CompletionKind,
    CompletionsBody,
    EmbeddingsBody,
    ImagesBody,
    chat_item,
    completion_items,
    embedding_items,
    embeddings_response,
    image_items,
    images_response,
    models_response,
    sse,
    stream_error,
    with_adapter,
)
from model_server.frontend.server import ModelServer
from model_server.frontend.token_stream import TokenStream

_ID_PREFIX = {"text_completion": "cmpl-", "chat": "chatcmpl-"}


def register(app: FastAPI, server: ModelServer) -> None:
    name = server.config.served_name
    inference = server.inference

    @app.get("/v1/models", tags=["openai"])
    async def models() -> Response:
        return ORJSONResponse(models_response(name, server.config.task, list(server.config.adapters)))

    @app.post("/v1/embeddings", tags=["openai"])
    async def embeddings(body: EmbeddingsBody, request: Request) -> Response:
        check_model(server, body.model)
        task = require_task(server, "text-embedding", "image-embedding")
        results = await _infer(inference, request, embedding_items(body, task))
        return ORJSONResponse(embeddings_response(body, results, name))

    @app.post("/v1/completions", tags=["openai"])
    async def completions(body: CompletionsBody, request: Request) -> Response:
        adapter = check_model(server, body.model, adapters=True)
        require_task(server, "text-generation")
        completion = _new_completion("text_completion", adapter or name)
        items = with_adapter(completion_items(body), adapter)
        return await _complete(inference, request, items, body.stream, completion)

    @app.post("/v1/chat/completions", tags=["openai"])
    async def chat(body: ChatBody, request: Request) -> Response:
        adapter = check_model(server, body.model, adapters=True)
        task = require_task(server, "text-generation", "vision")
        completion = _new_completion("chat", adapter or name)
        items = with_adapter([chat_item(body, task)], adapter)
        return await _complete(inference, request, items, body.stream, completion)

    @app.post("/v1/images/generations", tags=["openai"])
    async def images(body: ImagesBody, request: Request) -> Response:
        check_model(server, body.model)
        require_task(server, "text-to-image")
        results = await _infer(inference, request, image_items(body))
        return ORJSONResponse(images_response(results, int(time.time())))


async def _infer(inference: InferenceClient, request: Request, items: Sequence[Any]) -> list[Any]:
    """Run the items through the queue; the request is dropped if its client goes away first."""
    async with disconnect_watch(request) as gone:
        return await inference.infer(items, timeout=header_timeout(request), gone=gone)


def _new_completion(kind: CompletionKind, model: str) -> Completion:
    return Completion(kind, _ID_PREFIX[kind] + uuid.uuid4().hex, int(time.time()), model)


async def _complete(
    inference: InferenceClient, request: Request, items: Sequence[Any], stream: bool, completion: Completion
) -> Response:
    """A whole completion response, or (``stream``) the server-sent events of one."""
    if not stream:
        return ORJSONResponse(completion.response(await _infer(inference, request, items)))
    if len(items) != 1:
        raise InvalidInput("stream=true takes exactly one prompt")
    tokens = inference.stream(items, header_timeout(request))  # 429/503 before the stream starts
    try:  # the model's own refusal (400, 429 of a generation engine) before the headers, too
        async with disconnect_watch(request) as gone:
            await tokens.accepted(gone)
        if gone.is_set():
            raise ClientGone("client disconnected before the model took the request")
        refused = tokens.refusal()
        if refused is not None:
            raise refused
    except BaseException:
        tokens.close()
        raise
    return StreamingResponse(
        _events(completion, tokens), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )


async def _events(completion: Completion, tokens: TokenStream) -> AsyncIterator[bytes]:
    """The server-sent events of one streamed completion; the request is dropped if the client leaves."""
    try:
        for chunk in completion.opening():
            yield sse(chunk)
        streamed = False
        async for piece in tokens:
            streamed = True
            yield sse(completion.chunk(piece, None))
        try:
            results = tokens.results()
        except ServerError as exc:
            yield sse(stream_error(exc))
            return
        for chunk in completion.closing(results, streamed):
            yield sse(chunk)
        yield SSE_DONE
    finally:
        tokens.close()
