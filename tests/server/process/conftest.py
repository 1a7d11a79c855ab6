"""The process tests' fixture: ``server(*args, env=..., wait=...)`` -> ``ServerProcess``, the test kit's
``start_server`` (``testkit.server``: a free port, the repository root on ``PYTHONPATH`` so that
``--handler testkit.echo_models:Class`` imports, a bounded wait until live or ready), each process it
started stopped when the test ends, so no test leaks a server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.server import ServerFactory, ServerProcess, start_server


@pytest.fixture
def server() -> Iterator[ServerFactory]:
    started: list[ServerProcess] = []

    def factory(*args: str, **kwargs: object) -> ServerProcess:
        proc = start_server(*args, **kwargs)  # type: ignore[arg-type]
        started.append(proc)
        return proc

    yield factory
    for proc in started:
        proc.stop()
