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


#: The project's packages and where their sources are (the operator's lives under operator/).
PACKAGES: dict[str, str] = {
    "model_server": "model_server",
    "modelpool_gateway": "modelpool_gateway",
    "modelpool_contract": "modelpool_contract",
    "modelpool_operator": "operator/modelpool_operator",
    "testkit": "testkit",
    "bench": "bench",
}


def project_modules(root: Path) -> dict[str, Path]:
    """Every module of ``PACKAGES`` under the checkout ``root``, by dotted name (a package by its own)."""
    modules = {}
    for package, folder in PACKAGES.items():
        base = root / folder
        for path in base.rglob("*.py"):
            parts = [package, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module an imported name lives in (``a.b.c`` of ``from a.b import c``: ``a.b`` unless
    ``a.b.c`` is a module), None outside the project."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Which project modules each one imports, at any depth (lazy and ``TYPE_CHECKING`` ones too: a
    cycle through them still ties the modules together)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        owners = {_owner(imported, modules) for imported in imports_of(path)}
        graph[name] = {o for o in owners if o is not None and o != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected set of two or more modules (Tarjan's), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def private_imports(modules: dict[str, Path]) -> list[str]:
    """``from x import _name`` of a project module ``x`` in another module: a private name used across
    modules (make it public, or move it where both can import it)."""
    found = []
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                if _owner(node.module, modules) is None:
                    continue
                found += [
                    f"{name}: from {node.module} import {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    return found
