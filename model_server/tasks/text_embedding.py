"""text-embedding: transformers ``AutoModel`` + the pooling/normalisation a sentence-transformers folder
declares (``modules.json``, ``1_Pooling/config.json``, a ``Normalize`` module); mean pooling otherwise.

Texts longer than the model's limit (``sentence_bert_config.json`` ``max_seq_length``, else the
tokenizer's/position-embedding limit) are truncated and the result says so (``Embedding.truncated``).
Within a unit the texts are sorted by length and run in micro-batches whose padded size is bounded, so
a few long texts do not make every short one pay for their padding.

v2: input ``text`` BYTES [-1] (UTF-8); output ``embedding`` FP32 [-1, dim].
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from model_server.errors import InvalidInput
from model_server.tasks.base import (
    Embedding,
    Emitter,
    LoadOptions,
    Task,
    TensorSpec,
    TextItem,
    bytes_items,
    decode_text,
    require_tensor,
)
from model_server.tasks.encoder_runtime import Forward, encoder_forward

TEXT = TensorSpec("text", "BYTES", (-1,))
EMBEDDING = TensorSpec("embedding", "FP32", (-1, -1))
# Padded tokens per forward pass on the CPU path; bounds activation memory and padding waste.
TOKEN_BUDGET = 16384
# The fixed cost of one forward pass on a CPU, in padded tokens' worth of compute (all-MiniLM-L6-v2 on
# x86: about 12 ms per pass + 0.26 ms per token, so ~48 tokens; larger models have both costs grow
# together, so the ratio carries over roughly).  Decides how finely a unit is split by length.
CPU_PASS_OVERHEAD_TOKENS = 48
# The warm-up input: one sentence of ordinary length.
WARMUP_TEXT = "A short sentence of ordinary length, embedded once before the first request arrives."
# The dynamic programme looks at most this many texts back; beyond it one more pass costs little.
MAX_ROWS_PER_PASS = 64


def read_pooling(path: Path) -> tuple[str, bool, int | None]:
    """Pure-ish: (pooling mode, normalise?, max_seq_length) declared by a sentence-transformers folder.

    Mode is one of ``mean`` (default), ``cls``, ``max``, ``lasttoken``."""
    mode, normalize, max_len = "mean", False, None
    modules_file = path / "modules.json"
    if modules_file.is_file():
        for module in json.loads(modules_file.read_text()):
            kind = str(module.get("type", ""))
            if kind.endswith("Normalize"):
                normalize = True
            elif kind.endswith("Pooling"):
                cfg_file = path / str(module.get("path", "")) / "config.json"
                if cfg_file.is_file():
                    cfg = json.loads(cfg_file.read_text())
                    for key, name in (
                        ("pooling_mode_cls_token", "cls"),
                        ("pooling_mode_max_tokens", "max"),
                        ("pooling_mode_lasttoken", "lasttoken"),
                        ("pooling_mode_mean_tokens", "mean"),
                    ):
                        if cfg.get(key):
                            mode = name
                            break
    st_cfg = path / "sentence_bert_config.json"
    if st_cfg.is_file():
        value = json.loads(st_cfg.read_text()).get("max_seq_length")
        max_len = int(value) if value else None
    return mode, normalize, max_len


def micro_batches(
    lengths: Sequence[int], budget: int = TOKEN_BUDGET, overhead_tokens: int | None = None
) -> list[list[int]]:
    """Pure: split a unit into forward passes; indices sorted by length, each group's
    ``len(group) * max_len <= budget`` (a single over-long text still gets its own group).

    ``overhead_tokens=None`` (GPUs: a forward pass costs about the same up to the budget) fills each
    group greedily.  Otherwise (CPUs: cost ~ a fixed per-pass overhead + padded tokens) the split that
    minimises ``passes * overhead_tokens + padded tokens`` is chosen by dynamic programming over the
    sorted lengths, so texts of similar length share a pass and few tokens are padding."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    if overhead_tokens is None:
        return _greedy(order, lengths, budget)
    sorted_len = [max(1, lengths[i]) for i in order]
    n = len(order)
    best = [0.0] + [math.inf] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        width = sorted_len[end - 1]  # ascending: the last text is the widest
        for start in range(end - 1, max(-1, end - 1 - MAX_ROWS_PER_PASS), -1):
            padded = (end - start) * width
            if padded > budget and start < end - 1:
                break
            cost = best[start] + overhead_tokens + padded
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups: list[list[int]] = []
    end = n
    while end > 0:
        start = cut[end]
        groups.append(order[start:end])
        end = start
    return groups[::-1]


def _greedy(order: list[int], lengths: Sequence[int], budget: int) -> list[list[int]]:
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # Sorted ascending, so the newest index has the group's max length.
        if current and (len(current) + 1) * max(1, lengths[i]) > budget:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


