"""Downloading an ``hf://`` model into the huggingface_hub cache, which workers may share, with progress.

The cache is huggingface_hub's own (``$HF_HOME/hub``, or ``--hf-home``/hub), and it is made for
sharing: each file is a blob named by its etag, and ``hf_hub_download`` fetches a blob only while
holding a file lock (``.locks/<repo>/<etag>.lock``) and only if the blob is still missing once it holds
it.  So workers whose pods mount the same cache (a ReadWriteMany volume, a node's hostPath) never fetch
the same file twice: a second worker waits for the first one's fetch, then finds the blob, and a
worker that starts later finds the whole snapshot and downloads nothing.  (The lock is ``flock``; on a
filesystem without it huggingface_hub falls back to a lock file.)

What this module adds around ``snapshot_download``:

* the file list first, from one ``model_info`` call with file metadata: the pickle weight formats are
  skipped when the repository has safetensors, and the sizes give the bytes the load needs;
* ``DownloadProgress``: the bytes of those files in the cache so far, measured on disk (complete blobs,
  plus the ``.incomplete`` files being written, whoever writes them), refreshed by a small thread while
  ``snapshot_download`` runs, and read by ``/stats``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("modelpool.download")

# Weight formats that are never fetched when safetensors exist (pickles can execute code on load).
PICKLE_WEIGHTS = [
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
# How often the progress is measured while a download runs.
PROGRESS_INTERVAL_S = 0.25


@dataclass(frozen=True)
class RepoFileEntry:
    """One file of the repository: its name, size and the etag its blob is stored under."""

    name: str
    size: int
    etag: str


class DownloadProgress:
    """Bytes of the model's files in the cache so far, out of ``total_bytes`` (None until known).

    Plain attributes, written by the measuring thread and read by ``/stats``."""

    def __init__(self) -> None:
        self.downloaded_bytes = 0
        self.total_bytes: int | None = None


def ignore_patterns(names: Sequence[str]) -> list[str] | None:
    """Pure: skip the pickle weight formats unless the repository has no safetensors."""
    return PICKLE_WEIGHTS if any(name.endswith(".safetensors") for name in names) else None


def wanted_files(entries: Sequence[RepoFileEntry]) -> list[RepoFileEntry]:
    """Pure: the files ``snapshot_download`` will fetch (same pattern filter as huggingface_hub's)."""
    # Exported lazily by huggingface_hub.utils, which mypy cannot see.
    from huggingface_hub.utils import filter_repo_objects  # type: ignore[attr-defined]

    ignore = ignore_patterns([e.name for e in entries])
    return list(filter_repo_objects(entries, ignore_patterns=ignore, key=lambda e: e.name))


def bytes_in_cache(blobs: Path, files: Sequence[RepoFileEntry]) -> int:
    """Bytes of ``files`` in the cache's ``blobs`` folder: a complete blob counts its size, a blob being
    written the size of its largest ``.incomplete`` file (huggingface_hub writes ``<etag>.incomplete``,
    newer versions ``<etag>.<id>.incomplete``)."""
    total = 0
    for entry in files:
        if (blobs / entry.etag).is_file():
            total += entry.size
            continue
        partial = [_size(p) for p in blobs.glob(f"{entry.etag}*.incomplete")]
        total += min(entry.size, max(partial, default=0))
    return total


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # renamed into place (or removed) between the listing and the stat
        return 0


def download(
    repo_id: str, revision: str | None, cache_dir: Path | None, progress: DownloadProgress | None = None
) -> Path:
    """The snapshot directory of ``repo_id`` at ``revision``, downloading what the cache lacks."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils.tqdm import disable_progress_bars

    # The worker reports progress in /stats; a terminal progress bar would only clutter its log.
    disable_progress_bars()
    entries = _list_files(repo_id, revision)
    ignore = ignore_patterns([e.name for e in entries]) if entries is not None else PICKLE_WEIGHTS
    measuring: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if entries is not None:
        files = wanted_files(entries)
        blobs = _blobs_dir(repo_id, cache_dir)
        log.info(
            "%s: %d files, %d bytes, %d of them in the cache (%s)",
            repo_id,
            len(files),
            sum(e.size for e in files),
            bytes_in_cache(blobs, files),
            blobs.parent.parent,
        )
        if progress is not None:
            measuring = _measure(blobs, files, progress)
    with measuring:
        path = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=str(cache_dir) if cache_dir else None,
            ignore_patterns=ignore,
        )
    return Path(path)


def _list_files(repo_id: str, revision: str | None) -> list[RepoFileEntry] | None:
    """The repository's files with sizes and etags; None when the hub cannot be asked (offline: the
    download then takes what the cache has, safetensors only)."""
    from huggingface_hub import HfApi

    try:
        info = HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:  # offline or unreachable: snapshot_download decides what the cache can do
        log.info("cannot list %s on the hub (%s: %s); using the cache", repo_id, type(exc).__name__, exc)
        return None
    return [_entry(sibling) for sibling in info.siblings or []]


def _entry(sibling: Any) -> RepoFileEntry:
    # The blob of an LFS file is named by its sha256, any other by its git blob id (huggingface_hub's
    # etag for each).
    lfs = sibling.lfs
    return RepoFileEntry(
        name=sibling.rfilename,
        size=int(lfs.size if lfs else sibling.size or 0),
        etag=str(lfs.sha256 if lfs else sibling.blob_id),
    )


def _blobs_dir(repo_id: str, cache_dir: Path | None) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    root = Path(cache_dir) if cache_dir else Path(constants.HF_HUB_CACHE)
    return root / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"


@contextlib.contextmanager
def _measure(blobs: Path, files: Sequence[RepoFileEntry], progress: DownloadProgress) -> Iterator[None]:
    """Keep ``progress`` current from the disk while the body runs (and once more at the end)."""
    progress.total_bytes = sum(entry.size for entry in files)
    done = threading.Event()

    def measure() -> None:
        while True:
            progress.downloaded_bytes = bytes_in_cache(blobs, files)
            if done.wait(PROGRESS_INTERVAL_S):
                return

    thread = threading.Thread(target=measure, name="download-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        progress.downloaded_bytes = bytes_in_cache(blobs, files)
