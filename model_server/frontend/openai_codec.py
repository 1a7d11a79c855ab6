"""OpenAI-compatible API translation, pure: request bodies -> the task's items, the task's results ->
response documents and stream chunks.

The bodies are pydantic models that FastAPI validates before a route runs, so a request with a bad
field (a ``max_tokens`` over ``MAX_NEW_TOKENS``, a negative ``seed``) is refused with 400 before it is
queued; the sampling fields are ``tasks.params.SamplingParameters``', the same model a KServe v2 request's
parameters go through.  No I/O and no server state here: ``endpoints/openai_routes.py`` wires these
functions to HTTP and the data plane (as ``endpoints/kserve_routes.py`` does for ``kserve_codec``).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from model_server.errors import InvalidInput, ServerError
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
from model_server.tasks.params import GuidanceScale, MaxNewTokens, SamplingParameters, Seed, Steps
from model_server.tasks.text_to_image import parse_size

MAX_TEXT = 1 << 20  # characters in one input; longer is refused before tokenising
# Image sizes the images route accepts (a narrower range than the task's own limits).
MIN_IMAGE_SIDE, MAX_IMAGE_SIDE, IMAGE_SIDE_MULTIPLE = 64, 2048, 8
SSE_DONE = b"data: [DONE]\n\n"

CompletionKind = Literal["text_completion", "chat"]


# ---- request bodies ---------------------------------------------------------------------------------


class OpenAIBody(BaseModel):
    """Fields every OpenAI request has; unknown fields are accepted and ignored, as OpenAI's clients
    send fields this server has no use for."""

    model_config = ConfigDict(extra="allow")
    model: str | None = Field(default=None, max_length=512)


class EmbeddingsBody(OpenAIBody):
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


class SamplingBody(OpenAIBody, SamplingParameters):
    """A generation request: the sampling fields (and their ranges) are ``SamplingParameters``'."""

    model_config = ConfigDict(extra="allow", frozen=True)
    stream: bool = False
    n: int = Field(default=1, ge=1, le=1)


class CompletionsBody(SamplingBody):
    prompt: str | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None


