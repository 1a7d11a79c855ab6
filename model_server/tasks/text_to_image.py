"""text-to-image: a diffusers pipeline (Stable Diffusion and anything ``DiffusionPipeline`` loads from a
``model_index.json`` folder) -> PNG.

Steps, guidance scale, size, seed (a ``torch.Generator`` on the model's device, so a seed reproduces the
image) and negative prompt per request.  Sizes must be multiples of 8 (the VAE's downsampling) within
``MAX_SIDE``; steps and guidance are bounded so one request cannot hold the inference thread for ever.
Not batchable.

v2: input ``prompt`` BYTES [-1], optional ``negative_prompt`` BYTES [-1] (one per prompt, or one for all);
``steps``, ``guidance_scale``, ``width``, ``height``, ``seed`` from the request's ``parameters``; output
``image`` BYTES [-1] (PNG bytes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from model_server.errors import InvalidInput
from model_server.tasks.base import (
    Emitter,
    ImageGenerationItem,
    ImageResult,
    LoadOptions,
    Task,
    TensorSpec,
    bytes_items,
    decode_text,
    require_tensor,
)
from model_server.tasks.devices import torch_dtype
from model_server.tasks.media import encode_png
from model_server.tasks.params import (
    MAX_GUIDANCE,
    MAX_SEED,
    MAX_SIDE,
    MAX_STEPS,
    SIZE_MULTIPLE,
    diffusion_params,
)

PROMPT_INPUT = TensorSpec("prompt", "BYTES", (-1,))
NEGATIVE_INPUT = TensorSpec("negative_prompt", "BYTES", (-1,), optional=True)
IMAGE_OUTPUT = TensorSpec("image", "BYTES", (-1,))


def check_item(item: ImageGenerationItem) -> None:
    """Pure: every parameter in range, with a reason the user can act on."""
    if not item.prompt.strip():
        raise InvalidInput("the prompt is empty")
    for side, value in (("width", item.width), ("height", item.height)):
        if not SIZE_MULTIPLE <= value <= MAX_SIDE:
            raise InvalidInput(f"{side} must be between {SIZE_MULTIPLE} and {MAX_SIDE}, got {value}")
        if value % SIZE_MULTIPLE:
            raise InvalidInput(f"{side} must be a multiple of {SIZE_MULTIPLE}, got {value}")
    if not 1 <= item.steps <= MAX_STEPS:
        raise InvalidInput(f"steps must be between 1 and {MAX_STEPS}, got {item.steps}")
    if not (math.isfinite(item.guidance_scale) and 0.0 <= item.guidance_scale <= MAX_GUIDANCE):
        raise InvalidInput(f"guidance_scale must be between 0 and {MAX_GUIDANCE}, got {item.guidance_scale}")
    if item.seed is not None and not 0 <= item.seed <= MAX_SEED:
        raise InvalidInput(f"seed must be between 0 and {MAX_SEED}, got {item.seed}")


def parse_size(size: str) -> tuple[int, int]:
    """Pure: OpenAI's ``size`` ("WIDTHxHEIGHT") -> (width, height), for the images route."""
    width, sep, height = size.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise InvalidInput(f"size must look like '512x512', got {size!r}")
    return int(width), int(height)


class TextToImageTask(Task[ImageGenerationItem, ImageResult]):
    """Prompt -> PNG through a diffusion pipeline."""

    name: ClassVar = "text-to-image"
    batchable: ClassVar[bool] = False
    v2_inputs: ClassVar[tuple[TensorSpec, ...]] = (PROMPT_INPUT, NEGATIVE_INPUT)
    v2_outputs: ClassVar[tuple[TensorSpec, ...]] = (IMAGE_OUTPUT,)

    def __init__(self) -> None:
        self._pipe: Any = None
        self._device = "cpu"

    def load(self, options: LoadOptions) -> None:
        import diffusers

        lib: Any = diffusers  # typed loosely: from_pretrained is not statically typed

        dtype = torch_dtype(options.dtype, options.device, half_on_cuda=True)
        pipe = lib.DiffusionPipeline.from_pretrained(
            options.path, dtype=dtype, trust_remote_code=options.trust_remote_code
        )
        pipe.set_progress_bar_config(disable=True)
        self._pipe = pipe.to(options.device)
        self._device = options.device

    def max_input_tokens(self) -> int | None:
        tokenizer = getattr(self._pipe, "tokenizer", None)
        limit = getattr(tokenizer, "model_max_length", None)
        return limit if isinstance(limit, int) else None

    def run(self, items: Sequence[ImageGenerationItem], emit: Emitter | None = None) -> list[ImageResult]:
        for item in items:
            check_item(item)
        return [self._one(item) for item in items]

    def _one(self, item: ImageGenerationItem) -> ImageResult:
        import torch

        generator = None
        if item.seed is not None:
            generator = torch.Generator(device=self._device).manual_seed(item.seed)
        with torch.inference_mode():
            output = self._pipe(
                prompt=item.prompt,
                negative_prompt=item.negative_prompt,
                num_inference_steps=item.steps,
                guidance_scale=item.guidance_scale,
                width=item.width,
                height=item.height,
                generator=generator,
                output_type="pil",
            )
        image = output.images[0]
        return ImageResult(png=encode_png(image), width=image.width, height=image.height)

    def warmup_items(self) -> list[ImageGenerationItem]:
        # One denoising step at the smallest size: the pipeline's first-call set-up, little compute.
        return [ImageGenerationItem(prompt="warm-up", steps=1, width=64, height=64, seed=0)]

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[ImageGenerationItem]:
        settings = diffusion_params(parameters)
        prompts = [
            decode_text(p, PROMPT_INPUT.name)
            for p in bytes_items(require_tensor(inputs, PROMPT_INPUT), PROMPT_INPUT.name)
        ]
        negatives: list[str | None] = [None] * len(prompts)
        if NEGATIVE_INPUT.name in inputs:
            raw = [
                decode_text(p, NEGATIVE_INPUT.name)
                for p in bytes_items(inputs[NEGATIVE_INPUT.name], NEGATIVE_INPUT.name)
            ]
            if len(raw) not in (1, len(prompts)):
                raise InvalidInput(
                    f"input tensor 'negative_prompt' has {len(raw)} elements; "
                    f"expected 1 or one per prompt ({len(prompts)})"
                )
            negatives = [n or None for n in (raw * len(prompts) if len(raw) == 1 else raw)]
        items = [settings.item(p, n) for p, n in zip(prompts, negatives, strict=True)]
        for item in items:
            check_item(item)
        return items

    def encode_v2(self, results: Sequence[ImageResult]) -> dict[str, npt.NDArray[Any]]:
        return {IMAGE_OUTPUT.name: np.array([r.png for r in results], dtype=np.object_)}
