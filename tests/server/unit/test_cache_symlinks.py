"""A model cache that workers share never leads the server outside it: ``sources.check_inside`` on a real
directory tree shaped like huggingface_hub's cache (snapshots linking into ``blobs``), and ``resolve``
refusing an hf:// model whose snapshot holds a planted link (issue 30: a shared hostPath cache let one
namespace plant a symlink to another's weights or remote code).

``download`` is replaced by a function returning the snapshot, so no hub is asked; everything else is the
server's own code on the real filesystem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from model_server.engine import sources
from model_server.engine.sources import SourceError, check_inside, resolve


def _hub(tmp_path: Path) -> tuple[Path, Path]:
    """A cache (``<hf_home>/hub``) with one snapshot whose files link into ``blobs``, as huggingface_hub
    lays it out. Returns the hub and the snapshot."""
    repo = tmp_path / "hf" / "hub" / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    (repo / "blobs" / "def").write_bytes(b"weights")
    snapshot = repo / "snapshots" / "0123"
    (snapshot / "sub").mkdir(parents=True)
    (snapshot / "config.json").symlink_to("../../blobs/abc")
    (snapshot / "sub" / "model.safetensors").symlink_to("../../../blobs/def")
    return tmp_path / "hf" / "hub", snapshot


def test_a_snapshot_linking_into_its_own_blobs_is_accepted(tmp_path: Path) -> None:
    hub, snapshot = _hub(tmp_path)
    check_inside(snapshot, hub)


@pytest.mark.parametrize("target", ["outside/secret.py", "outside"])
def test_a_link_leaving_the_cache_is_refused(tmp_path: Path, target: str) -> None:
    hub, snapshot = _hub(tmp_path)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.py").write_text("print('another tenant')")
    (snapshot / "modeling_x.py").symlink_to(tmp_path / target)
    with pytest.raises(SourceError, match="outside the model cache"):
        check_inside(snapshot, hub)


def test_a_relative_link_climbing_out_of_the_cache_is_refused(tmp_path: Path) -> None:
    hub, snapshot = _hub(tmp_path)
    (tmp_path / "other-namespace").mkdir()
    (snapshot / "sub" / "weights.bin").symlink_to("../../../../../../other-namespace")
    with pytest.raises(SourceError, match="other-namespace"):
        check_inside(snapshot, hub)


def test_a_snapshot_that_is_itself_a_link_out_of_the_cache_is_refused(tmp_path: Path) -> None:
    hub, snapshot = _hub(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = snapshot.parent / "4567"
    planted.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SourceError, match="leaves the model cache"):
        check_inside(planted, hub)


def test_a_sibling_directory_sharing_the_cache_name_prefix_is_outside(tmp_path: Path) -> None:
    hub, snapshot = _hub(tmp_path)
    sibling = Path(str(hub) + "-evil")
    sibling.mkdir()
    (sibling / "x").write_text("x")
    (snapshot / "x").symlink_to(sibling / "x")
    with pytest.raises(SourceError):
        check_inside(snapshot, hub)


def test_resolve_refuses_an_hf_model_with_a_planted_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, snapshot = _hub(tmp_path)
    calls: list[Path | None] = []

    def fake_download(repo: str, revision: str | None, cache_dir: Path | None, progress: object) -> Path:
        calls.append(cache_dir)
        return snapshot

    monkeypatch.setattr(sources, "download", fake_download)
    assert resolve("hf://org/m", hf_home=tmp_path / "hf") == snapshot
    assert calls == [hub]

    os.symlink("/etc/passwd", snapshot / "tokenizer.json")
    with pytest.raises(SourceError, match="/etc/passwd"):
        resolve("hf://org/m", hf_home=tmp_path / "hf")