class ChatBody(SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: MaxNewTokens | None = None

    @model_validator(mode="before")
    @classmethod
    def _max_completion_tokens(cls, data: Any) -> Any:
        """``max_completion_tokens`` (the newer name) stands for ``max_tokens`` when that is not given."""
        if not isinstance(data, Mapping) or data.get("max_tokens") is not None:
            return data
        if data.get("max_completion_tokens") is None:
            return data
        return {**data, "max_tokens": data["max_completion_tokens"]}


class ImagesBody(OpenAIBody):
    prompt: str = Field(min_length=1)
    n: int = Field(default=1, ge=1, le=4)
    size: str = Field(default="512x512", pattern=r"^\d{2,4}x\d{2,4}$")
    response_format: Literal["b64_json", "url"] = "b64_json"
    negative_prompt: str | None = None
    steps: Steps = 25
    guidance_scale: GuidanceScale = 7.5
    seed: Seed | None = None


# ---- bodies -> items --------------------------------------------------------------------------------


def checked_text(value: str, what: str) -> str:
    """``value``, or 400 when it is longer than ``MAX_TEXT`` characters."""
    if len(value) > MAX_TEXT:
        raise InvalidInput(f"{what} is {len(value)} characters; the limit is {MAX_TEXT}")
    return value


def decode_data_url(value: str, what: str) -> bytes:
    """A data: URL or bare base64 -> the bytes it holds (remote URLs are refused: the worker has no
    network)."""
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


def embedding_items(body: EmbeddingsBody, task: str) -> list[TextItem] | list[ImageItem]:
    """Texts (text-embedding) or base64 images (image-embedding) -> items."""
    raw = [body.input] if isinstance(body.input, str) else body.input
    if not raw:
        raise InvalidInput("'input' is empty")
    if not all(isinstance(x, str) for x in raw):
        raise InvalidInput("'input' as token ids is not supported; send text")
    texts: list[str] = raw  # type: ignore[assignment]
    if task == "text-embedding":
        return [TextItem(checked_text(t, f"input[{i}]")) for i, t in enumerate(texts)]
    return [ImageItem(decode_data_url(t, f"input[{i}]")) for i, t in enumerate(texts)]


def completion_items(body: CompletionsBody) -> list[GenerationItem]:
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if not prompts:
        raise InvalidInput("'prompt' is empty")
    params = body.generation_params()
    return [GenerationItem(checked_text(p, f"prompt[{i}]"), params) for i, p in enumerate(prompts)]


def render_chat(messages: Sequence[Mapping[str, str]]) -> str:
    """Plain rendering for models without a chat template ('role: content' lines + 'assistant:')."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def chat_item(body: ChatBody, task: str) -> GenerationItem | VisionItem:
    """The chat's one item: the messages (text-generation), or the image and the user's text (vision)."""
    params = body.generation_params()
    if task == "text-generation":
        return _text_chat_item(body.messages, params)
    return _vision_chat_item(body.messages, params)


def _text_chat_item(messages: Sequence[ChatMessage], params: GenerationParams) -> GenerationItem:
    rendered: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if m.content is None:
            content = ""
        elif isinstance(m.content, str):
            content = m.content
        else:
            parts = [p.get("text") for p in m.content if p.get("type") == "text"]
            if len(parts) != len(m.content) or not all(isinstance(p, str) for p in parts):
                raise InvalidInput(f"messages[{i}]: this model takes text parts only")
            content = "\n".join(str(p) for p in parts)
        rendered.append({"role": m.role, "content": checked_text(content, f"messages[{i}].content")})
    return GenerationItem(render_chat(rendered), params, messages=tuple(rendered))


def _vision_chat_item(messages: Sequence[ChatMessage], params: GenerationParams) -> VisionItem:
    image: bytes | None = None
    texts: list[str] = []
    for i, m in enumerate(messages):
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
                image = decode_data_url(url, f"messages[{i}].content[{j}]")
            else:
                raise InvalidInput(f"messages[{i}].content[{j}]: unsupported part type {kind!r}")
    if image is None:
        raise InvalidInput("a vision model needs an image_url part (data: URL) in a user message")
    prompt = "\n".join(texts).strip() or None
    return VisionItem(image, checked_text(prompt, "prompt") if prompt else None, params)


def image_items(body: ImagesBody) -> list[ImageGenerationItem]:
    """One item per image asked for (``n``); image ``i`` gets ``seed + i`` so the images differ."""
    if body.response_format != "b64_json":
        raise InvalidInput("response_format 'url' is not supported (no image store); use 'b64_json'")
    width, height = parse_size(body.size)
    sides_ok = all(MIN_IMAGE_SIDE <= side <= MAX_IMAGE_SIDE for side in (width, height))
    if not sides_ok or width % IMAGE_SIDE_MULTIPLE or height % IMAGE_SIDE_MULTIPLE:
        raise InvalidInput(
            f"size {body.size}: width and height must be multiples of {IMAGE_SIDE_MULTIPLE} in "
            f"{MIN_IMAGE_SIDE}..{MAX_IMAGE_SIDE}"
        )
    return [
        ImageGenerationItem(
            prompt=checked_text(body.prompt, "prompt"),
            negative_prompt=body.negative_prompt,
            steps=body.steps,
            guidance_scale=body.guidance_scale,
            width=width,
            height=height,
            seed=None if body.seed is None else body.seed + i,
        )
        for i in range(body.n)
    ]


# ---- results -> responses ---------------------------------------------------------------------------


def models_response(name: str, task: str, adapters: Sequence[str] = ()) -> dict[str, Any]:
    """``GET /v1/models``: the served model, and its LoRA adapters, each with its base as ``parent``
    (vLLM's shape: ``root`` the adapter, ``parent`` the base model's name)."""
    model = {"id": name, "object": "model", "created": 0, "owned_by": "modelpool", "task": task}
    loras = [
        {
            "id": a,
            "object": "model",
            "created": 0,
            "owned_by": "modelpool",
            "task": task,
            "root": a,
            "parent": name,
        }
        for a in adapters
    ]
    return {"object": "list", "data": [model, *loras]}


def with_adapter(items: Sequence[Any], adapter: str | None) -> list[Any]:
    """The generation items of a request that named LoRA adapter ``adapter`` (None: the base model)."""
    if adapter is None:
        return list(items)
    return [dataclasses.replace(item, adapter=adapter) for item in items]


def embeddings_response(body: EmbeddingsBody, results: Sequence[Embedding], name: str) -> dict[str, Any]:
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
    return {
        "object": "list",
        "data": data,
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "truncated": sum(1 for e in results if e.truncated),
    }


def images_response(results: Sequence[ImageResult], created: int) -> dict[str, Any]:
    return {"created": created, "data": [{"b64_json": base64.b64encode(r.png).decode()} for r in results]}


def usage(results: Sequence[GenerationResult]) -> dict[str, int]:
    prompt = sum(r.prompt_tokens for r in results)
    completion = sum(r.completion_tokens for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@dataclass(frozen=True)
class Completion:
    """One completion response (``kind``: /v1/completions or /v1/chat/completions), whole or streamed:
    its id, creation time and model name are the same in every chunk."""

    kind: CompletionKind
    id: str
    created: int
    model: str

    def _doc(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def response(self, results: Sequence[GenerationResult]) -> dict[str, Any]:
        """The whole (non-streamed) response."""
        if self.kind == "text_completion":
            choices: list[dict[str, Any]] = [
                {"index": i, "text": r.text, "finish_reason": r.finish_reason, "logprobs": None}
                for i, r in enumerate(results)
            ]
            doc = self._doc("text_completion", choices)
        else:
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": r.text},
                    "finish_reason": r.finish_reason,
                }
                for i, r in enumerate(results)
            ]
            doc = self._doc("chat.completion", choices)
        doc["usage"] = usage(results)
        return doc

    def opening(self) -> list[dict[str, Any]]:
        """Chunks before the first piece of text (a chat stream first names the assistant's role)."""
        return [self.chunk(None, None, first=True)] if self.kind == "chat" else []

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        """One stream chunk carrying ``text`` (and the finish reason in the last one)."""
        if self.kind == "text_completion":
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
            return self._doc("text_completion", [choice])
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        return self._doc("chat.completion.chunk", [{"index": 0, "delta": delta, "finish_reason": finish}])

    def closing(self, results: Sequence[GenerationResult], streamed: bool) -> list[dict[str, Any]]:
        """The chunks after the last piece: the whole text at once when the task did not stream
        (``streamed`` is False), then the finish reason with the usage."""
        result = results[0]
        chunks = [] if streamed or not result.text else [self.chunk(result.text, None)]
        final = self.chunk(None, result.finish_reason)
        final["usage"] = usage(results)
        return [*chunks, final]


def stream_error(exc: ServerError) -> dict[str, Any]:
    """The chunk that ends a stream whose request failed after the response had started."""
    return {"error": {"message": str(exc), "type": exc.reason, "code": exc.status}}


def sse(doc: Mapping[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"
