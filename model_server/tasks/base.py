"""The one interface every task implements, and the typed items that flow through it.

A task owns three things and nothing else:
  * loading its model from a local directory (``load``), on the worker's inference thread;
  * running one unit of work (``run``): a list of items in, one result per item out, on that same thread
    (tokenisation and image decoding happen here too, never on the event loop);
  * its KServe v2 tensor contract: the input/output tensor specs (served as model metadata) and the
    conversion between v2 tensors and its items/results.

The data plane (queue, batching, deadlines) and the HTTP layer (v2 and OpenAI routes) never touch torch;
they only see these dataclasses.  The OpenAI routes build the same items directly from their JSON bodies.

Torch, transformers and diffusers are imported lazily inside ``load``/``run`` so that importing a task
module is cheap (the server answers health before the heavy imports finish).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

import numpy as np
import numpy.typing as npt

from model_server.errors import InvalidInput
from modelpool_contract.flags import EncoderRuntime
from modelpool_contract.tasks import TaskName

# KServe v2 datatypes used by the tasks.
V2Datatype = Literal["BYTES", "FP32", "FP16", "INT32", "INT64", "UINT8", "BOOL"]


@dataclass(frozen=True)
class TensorSpec:
    """One v2 input or output tensor as listed in model metadata (-1 = variable dimension)."""

    name: str
    datatype: V2Datatype
    shape: tuple[int, ...]
    optional: bool = False


@dataclass(frozen=True)
class LoadOptions:
    """How to load: the resolved local model directory, device and dtype (``auto`` resolved by the task)."""

    path: Path
    device: str  # "cpu" or "cuda" or "cuda:N" (already resolved from "auto" by the worker)
    dtype: str  # "auto" | "float32" | "float16" | "bfloat16"
    trust_remote_code: bool = False
    #: What an encoder's forward pass runs on (text-embedding; the other tasks run on torch).
    runtime: EncoderRuntime = "torch"


# ---- items (inputs) and results (outputs) per task -------------------------------------------------------


@dataclass(frozen=True)
class TextItem:
    """text-embedding: one text to embed."""

    text: str


@dataclass(frozen=True)
class Embedding:
    """text-embedding / image-embedding result: one vector, and how many input tokens it used."""

    vector: npt.NDArray[np.float32]
    tokens: int = 0
    truncated: bool = False


@dataclass(frozen=True)
class ImageItem:
    """image-embedding: one encoded image (PNG/JPEG/... bytes, already base64-decoded)."""

    image: bytes


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters shared by text-generation and vision (OpenAI names)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


@dataclass(frozen=True)
class GenerationItem:
    """text-generation: a prompt (chat requests are rendered to a prompt by the route)."""

    prompt: str
    params: GenerationParams = field(default_factory=GenerationParams)
    # Chat messages, when the request came from /v1/chat/completions; a task with a chat template
    # renders these itself, otherwise the route's plain rendering in ``prompt`` is used.
    messages: tuple[Mapping[str, str], ...] | None = None
    # The LoRA adapter the request's model field named (``--adapter``); None: the base model.
    adapter: str | None = None


@dataclass(frozen=True)
class VisionItem:
    """vision: an image plus an optional text prompt -> text."""

    image: bytes
    prompt: str | None = None
    params: GenerationParams = field(default_factory=GenerationParams)


@dataclass(frozen=True)
class GenerationResult:
    """text-generation / vision result."""

    text: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class ImageGenerationItem:
    """text-to-image: one prompt and the diffusion parameters."""

    prompt: str
    negative_prompt: str | None = None
    steps: int = 25
    guidance_scale: float = 7.5
    width: int = 512
    height: int = 512
    seed: int | None = None


@dataclass(frozen=True)
class ImageResult:
    """text-to-image result: a PNG."""

    png: bytes
    width: int
    height: int


ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")

# Called from the inference thread with each new piece of generated text (streaming routes only).
Emitter = Callable[[str], None]


class Task(abc.ABC, Generic[ItemT, ResultT]):
    """A model behind one task.  ``load``, ``run`` and ``warmup_items`` run on the single inference thread
    that owns the model, in the inference process.  The v2 codecs (``decode_v2``, ``encode_v2``) and
    ``length_hint`` run in the HTTP processes, on an instance that was never loaded: they must not use
    what ``load`` sets up (and the task's module must not import torch at import time)."""

    name: ClassVar[TaskName]
    # True: the data plane may merge items of several requests into one ``run`` call (dynamic batching).
    batchable: ClassVar[bool]
    v2_inputs: ClassVar[tuple[TensorSpec, ...]]
    v2_outputs: ClassVar[tuple[TensorSpec, ...]]

    @abc.abstractmethod
    def load(self, options: LoadOptions) -> None:
        """Load weights/tokenizer/processor.  Raises on failure (the worker turns it into Failed)."""

    @abc.abstractmethod
    def run(self, items: Sequence[ItemT], emit: Emitter | None = None) -> list[ResultT]:
        """One unit of work: a result per item, in order.  Raise ``InvalidInput`` for a bad item (4xx);
        any other exception fails the whole unit (500).  ``emit`` is only passed for a single streaming
        item."""

    @abc.abstractmethod
    def decode_v2(self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]) -> list[ItemT]:
        """v2 input tensors (already decoded to numpy; BYTES as object arrays of ``bytes``) -> items.
        Raise ``InvalidInput`` with a reason naming the tensor for a wrong name/shape/datatype."""

    @abc.abstractmethod
    def encode_v2(self, results: Sequence[ResultT]) -> dict[str, npt.NDArray[Any]]:
        """Results -> v2 output tensors by name (BYTES outputs as object arrays of ``bytes``)."""

    # Optional, for metadata and limits.
    def max_input_tokens(self) -> int | None:
        """The model's input length limit, when it has one (known after ``load``)."""
        return None

    def warmup_items(self) -> list[ItemT]:
        """A representative input, run once after ``load`` and before the worker turns Ready, so the
        first request does not pay for first-call set-up (CUDA context and kernels, allocator pools,
        lazy imports).  ``[]``: no warm-up."""
        return []

    def length_hint(self, item: ItemT) -> int:
        """A cheap estimate of an item's size (a text's length), computed in the HTTP processes on an
        instance that was never loaded: the batcher groups items of similar size from different requests
        into one forward pass.  0 (the default): items are batched in arrival order."""
        return 0


def require_tensor(inputs: Mapping[str, npt.NDArray[Any]], spec: TensorSpec) -> npt.NDArray[Any]:
    """Fetch a required v2 input by name, with an actionable error when it is missing."""
    if spec.name not in inputs:
        names = ", ".join(sorted(inputs)) or "none"
        raise InvalidInput(f"missing input tensor '{spec.name}' ({spec.datatype}); got: {names}")
    return inputs[spec.name]


def bytes_items(array: npt.NDArray[Any], tensor: str) -> list[bytes]:
    """Flatten a BYTES tensor to a list of ``bytes`` (rejecting other datatypes and empty input)."""
    if array.dtype != np.object_:
        raise InvalidInput(f"input tensor '{tensor}' must have datatype BYTES")
    flat = [x if isinstance(x, bytes) else str(x).encode() for x in array.reshape(-1).tolist()]
    if not flat:
        raise InvalidInput(f"input tensor '{tensor}' is empty")
    return flat


def decode_text(raw: bytes, tensor: str) -> str:
    """UTF-8 decode with a 400-worthy message instead of a crash."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"input tensor '{tensor}' holds bytes that are not valid UTF-8: {exc}") from None
