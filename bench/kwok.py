"""What the control-plane benchmarks share (``bench.controlplane``, ``bench.gateway``,
``bench.gateway_scale``): a pool of workers on the KWOK nodes, and a polling wait with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 1.0) -> float:
    """Seconds until ``predicate`` holds; raises after ``timeout``."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f}s")
        time.sleep(interval)


def kwok_pool(name: str, namespace: str, workers: int) -> dict[str, Any]:
    """A pool of ``workers`` workers on the KWOK nodes (pods with no process behind them)."""
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"source": "/models/bench", "task": "text-embedding"},
            "replicas": workers,
            "minReplicas": 0,
            "maxReplicas": max(workers, 10),
            # GPUs are not requested: 1000 workers would need 1000 fake GPUs; placement is not what
            # this benchmark measures.
            "resources": {"memory": "1Gi", "gpus": 0},
            "podTemplate": {
                "nodeSelector": {"type": "kwok"},
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
            },
        },
    }
