"""What a Python module imports, read from its source: the layout tests check which way imports go with it."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(tree: ast.Module) -> set[str]:
    """Every absolute module an ``import`` or ``from ... import`` names, at any depth (lazy ones too);
    ``from a.b import c`` counts as ``a.b.c``, so that a submodule shows (a prefix names ``a.b`` too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def imports_of(path: Path) -> set[str]:
    """``imported_modules`` of one source file."""
    return imported_modules(ast.parse(path.read_text()))
