"""Another revision's source tree, to run its server beside this tree's in one benchmark run (the
before/after comparisons of ``bench.server --baseline`` and ``bench.limits --baseline``)."""

from __future__ import annotations

import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from shutil import rmtree

from testkit.environment import ROOT


@contextmanager
def baseline_tree(rev: str) -> Iterator[Path]:
    """The source tree of ``rev`` (``git archive``) in a temporary folder, removed afterwards: its server
    runs from this tree's virtualenv (the same libraries), so only our code differs."""
    tree = Path(tempfile.mkdtemp(prefix="bench-baseline-"))
    try:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        yield tree
    finally:
        rmtree(tree, ignore_errors=True)


def ratio_of_medians(before: list[float], after: list[float]) -> float | None:
    """median(after) / median(before): how this tree compares with the baseline (None without figures)."""
    if not before or not after or not statistics.median(before):
        return None
    return statistics.median(after) / statistics.median(before)
