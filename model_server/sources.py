"""Resolving a model ``source`` to a local directory.

Forms: a local path (``/models/x``), ``file:///models/x``, ``hf://org/name[@revision]``
(downloaded with huggingface_hub into ``HF_HOME``; safetensors preferred: the pickle formats are only
fetched when the repository has no safetensors), ``pvc://claim/sub/path`` (the claim mounted by the
operator under ``pvc_root``).  Parsing is pure (``parse_source``); only ``resolve`` touches disk/network.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

# Weight formats that are never fetched when safetensors exist (pickles can execute code on load).
_PICKLE_WEIGHTS = [
    "*.bin",
    "*.pt",
    "*.pth",
    "*.ckpt",
    "*.pkl",
    "*.h5",
    "*.msgpack",
    "*.ot",
    "*.onnx",
    "*.tflite",
]


class SourceError(ValueError):
    """The source string is malformed or does not point at a usable model directory."""


@dataclass(frozen=True)
class Source:
    kind: Literal["local", "hf", "pvc"]
    path: str  # local/pvc: the path; hf: the repo id
    revision: str | None = None
    claim: str | None = None


def parse_source(source: str) -> Source:
    """Pure: a source string -> ``Source`` (raises ``SourceError`` with a reason)."""
    if source.startswith("hf://"):
        rest = source[len("hf://") :].strip("/")
        repo, _, revision = rest.partition("@")
        if repo.count("/") > 1 or not repo or any(not p for p in repo.split("/")):
            raise SourceError(f"hf source must be hf://org/name[@revision], got {source!r}")
        if "@" in rest and not revision:
            raise SourceError(f"empty revision in {source!r}")
        return Source("hf", repo, revision or None)
    if source.startswith("pvc://"):
        rest = source[len("pvc://") :]
        claim, _, sub = rest.partition("/")
        if not claim:
            raise SourceError(f"pvc source must be pvc://claim[/sub/path], got {source!r}")
        return Source("pvc", sub.strip("/"), claim=claim)
    if source.startswith("file://"):
        parsed = urlparse(source)
        if parsed.netloc not in ("", "localhost"):
            raise SourceError(f"file:// source must be a local path, got host {parsed.netloc!r}")
        return Source("local", unquote(parsed.path))
    if "://" in source:
        raise SourceError(f"unsupported source scheme in {source!r} (use a path, file://, hf://, pvc://)")
    return Source("local", source)


def resolve(source: str, *, hf_home: Path | None = None, pvc_root: Path = Path("/mnt/pvc")) -> Path:
    """The local model directory for ``source`` (downloading hf:// sources first)."""
    parsed = parse_source(source)
    if parsed.kind == "hf":
        path = _download(parsed.path, parsed.revision, hf_home)
    elif parsed.kind == "pvc":
        assert parsed.claim is not None
        path = pvc_root / parsed.claim / parsed.path
    else:
        path = Path(parsed.path)
    if not path.is_dir():
        raise SourceError(f"model directory {path} does not exist (source {source!r})")
    return path


def _download(repo_id: str, revision: str | None, hf_home: Path | None) -> Path:
    from huggingface_hub import HfApi, snapshot_download

    cache_dir = str(hf_home / "hub") if hf_home else None
    if hf_home:
        os.environ.setdefault("HF_HOME", str(hf_home))
    ignore: list[str] | None = _PICKLE_WEIGHTS
    try:
        files = HfApi().list_repo_files(repo_id, revision=revision)
        if not any(f.endswith(".safetensors") for f in files):
            ignore = None  # no safetensors: the only weights there are
    except Exception:  # offline: take what the cache has, safetensors only
        pass
    return Path(snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, ignore_patterns=ignore))
