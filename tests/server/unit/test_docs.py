"""The v2 tensor table (docs/server.md) is generated from the task classes; fail when stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_server.docs import DOCS, render


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_tensor_table_in_sync(doc: Path) -> None:
    current = doc.read_text()
    assert render(current) == current, "run: python -m model_server.docs --write"
