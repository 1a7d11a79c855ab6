"""The worker's CPU budget in a real cgroup: one real server started inside a cgroup with a 1-CPU quota on
this multi-core machine, whose model must run one CPU thread, not torch's default of one per core (the
budget's pure parts: ``tests/server/unit/test_cpu_budget.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.cgroups import CpuCgroup, cpu_cgroup
from model_server.cpu_budget import THREADS_ENV, visible_cpus
from testkit.server import ServerFactory


@pytest.fixture
def one_cpu_cgroup() -> Iterator[CpuCgroup]:
    if visible_cpus() < 2:
        pytest.skip("needs at least 2 CPUs, so that a 1-CPU quota differs from the CPU count")
    with contextlib.ExitStack() as stack:
        try:
            group = stack.enter_context(cpu_cgroup(1.0))
        except OSError as exc:
            pytest.skip(f"cannot make a cgroup with a CPU quota here: {exc}")
        yield group


@pytest.mark.slow
def test_a_cpu_limit_caps_the_models_threads(
    one_cpu_cgroup: CpuCgroup, minilm: Path, server: ServerFactory
) -> None:
    # The cgroup comes first: fixtures are torn down in reverse, so the server stops before it goes.
    srv = server(
        "--model", str(minilm), "--task", "text-embedding", "--name", "minilm", "--device", "cpu",
        env={THREADS_ENV: ""}, wait="ready", timeout=300, preexec=one_cpu_cgroup.join,
    )  # fmt: skip
    members = one_cpu_cgroup.members()
    assert srv.proc.pid in members and len(members) >= 3  # the supervisor, the inference and HTTP processes
    assert srv.stats()["cpu_threads"] == 1  # torch's default here would be one per core
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": ["a limited worker still serves"]}, timeout=60)
    assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
