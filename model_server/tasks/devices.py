"""Device and dtype resolution shared by the torch-backed tasks (torch is imported lazily)."""

from __future__ import annotations

from typing import Any

DTYPE_NAMES = ("auto", "float32", "float16", "bfloat16")


def torch_dtype(dtype: str, device: str, *, half_on_cuda: bool) -> Any:
    """The ``torch.dtype`` for ``--dtype``: ``auto`` is float16 on CUDA for a task that runs well in half
    precision (``half_on_cuda``: generation, vision, diffusion, image embeddings) and float32 everywhere
    else, because many CPU kernels are missing or slow in half precision."""
    import torch

    if dtype == "auto":
        return torch.float16 if half_on_cuda and device.startswith("cuda") else torch.float32
    mapping = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in mapping:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_NAMES)}")
    return mapping[dtype]
