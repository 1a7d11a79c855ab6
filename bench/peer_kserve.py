"""The KServe peer of ``bench.peers``: KServe's Python model server with a sentence-transformers model class,
as a KServe user serves an embedding model (``kserve.Model``: ``load`` then a synchronous ``predict`` in the
server's process).  Runs in KServe's own environment (``.bench/peers/kserve``), not this repository's:
it imports nothing from here.

    python bench/peer_kserve.py --model_dir DIR --model_name minilm --http_port PORT --enable_grpc false

v1 predict: ``{"instances": [text, ...]}`` -> ``{"predictions": [[float, ...], ...]}``.
"""

from __future__ import annotations

import argparse
from typing import Any

import kserve
import uvicorn
from kserve import model_server
from sentence_transformers import SentenceTransformer

_Config = uvicorn.Config


def _loopback_config(*args: Any, **kwargs: Any) -> uvicorn.Config:
    """KServe's REST server binds 0.0.0.0 (not a flag): the bench keeps every server on loopback."""
    kwargs["host"] = "127.0.0.1"
    return _Config(*args, **kwargs)


class SentenceTransformerModel(kserve.Model):  # type: ignore[misc]
    """A sentence-transformers folder (its pooling and normalisation included), on the CPU."""

    def __init__(self, name: str, model_dir: str) -> None:
        super().__init__(name)
        self.model_dir = model_dir
        self.model: Any = None
        self.load()

    def load(self) -> bool:
        self.model = SentenceTransformer(self.model_dir, device="cpu")
        self.ready = True
        return True

    def predict(self, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
        texts = payload["instances"]
        return {"predictions": self.model.encode(texts, convert_to_numpy=True).tolist()}


def main() -> None:
    uvicorn.Config = _loopback_config  # type: ignore[misc,assignment]
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("--model_dir", required=True)
    args, _ = parser.parse_known_args()
    kserve.ModelServer().start([SentenceTransformerModel(args.model_name, args.model_dir)])


if __name__ == "__main__":
    main()
