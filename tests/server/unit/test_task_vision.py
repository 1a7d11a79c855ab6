"""vision through the real task class and tiny models saved to disk (a ViT + GPT-2 VisionEncoderDecoder,
and a BLIP captioner for the image-text-to-text path): captions with and without a prompt, determinism,
streaming, corrupt images, and the v2 codec."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from model_server.errors import InvalidInput
from model_server.tasks.base import GenerationParams, VisionItem
from model_server.tasks.vision import VisionTask, pair_prompts
from tests.server.tiny_fixtures import (
    gradient_png,
    image_bytes,
    load_task,
    tiny_vision,
    tiny_vision_blip,
    torch_threads,
)

__all__ = ["tiny_vision", "tiny_vision_blip"]

GREEDY = GenerationParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def task(tiny_vision: Path) -> Iterator[VisionTask]:
    with torch_threads(1):
        yield load_task(VisionTask(), tiny_vision)


def test_caption_is_deterministic_and_bounded(task: VisionTask) -> None:
    item = VisionItem(image=gradient_png(), params=GREEDY)
    [first] = task.run([item])
    [second] = task.run([item])
    assert first == second
    assert first.text
    assert first.completion_tokens <= GREEDY.max_tokens
    assert first.finish_reason == "length"  # the tiny decoder never picks end-of-text
    assert first.prompt_tokens == 0


def test_prompt_prefixes_the_decoder(task: VisionTask) -> None:
    [plain] = task.run([VisionItem(image=gradient_png(), params=GREEDY)])
    [prompted] = task.run(
        [VisionItem(image=gradient_png(), prompt="What is in this picture?", params=GREEDY)]
    )
    assert prompted.prompt_tokens > 0
    assert prompted.completion_tokens <= GREEDY.max_tokens
    # The answer continues the prompt, so greedy decoding differs from the unprompted caption.
    assert prompted.text != plain.text


def test_streaming_pieces_join_to_the_final_text(task: VisionTask) -> None:
    pieces: list[str] = []
    [streamed] = task.run(
        [VisionItem(image=image_bytes("red"), prompt="A red", params=GREEDY)], emit=pieces.append
    )
    assert pieces
    assert "".join(pieces) == streamed.text
    [again] = task.run([VisionItem(image=image_bytes("red"), prompt="A red", params=GREEDY)])
    assert again.text == streamed.text


def test_corrupt_image_and_bad_params(task: VisionTask) -> None:
    with pytest.raises(InvalidInput, match="image 0 is not a decodable image"):
        task.run([VisionItem(image=b"\x89PNG broken", params=GREEDY)])
    with pytest.raises(InvalidInput, match="max_tokens"):
        task.run([VisionItem(image=gradient_png(), params=GenerationParams(max_tokens=0))])
    assert task.run([VisionItem(image=gradient_png(), params=GREEDY)])[0].text  # still serving


def test_prompt_and_answer_must_fit_the_decoder(task: VisionTask) -> None:
    assert task.max_input_tokens() == 128  # the tiny GPT-2 decoder's n_positions
    with pytest.raises(InvalidInput, match="maximum context length is 128"):
        task.run([VisionItem(image=gradient_png(), prompt="picture " * 100, params=GREEDY)])
    with pytest.raises(InvalidInput, match="maximum context length is 128"):
        task.run([VisionItem(image=gradient_png(), params=GenerationParams(max_tokens=200))])


def test_pair_prompts() -> None:
    assert pair_prompts(2, None) == [None, None]
    assert pair_prompts(3, ["x"]) == ["x", "x", "x"]
    assert pair_prompts(2, ["a", "b"]) == ["a", "b"]
    with pytest.raises(InvalidInput, match="'prompt' has 2 elements"):
        pair_prompts(3, ["a", "b"])


def test_v2_round_trip(task: VisionTask) -> None:
    inputs = {
        "image": np.array([gradient_png(), image_bytes("blue")], dtype=np.object_),
        "prompt": np.array([b"Describe"], dtype=np.object_),
    }
    items = task.decode_v2(inputs, {"max_tokens": 6, "temperature": 0})
    assert [i.prompt for i in items] == ["Describe", "Describe"]
    assert items[0].params.max_tokens == 6
    results = task.run(items)
    encoded = task.encode_v2(results)
    assert [x.decode() for x in encoded["text_output"]] == [r.text for r in results]
    no_prompt = task.decode_v2({"image": inputs["image"]}, {})
    assert [i.prompt for i in no_prompt] == [None, None]


def test_v2_bad_input(task: VisionTask) -> None:
    with pytest.raises(InvalidInput, match="missing input tensor 'image'"):
        task.decode_v2({"prompt": np.array([b"x"], dtype=np.object_)}, {})
    with pytest.raises(InvalidInput, match="'prompt' has 2 elements"):
        task.decode_v2(
            {
                "image": np.array([gradient_png()] * 3, dtype=np.object_),
                "prompt": np.array([b"a", b"b"], dtype=np.object_),
            },
            {},
        )


# ---- the image-text-to-text path (BLIP through AutoModelForImageTextToText + AutoProcessor) ----


@pytest.fixture(scope="module")
def blip(tiny_vision_blip: Path) -> Iterator[VisionTask]:
    with torch_threads(1):
        yield load_task(VisionTask(), tiny_vision_blip)


def test_image_text_to_text_model_captions_and_streams(blip: VisionTask) -> None:
    pieces: list[str] = []
    [caption] = blip.run([VisionItem(image=gradient_png(), params=GREEDY)], emit=pieces.append)
    assert caption.text
    assert caption.finish_reason == "length" and caption.completion_tokens == GREEDY.max_tokens
    assert "".join(pieces) == caption.text
    [prompted] = blip.run([VisionItem(image=gradient_png(), prompt="a picture of", params=GREEDY)])
    assert prompted.prompt_tokens > 0
    assert prompted.completion_tokens == GREEDY.max_tokens
    assert blip.run([VisionItem(image=gradient_png(), params=GREEDY)]) == [caption]
