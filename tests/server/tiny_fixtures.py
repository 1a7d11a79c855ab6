"""Pytest fixtures for the tiny task models: each model is built ONCE per test session into a tmp dir
(``tiny_models.build``), and each test module loads it through its task class once.

Import the fixtures you use into a test module (``from tests.server.tiny_fixtures import tiny_vision``),
or register this module with ``pytest_plugins``.  Also: small image helpers the task tests share.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from model_server.tasks.base import LoadOptions, Task
from testkit import tiny_models

TaskT = TypeVar("TaskT", bound=Task[Any, Any])


def _build(factory: pytest.TempPathFactory, task: str) -> Path:
    return tiny_models.build(task, factory.mktemp(task.replace("-", "_")))


@pytest.fixture(scope="session")
def tiny_text_generation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 with a BPE tokenizer and a ChatML chat template."""
    return _build(tmp_path_factory, "text-generation")


@pytest.fixture(scope="session")
def tiny_llama_generation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with the same tokenizer and chat template (continuous batching's shape)."""
    return _build(tmp_path_factory, "text-generation-llama")


@pytest.fixture(scope="session")
def tiny_image_embedding(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny CLIP (projection dim 16, 32x32 images)."""
    return _build(tmp_path_factory, "image-embedding")


@pytest.fixture(scope="session")
def tiny_vision(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ViT + GPT-2 VisionEncoderDecoder."""
    return _build(tmp_path_factory, "vision")


@pytest.fixture(scope="session")
def tiny_vision_blip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BLIP captioner (the image-text-to-text path of the vision task)."""
    return _build(tmp_path_factory, "vision-blip")


@pytest.fixture(scope="session")
def tiny_text_to_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Stable Diffusion pipeline."""
    return _build(tmp_path_factory, "text-to-image")


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the tiny models on ``count`` intra-op threads (restored after): on two shared cores, two
    threads per process mostly wait for each other."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# The device the task tests load their models on: the CPU in CI; ``MODELPOOL_TEST_DEVICE=cuda`` runs the same
# tests on a GPU (``--dtype auto`` then means float16).
TEST_DEVICE = os.environ.get("MODELPOOL_TEST_DEVICE", "cpu")
# Float tolerance for comparing two forward passes of different batch shapes (float16 on a GPU).
ATOL = 1e-5 if TEST_DEVICE == "cpu" else 5e-3


def load_task(task: TaskT, path: Path) -> TaskT:
    """Load ``task`` from ``path`` on ``TEST_DEVICE`` with the default dtype, through its real ``load``."""
    task.load(LoadOptions(path=path, device=TEST_DEVICE, dtype="auto"))
    return task


def image_bytes(
    color: str | tuple[int, int, int], size: tuple[int, int] = (40, 30), fmt: str = "PNG"
) -> bytes:
    """An encoded solid-colour image."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt)
    return buffer.getvalue()


def gradient_png(size: tuple[int, int] = (32, 32)) -> bytes:
    """A PNG with structure (a diagonal gradient), unlike the solid colours."""
    from PIL import Image

    image = Image.new("RGB", size)
    image.putdata(
        [((x * 8) % 256, (y * 8) % 256, ((x + y) * 4) % 256) for y in range(size[1]) for x in range(size[0])]
    )
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
