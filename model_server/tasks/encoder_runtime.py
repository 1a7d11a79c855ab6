"""The runtime an encoder's forward pass runs on (``--runtime``, a pool's ``spec.model.runtime``): eager
torch, or ONNX Runtime on CPUs, the model exported at load from the same weights (``torch.onnx.export``,
then ONNX Runtime's transformer fusions: attention, LayerNorm, GELU) into a temporary folder.

``onnxruntime`` falls back to eager torch, with the reason logged, wherever it cannot serve: on a GPU, with
the ``onnx`` extra missing, or when the export or the session fails; the model is served either way.  The
task keeps tokenizing, batching and pooling; only ``hidden(batch) -> last_hidden_state`` changes.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from modelpool_contract.flags import ENCODER_RUNTIMES, EncoderRuntime

log = logging.getLogger("modelpool.worker")

#: A forward pass: the padded batch (``input_ids``, ``attention_mask``, maybe ``token_type_ids``, int64
#: arrays) -> the last hidden state, a torch tensor [batch, tokens, hidden].
Hidden = Callable[[Mapping[str, npt.NDArray[np.int64]]], Any]
_OPSET = 18


def refusal(runtime: EncoderRuntime, device: str) -> str | None:
    """Pure: why ``runtime`` cannot run on ``device`` (None: it can)."""
    if runtime not in ENCODER_RUNTIMES:
        return f"unknown runtime {runtime!r} (one of {', '.join(ENCODER_RUNTIMES)})"
    if runtime == "onnxruntime" and device != "cpu":
        return f"onnxruntime serves CPUs here, the model is on {device}"
    return None


def torch_hidden(model: Any, device: str) -> Hidden:
    """Eager torch: the model itself."""
    import torch

    def hidden(batch: Mapping[str, npt.NDArray[np.int64]]) -> Any:
        tensors = {name: torch.from_numpy(array).to(device) for name, array in batch.items()}
        return model(**tensors).last_hidden_state

    return hidden


@dataclass(frozen=True)
class Forward:
    """The forward pass a task runs, the runtime that serves it, and why the one asked for does not (None:
    it does)."""

    hidden: Hidden
    runtime: EncoderRuntime
    fallback: str | None = None


def encoder_forward(runtime: EncoderRuntime, model: Any, device: str, inputs: tuple[str, ...]) -> Forward:
    """The forward pass of ``model`` on ``runtime``; eager torch, with the reason logged, where ``runtime``
    cannot serve here.  ``inputs``: the names the tokenizer gives the model."""
    reason = refusal(runtime, device)
    if runtime == "onnxruntime" and reason is None:
        try:
            return Forward(onnx_hidden(model, inputs), "onnxruntime")
        except Exception as exc:  # any failure to export or to open the session: serve on torch
            reason = f"{type(exc).__name__}: {exc}"
    if reason is not None:
        log.warning("runtime %s not used, eager torch instead: %s", runtime, reason)
    return Forward(torch_hidden(model, device), "torch", reason)


def onnx_hidden(model: Any, inputs: tuple[str, ...]) -> Hidden:
    """Export ``model`` to ONNX, fuse it for CPUs and open an ONNX Runtime session with torch's thread
    count (the server sized it to the worker's CPU share)."""
    import onnxruntime as ort
    import torch

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # No spinning between passes: the HTTP processes and the tokenizer share these cores.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # The session reads the whole graph when it is made: the files go with the folder right after.
    with tempfile.TemporaryDirectory(prefix="modelpool-onnx-") as folder:
        path = export(model, inputs, Path(folder) / "model.onnx")
        path = fuse(path, model.config, Path(folder) / "fused.onnx")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    (output,) = [o.name for o in session.get_outputs()]
    log.info("runtime onnxruntime: %s exported and fused (%d threads)", path.name, torch.get_num_threads())

    def hidden(batch: Mapping[str, npt.NDArray[np.int64]]) -> Any:
        (array,) = session.run([output], {name: batch[name] for name in inputs})
        return torch.from_numpy(array)

    return hidden


def export(model: Any, inputs: tuple[str, ...], path: Path) -> Path:
    """``model``'s last hidden state as ONNX at ``path``, the batch and token axes dynamic."""
    import torch

    class LastHidden(torch.nn.Module):
        """The model's last hidden state from positional inputs (what the exporter traces)."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *arrays: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.model(**dict(zip(inputs, arrays, strict=True))).last_hidden_state
            return out

    sample = tuple(torch.ones((2, 8), dtype=torch.int64) for _ in inputs)
    axes = {name: {0: "batch", 1: "tokens"} for name in [*inputs, "last_hidden_state"]}
    with torch.no_grad():
        torch.onnx.export(
            LastHidden().eval(), sample, str(path), input_names=list(inputs),
            output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=_OPSET, dynamo=False,
        )  # fmt: skip
    return path


def fuse(path: Path, config: Any, out: Path) -> Path:
    """ONNX Runtime's transformer fusions for a BERT-like ``config`` (its own optimizer); ``path``
    unchanged for other models (the session's generic optimizations still apply)."""
    if getattr(config, "model_type", None) not in {"bert", "roberta", "xlm-roberta", "mpnet", "distilbert"}:
        return path
    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(
        str(path),
        model_type="bert",
        num_heads=int(getattr(config, "num_attention_heads", 0) or 0),
        hidden_size=int(getattr(config, "hidden_size", 0) or 0),
        opt_level=0,
    )
    fused.save_model_to_file(str(out))
    return out


__all__ = ["Forward", "Hidden", "encoder_forward", "export", "fuse", "onnx_hidden", "refusal", "torch_hidden"]
