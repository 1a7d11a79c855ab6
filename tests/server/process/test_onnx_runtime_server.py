"""A worker asked for the ONNX Runtime encoder (``--runtime onnxruntime``, a pool's ``spec.model.runtime``)
serves on it, from the flag to the task's load, and answers what sentence-transformers computes on the real
all-MiniLM-L6-v2 weights."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from testkit.server import start_server

pytestmark = pytest.mark.slow

TEXTS = ["A man is eating food.", "short", "A much longer sentence about the weather in the mountains."]


def test_a_worker_asked_for_onnxruntime_serves_on_it(minilm: Path) -> None:
    from sentence_transformers import SentenceTransformer

    server = start_server(
        "--model", str(minilm), "--task", "text-embedding", "--name", "minilm", "--device", "cpu",
        "--runtime", "onnxruntime", wait="ready", timeout=300,
    )  # fmt: skip
    try:
        r = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS}, timeout=60)
        assert r.status_code == 200, r.text
        got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
        log = server.log()
    finally:
        server.stop()
    expected = SentenceTransformer(str(minilm), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(got, expected, atol=2e-4)
    assert "runtime onnxruntime: fused.onnx exported and fused" in log
    assert "eager torch instead" not in log
