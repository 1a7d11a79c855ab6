"""text-to-image through the real task class and a tiny Stable Diffusion pipeline saved to disk: PNG of the
requested size, seeds, negative prompts, limits, and the v2 codec."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_server.errors import InvalidInput
from model_server.tasks.base import ImageGenerationItem, ImageResult
from model_server.tasks.text_to_image import TextToImageTask, check_item, parse_size
from tests.server.tiny_fixtures import load_task, tiny_text_to_image, torch_threads

__all__ = ["tiny_text_to_image"]


def item(**overrides: object) -> ImageGenerationItem:
    fields: dict[str, object] = {"prompt": "a red square", "steps": 2, "width": 32, "height": 48, "seed": 1}
    fields.update(overrides)
    return ImageGenerationItem(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def task(tiny_text_to_image: Path) -> Iterator[TextToImageTask]:
    with torch_threads(1):
        yield load_task(TextToImageTask(), tiny_text_to_image)


def decode(result: ImageResult) -> tuple[int, int]:
    from PIL import Image

    image = Image.open(io.BytesIO(result.png))
    assert image.format == "PNG"
    return image.size


def test_png_of_the_requested_size(task: TextToImageTask) -> None:
    [result] = task.run([item()])
    assert decode(result) == (32, 48) == (result.width, result.height)


def test_seed_reproduces_the_image(task: TextToImageTask) -> None:
    [a] = task.run([item(seed=7)])
    [b] = task.run([item(seed=7)])
    [c] = task.run([item(seed=8)])
    assert a.png == b.png
    assert a.png != c.png


def test_negative_prompt_and_guidance_change_the_image(task: TextToImageTask) -> None:
    [base] = task.run([item()])
    [negative] = task.run([item(negative_prompt="blue")])
    [unguided] = task.run([item(guidance_scale=0.0)])
    assert decode(negative) == decode(unguided) == (32, 48)
    assert negative.png != base.png
    assert unguided.png != base.png


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"prompt": ""}, "prompt is empty"),
        ({"width": 30}, "width must be a multiple of 8"),
        ({"height": 4}, "height must be between"),
        ({"width": 4096}, "width must be between 8 and 2048"),
        ({"steps": 0}, "steps"),
        ({"steps": 10_000}, "steps"),
        ({"guidance_scale": float("nan")}, "guidance_scale"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_input_is_invalid_input(task: TextToImageTask, overrides: dict[str, object], reason: str) -> None:
    with pytest.raises(InvalidInput, match=reason):
        task.run([item(**overrides)])


def test_check_item_accepts_the_defaults() -> None:
    check_item(ImageGenerationItem(prompt="x"))


def test_parse_size() -> None:
    assert parse_size("64x32") == (64, 32)
    with pytest.raises(InvalidInput, match="size"):
        parse_size("big")


def test_v2_round_trip(task: TextToImageTask) -> None:
    inputs = {
        "prompt": np.array([b"a cat", b"a dog"], dtype=np.object_),
        "negative_prompt": np.array([b"blurry"], dtype=np.object_),
    }
    parameters = {"steps": 2, "width": 32, "height": 32, "seed": 3, "guidance_scale": 5}
    items = task.decode_v2(inputs, parameters)
    assert [(i.prompt, i.negative_prompt, i.steps, i.width, i.seed) for i in items] == [
        ("a cat", "blurry", 2, 32, 3),
        ("a dog", "blurry", 2, 32, 3),
    ]
    encoded = task.encode_v2(task.run(items))
    assert encoded["image"].dtype == np.object_ and encoded["image"].shape == (2,)
    for png in encoded["image"]:
        assert png.startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("inputs", "parameters", "reason"),
    [
        ({}, {}, "missing input tensor 'prompt'"),
        ({"prompt": np.array([b"x"], dtype=np.object_)}, {"width": 30}, "multiple of 8"),
        ({"prompt": np.array([b"x"], dtype=np.object_)}, {"steps": "lots"}, "steps"),
        ({"prompt": np.array([b""], dtype=np.object_)}, {}, "empty"),
        (
            {
                "prompt": np.array([b"a", b"b", b"c"], dtype=np.object_),
                "negative_prompt": np.array([b"x", b"y"], dtype=np.object_),
            },
            {},
            "negative_prompt",
        ),
    ],
)
def test_v2_bad_input(
    task: TextToImageTask, inputs: dict[str, np.ndarray], parameters: dict[str, object], reason: str
) -> None:
    with pytest.raises(InvalidInput, match=reason):
        task.decode_v2(inputs, parameters)
