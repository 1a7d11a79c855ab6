"""A small local Hugging Face Hub for tests: the real ``huggingface_hub`` client downloads from it.

``LocalHub({"org/name": directory})`` serves each directory's files as one model repository at one
commit, on 127.0.0.1 (point ``HF_ENDPOINT`` at ``hub.url``), with just the part of the Hub's API that
``snapshot_download`` and ``hf_hub_download`` use:

* ``GET /api/models/{repo}[/revision/{rev}]`` (model info; ``?blobs=true`` adds sizes, blob ids, LFS),
* ``GET /api/models/{repo}/tree/{rev}`` (the file listing),
* ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` (a file, with ``X-Repo-Commit``, ``ETag`` and, for LFS
  files, ``X-Linked-Etag``/``X-Linked-Size``, as the Hub sends them).

Every request is counted by method and path (``count``, ``bodies``).  ``hold(path)`` makes the hub send
the first ``HELD_AFTER`` bytes of that file and then wait until the test calls ``release()``, so a test
can watch a download in progress without racing a timer.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# Files at least this large are served as LFS files (the Hub's blob is then named by its sha256).
LFS_MIN_BYTES = 1 << 20
# More than huggingface_hub's 10 MiB write chunk, so a held download has bytes on disk.
HELD_AFTER = 16 << 20
CHUNK = 256 << 10
# A held download waits at most this long for release() (a test that forgets still ends).
HOLD_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class HubFile:
    path: str
    local: Path
    size: int
    blob_id: str  # git blob id
    sha256: str | None  # LFS files only

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id

    def sibling(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"rfilename": self.path, "size": self.size, "blobId": self.blob_id}
        if self.sha256:
            doc["lfs"] = {"sha256": self.sha256, "size": self.size, "pointerSize": 134}
        return doc

    def tree_entry(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": "file", "path": self.path, "size": self.size, "oid": self.blob_id}
        if self.sha256:
            doc["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": 134}
        return doc


def _describe(directory: Path) -> dict[str, HubFile]:
    files = {}
    for local in sorted(p for p in directory.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        data = local.read_bytes()
        blob_id = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        sha256 = hashlib.sha256(data).hexdigest() if len(data) >= LFS_MIN_BYTES else None
        path = local.relative_to(directory).as_posix()
        files[path] = HubFile(path, local, len(data), blob_id, sha256)
    return files


class LocalHub:
    """The hub server (in a thread); ``with LocalHub(...) as hub:`` starts and stops it."""

    def __init__(self, repos: Mapping[str, Path]) -> None:
        self.repos = {repo: _describe(Path(directory)) for repo, directory in repos.items()}
        self.commits = {
            repo: hashlib.sha1("".join(f.etag for f in files.values()).encode()).hexdigest()
            for repo, files in self.repos.items()
        }
        self.requests: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._released = threading.Event()
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(self._app(), log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]})

    # ---- the test's side ------------------------------------------------------------------------------

    def __enter__(self) -> LocalHub:
        self._thread.start()
        for _ in range(200):
            if self._server.started:
                return self
            self._thread.join(0.05)
        raise AssertionError("the local hub did not start")

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.should_exit = True
        self._thread.join(30)
        self._socket.close()

    def hold(self, path: str) -> None:
        """Downloads of ``path`` stop after ``HELD_AFTER`` bytes until ``release()``."""
        self._held.add(path)
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    def count(self, method: str, path_suffix: str = "") -> int:
        """Requests so far with this method whose path ends with ``path_suffix``."""
        with self._lock:
            return sum(n for (m, p), n in self.requests.items() if m == method and p.endswith(path_suffix))

    def bodies(self) -> dict[str, int]:
        """File bodies served so far (GET .../resolve/...), by file path."""
        with self._lock:
            counted: Counter[str] = Counter()
            for (method, path), n in self.requests.items():
                if method == "GET" and "/resolve/" in path:
                    counted[path.split("/resolve/", 1)[1].split("/", 1)[1]] += n
            return dict(counted)

    def summary(self) -> dict[str, int]:
        """Requests so far by kind: model info, file listings, file metadata (HEAD), file bodies (GET)."""
        kinds: Counter[str] = Counter()
        with self._lock:
            for (method, path), n in self.requests.items():
                if "/tree/" in path:
                    kinds["tree"] += n
                elif path.startswith("/api/"):
                    kinds["info"] += n
                else:
                    kinds["file HEAD" if method == "HEAD" else "file GET"] += n
        return dict(kinds)

    def files(self, repo: str) -> dict[str, HubFile]:
        return self.repos[repo]

    # ---- the server's side ------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/api/models/{org}/{name}", self._info),
                Route("/api/models/{org}/{name}/revision/{revision}", self._info),
                Route("/api/models/{org}/{name}/tree/{revision}", self._tree),
                Route("/{org}/{name}/resolve/{revision}/{path:path}", self._file, methods=["GET", "HEAD"]),
            ]
        )

    def _count(self, request: Request) -> None:
        with self._lock:
            self.requests[(request.method, request.url.path)] += 1

    def _repo(self, request: Request) -> tuple[str, dict[str, HubFile]] | Response:
        self._count(request)
        repo = f"{request.path_params['org']}/{request.path_params['name']}"
        if repo not in self.repos:
            return JSONResponse({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})
        revision = request.path_params.get("revision", "main")
        if revision not in ("main", self.commits[repo]):
            return JSONResponse({"error": "Invalid rev id"}, 404, {"X-Error-Code": "RevisionNotFound"})
        return repo, self.repos[repo]

    async def _info(self, request: Request) -> Response:
        found = self._repo(request)
        if isinstance(found, Response):
            return found
        repo, files = found
        blobs = request.query_params.get("blobs", "").lower() == "true"
        siblings = [f.sibling() if blobs else {"rfilename": f.path} for f in files.values()]
        doc = {"id": repo, "modelId": repo, "sha": self.commits[repo], "private": False, "siblings": siblings}
        return JSONResponse(doc)

    async def _tree(self, request: Request) -> Response:
        found = self._repo(request)
        if isinstance(found, Response):
            return found
        return JSONResponse([f.tree_entry() for f in found[1].values()])

    async def _file(self, request: Request) -> Response:
        found = self._repo(request)
        if isinstance(found, Response):
            return found
        repo, files = found
        entry = files.get(request.path_params["path"])
        if entry is None:
            return JSONResponse({"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound"})
        headers = {
            "X-Repo-Commit": self.commits[repo],
            "ETag": f'"{entry.blob_id}"',
            "Content-Length": str(entry.size),
            "Content-Type": "application/octet-stream",
        }
        if entry.sha256:
            headers |= {"X-Linked-Etag": f'"{entry.sha256}"', "X-Linked-Size": str(entry.size)}
        if request.method == "HEAD":
            return Response(status_code=200, headers=headers)
        return StreamingResponse(self._stream(entry), headers=headers)

    async def _stream(self, entry: HubFile) -> AsyncIterator[bytes]:
        sent = 0
        with entry.local.open("rb") as body:
            while chunk := body.read(CHUNK):
                if entry.path in self._held and sent >= HELD_AFTER:
                    await anyio.to_thread.run_sync(self._released.wait, HOLD_TIMEOUT_S)
                yield chunk
                sent += len(chunk)
