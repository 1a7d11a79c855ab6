"""The server under test as a child process (``python -m model_server``), and what it reports: its
``/stats`` and the batch-size histogram of its ``/metrics``."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from testkit import prom
from testkit.environment import ROOT, child_env, free_port

# The server's cheapest model: a real Task that echoes lengths (tests/server/handlers.py).
ECHO_HANDLER = "tests.server.handlers:EchoEmbedding"


class ServerProcess:
    """``modelpool-server`` serving ``model`` as ``minilm`` (text-embedding) on a free loopback port, with
    its probe port on another, as in a pod.  ``/stats`` (and so ``rss_bytes``) covers the whole worker:
    the supervisor and all its processes; the bench reads it on the probe port, as the operator does."""

    def __init__(
        self,
        model: Path,
        device: str,
        dtype: str,
        *extra: str,
        env: Mapping[str, str] | None = None,
        preexec: Callable[[], None] | None = None,
        root: Path = ROOT,
    ) -> None:
        """``env`` is added to the child's environment; ``preexec`` runs in the child before the server
        (to join a cgroup, say); ``root``: the source tree the server runs from (another revision's, to
        compare with in one run)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        probe_port = free_port()
        self.probe_url = f"http://127.0.0.1:{probe_port}"
        self.log = tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [
            sys.executable, "-m", "model_server", "--model", str(model), "--task", "text-embedding",
            "--name", "minilm", "--device", device, "--dtype", dtype, "--host", "127.0.0.1",
            "--port", str(self.port), "--probe-port", str(probe_port),
            "--termination-log", self.log.name + ".termination",
            "--log-level", "warning",
            *extra,
        ]  # fmt: skip
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=root,  # ``-m`` puts the working directory first on sys.path
            env={**child_env(), "PYTHONPATH": str(root), **(env or {})},
            preexec_fn=preexec,  # noqa: PLW1509 - it only joins a cgroup (one write)
        )
        self.client = httpx.Client(timeout=10)

    def wait(self, path: str, timeout: float = 600, interval: float = 0.02) -> None:
        """Wait (bounded) until ``path`` answers 200; raise with the log if the server exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited {self.proc.returncode}: {Path(self.log.name).read_text()[-3000:]}"
                )
            try:
                if self.client.get(self.url + path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(interval)
        raise RuntimeError(f"{path} not answering after {timeout}s")

    def stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.client.get(self.probe_url + "/stats").json()
        return doc

    def rss_bytes(self) -> int:
        return int(self.stats()["memory"]["rss_bytes"])

    def settle(self, timeout: float = 120) -> None:
        """Wait until the server has nothing queued or in flight (a run's leftovers are not the next's)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.stats()
            if not doc["queue_depth"] and not doc["in_flight"]:
                return
            time.sleep(0.1)

    def mean_batch(self) -> tuple[float, float]:
        """(sum, count) of the batch-size histogram ``modelpool_batch_size``."""
        text = self.client.get(self.probe_url + "/metrics").text  # as Prometheus scrapes a pod
        return prom.value(text, "modelpool_batch_size_sum"), prom.value(text, "modelpool_batch_size_count")

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
