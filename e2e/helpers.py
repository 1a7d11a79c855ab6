"""Shared helpers of the e2e suite: paths, the `make testbin` binaries, and running helm/kubectl (the
repository, the binaries and the skip-or-fail rule come from the test kit, testkit/).

A missing binary skips a test on a developer's machine but fails it in CI (``CI=true``): CI builds them.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from testkit.cluster import missing
from testkit.environment import BIN, ROOT

CHART = ROOT / "charts" / "modelpool-operator"
CRDS = ROOT / "crds"
CHART_CRDS = CHART / "files" / "crds"
EXAMPLES = ROOT / "examples"

T = TypeVar("T")


def require_binary(name: str) -> Path:
    path = BIN / name
    if not os.access(path, os.X_OK):
        missing(f"bin/{name} is missing: run `make testbin`")
    return path


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 120,
    input_text: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command with a deadline; on an unexpected exit code, fail with its output."""
    result = subprocess.run(
        [str(a) for a in argv],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input_text,
        check=False,
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, argv))} exited {result.returncode}\n"
            f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
        )
    return result


def load_all(text: str) -> list[dict[str, Any]]:
    """Every non-empty YAML document in ``text``."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc.get("kind") == kind]


def one(docs: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def eventually(
    check: Callable[[], T | None], *, timeout: float, interval: float = 0.5, what: str = "condition"
) -> T:
    """Call ``check`` until it returns something truthy, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)
