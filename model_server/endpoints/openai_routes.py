"""OpenAI-compatible routes.  Each builds the task's items (``tasks/base.py``) from its JSON body and
dispatches on the model's task; a route the model's task cannot serve is a 400 with the reason."""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import orjson
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from model_server.endpoints.common import (
    ORJSONResponse,
    check_model,
    disconnect_watch,
    header_timeout,
    require_task,
)
from model_server.errors import InvalidInput, ServerError
from model_server.server import ModelServer
from model_server.tasks.base import (
    Embedding,
    GenerationItem,
    GenerationParams,
    GenerationResult,
    ImageGenerationItem,
    ImageItem,
    ImageResult,
    TextItem,
    VisionItem,
)

MAX_TEXT = 1 << 20  # characters in one input; longer is refused before tokenising


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=512)


class EmbeddingsBody(_Body):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


class _SamplingBody(_Body):
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)

    def params(self) -> GenerationParams:
        stop: tuple[str, ...] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return GenerationParams(
            max_tokens=self.max_tokens or 16,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=stop,
            seed=self.seed,
        )


class CompletionsBody(_SamplingBody):
    prompt: str | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768)


class ImagesBody(_Body):
    prompt: str = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=4)
    size: str = Field(default="512x512", pattern=r"^\d{2,4}x\d{2,4}$")
    response_format: Literal["b64_json", "url"] = "b64_json"
    negative_prompt: str | None = None
    steps: int = Field(default=25, ge=1, le=200)
    guidance_scale: float = Field(default=7.5, ge=0.0, le=50.0)
    seed: int | None = None


