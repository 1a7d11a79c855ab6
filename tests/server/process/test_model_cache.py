"""The shared model cache, with the real ``huggingface_hub`` client against a local hub (tests/hub.py)
that serves the packaged MiniLM files: two ``modelpool-server`` processes sharing one ``HF_HOME`` start
at once and fetch each file once between them, both reporting the download's progress in ``/stats``
while it runs; a third server started later on the same cache downloads nothing.  The download
helpers' pure parts are checked on their own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_server.engine.download import (
    PICKLE_WEIGHTS,
    RepoFileEntry,
    bytes_in_cache,
    ignore_patterns,
    wanted_files,
)
from testkit.echo_models import ECHO
from testkit.kubectl import wait_for
from testkit.server import ServerFactory, ServerProcess
from tests.hub import HELD_AFTER, LocalHub

REPO = "sentence-transformers/all-MiniLM-L6-v2"
WEIGHTS = "model.safetensors"


@pytest.fixture
def hub(minilm: Path) -> Iterator[LocalHub]:
    with LocalHub({REPO: minilm}) as running:
        yield running


def _stats(server: ServerProcess) -> dict[str, Any]:
    return dict(httpx.get(server.url + "/stats", timeout=10).json())


def _start(server: ServerFactory, hub: LocalHub, hf_home: Path) -> ServerProcess:
    env = {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "0",
        # A held download sends nothing for a while: the client must not give up on it meanwhile.
        "HF_HUB_DOWNLOAD_TIMEOUT": "300",
    }
    return server("--model", f"hf://{REPO}", "--task", "text-embedding", "--name", "minilm", env=env)


def _embed(server: ServerProcess) -> list[float]:
    response = httpx.post(server.url + "/v1/embeddings", json={"input": "a shared cache"}, timeout=60)
    assert response.status_code == 200, response.text
    return list(response.json()["data"][0]["embedding"])


@pytest.mark.slow
def test_two_servers_sharing_a_cache_fetch_each_file_once(
    server: ServerFactory, hub: LocalHub, tmp_path: Path
) -> None:
    total = sum(f.size for f in hub.files(REPO).values())
    others = total - hub.files(REPO)[WEIGHTS].size
    hub.hold(WEIGHTS)
    first, second = _start(server, hub, tmp_path), _start(server, hub, tmp_path)

    def both_mid_download() -> list[dict[str, Any]] | None:
        # Both asked for the weights' metadata; one body is on its way and held; both see its bytes
        # (in the shared cache, whichever of them writes it).
        if hub.count("HEAD", f"/{WEIGHTS}") < 2:
            return None
        stats = [first.stats(), second.stats()]
        partial = all(
            s["state"] == "Loading" and others < s["download"]["downloaded_bytes"] < total for s in stats
        )
        return stats if partial else None

    stats = wait_for(
        both_mid_download,
        120,
        interval=0.1,
        message="both servers loading with the weights partly downloaded",
    )
    assert all(s["download"]["total_bytes"] == total for s in stats)
    assert all(s["download"]["downloaded_bytes"] <= others + HELD_AFTER for s in stats)
    assert hub.bodies().get(WEIGHTS) == 1
    hub.release()

    for proc in (first, second):
        wait_for(lambda p=proc: p.stats()["state"] == "Ready", 180, message="server Ready")  # type: ignore[misc]
    assert hub.bodies() == {name: 1 for name in hub.files(REPO)}, hub.requests
    assert all(
        p.stats()["download"] == {"downloaded_bytes": total, "total_bytes": total} for p in (first, second)
    )
    assert _embed(first) == _embed(second)

    fetched, two = dict(hub.requests), hub.summary()
    third = _start(server, hub, tmp_path)
    wait_for(lambda: third.stats()["state"] == "Ready", 180, message="third server Ready")
    assert hub.bodies() == {name: 1 for name in hub.files(REPO)}
    assert third.stats()["download"] == {"downloaded_bytes": total, "total_bytes": total}
    later = {key: n - fetched.get(key, 0) for key, n in hub.requests.items() if n != fetched.get(key, 0)}
    # Only the metadata: the model's info (file list) and the revision's commit.
    assert all(method == "GET" and path.startswith("/api/models/") for method, path in later), later
    assert len(later) <= 2, later
    # The hub's request counts, for the test's output (-s).
    print(json.dumps({"two servers at once": two, "then a third": hub.summary()}))


def test_local_sources_report_no_download(server: ServerFactory) -> None:
    proc = server("--model", "/", "--task", "text-embedding", "--handler", ECHO)
    assert proc.stats()["download"] is None


def test_download_helpers(tmp_path: Path) -> None:
    entries = [RepoFileEntry("model.safetensors", 100, "a" * 64), RepoFileEntry("config.json", 10, "b" * 40)]
    with_pickle = [*entries, RepoFileEntry("pytorch_model.bin", 100, "c" * 64)]
    assert ignore_patterns([e.name for e in with_pickle]) == PICKLE_WEIGHTS
    assert ignore_patterns(["pytorch_model.bin", "config.json"]) is None  # the only weights there are
    assert wanted_files(with_pickle) == entries
    assert bytes_in_cache(tmp_path / "missing", entries) == 0
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / ("b" * 40)).write_bytes(b"x" * 10)
    (blobs / ("a" * 64 + ".1234abcd.incomplete")).write_bytes(b"x" * 30)
    assert bytes_in_cache(blobs, entries) == 40
    (blobs / ("a" * 64)).write_bytes(b"x" * 100)
    assert bytes_in_cache(blobs, entries) == 110
