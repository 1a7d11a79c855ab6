"""The generation routes (/v1/completions, /v1/chat/completions with SSE stream, v2 BYTES out) through the
openai package, against a streaming ``--handler`` (the real text-generation task has its own tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton

from testkit.echo_models import GENERATION
from testkit.server import ServerProcess, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gen() -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", "/", "--task", "text-generation", "--handler", GENERATION,
        "--device", "cpu", "--name", "gen", wait="ready",
    )  # fmt: skip
    yield proc
    proc.stop()


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_completion(gen: ServerProcess) -> None:
    r = _client(gen).completions.create(model="gen", prompt="one two three four", max_tokens=2)
    assert r.choices[0].text == "one two"
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 2


def test_completion_stream(gen: ServerProcess) -> None:
    stream = _client(gen).completions.create(
        model="gen", prompt="alpha beta gamma", max_tokens=10, stream=True
    )
    pieces = [c.choices[0].text for c in stream if c.choices]
    assert "".join(pieces).split() == ["alpha", "beta", "gamma"]


def test_chat_and_chat_stream(gen: ServerProcess) -> None:
    client = _client(gen)
    messages: list[Any] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello there"},
    ]
    r = client.chat.completions.create(model="gen", messages=messages, max_tokens=50)
    # The handler echoes the rendered prompt: the route's plain rendering of the messages.
    assert r.choices[0].message.content == "system: be brief user: hello there assistant:"
    stream = client.chat.completions.create(model="gen", messages=messages, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split()[:2] == ["system:", "be"]
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_wrong_routes_for_task(gen: ServerProcess) -> None:
    client = _client(gen)
    with pytest.raises(openai.BadRequestError, match="text-generation"):
        client.embeddings.create(model="gen", input="x")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="gen", prompt="x", temperature=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gen", messages=[])
    r = httpx.post(gen.url + "/v1/completions", json={"prompt": ["a", "b"], "stream": True}, timeout=10)
    assert r.status_code == 400


def test_v2_bytes_output(gen: ServerProcess) -> None:
    client = triton.InferenceServerClient(gen.url.removeprefix("http://"))
    inp = triton.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"x y z"], dtype=object))
    for binary in (True, False):
        out = client.infer(
            "gen", [inp], outputs=[triton.InferRequestedOutput("text_output", binary_data=binary)]
        )
        values = out.as_numpy("text_output").tolist()
        # tritonclient gives bytes for binary outputs and str for JSON ones.
        assert [v if isinstance(v, bytes) else v.encode() for v in values] == [b"x y z"]
    client.close()