def _text(value: str, what: str) -> str:
    if len(value) > MAX_TEXT:
        raise InvalidInput(f"{what} is {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def decode_image(value: str, what: str) -> bytes:
    """A data: URL or bare base64 -> bytes (remote URLs are refused: the worker has no network)."""
    if value.startswith(("http://", "https://")):
        raise InvalidInput(f"{what}: remote image URLs are not fetched; send a data: URL (base64)")
    if value.startswith("data:"):
        header, sep, value = value.partition(",")
        if not sep or ";base64" not in header:
            raise InvalidInput(f"{what}: data URL must be base64-encoded")
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{what}: not valid base64") from None
    if not raw:
        raise InvalidInput(f"{what}: empty image")
    return raw


def render_chat(messages: Sequence[Mapping[str, str]]) -> str:
    """Plain rendering for models without a chat template ('role: content' lines + 'assistant:')."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def _usage(results: Sequence[GenerationResult]) -> dict[str, int]:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _sse(doc: Mapping[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def register(app: FastAPI, server: ModelServer) -> None:
    name = server.config.served_name

    async def run(request: Request, items: Sequence[Any]) -> list[Any]:
        timeout = header_timeout(request)
        async with disconnect_watch(request) as gone:
            return await server.dataplane.infer(items, timeout=timeout, gone=gone)

    @app.get("/v1/models", tags=["openai"])
    async def models() -> Response:
        return ORJSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "modelpool",
                        "task": server.config.task,
                    }
                ],
            }
        )

    @app.post("/v1/embeddings", tags=["openai"])
    async def embeddings(body: EmbeddingsBody, request: Request) -> Response:
        check_model(server, body.model)
        task = require_task(server, "text-embedding", "image-embedding")
        raw = [body.input] if isinstance(body.input, str) else body.input
        if not raw:
            raise InvalidInput("'input' is empty")
        if not all(isinstance(x, str) for x in raw):
            raise InvalidInput("'input' as token ids is not supported; send text")
        texts: list[str] = raw  # type: ignore[assignment]
        items: list[Any]
        if task == "text-embedding":
            items = [TextItem(_text(t, f"input[{i}]")) for i, t in enumerate(texts)]
        else:
            items = [ImageItem(decode_image(t, f"input[{i}]")) for i, t in enumerate(texts)]
        results: list[Embedding] = await run(request, items)
        data = []
        for i, emb in enumerate(results):
            vector = emb.vector if body.dimensions is None else emb.vector[: body.dimensions]
            value: Any = (
                base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
                if body.encoding_format == "base64"
                else np.ascontiguousarray(vector, dtype=np.float32)
            )
            entry: dict[str, Any] = {"object": "embedding", "index": i, "embedding": value}
            if emb.truncated:
                entry["truncated"] = True
            data.append(entry)
        tokens = sum(e.tokens for e in results)
        return ORJSONResponse(
            {
                "object": "list",
                "data": data,
                "model": name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "truncated": sum(1 for e in results if e.truncated),
            }
        )

    async def generate(
        request: Request, items: list[Any], stream: bool, kind: Literal["text_completion", "chat"]
    ) -> Response:
        rid = ("cmpl-" if kind == "text_completion" else "chatcmpl-") + uuid.uuid4().hex
        created = int(time.time())
        if not stream:
            results: list[GenerationResult] = await run(request, items)
            choices: list[dict[str, Any]]
            if kind == "text_completion":
                choices = [
                    {"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None}
                    for i, r in enumerate(results)
                ]
                obj = "text_completion"
            else:
                choices = [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": r.text},
                        "finish_reason": r.finish_reason,
                    }
                    for i, r in enumerate(results)
                ]
                obj = "chat.completion"
            return ORJSONResponse(
                {
                    "id": rid,
                    "object": obj,
                    "created": created,
                    "model": name,
                    "choices": choices,
                    "usage": _usage(results),
                }
            )
        if len(items) != 1:
            raise InvalidInput("stream=true takes exactly one prompt")
        assert server.worker.task_cls is not None
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str] = asyncio.Queue()

        def emit(text: str) -> None:  # called on the inference thread
            loop.call_soon_threadsafe(pieces.put_nowait, text)

        timeout = header_timeout(request)
        unit = server.dataplane.admit(items, timeout, emit)  # 429/503 before the stream starts
        obj = "text_completion" if kind == "text_completion" else "chat.completion.chunk"

        def chunk(text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
            if kind == "text_completion":
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": text or "",
                    "finish_reason": finish,
                    "logprobs": None,
                }
            else:
                delta: dict[str, Any] = {}
                if first:
                    delta["role"] = "assistant"
                if text:
                    delta["content"] = text
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            doc: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": name}
            doc["choices"] = [choice]
            return doc

        async def events() -> AsyncIterator[bytes]:
            waiter = asyncio.ensure_future(server.dataplane.wait(unit))
            try:
                if kind == "chat":
                    yield _sse(chunk(None, None, first=True))
                emitted = False
                while True:
                    getter = asyncio.ensure_future(pieces.get())
                    done, _ = await asyncio.wait({getter, waiter}, return_when=asyncio.FIRST_COMPLETED)
                    if getter in done:
                        emitted = True
                        yield _sse(chunk(getter.result(), None))
                        continue
                    getter.cancel()
                    break
                while not pieces.empty():
                    emitted = True
                    yield _sse(chunk(pieces.get_nowait(), None))
                try:
                    results: list[GenerationResult] = waiter.result()
                except ServerError as exc:
                    yield _sse({"error": {"message": str(exc), "type": exc.reason, "code": exc.status}})
                    return
                result = results[0]
                if not emitted and result.text:  # a task that does not stream: one chunk with everything
                    yield _sse(chunk(result.text, None))
                final = chunk(None, result.finish_reason)
                final["usage"] = _usage(results)
                yield _sse(final)
                yield b"data: [DONE]\n\n"
            finally:
                if not waiter.done():
                    unit.abandoned = "disconnected"
                    waiter.cancel()

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.post("/v1/completions", tags=["openai"])
    async def completions(body: CompletionsBody, request: Request) -> Response:
        check_model(server, body.model)
        require_task(server, "text-generation")
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if not prompts:
            raise InvalidInput("'prompt' is empty")
        params = body.params()
        items = [GenerationItem(_text(p, f"prompt[{i}]"), params) for i, p in enumerate(prompts)]
        return await generate(request, items, body.stream, "text_completion")

    @app.post("/v1/chat/completions", tags=["openai"])
    async def chat(body: ChatBody, request: Request) -> Response:
        check_model(server, body.model)
        task = require_task(server, "text-generation", "vision")
        if body.max_completion_tokens is not None and body.max_tokens is None:
            body.max_tokens = body.max_completion_tokens
        params = body.params()
        item: Any
        if task == "text-generation":
            messages: list[dict[str, str]] = []
            for i, m in enumerate(body.messages):
                if m.content is None:
                    content = ""
                elif isinstance(m.content, str):
                    content = m.content
                else:
                    parts = [p.get("text") for p in m.content if p.get("type") == "text"]
                    if len(parts) != len(m.content) or not all(isinstance(p, str) for p in parts):
                        raise InvalidInput(f"messages[{i}]: this model takes text parts only")
                    content = "\n".join(str(p) for p in parts)
                messages.append({"role": m.role, "content": _text(content, f"messages[{i}].content")})
            item = GenerationItem(render_chat(messages), params, messages=tuple(messages))
        else:
            image: bytes | None = None
            texts: list[str] = []
            for i, m in enumerate(body.messages):
                if m.role != "user" or m.content is None:
                    continue
                if isinstance(m.content, str):
                    texts.append(m.content)
                    continue
                for j, part in enumerate(m.content):
                    kind = part.get("type")
                    if kind == "text" and isinstance(part.get("text"), str):
                        texts.append(part["text"])
                    elif kind == "image_url":
                        url = part.get("image_url")
                        url = url.get("url") if isinstance(url, dict) else url
                        if not isinstance(url, str):
                            raise InvalidInput(f"messages[{i}].content[{j}]: image_url.url must be a string")
                        image = decode_image(url, f"messages[{i}].content[{j}]")
                    else:
                        raise InvalidInput(f"messages[{i}].content[{j}]: unsupported part type {kind!r}")
            if image is None:
                raise InvalidInput("a vision model needs an image_url part (data: URL) in a user message")
            prompt = "\n".join(texts).strip() or None
            item = VisionItem(image, _text(prompt, "prompt") if prompt else None, params)
        return await generate(request, [item], body.stream, "chat")

    @app.post("/v1/images/generations", tags=["openai"])
    async def images(body: ImagesBody, request: Request) -> Response:
        check_model(server, body.model)
        require_task(server, "text-to-image")
        if body.response_format != "b64_json":
            raise InvalidInput("response_format 'url' is not supported (no image store); use 'b64_json'")
        width, height = (int(x) for x in body.size.split("x"))
        if not (64 <= width <= 2048 and 64 <= height <= 2048) or width % 8 or height % 8:
            raise InvalidInput(f"size {body.size}: width and height must be multiples of 8 in 64..2048")
        items = [
            ImageGenerationItem(
                prompt=_text(body.prompt, "prompt"),
                negative_prompt=body.negative_prompt,
                steps=body.steps,
                guidance_scale=body.guidance_scale,
                width=width,
                height=height,
                seed=None if body.seed is None else body.seed + i,
            )
            for i in range(body.n)
        ]
        results: list[ImageResult] = await run(request, items)
        return ORJSONResponse(
            {
                "created": int(time.time()),
                "data": [{"b64_json": base64.b64encode(r.png).decode()} for r in results],
            }
        )
