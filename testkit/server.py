"""``modelpool-server`` as a child process: the one harness the server tests and the benchmarks start it with.

``launch(args)`` runs ``python -m model_server ARGS --host H --port <free>`` (with ``probe=True`` a probe
port too, as in a pod, where the operator reads ``/stats``) from a source tree (this repository, or another
revision's to compare with in one run), its output in a log file, and returns a ``ServerProcess`` at once;
``ServerProcess.wait(path)`` waits, bounded, until a route answers 200 and fails with the log if the
process exits first; ``stop()`` sends SIGTERM, waits, and kills as a last resort.  The benchmarks'
``minilm_server`` (bench/server_process.py) is this with their own flags and environment.

The tests start both shapes of server through two functions: ``start_server`` (a dedicated worker, or any
flags: one thread a model unless the shell says otherwise, since the tests share two cores; waits until
live or ready) and ``start_host`` (a shared host on one device, its control API on a probe port; what a
host bench passes the same flags to ``launch`` with is ``host_flags``).  ``SharedHost`` is a running host:
its process and its control API (``HostControlClient``, which ``bench.density`` calls too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from modelpool_contract.host_control import INDEX_PATH, ModelAction, model_action_path
from testkit import prom
from testkit.environment import ROOT, child_env, free_port
from testkit.waiting import wait_for


@dataclass
class ServerProcess:
    """A running ``modelpool-server``: its base URL, port, process and log file (and its probe port's URL
    when it has one: ``stats`` and ``mean_batch`` read it there, as the operator and Prometheus do)."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    termination_log: Path
    args: tuple[str, ...] = ()
    probe_url: str | None = None
    wait_timeout: float = 120.0  # ``wait``'s default
    started: float = field(default_factory=time.perf_counter)
    # One client for the reads (thread-safe: a sampler thread reads the RSS beside a load).
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))

    def log(self) -> str:
        """The server's combined stdout/stderr so far (for assertion messages)."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait(self, path: str, timeout: float | None = None, interval: float = 0.02) -> None:
        """Wait (bounded: ``timeout``, else ``wait_timeout``) until ``path`` answers 200; AssertionError with
        the log if the process exits first or the time runs out."""
        timeout = self.wait_timeout if timeout is None else timeout

        def answered_or_exited() -> bool:  # a connection refused (still starting) counts as "not yet"
            return (
                self.proc.poll() is not None
                or self.client.get(self.url + path, timeout=2.0).status_code == 200
            )

        wait_for(
            answered_or_exited, timeout, interval, lambda: f"{path} answering 200; log:\n{self.log()[-4000:]}"
        )
        if self.proc.poll() is not None:
            raise AssertionError(
                f"server exited with {self.proc.returncode} before {path} answered; "
                f"log:\n{self.log()[-4000:]}"
            )

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
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode

    @property
    def _reads(self) -> str:
        return self.probe_url or self.url

    def stats(self) -> dict[str, Any]:
        """The worker's ``/stats`` (the whole worker: the supervisor and all its processes)."""
        doc: dict[str, Any] = self.client.get(self._reads + "/stats").json()
        return doc

    def rss_bytes(self) -> int:
        return int(self.stats()["memory"]["rss_bytes"])

    def settle(self, timeout: float = 120) -> None:
        """Wait until the server has nothing queued or in flight (a run's leftovers are not the next's)."""

        def idle() -> bool:
            doc = self.stats()
            return not doc["queue_depth"] and not doc["in_flight"]

        wait_for(idle, timeout, 0.1, "the server idle (nothing queued or in flight)")

    def mean_batch(self) -> tuple[float, float]:
        """(sum, count) of the batch-size histogram ``modelpool_batch_size``."""
        text = self.client.get(self._reads + "/metrics").text
        return prom.value(text, "modelpool_batch_size_sum"), prom.value(text, "modelpool_batch_size_count")

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the server's ``/metrics`` (0 when absent)."""
        return prom.value(self.client.get(self._reads + "/metrics").text, name, **labels)


