"""image-embedding: CLIP-style image features, L2-normalised (cosine similarity = dot product).

Model families: any dual encoder with ``get_image_features`` (CLIP, SigLIP, ...: ``AutoModel``) and the
vision towers with a projection (``CLIPVisionModelWithProjection`` and the like, picked from the config's
``architectures``).  Images arrive as encoded bytes (PNG, JPEG, ...) and are decoded on the inference
thread; a corrupt image fails the unit with ``InvalidInput`` naming the item.  Batchable: the data plane
merges several requests' images into one forward pass.

v2: input ``image`` BYTES [-1] (encoded image bytes, one image per element); output ``embedding`` FP32
[-1, dim].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from model_server.errors import InvalidInput
from model_server.tasks.base import (
    Embedding,
    Emitter,
    ImageItem,
    LoadOptions,
    Task,
    TensorSpec,
    bytes_items,
    require_tensor,
)
from model_server.tasks.devices import torch_dtype
from model_server.tasks.media import decode_image, warmup_png

IMAGE_INPUT = TensorSpec("image", "BYTES", (-1,))
EMBEDDING_OUTPUT = TensorSpec("embedding", "FP32", (-1, -1))


def image_tower_class(architectures: Sequence[str]) -> str | None:
    """Pure: the transformers class to load when the checkpoint is a projected vision tower alone (its
    ``AutoModel`` mapping would drop the projection); ``None`` means ``AutoModel``."""
    for arch in architectures:
        if arch.endswith("VisionModelWithProjection"):
            return arch
    return None


def image_features(model: Any, pixel_values: Any) -> Any:
    """The projected image embedding, whatever the model family returns it as."""
    if hasattr(model, "get_image_features"):
        out = model.get_image_features(pixel_values=pixel_values)
        # transformers < 5 returns the tensor; 5.x a ModelOutput whose pooler_output is projected.
        return out if hasattr(out, "ndim") else out.pooler_output
    return model(pixel_values=pixel_values).image_embeds


class ImageEmbeddingTask(Task[ImageItem, Embedding]):
    """Encoded images -> unit-length embedding vectors."""

    name: ClassVar = "image-embedding"
    batchable: ClassVar[bool] = True
    v2_inputs: ClassVar[tuple[TensorSpec, ...]] = (IMAGE_INPUT,)
    v2_outputs: ClassVar[tuple[TensorSpec, ...]] = (EMBEDDING_OUTPUT,)

    def __init__(self) -> None:
        self._model: Any = None
        self._processor: Any = None
        self._device = "cpu"
        self._dtype: Any = None
        self.dim = 0

    def load(self, options: LoadOptions) -> None:
        import transformers

        lib: Any = transformers  # typed loosely: the Auto* factories are not statically typed

        remote = options.trust_remote_code
        self._dtype = torch_dtype(options.dtype, options.device, half_on_cuda=True)
        config = lib.AutoConfig.from_pretrained(options.path, trust_remote_code=remote)
        tower = image_tower_class(getattr(config, "architectures", None) or [])
        cls = getattr(lib, tower) if tower else lib.AutoModel
        model = cls.from_pretrained(options.path, dtype=self._dtype, trust_remote_code=remote)
        self._model = model.to(options.device).eval()
        self._processor = lib.AutoImageProcessor.from_pretrained(options.path, trust_remote_code=remote)
        self._device = options.device
        projection = getattr(config, "projection_dim", None)
        self.dim = int(projection) if isinstance(projection, int) else 0

    def run(self, items: Sequence[ImageItem], emit: Emitter | None = None) -> list[Embedding]:
        import torch

        if not items:
            return []
        images = [decode_image(item.image, i) for i, item in enumerate(items)]
        pixels = self._processor(images=images, return_tensors="pt")["pixel_values"]
        pixels = pixels.to(self._device, dtype=self._dtype)
        with torch.inference_mode():
            features = image_features(self._model, pixels)
            vectors = torch.nn.functional.normalize(features.float(), dim=-1).cpu().numpy()
        self.dim = int(vectors.shape[-1])
        return [Embedding(vector=np.ascontiguousarray(row, dtype=np.float32)) for row in vectors]

    def warmup_items(self) -> list[ImageItem]:
        return [ImageItem(image=warmup_png())]

    def decode_v2(
        self, inputs: Mapping[str, npt.NDArray[Any]], parameters: Mapping[str, Any]
    ) -> list[ImageItem]:
        return [ImageItem(image=raw) for raw in bytes_items(require_tensor(inputs, IMAGE_INPUT), "image")]

    def encode_v2(self, results: Sequence[Embedding]) -> dict[str, npt.NDArray[Any]]:
        if not results:
            raise InvalidInput("no images to embed")
        return {EMBEDDING_OUTPUT.name: np.stack([r.vector for r in results]).astype(np.float32)}
