"""image-embedding through the real task class and a tiny CLIP saved to disk: shapes, unit norm,
determinism, batch == single, corrupt images named by index, and the v2 codec."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_server.errors import InvalidInput
from model_server.tasks.base import ImageItem
from model_server.tasks.image_embedding import ImageEmbeddingTask, image_tower_class
from model_server.tasks.media import MAX_IMAGE_PIXELS, decode_image
from tests.server.tiny_fixtures import (
    ATOL,
    gradient_png,
    image_bytes,
    load_task,
    tiny_image_embedding,
    torch_threads,
)

__all__ = ["tiny_image_embedding"]

DIM = 16  # the tiny CLIP's projection_dim


@pytest.fixture(scope="module")
def task(tiny_image_embedding: Path) -> Iterator[ImageEmbeddingTask]:
    with torch_threads(1):
        yield load_task(ImageEmbeddingTask(), tiny_image_embedding)


def test_embeddings_are_unit_vectors_of_the_projection_dim(task: ImageEmbeddingTask) -> None:
    results = task.run(
        [ImageItem(image_bytes("red")), ImageItem(gradient_png()), ImageItem(image_bytes("blue"))]
    )
    assert len(results) == 3
    for result in results:
        assert result.vector.shape == (DIM,)
        assert result.vector.dtype == np.float32
        assert np.linalg.norm(result.vector) == pytest.approx(1.0, abs=1e-5)  # normalised in float32
    assert task.dim == DIM
    assert not np.allclose(results[0].vector, results[1].vector)


def test_deterministic_and_batch_equals_single(task: ImageEmbeddingTask) -> None:
    images = [image_bytes("red"), gradient_png(), image_bytes((10, 200, 30), fmt="JPEG")]
    batch = task.run([ImageItem(i) for i in images])
    singles = [task.run([ImageItem(i)])[0] for i in images]
    for together, alone in zip(batch, singles, strict=True):
        np.testing.assert_allclose(together.vector, alone.vector, atol=ATOL)
    np.testing.assert_array_equal(task.run([ImageItem(images[1])])[0].vector, singles[1].vector)


def test_any_size_and_mode_is_accepted(task: ImageEmbeddingTask) -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (300, 17), 128).save(buffer, format="PNG")  # greyscale, odd aspect ratio
    [result] = task.run([ImageItem(buffer.getvalue())])
    assert result.vector.shape == (DIM,)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "image 1 is empty"),
        (b"definitely not an image", "image 1 is not a decodable image"),
        (image_bytes("red")[:40], "image 1 is not a decodable image"),  # truncated PNG
    ],
)
def test_corrupt_image_names_the_item(task: ImageEmbeddingTask, raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        task.run([ImageItem(image_bytes("red")), ImageItem(raw)])
    assert task.run([ImageItem(image_bytes("red"))])[0].vector.shape == (DIM,)  # still serving


def test_oversized_image_is_refused_before_decoding() -> None:
    from PIL import Image

    side = int(MAX_IMAGE_PIXELS**0.5) + 10
    buffer = io.BytesIO()
    Image.new("1", (side, side)).save(buffer, format="PNG")  # 1-bit: a small file, a huge image
    with pytest.raises(InvalidInput, match="over the limit"):
        decode_image(buffer.getvalue(), 0)


def test_projected_vision_towers_are_picked_from_architectures() -> None:
    assert image_tower_class(["CLIPVisionModelWithProjection"]) == "CLIPVisionModelWithProjection"
    assert image_tower_class(["CLIPModel"]) is None
    assert image_tower_class([]) is None


def test_v2_round_trip(task: ImageEmbeddingTask) -> None:
    inputs = {"image": np.array([image_bytes("red"), gradient_png()], dtype=np.object_)}
    items = task.decode_v2(inputs, {})
    assert [i.image for i in items] == list(inputs["image"])
    encoded = task.encode_v2(task.run(items))
    assert encoded["embedding"].shape == (2, DIM)
    assert encoded["embedding"].dtype == np.float32


@pytest.mark.parametrize(
    ("inputs", "reason"),
    [
        ({}, "missing input tensor 'image'"),
        ({"image": np.zeros((2, 3), dtype=np.float32)}, "BYTES"),
        ({"image": np.array([], dtype=np.object_)}, "empty"),
    ],
)
def test_v2_bad_input(task: ImageEmbeddingTask, inputs: dict[str, np.ndarray], reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        task.decode_v2(inputs, {})
