"""The operator's folders follow its pass (docs/design.md, "The operator").

``modelpool_operator/observe/`` reads the cluster (indices, ``/stats``) into plain values,
``modelpool_operator/planner/`` computes the desired state from them (pure), ``modelpool_operator/effects/``
applies it (the API, Events); the Kopf wiring (``handlers``) and the pass (``reconcile``) join them, and the
top of the package holds what more than one of them imports (``pool``, ``budget``, ``settings``, ...).
These checks read the sources (ast), so an import against the grain (the planner reaching for the API, an
observation deciding something) fails here, not in review.
"""

from __future__ import annotations

import ast
from pathlib import Path

from testkit import layout

PACKAGE = "modelpool_operator"
ROOT = Path(__file__).resolve().parents[3] / "operator" / PACKAGE
LAYERS = ("observe", "planner", "effects")
# The modules that join the layers: no layer imports them.
WIRING = {f"{PACKAGE}.{name}" for name in ("handlers", "reconcile", "reconcile_host", "main")}
# What one process holds (its connections, its bookkeeping): the effects use it, observing and planning never.
PROCESS = (f"{PACKAGE}.services", f"{PACKAGE}.bookkeeping")


def imports_of(layer: str) -> dict[str, set[str]]:
    """Each module of ``modelpool_operator/<layer>/`` (by path) with the modules it imports."""
    return {
        str(path.relative_to(ROOT.parent)): layout.imports_of(path)
        for path in sorted((ROOT / layer).rglob("*.py"))
    }


def _offending(layer: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{path}: {module}"
        for path, modules in imports_of(layer).items()
        for module in modules
        if module in WIRING or any(module == f or module.startswith(f + ".") for f in forbidden)
    )


def test_the_layers_exist() -> None:
    assert all((ROOT / layer / "__init__.py").is_file() for layer in LAYERS)


def test_observation_neither_plans_nor_applies() -> None:
    forbidden = (f"{PACKAGE}.planner", f"{PACKAGE}.effects", *PROCESS, "kopf", "kubernetes_asyncio")
    assert _offending("observe", forbidden) == []


def test_the_planner_is_pure() -> None:
    """The planner reads observed values (``observe.worker_state``'s types) and nothing that does I/O."""
    forbidden = (
        f"{PACKAGE}.effects",
        f"{PACKAGE}.observe.observation",
        f"{PACKAGE}.observe.stats",
        f"{PACKAGE}.metrics",
        *PROCESS,
        "kopf",
        "kubernetes_asyncio",
        "httpx",
        "asyncio",
    )
    assert _offending("planner", forbidden) == []


#: The one effects module that speaks HTTP: the shared hosts' control API client (load, unload, sleep a
#: model on a host pod is an effect, and the control API is HTTP). Every other HTTP request the operator
#: makes is observation (``observe/stats.py``).
HTTP_EFFECTS = {"modelpool_operator/effects/host_control.py"}


def test_effects_never_observe() -> None:
    assert _offending("effects", (f"{PACKAGE}.observe",)) == []
    speaking_http = sorted(path for path, modules in imports_of("effects").items() if "httpx" in modules)
    assert set(speaking_http) <= HTTP_EFFECTS, speaking_http


def test_only_the_effects_reach_the_api_and_the_event_sink() -> None:
    """``services.kube`` and ``services.events`` are used under ``effects/`` only: the pass (``reconcile``)
    and the Kopf wiring (``handlers``) hand plans and refusals to ``effects.apply``."""
    reached = sorted(
        f"{path.relative_to(ROOT.parent)}:{node.lineno}: services.{node.attr}"
        for path in ROOT.rglob("*.py")
        if "effects" not in path.relative_to(ROOT).parts
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute)
        and node.attr in {"kube", "events"}
        and isinstance(node.value, ast.Name)
        and node.value.id == "services"
    )
    assert reached == []
