"""docs/server.md's v2 tensor table is generated from the task classes; fail when it is stale."""

from __future__ import annotations

from model_server.docs import DOC, render


def test_tensor_table_in_sync() -> None:
    current = DOC.read_text()
    assert render(current) == current, "run: python -m model_server.docs --write"
