"""End to end: the four tiny-model tasks through a real ``modelpool-server`` process, called by the real
clients (``tritonclient.http`` with binary_data True and False, the ``openai`` package).  Each module-scoped
server loads its model through the task's real loading code from the directory the tiny builder wrote."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from testkit.server import ServerProcess, start_server
from tests.server.tiny_fixtures import (
    gradient_png,
    image_bytes,
    tiny_image_embedding,
    tiny_text_generation,
    tiny_text_to_image,
    tiny_vision,
)

__all__ = ["tiny_image_embedding", "tiny_text_generation", "tiny_text_to_image", "tiny_vision"]

pytestmark = pytest.mark.slow


def _serve(path: Path, task: str) -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", str(path), "--task", task, "--device", "cpu", "--name", "tiny", wait="ready"
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def gen_server(tiny_text_generation: Path) -> Iterator[ServerProcess]:
    yield from _serve(tiny_text_generation, "text-generation")


@pytest.fixture(scope="module")
def clip_server(tiny_image_embedding: Path) -> Iterator[ServerProcess]:
    yield from _serve(tiny_image_embedding, "image-embedding")


@pytest.fixture(scope="module")
def vision_server(tiny_vision: Path) -> Iterator[ServerProcess]:
    yield from _serve(tiny_vision, "vision")


@pytest.fixture(scope="module")
def sd_server(tiny_text_to_image: Path) -> Iterator[ServerProcess]:
    yield from _serve(tiny_text_to_image, "text-to-image")


def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def v2_infer(
    server: ServerProcess,
    tensors: dict[str, np.ndarray],
    output: str,
    *,
    binary: bool,
    parameters: dict[str, Any] | None = None,
) -> np.ndarray:
    """One tritonclient.http inference; BYTES inputs always travel binary (images are not UTF-8)."""
    client = triton.InferenceServerClient(server.url.removeprefix("http://"), network_timeout=120)
    try:
        inputs = []
        for name, values in tensors.items():
            datatype = "BYTES" if values.dtype == np.object_ else "FP32"
            tensor = triton.InferInput(name, list(values.shape), datatype)
            tensor.set_data_from_numpy(values, binary_data=binary or datatype == "BYTES")
            inputs.append(tensor)
        result = client.infer(
            "tiny",
            inputs,
            outputs=[triton.InferRequestedOutput(output, binary_data=binary)],
            parameters=parameters,
        )
        array: np.ndarray | None = result.as_numpy(output)
        assert array is not None
        return array
    finally:
        client.close()


def as_bytes(values: np.ndarray) -> list[bytes]:
    """tritonclient gives bytes for binary BYTES outputs and str for JSON ones."""
    return [v if isinstance(v, bytes) else str(v).encode() for v in values.reshape(-1).tolist()]


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()


# ---- text-generation ----


def test_generation_metadata_lists_the_tensors(gen_server: ServerProcess) -> None:
    client = triton.InferenceServerClient(gen_server.url.removeprefix("http://"))
    try:
        meta = client.get_model_metadata("tiny")
    finally:
        client.close()
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("text_input", "BYTES")]
    assert [(t["name"], t["datatype"]) for t in meta["outputs"]] == [("text_output", "BYTES")]


def test_generation_v2_matches_completions(gen_server: ServerProcess) -> None:
    parameters = {"max_tokens": 6, "temperature": 0}
    prompts = np.array([b"Hello, world!", b"A man is eating"], dtype=np.object_)
    texts = {
        binary: as_bytes(
            v2_infer(gen_server, {"text_input": prompts}, "text_output", binary=binary, parameters=parameters)
        )
        for binary in (True, False)
    }
    assert texts[True] == texts[False]
    completion = oai(gen_server).completions.create(
        model="tiny", prompt=["Hello, world!", "A man is eating"], max_tokens=6, temperature=0
    )
    assert [c.text.encode() for c in completion.choices] == texts[True]
    assert all(c.finish_reason == "length" for c in completion.choices)
    assert completion.usage is not None and completion.usage.completion_tokens == 12


def test_completion_stream_and_stop(gen_server: ServerProcess) -> None:
    client = oai(gen_server)
    full = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=20, temperature=0)
    text = full.choices[0].text
    stream = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=20, temperature=0, stream=True
    )
    chunks = list(stream)
    assert len(chunks) > 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices[0].finish_reason == "length"
    index = next(i for i, ch in enumerate(text) if ch != text[0])
    stopped = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=20, temperature=0, stop=[text[index : index + 2]]
    )
    assert stopped.choices[0].text == text[:index]
    assert stopped.choices[0].finish_reason == "stop"


def test_chat_uses_the_template_and_streams(gen_server: ServerProcess) -> None:
    client = oai(gen_server)
    messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    reply = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, seed=1
    )
    content = reply.choices[0].message.content
    assert content
    # Rendered with the ChatML template: special tokens count (the plain rendering would be shorter).
    assert reply.usage is not None and reply.usage.prompt_tokens > 10
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, seed=1, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == content


def test_generation_bad_input_then_good(gen_server: ServerProcess) -> None:
    client = oai(gen_server)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="tiny", prompt="hello " * 200, max_tokens=4)
    with pytest.raises(InferenceServerException, match="max_tokens"):
        v2_infer(
            gen_server,
            {"text_input": np.array([b"hi"], dtype=np.object_)},
            "text_output",
            binary=True,
            parameters={"max_tokens": 0},
        )
    ok = client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0)
    assert ok.usage is not None and ok.usage.completion_tokens == 3


def test_generation_engine_in_stats_and_a_refused_stream_is_a_400(gen_server: ServerProcess) -> None:
    """The tiny GPT-2 runs on the continuous-batching engine; a streaming request the model refuses is
    answered 400 before the stream's headers, not as an error event in a 200 stream."""
    generation = httpx.get(gen_server.url + "/stats").json()["generation"]
    assert generation["engine"] == "continuous-batching" and generation["kv_cache_tokens"] > 0
    assert generation["kv_cache_reserved_tokens"] == 0 and generation["running"] == 0
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        oai(gen_server).completions.create(model="tiny", prompt="hello " * 200, max_tokens=4, stream=True)


