"""uv.lock is what `make venv`, the images and CI install from: it must agree with pyproject.toml.

`uv lock --check --offline` re-reads pyproject.toml's requirements and fails when the lock no longer
satisfies them (a bound changed, a dependency added or dropped) without resolving anything anew or
touching the network, so the check is fast and works on a machine with no index.  The fix it asks for is
`uv lock` and committing uv.lock."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _uv() -> str:
    """uv as hack/venv.sh finds it (on PATH, or where its installer puts it)."""
    found = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    assert os.access(found, os.X_OK), "uv is not installed (make venv installs it)"
    return found


def test_the_lock_agrees_with_pyproject() -> None:
    result = subprocess.run(
        [_uv(), "lock", "--check", "--offline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, f"uv.lock is stale: run `uv lock`\n{result.stderr}"


def test_the_version_is_written_once() -> None:
    """pyproject.toml's version is dynamic (read from modelpool_contract/version.py), so neither it nor the
    lock holds a copy to bump: uv.lock records the project as dynamic."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "modelpool_contract.version.VERSION"
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (own,) = [p for p in lock["package"] if p["name"] == "modelpool"]
    assert "version" not in own
