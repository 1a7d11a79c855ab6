"""text-generation: a causal language model (``AutoModelForCausalLM``) behind ``generate``.

Chat requests are rendered with the tokenizer's chat template when it has one (otherwise the route's plain
rendering in ``GenerationItem.prompt`` is used).  Sampling, stop sequences and streaming live in
``tasks.generation``.  Not batchable: one request's prompts run one after another.

v2: input ``text_input`` BYTES [-1] (one prompt per element); sampling parameters come from the request's
``parameters`` (``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``); output ``text_output``
BYTES [-1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy.typing as npt

from model_server.errors import InvalidInput
from model_server.tasks.base import (
    Emitter,
    GenerationItem,
    GenerationResult,
    LoadOptions,
    TensorSpec,
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
from model_server.tasks.params import check_generation_params, generation_params

TEXT_INPUT = TensorSpec("text_input", "BYTES", (-1,))


class TextGenerationTask(GenerativeTask[GenerationItem]):
    """A causal LM: prompt (or chat messages) -> completion, optionally streamed."""

    name: ClassVar = "text-generation"
    v2_inputs: ClassVar[tuple[TensorSpec, ...]] = (TEXT_INPUT,)

    def load(self, options: LoadOptions) -> None:
        import transformers

        lib: Any = transformers  # typed loosely: the Auto* factories are not statically typed

        dtype = torch_dtype(options.dtype, options.device, half_on_cuda=True)
        self._tokenizer = lib.AutoTokenizer.from_pretrained(
            options.path, trust_remote_code=options.trust_remote_code
        )
        model = lib.AutoModelForCausalLM.from_pretrained(
            options.path, dtype=dtype, trust_remote_code=options.trust_remote_code
        )
        self._model = model.to(options.device).eval()
        ensure_pad_token(self._model, self._tokenizer)
        self._device = options.device
        self._context = context_length(model.config, self._tokenizer)

    def render(self, item: GenerationItem) -> tuple[str, bool]:
        """The text to tokenize and whether it already holds the special tokens (a chat template adds
        them itself)."""
        template = getattr(self._tokenizer, "chat_template", None)
        if item.messages is not None and template:
            try:
                rendered = self._tokenizer.apply_chat_template(
                    [dict(m) for m in item.messages], tokenize=False, add_generation_prompt=True
                )
            except Exception as exc:  # jinja raises for messages a template refuses (e.g. role order)
                raise InvalidInput(f"the model's chat template rejected the messages: {exc}") from None
            return str(rendered), True
        return item.prompt, False

    def run(self, items: Sequence[GenerationItem], emit: Emitter | None = None) -> list[GenerationResult]:
        # Validate every item first, so a bad second prompt does not waste the first one's compute.
        for item in items:
            check_generation_params(item.params)
        return [self._one(item, emit if len(items) == 1 else None) for item in items]

    def _one(self, item: GenerationItem, emit: Emitter | None) -> GenerationResult:
        text, templated = self.render(item)
        if not text.strip():
            raise InvalidInput("the prompt is empty")
        encoded = self._tokenizer(text, return_tensors="pt", add_special_tokens=not templated)
        prompt_tokens = int(encoded["input_ids"].shape[-1])
        check_context(prompt_tokens, item.params.max_tokens, self._context)
        inputs = {k: v.to(self._device) for k, v in encoded.items() if k in ("input_ids", "attention_mask")}
        if item.adapter is None:
            return self._generate(inputs, prompt_tokens, item.params, emit)
        if self.adapters is None:
            raise InvalidInput(f"this model has no adapter {item.adapter!r}")
        with self.adapters.applied(item.adapter):  # loaded on demand, applied to this generate alone
            return self._generate(inputs, prompt_tokens, item.params, emit)

    def warmup_items(self) -> list[GenerationItem]:
        return [GenerationItem(prompt="Hello", params=WARMUP_PARAMS)]

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[GenerationItem]:
        params = generation_params(parameters)
        prompts = bytes_items(require_tensor(inputs, TEXT_INPUT), TEXT_INPUT.name)
        return [GenerationItem(prompt=decode_text(p, TEXT_INPUT.name), params=params) for p in prompts]
