"""The project's import layout (issue 32): no import cycles between the project's modules, no private
name imported across modules, and no process of a worker importing the server's entry point. (Which
process's folder may import which: ``tests/server/unit/test_layout.py``.)"""

from __future__ import annotations

from testkit.environment import ROOT
from testkit.layout import cycles, import_graph, imports_of, private_imports, project_modules

MODULES = project_modules(ROOT)


def test_the_project_modules_import_each_other_without_cycles() -> None:
    assert cycles(import_graph(MODULES)) == []


def test_no_private_name_is_imported_across_modules() -> None:
    assert private_imports(MODULES) == []


def test_the_processes_a_worker_starts_never_import_its_entry_point() -> None:
    children = [
        name
        for name, path in MODULES.items()
        if name.startswith(("model_server.frontend.", "model_server.engine."))
        and any(m == "model_server.main" or m.startswith("model_server.main.") for m in imports_of(path))
    ]
    assert children == []


def test_the_checks_find_what_they_look_for() -> None:
    """The checks themselves, on a made-up graph: a cycle of three and a module outside it."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports a test file outside a package by its basename (the default import mode), so a second
    file of one name fails collection: "import file mismatch" (CI failed on it twice)."""
    names: dict[str, list[str]] = {}
    for path in sorted([*ROOT.glob("tests/**/test_*.py"), *ROOT.glob("e2e/**/test_*.py")]):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}