def _refuse_max_tokens(server: ServerProcess, protocol: str, max_tokens: int) -> str:
    """Send one request asking for ``max_tokens`` new tokens; return the refusal's message."""
    hi: Any = [{"role": "user", "content": "hi"}]
    refusal: type[Exception] = InferenceServerException if protocol == "v2" else openai.BadRequestError
    with pytest.raises(refusal) as refused:
        if protocol == "completions":
            oai(server).completions.create(model="tiny", prompt="hi", max_tokens=max_tokens)
        elif protocol == "chat":
            oai(server).chat.completions.create(model="tiny", messages=hi, max_tokens=max_tokens)
        elif protocol == "chat-max-completion-tokens":
            oai(server).chat.completions.create(model="tiny", messages=hi, max_completion_tokens=max_tokens)
        else:
            prompt = {"text_input": np.array([b"hi"], dtype=np.object_)}
            v2_infer(server, prompt, "text_output", binary=True, parameters={"max_tokens": max_tokens})
    return str(refused.value)


@pytest.mark.parametrize("protocol", ["completions", "chat", "chat-max-completion-tokens", "v2"])
def test_max_tokens_over_the_limit_is_refused_before_it_is_queued(
    gen_server: ServerProcess, protocol: str
) -> None:
    """A max_tokens over the server's limit (4096) is a 400 naming the parameter and the limit, answered
    at the door: the server admits nothing (``requests_total`` stays) and counts the rejection."""
    before = httpx.get(gen_server.url + "/stats", timeout=10).json()
    message = _refuse_max_tokens(gen_server, protocol, 5000)
    after = httpx.get(gen_server.url + "/stats", timeout=10).json()
    assert "max_tokens" in message and "4096" in message, message
    assert after["requests_total"] == before["requests_total"]
    assert after["rejected_total"] == before["rejected_total"] + 1
    # At the limit the door lets it through; this tiny model's context window (128) then refuses it.
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        oai(gen_server).completions.create(model="tiny", prompt="hi", max_tokens=4096)


