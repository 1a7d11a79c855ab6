"""The encoder's runtime (``--runtime``, ``model_server.tasks.encoder_runtime``): ONNX Runtime gives the
embeddings eager torch gives, on the real all-MiniLM-L6-v2 weights and a fixed corpus, and a runtime that
cannot serve falls back to eager torch saying why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from model_server.config import load_config
from model_server.tasks.base import LoadOptions, TextItem
from model_server.tasks.encoder_runtime import encoder_forward, refusal
from model_server.tasks.text_embedding import TextEmbeddingTask
from modelpool_contract.flags import ENCODER_RUNTIMES, EncoderRuntime
from testkit.corpus import corpus

# Long enough to take several micro-batches of different widths, and texts at the model's limit.
TEXTS = [*corpus(96, seed=35), " ".join(["embedding"] * 400)]


def _embed(minilm: Path, runtime: EncoderRuntime) -> tuple[TextEmbeddingTask, npt.NDArray[np.float32]]:
    task = TextEmbeddingTask()
    task.load(LoadOptions(path=minilm, device="cpu", dtype="float32", runtime=runtime))
    results = task.run([TextItem(text) for text in TEXTS])
    return task, np.stack([r.vector for r in results])


@pytest.mark.slow
def test_onnxruntime_embeddings_equal_eager_torchs(minilm: Path) -> None:
    eager_task, eager = _embed(minilm, "torch")
    onnx_task, onnx = _embed(minilm, "onnxruntime")
    assert eager_task.forward is not None and eager_task.forward.runtime == "torch"
    assert onnx_task.forward is not None, "loaded"
    assert (onnx_task.forward.runtime, onnx_task.forward.fallback) == ("onnxruntime", None)
    cosine = (eager * onnx).sum(axis=1) / (np.linalg.norm(eager, axis=1) * np.linalg.norm(onnx, axis=1))
    assert cosine.min() >= 0.9999, f"lowest cosine {cosine.min():.6f}"


def test_a_runtime_that_cannot_serve_here_says_why() -> None:
    assert refusal("torch", "cuda:0") is None
    assert refusal("onnxruntime", "cpu") is None
    assert refusal("onnxruntime", "cuda:0") == "onnxruntime serves CPUs here, the model is on cuda:0"
    assert "unknown runtime 'tvm'" in (refusal("tvm", "cpu") or "")  # type: ignore[arg-type]
    assert ENCODER_RUNTIMES == ("torch", "onnxruntime")


def test_an_export_that_fails_falls_back_to_eager_torch_with_its_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    forward = encoder_forward("onnxruntime", object(), "cpu", ("input_ids", "attention_mask"))
    assert forward.runtime == "torch"
    assert forward.fallback is not None and forward.fallback.startswith("TypeError")
    assert f"runtime onnxruntime not used, eager torch instead: {forward.fallback}" in caplog.text


def test_the_runtime_is_a_server_flag_torch_by_default() -> None:
    base = ["--model", "/m", "--task", "text-embedding"]
    assert load_config(base).runtime == "torch"
    assert load_config([*base, "--runtime", "onnxruntime"]).runtime == "onnxruntime"
