"""The upgrade check's drain: a second process node (``process-node-drain``, process mode like the session's
process-node-0, started here), a pool whose workers all run on it, and ``kubectl drain`` of that node under
the clients' traffic. Measured: how long the pool had no Ready worker (``serving_gaps``, pure: from the
samples of the auditor's own pod watch), and the requests' outcomes meanwhile.

Without a PodDisruptionBudget for a pool's workers, a drain evicts them all at once: the pool serves again
only when the operator's replacements (on another node) are Ready.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelpool_contract.labels import LABEL_POOL
from testkit.cluster import Cluster, pod_octet
from testkit.environment import ROOT
from testkit.kubectl import is_ready
from testkit.nodeagent import NodeAgent

NODE = "process-node-drain"


def serving_gaps(samples: Iterable[tuple[float, int]]) -> list[tuple[float, float]]:
    """The (start, end) windows in which a pool had no Ready worker, from (time, Ready workers) samples in
    time order; a window still open at the last sample ends there."""
    gaps: list[tuple[float, float]] = []
    start: float | None = None
    last = 0.0
    for at, ready in samples:
        last = at
        if ready == 0 and start is None:
            start = at
        elif ready > 0 and start is not None:
            gaps.append((start, at))
            start = None
    if start is not None:
        gaps.append((start, last))
    return gaps


def ready_workers(pods: Iterable[dict[str, Any]], pool: str) -> int:
    """The pool's Ready workers that are not being deleted (what the gateway routes to)."""
    ready = [
        p
        for p in pods
        if (p["metadata"].get("labels") or {}).get(LABEL_POOL) == pool
        and not p["metadata"].get("deletionTimestamp")
        and is_ready(p)
    ]
    return len(ready)


class PodLister:
    """Lists a namespace's pods through the Python client (one connection, no kubectl process per call)."""

    def __init__(self, kubeconfig: Path, namespace: str, selector: str = "") -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self._core = client.CoreV1Api(api)
        self._namespace = namespace
        self._selector = selector

    def __call__(self) -> list[dict[str, Any]]:
        response = self._core.list_namespaced_pod(
            self._namespace, label_selector=self._selector, _preload_content=False, _request_timeout=10
        )
        items: list[dict[str, Any]] = json.loads(response.data).get("items") or []  # type: ignore[attr-defined]
        return items


def process_node(cluster: Cluster, workdir: Path) -> NodeAgent:
    """The second process node (process mode: its pods run from the checkout, as process-node-0's), its
    logs and pods under ``workdir``; its pods' addresses apart from the session node's."""
    args = ("--extra-path", str(ROOT / ".venv" / "bin"))
    return NodeAgent(cluster, NODE, pod_octet(75), args=args, workdir=workdir / NODE)


@dataclass
class Sampler:
    """Samples ``count()`` every ``interval`` seconds (monotonic time, value) until stopped."""

    count: Callable[[], int]
    interval: float = 0.2
    samples: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True, name="drain-sampler")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), self.count()))
            self._stop.wait(self.interval)

    def stop(self) -> list[tuple[float, int]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        return self.samples


def drain(cluster: Cluster, timeout_s: int) -> tuple[int, float, str]:
    """``kubectl drain`` of the node: (exit status, seconds, its output's tail)."""
    started = time.monotonic()
    done = cluster.kubectl(
        "drain", NODE, "--ignore-daemonsets", "--delete-emptydir-data", f"--timeout={timeout_s}s",
        check=False, timeout=timeout_s + 30,
    )  # fmt: skip
    return done.returncode, time.monotonic() - started, (done.stdout + done.stderr)[-600:]
