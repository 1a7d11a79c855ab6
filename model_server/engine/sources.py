"""Resolving a model ``source`` to a local directory.

Forms (docs/design.md, "Contracts"): a local path (``/models/x``), ``file:///models/x``, ``hf://org/name[@revision]``
(downloaded with huggingface_hub into its cache, which workers may share: ``model_server.engine.download``;
every file of the snapshot must lie inside that cache once its symlinks are followed, ``check_inside``),
``pvc://claim/sub/path`` (the claim mounted by the operator under ``pvc_root``, by default
``modelpool_contract.mounts.PVC_MOUNT_ROOT``).  Parsing is pure (``parse_source``); only ``resolve``
touches disk/network.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import unquote, urlparse

from model_server.engine.download import DownloadProgress, download
from modelpool_contract.mounts import PVC_MOUNT_ROOT, PvcSourceError, parse_pvc_source


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
    try:
        pvc = parse_pvc_source(source)
    except PvcSourceError as exc:
        raise SourceError(str(exc)) from None
    if pvc is not None:
        return Source("pvc", pvc.path, claim=pvc.claim)
    if source.startswith("file://"):
        parsed = urlparse(source)
        if parsed.netloc not in ("", "localhost"):
            raise SourceError(f"file:// source must be a local path, got host {parsed.netloc!r}")
        return Source("local", unquote(parsed.path))
    if "://" in source:
        raise SourceError(f"unsupported source scheme in {source!r} (use a path, file://, hf://, pvc://)")
    return Source("local", source)


def resolve(
    source: str,
    *,
    hf_home: Path | None = None,
    pvc_root: Path = Path(PVC_MOUNT_ROOT),
    progress: DownloadProgress | None = None,
) -> Path:
    """The local model directory for ``source`` (downloading hf:// sources first, with ``progress``)."""
    parsed = parse_source(source)
    if parsed.kind == "hf":
        hub = hf_home / "hub" if hf_home else None
        path = download(parsed.path, parsed.revision, hub, progress)
        check_inside(path, hub if hub is not None else _default_hub())
    elif parsed.kind == "pvc":
        assert parsed.claim is not None
        path = pvc_root / parsed.claim / parsed.path
    else:
        path = Path(parsed.path)
    if not path.is_dir():
        raise SourceError(f"model directory {path} does not exist (source {source!r})")
    return path


def _default_hub() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def check_inside(snapshot: Path, cache: Path) -> None:
    """Raise ``SourceError`` unless ``snapshot`` and every entry below it, symlinks followed, lie inside
    ``cache``.

    huggingface_hub's snapshots are symlinks into the cache's ``blobs``; a cache that workers share (a
    claim, a node's directory) is writable by whoever else mounts it, who could plant a link to another
    directory (another tenant's weights or remote code, a file of the node). The model is never loaded
    through such a link. Directories are walked without following their links: a linked directory is
    itself checked as an entry."""
    root = os.path.realpath(cache)

    def inside(path: str) -> bool:
        real = os.path.realpath(path)
        return real == root or real.startswith(root.rstrip("/") + "/")

    if not inside(str(snapshot)):
        raise SourceError(f"the model snapshot {snapshot} leaves the model cache {cache} (a symlink)")
    for directory, dirs, files in os.walk(snapshot):
        for name in (*dirs, *files):
            entry = os.path.join(directory, name)
            if not inside(entry):
                target = os.path.realpath(entry)
                raise SourceError(
                    f"{entry} links to {target}, outside the model cache {cache}: refusing to load it "
                    "(a shared cache is writable by every worker that mounts it)"
                )