class TextEmbeddingTask(Task[TextItem, Embedding]):
    name = "text-embedding"
    batchable = True
    v2_inputs = (TEXT,)
    v2_outputs = (EMBEDDING,)

    def __init__(self) -> None:
        self._model: Any = None
        self.forward: Forward | None = None
        self._tokenizer: Any = None
        self._torch: Any = None
        self._device = "cpu"
        self._mode = "mean"
        self._normalize = False
        self._max_len = 512

    def load(self, options: LoadOptions) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self._torch = torch
        self._device = options.device
        dtype = options.dtype
        if dtype == "auto":
            dtype = "float16" if options.device.startswith("cuda") else "float32"
        self._mode, self._normalize, st_max = read_pooling(options.path)
        self._tokenizer = AutoTokenizer.from_pretrained(
            options.path, trust_remote_code=options.trust_remote_code
        )
        model = AutoModel.from_pretrained(
            options.path,
            dtype=getattr(torch, dtype),
            trust_remote_code=options.trust_remote_code,
            use_safetensors=any(options.path.glob("*.safetensors")) or None,
        )
        self._model = model.to(options.device).eval()
        names = getattr(self._tokenizer, "model_input_names", None) or ["input_ids", "attention_mask"]
        inputs = tuple(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in names)
        self.forward = encoder_forward(options.runtime, self._model, options.device, inputs)
        limits = [
            st_max,
            getattr(model.config, "max_position_embeddings", None),
            getattr(self._tokenizer, "model_max_length", None),
        ]
        self._max_len = min(int(x) for x in limits if x and int(x) < 1_000_000)

    def max_input_tokens(self) -> int | None:
        return self._max_len

    def warmup_items(self) -> list[TextItem]:
        return [TextItem(WARMUP_TEXT)]

    def length_hint(self, item: TextItem) -> int:
        return len(item.text)

    def run(self, items: Sequence[TextItem], emit: Emitter | None = None) -> list[Embedding]:
        torch, forward = self._torch, self.forward
        assert forward is not None, "run before load"
        texts = [item.text for item in items]
        # One tokenizer call for the whole unit (the fast tokenizer parallelises it internally).
        enc = self._tokenizer(texts, truncation=True, max_length=self._max_len, padding=False)
        ids: list[list[int]] = enc["input_ids"]
        types: list[list[int]] | None = enc.get("token_type_ids")
        lengths = [len(x) for x in ids]
        # Only a text that hit the limit can have been truncated: count its full length to be sure.
        at_limit = [i for i, n in enumerate(lengths) if n >= self._max_len]
        truncated = set()
        if at_limit:
            full = self._tokenizer([texts[i] for i in at_limit], truncation=False)["input_ids"]
            truncated = {i for i, f in zip(at_limit, full, strict=True) if len(f) > self._max_len}
        budget = TOKEN_BUDGET if self._device == "cpu" else TOKEN_BUDGET * 8
        pad_id = self._tokenizer.pad_token_id or 0
        out: list[Embedding | None] = [None] * len(items)
        with torch.inference_mode():
            overhead = CPU_PASS_OVERHEAD_TOKENS if self._device == "cpu" else None
            for group in micro_batches(lengths, budget, overhead):
                width = max(lengths[i] for i in group)
                if self._device != "cpu":
                    # Few distinct shapes on GPUs: tensor-core friendly, and the per-shape kernel caches
                    # (host memory) stop growing under traffic of arbitrary lengths.
                    width = min(-(-width // 8) * 8, max(width, self._max_len))
                input_ids = np.full((len(group), width), pad_id, dtype=np.int64)
                mask = np.zeros((len(group), width), dtype=np.int64)
                type_ids = np.zeros((len(group), width), dtype=np.int64) if types is not None else None
                for row, i in enumerate(group):
                    n = lengths[i]
                    input_ids[row, :n] = ids[i]
                    mask[row, :n] = 1
                    if type_ids is not None and types is not None:
                        type_ids[row, :n] = types[i]
                batch = {"input_ids": input_ids, "attention_mask": mask}
                if type_ids is not None:
                    batch["token_type_ids"] = type_ids
                hidden = forward.hidden(batch)
                array = self._pool(hidden, torch.from_numpy(mask).to(hidden.device)).float().cpu().numpy()
                for row, i in enumerate(group):
                    out[i] = Embedding(array[row], tokens=lengths[i], truncated=i in truncated)
        return [e for e in out if e is not None]

    def _pool(self, hidden: Any, mask: Any) -> Any:
        torch = self._torch
        if self._mode == "cls":
            pooled = hidden[:, 0]
        elif self._mode == "lasttoken":
            last = mask.sum(dim=1) - 1
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        elif self._mode == "max":
            masked = hidden.masked_fill(~mask.bool().unsqueeze(-1), torch.finfo(hidden.dtype).min)
            pooled = masked.max(dim=1).values
        else:
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
        if self._normalize:
            pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
        return pooled

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[TextItem]:
        array = require_tensor(inputs, TEXT)
        if array.ndim != 1 and not (array.ndim == 2 and array.shape[1] == 1):
            raise InvalidInput(
                f"input tensor '{TEXT.name}' must have shape [N] or [N, 1], got {list(array.shape)}"
            )
        return [TextItem(decode_text(raw, TEXT.name)) for raw in bytes_items(array, TEXT.name)]

    def encode_v2(self, results: Sequence[Embedding]) -> dict[str, npt.NDArray[Any]]:
        return {EMBEDDING.name: np.stack([r.vector for r in results]).astype(np.float32, copy=False)}
