"""The parameters of the generative tasks: one pydantic model each, the one place their types and ranges
are written down.

``SamplingParameters`` (text-generation, vision) and ``DiffusionParameters`` (text-to-image) are checked
at the door by both protocols, before a request is queued: the OpenAI request bodies are built on them
(FastAPI validates the body), and a KServe v2 request's ``parameters`` object goes through
``generation_params``/``diffusion_params`` in the task's ``decode_v2``, which runs on the event loop
before admission.  A null value means "not given" (the default), as in the OpenAI API.

The generation tasks check their items once more on the inference thread with the same model
(``check_generation_params``): a request that came through a route always passes; an item built by hand
(a test, a custom handler's caller) gets the same 400-worthy reason.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from model_server.errors import InvalidInput
from model_server.tasks.base import GenerationParams, ImageGenerationItem

# Upper bound on new tokens per request whatever the model's context (bounds the time one request holds
# the single inference thread).
MAX_NEW_TOKENS = 4096
MAX_STOP_SEQUENCES = 4  # OpenAI's limit
MAX_SEED = 2**63 - 1
MAX_STEPS = 200
MAX_GUIDANCE = 50.0
MAX_SIDE = 2048
SIZE_MULTIPLE = 8  # the VAE's downsampling factor: image sides are multiples of it (``check_item``)

_SAMPLING = GenerationParams()
_DIFFUSION = ImageGenerationItem(prompt="")


def _not_bool(value: Any) -> Any:
    """Refuse booleans where a number is expected (pydantic would read ``true`` as 1)."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


Integer = Annotated[int, BeforeValidator(_not_bool)]
Number = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
MaxNewTokens = Annotated[Integer, Field(ge=1, le=MAX_NEW_TOKENS)]
Temperature = Annotated[Number, Field(ge=0.0, le=2.0)]
TopP = Annotated[Number, Field(gt=0.0, le=1.0)]
StopSequences = Annotated[
    tuple[Annotated[str, Field(min_length=1)], ...], Field(max_length=MAX_STOP_SEQUENCES)
]
Seed = Annotated[Integer, Field(ge=0, le=MAX_SEED)]
Steps = Annotated[Integer, Field(ge=1, le=MAX_STEPS)]
GuidanceScale = Annotated[Number, Field(ge=0.0, le=MAX_GUIDANCE)]
ImageSide = Annotated[Integer, Field(ge=SIZE_MULTIPLE, le=MAX_SIDE)]


class NullMeansDefault(BaseModel):
    """A parameter sent as null takes its default."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None}
        return data


class SamplingParameters(NullMeansDefault):
    """Sampling parameters of text-generation and vision (OpenAI's names and ranges)."""

    model_config = ConfigDict(frozen=True)

    max_tokens: MaxNewTokens = _SAMPLING.max_tokens
    temperature: Temperature = _SAMPLING.temperature
    top_p: TopP = _SAMPLING.top_p
    stop: StopSequences = _SAMPLING.stop
    seed: Seed | None = _SAMPLING.seed

    @model_validator(mode="before")
    @classmethod
    def _one_stop_string(cls, data: Any) -> Any:
        """``stop`` may be one string or a list of them."""
        if isinstance(data, Mapping) and isinstance(data.get("stop"), str):
            return {**data, "stop": [data["stop"]]}
        return data

    def generation_params(self) -> GenerationParams:
        return GenerationParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stop,
            seed=self.seed,
        )


class DiffusionParameters(NullMeansDefault):
    """text-to-image settings of a KServe v2 request (``num_inference_steps``, diffusers' name, wins over
    ``steps``)."""

    model_config = ConfigDict(frozen=True)

    steps: Steps = _DIFFUSION.steps
    num_inference_steps: Steps | None = None
    guidance_scale: GuidanceScale = _DIFFUSION.guidance_scale
    width: ImageSide = _DIFFUSION.width
    height: ImageSide = _DIFFUSION.height
    seed: Seed | None = _DIFFUSION.seed

    def item(self, prompt: str, negative_prompt: str | None) -> ImageGenerationItem:
        return ImageGenerationItem(
            prompt=prompt,
            negative_prompt=negative_prompt,
            steps=self.steps if self.num_inference_steps is None else self.num_inference_steps,
            guidance_scale=self.guidance_scale,
            width=self.width,
            height=self.height,
            seed=self.seed,
        )


ParametersT = TypeVar("ParametersT", bound=BaseModel)


def reason(exc: ValidationError) -> str:
    """A pydantic error as one line naming each wrong parameter and its value."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(x) for x in err["loc"]) or "parameters"
        parts.append(f"parameter '{where}': {err['msg']} (got {err['input']!r})")
    return "; ".join(parts)


def validated(model: type[ParametersT], values: Mapping[str, Any]) -> ParametersT:
    """``values`` checked by ``model``; ``InvalidInput`` (400) with the reason when they do not fit."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise InvalidInput(reason(exc)) from None


def generation_params(parameters: Mapping[str, Any]) -> GenerationParams:
    """A KServe v2 request's ``parameters`` -> sampling parameters.  v2 parameters are scalars, so
    ``stop`` may also be a JSON-encoded list of strings."""
    stop = parameters.get("stop")
    if isinstance(stop, str) and stop.startswith("["):
        try:
            parameters = {**parameters, "stop": json.loads(stop)}
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"parameter 'stop' is not a valid JSON list of strings: {exc}") from None
    return validated(SamplingParameters, parameters).generation_params()


def check_generation_params(params: GenerationParams) -> None:
    """Raise ``InvalidInput`` unless ``params`` fit ``SamplingParameters`` (see the module docstring)."""
    validated(SamplingParameters, dataclasses.asdict(params))


def diffusion_params(parameters: Mapping[str, Any]) -> DiffusionParameters:
    """A KServe v2 request's ``parameters`` -> text-to-image settings."""
    return validated(DiffusionParameters, parameters)
