"""vision: an image plus an optional text prompt -> text (captioning, visual question answering).

Model families, picked from the config:
  * ``vision-encoder-decoder`` (ViT/Swin/... encoder + GPT-2/BERT/... decoder: captioning, OCR): loaded
    as ``VisionEncoderDecoderModel`` with ``AutoImageProcessor`` and ``AutoTokenizer``; a prompt becomes
    the start of the decoder's text and the answer is its continuation;
  * everything else ``AutoModelForImageTextToText`` knows (BLIP, LLaVA, Idefics, Qwen-VL, ...) with
    ``AutoProcessor``; when the processor has a chat template the prompt is rendered through it with the
    image placed before the text.
Sampling, stop sequences and streaming are ``tasks.generation``'s.  Not batchable.

v2: inputs ``image`` BYTES [-1] and optional ``prompt`` BYTES [-1] (one per image, or one for all);
sampling parameters from the request's ``parameters`` as for text-generation; output ``text_output``
BYTES [-1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy.typing as npt

from model_server.errors import InvalidInput
from model_server.tasks.base import (
    Emitter,
    GenerationResult,
    LoadOptions,
    TensorSpec,
    VisionItem,
    bytes_items,
    decode_text,
    require_tensor,
)
from model_server.tasks.devices import torch_dtype
from model_server.tasks.generation import (
    WARMUP_PARAMS,
    GenerativeTask,
    check_context,
    context_length,
    ensure_pad_token,
)
from model_server.tasks.media import decode_image, warmup_png
from model_server.tasks.params import check_generation_params, generation_params

IMAGE_INPUT = TensorSpec("image", "BYTES", (-1,))
PROMPT_INPUT = TensorSpec("prompt", "BYTES", (-1,), optional=True)


def pair_prompts(images: int, prompts: list[str] | None) -> list[str | None]:
    """Pure: one prompt per image; a single prompt applies to every image."""
    if prompts is None:
        return [None] * images
    if len(prompts) == 1:
        return [prompts[0]] * images
    if len(prompts) != images:
        raise InvalidInput(
            f"input tensor 'prompt' has {len(prompts)} elements; expected 1 or one per image ({images})"
        )
    return [*prompts]


class VisionTask(GenerativeTask[VisionItem]):
    """Image (+ prompt) -> generated text, optionally streamed."""

    name: ClassVar = "vision"
    v2_inputs: ClassVar[tuple[TensorSpec, ...]] = (IMAGE_INPUT, PROMPT_INPUT)

    def __init__(self) -> None:
        super().__init__()
        self._image_processor: Any = None  # encoder-decoder models
        self._processor: Any = None  # image-text-to-text models
        self._encoder_decoder = False
        self._dtype: Any = None

    def load(self, options: LoadOptions) -> None:
        import transformers

        lib: Any = transformers  # typed loosely: the Auto* factories are not statically typed

        remote = options.trust_remote_code
        self._dtype = torch_dtype(options.dtype, options.device, half_on_cuda=True)
        config = lib.AutoConfig.from_pretrained(options.path, trust_remote_code=remote)
        self._encoder_decoder = config.model_type == "vision-encoder-decoder"
        kwargs: dict[str, Any] = {"dtype": self._dtype, "trust_remote_code": remote}
        if self._encoder_decoder:
            model = lib.VisionEncoderDecoderModel.from_pretrained(options.path, **kwargs)
            self._image_processor = lib.AutoImageProcessor.from_pretrained(
                options.path, trust_remote_code=remote
            )
            self._tokenizer = lib.AutoTokenizer.from_pretrained(options.path, trust_remote_code=remote)
        else:
            model = lib.AutoModelForImageTextToText.from_pretrained(options.path, **kwargs)
            self._processor = lib.AutoProcessor.from_pretrained(options.path, trust_remote_code=remote)
            self._tokenizer = self._processor.tokenizer
        self._model = model.to(options.device).eval()
        ensure_pad_token(self._model, self._tokenizer)
        # The text side's context window bounds prompt + answer (the decoder's, or the language model's).
        text_config = config.decoder if self._encoder_decoder else getattr(config, "text_config", config)
        self._context = context_length(text_config, self._tokenizer)
        self._device = options.device

    def run(self, items: Sequence[VisionItem], emit: Emitter | None = None) -> list[GenerationResult]:
        for item in items:
            check_generation_params(item.params)
        images = [decode_image(item.image, i) for i, item in enumerate(items)]
        single = emit if len(items) == 1 else None
        return [self._one(image, item, single) for image, item in zip(images, items, strict=True)]

    def _inputs(self, image: Any, prompt: str | None) -> tuple[dict[str, Any], int]:
        """Model inputs on the device, and how many prompt tokens they hold."""
        import torch

        if self._encoder_decoder:
            pixels = self._image_processor(images=image, return_tensors="pt")["pixel_values"]
            inputs: dict[str, Any] = {"pixel_values": pixels.to(self._device, dtype=self._dtype)}
            if not prompt:
                return inputs, 0
            ids = self._tokenizer(prompt, add_special_tokens=False)["input_ids"]
            start = self._model.generation_config.decoder_start_token_id
            if start is None:
                start = self._model.config.decoder_start_token_id
            inputs["decoder_input_ids"] = torch.tensor([[start, *ids]], device=self._device)
            return inputs, len(ids)
        text = prompt or ""
        if getattr(self._processor, "chat_template", None):
            content: list[dict[str, str]] = [{"type": "image"}]
            if prompt:
                content.append({"type": "text", "text": prompt})
            text = self._processor.apply_chat_template(
                [{"role": "user", "content": content}], add_generation_prompt=True
            )
        # No text at all (not an empty string) when there is no prompt: captioners such as BLIP then
        # start from their own start token.
        kwargs = {"text": text} if text else {}
        encoded = self._processor(images=image, return_tensors="pt", **kwargs)
        inputs = {}
        for key, value in encoded.items():
            floating = hasattr(value, "is_floating_point") and value.is_floating_point()
            inputs[key] = value.to(self._device, dtype=self._dtype) if floating else value.to(self._device)
        prompt_tokens = int(inputs["input_ids"].shape[-1]) if "input_ids" in inputs else 0
        return inputs, prompt_tokens

    def _one(self, image: Any, item: VisionItem, emit: Emitter | None) -> GenerationResult:
        inputs, prompt_tokens = self._inputs(image, item.prompt)
        # Image-text-to-text models put the image's tokens into input_ids, so they count here too.
        check_context(prompt_tokens + 1, item.params.max_tokens, self._context, allow_empty=True)
        return self._generate(inputs, prompt_tokens, item.params, emit)

    def warmup_items(self) -> list[VisionItem]:
        return [VisionItem(image=warmup_png(), params=WARMUP_PARAMS)]

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[VisionItem]:
        params = generation_params(parameters)
        images = bytes_items(require_tensor(inputs, IMAGE_INPUT), IMAGE_INPUT.name)
        prompts = None
        if PROMPT_INPUT.name in inputs:
            raw = bytes_items(inputs[PROMPT_INPUT.name], PROMPT_INPUT.name)
            prompts = [decode_text(p, PROMPT_INPUT.name) for p in raw]
        return [
            VisionItem(image=image, prompt=prompt or None, params=params)
            for image, prompt in zip(images, pair_prompts(len(images), prompts), strict=True)
        ]