def launch(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
    probe: bool = False,
    preexec: Callable[[], None] | None = None,
    root: Path = ROOT,
    wait_timeout: float = 120.0,
) -> ServerProcess:
    """Start ``python -m model_server ARGS`` on a free port of ``host`` (and a probe port with ``probe``),
    from the source tree at ``root``, without waiting.  ``env`` is added to the benchmarks' child
    environment (``testkit.environment.child_env``); the termination log defaults to a file beside the
    log; ``preexec`` runs in the child before the server (to join a cgroup, say)."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-server-"))
    log_path = workdir / "server.log"
    full_env = child_env()
    full_env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    full_env.setdefault("MODELPOOL_TERMINATION_LOG", str(workdir / "termination-log"))
    full_env.update(env or {})
    cmd = [sys.executable, "-m", "model_server", *args, "--host", host, "--port", str(port)]
    probe_url = None
    if probe:
        probe_port = free_port()
        cmd += ["--probe-port", str(probe_port)]
        probe_url = f"http://{host}:{probe_port}"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=root,  # ``-m`` puts the working directory first on sys.path
            preexec_fn=preexec,  # noqa: PLW1509 - it only joins a cgroup (one write)
        )
    return ServerProcess(
        url=f"http://{host}:{port}",
        port=port,
        proc=proc,
        log_path=log_path,
        termination_log=Path(full_env["MODELPOOL_TERMINATION_LOG"]),
        args=tuple(args),
        probe_url=probe_url,
        wait_timeout=wait_timeout,
    )


WaitFor = Literal["live", "ready", "none"]
#: ``start_server`` as the server tests' fixtures hand it out (each process stopped at teardown).
ServerFactory = Callable[..., ServerProcess]
# The tests' servers keep to one thread a model (the tests share two cores), unless the shell says otherwise.
TEST_THREADS = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def start_server(
    *args: str,
    env: Mapping[str, str] | None = None,
    wait: WaitFor = "live",
    timeout: float = 120.0,
    host: str = "127.0.0.1",
    probe: bool = False,
    preexec: Callable[[], None] | None = None,
) -> ServerProcess:
    """Start ``modelpool-server ARGS`` on a free port (a probe port too with ``probe``) and wait (bounded)
    for it to answer: ``wait="live"`` returns once ``/v2/health/live`` is 200, ``"ready"`` once
    ``/v2/health/ready`` is 200 (model loaded), ``"none"`` at once.  If the process exits first,
    AssertionError with its log.  ``preexec`` runs in the child before the server (to join a cgroup, say)."""
    defaults = {name: value for name, value in TEST_THREADS.items() if name not in os.environ}
    server = launch(args, env={**defaults, **(env or {})}, host=host, probe=probe, preexec=preexec)
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


def host_flags(device_memory: int, max_models: int, model_overhead: int = 0) -> list[str]:
    """A shared host's flags: a device ledger of ``device_memory`` bytes holding at most ``max_models``
    models, ``model_overhead`` bytes charged for each model's process, one HTTP process."""
    return [
        "--shared-host", "--device-memory", str(device_memory), "--max-models", str(max_models),
        "--model-overhead", str(model_overhead), "--http-workers", "1",
    ]  # fmt: skip


def start_host(
    *flags: str,
    device_memory: int,
    max_models: int,
    model_overhead: int = 0,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> ServerProcess:
    """``start_server`` of a shared host (``host_flags`` and ``flags``) on one device, whatever GPUs the
    machine has, with its control API on a probe port; returned once live (no model loaded)."""
    return start_server(
        *host_flags(device_memory, max_models, model_overhead), "--gpus", "1", *flags,
        env=env, probe=True, wait="live", timeout=timeout,
    )  # fmt: skip


class HostControlClient:
    """A shared host's control API on its probe port (``--shared-host``): a model's load, unload, sleep
    and wake, the index of its models and ``/stats``."""

    def __init__(self, control: str, timeout: float = 120.0) -> None:
        self.control = control.rstrip("/")
        self.timeout = timeout

    def call(self, name: str, action: ModelAction, config: Mapping[str, Any] | None = None) -> httpx.Response:
        """POST ``/v2/repository/models/{name}/{action}`` (``config``: a load's settings); the answer."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        url = f"{self.control}{model_action_path(name, action)}"
        return httpx.post(url, json=body, timeout=self.timeout)

    def index(self) -> dict[str, dict[str, Any]]:
        """Each loaded model's entry (state, reason, device, bytes, pid) by name."""
        entries = httpx.post(f"{self.control}{INDEX_PATH}", timeout=30).json()
        return {e["name"]: e for e in entries}

    def states(self) -> dict[str, str]:
        return {name: str(entry["state"]) for name, entry in self.index().items()}

    def stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = httpx.get(f"{self.control}/stats", timeout=30).json()
        return doc


class SharedHost(HostControlClient):
    """A running shared host: its process (``server``, whose URL is the serving port) and its control API
    (the probe port ``launch`` gave it)."""

    def __init__(self, server: ServerProcess, timeout: float = 120.0) -> None:
        assert server.probe_url is not None, "a shared host's control API is on its probe port"
        super().__init__(server.probe_url, timeout=timeout)
        self.server = server

    def state(self, name: str) -> str:
        return self.states()[name]

    def stop(self) -> int | None:
        return self.server.stop()


__all__ = [
    "TEST_THREADS",
    "HostControlClient",
    "ServerFactory",
    "ServerProcess",
    "SharedHost",
    "WaitFor",
    "host_flags",
    "launch",
    "start_host",
    "start_server",
]
