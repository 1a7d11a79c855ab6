"""The model server's folders follow its processes (docs/design.md, "The worker's processes").

``model_server/frontend/`` runs in the HTTP processes, ``model_server/engine/`` in the inference
process, ``model_server/supervisor/`` in the main process; the top of ``model_server`` holds what more
than one of them imports.  These checks read the sources (ast), so an import that would pull the model's
side into an HTTP process (or the reverse) fails here rather than as a slower start or a larger RSS.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from testkit.environment import ROOT as REPOSITORY
from testkit.layout import imports_of

ROOT = REPOSITORY / "model_server"
SIDES = ("frontend", "engine", "supervisor")


def side_of(module: str) -> str | None:
    """Which process's package ``module`` (dotted) belongs to; None for the shared top level."""
    parts = module.split(".")
    if parts[0] != "model_server" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in SIDES else None


def crossings(package: str, allowed: set[str]) -> list[str]:
    """Imports from ``model_server/<package>`` (or the top level, for "") into a side not in ``allowed``."""
    base = ROOT / package if package else ROOT
    paths = base.rglob("*.py") if package else [p for p in ROOT.rglob("*.py") if side_of(_dotted(p)) is None]
    return sorted(
        f"{path.relative_to(ROOT.parent)}: {module}"
        for path in paths
        for module in imports_of(path)
        if (side := side_of(module)) is not None and side not in allowed
    )


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)


def test_the_frontend_imports_neither_the_engine_nor_the_supervisor() -> None:
    assert crossings("frontend", {"frontend"}) == []


def test_the_engine_imports_neither_the_frontend_nor_the_supervisor() -> None:
    assert crossings("engine", {"engine"}) == []


def started_by(*files: str) -> set[str]:
    """The module names (``"model_server...."`` strings) the supervisor's ``files`` start processes of."""
    sources = "".join((ROOT / "supervisor" / f).read_text() for f in files)
    return set(re.findall(r'"(model_server\.[\w.]+)"', sources))


def test_the_supervisor_starts_the_processes_by_name_and_imports_neither_side() -> None:
    assert crossings("supervisor", {"supervisor"}) == []
    # Each shape names its HTTP processes' module; the slot both share names the model's.
    assert started_by("slot.py") == {"model_server.engine.inference_process"}
    assert started_by("supervisor.py") == {"model_server.frontend.http_process"}
    assert started_by("host.py") == {"model_server.frontend.host_http"}
    started = started_by("slot.py", "supervisor.py", "host.py")
    assert all(importlib.util.find_spec(name) is not None for name in started)


def test_the_shared_modules_import_no_side_but_main_the_supervisor() -> None:
    assert crossings("", set()) == [
        "model_server/main.py: model_server.supervisor.host",
        "model_server/main.py: model_server.supervisor.runtime",
        "model_server/main.py: model_server.supervisor.supervisor",
    ]