# ---- image-embedding ----


def test_image_embeddings_over_v2_and_openai(clip_server: ServerProcess) -> None:
    images = [image_bytes("red"), gradient_png()]
    tensors = {"image": np.array(images, dtype=np.object_)}
    binary = v2_infer(clip_server, tensors, "embedding", binary=True)
    as_json = v2_infer(clip_server, tensors, "embedding", binary=False)
    assert binary.shape == (2, 16) and binary.dtype == np.float32
    np.testing.assert_allclose(binary, as_json, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(binary, axis=1), 1.0, atol=1e-5)
    response = oai(clip_server).embeddings.create(
        model="tiny", input=[base64.b64encode(i).decode() for i in images]
    )
    np.testing.assert_allclose(np.array([d.embedding for d in response.data]), binary, atol=1e-5)


def test_corrupt_image_is_a_400_naming_the_item(clip_server: ServerProcess) -> None:
    tensors = {"image": np.array([image_bytes("red"), b"not an image"], dtype=np.object_)}
    with pytest.raises(InferenceServerException, match="image 1 is not a decodable image"):
        v2_infer(clip_server, tensors, "embedding", binary=True)
    assert v2_infer(clip_server, {"image": tensors["image"][:1]}, "embedding", binary=True).shape == (1, 16)


# ---- vision ----


def test_vision_chat_with_an_image_url(vision_server: ServerProcess) -> None:
    client = oai(vision_server)
    messages: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": data_url(gradient_png())}},
            ],
        }
    ]
    reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    content = reply.choices[0].message.content
    assert content
    assert reply.choices[0].finish_reason == "length"
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == content
    # The same image and prompt over v2 give the same text, binary or JSON.
    tensors = {
        "image": np.array([gradient_png()], dtype=np.object_),
        "prompt": np.array([b"What is in this picture?"], dtype=np.object_),
    }
    for binary in (True, False):
        out = v2_infer(
            vision_server,
            tensors,
            "text_output",
            binary=binary,
            parameters={"max_tokens": 8, "temperature": 0},
        )
        assert as_bytes(out) == [content.encode()]


def test_vision_needs_a_decodable_image(vision_server: ServerProcess) -> None:
    messages: Any = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(b"broken")}}]}
    ]
    with pytest.raises(openai.BadRequestError, match="not a decodable image"):
        oai(vision_server).chat.completions.create(model="tiny", messages=messages, max_tokens=4)


# ---- text-to-image ----


def test_images_generate_and_v2_agree(sd_server: ServerProcess) -> None:
    from PIL import Image

    extra = {"steps": 2, "seed": 5}
    response = oai(sd_server).images.generate(
        model="tiny", prompt="a red square", size="64x64", response_format="b64_json", extra_body=extra
    )
    assert response.data is not None and response.data[0].b64_json is not None
    png = base64.b64decode(response.data[0].b64_json)
    assert Image.open(io.BytesIO(png)).size == (64, 64)
    parameters = {"steps": 2, "seed": 5, "width": 64, "height": 64}
    tensors = {"prompt": np.array([b"a red square"], dtype=np.object_)}
    binary = as_bytes(v2_infer(sd_server, tensors, "image", binary=True, parameters=parameters))
    # JSON outputs carry non-UTF-8 bytes (a PNG) as base64.
    as_json = v2_infer(sd_server, tensors, "image", binary=False, parameters=parameters)
    assert binary == [png] == [base64.b64decode(v) for v in as_bytes(as_json)]


def test_images_bad_size_is_a_400(sd_server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError):
        oai(sd_server).images.generate(model="tiny", prompt="x", size="100x64", response_format="b64_json")
    tensors = {"prompt": np.array([b"x"], dtype=np.object_)}
    with pytest.raises(InferenceServerException, match="multiple of 8"):
        v2_infer(sd_server, tensors, "image", binary=True, parameters={"width": 60, "steps": 1})
