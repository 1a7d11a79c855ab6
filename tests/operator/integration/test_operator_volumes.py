"""Model volumes end to end: the real operator, real ``modelpool-server`` processes on the process node,
real MiniLM.

* A ``pvc://`` source: a claim bound (by the real PV binder) to a hostPath PersistentVolume holding the
  packaged MiniLM; the operator mounts it and tells the server where (``modelpool_contract.mounts``), and
  the pool's worker serves embeddings from it.
* A shared model cache: an ``hf://`` pool whose ``spec.model.cache`` is a ReadWriteMany claim, against a
  local hub (tests/hub.py) serving the MiniLM files to the real ``huggingface_hub`` client.  The first
  worker downloads, with its progress in ``status.workers[]`` while it loads (the hub holds the weights
  half-sent until the test has seen it); scaled to two, the second worker finds every file in the cache
  and the hub serves no file body again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.cluster import Cluster, minilm_package
from testkit.environment import free_port
from testkit.kubectl import PROCESS_NODE_SELECTOR, apply, bind_host_path, wait_for
from tests.hub import LocalHub
from tests.operator.integration.opharness import (
    POOLS,
    StartOperator,
    StatusRecorder,
    pool_manifest,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

REPO = "sentence-transformers/all-MiniLM-L6-v2"
WEIGHTS = "model.safetensors"


def _process_node_pool(name: str, source: str) -> dict[str, Any]:
    pool = pool_manifest(name, memory="2Gi", source=source, node_selector=PROCESS_NODE_SELECTOR)
    pool["spec"]["resources"]["gpus"] = 0
    return pool


def _embed(pod: dict[str, Any], port: int, model: str) -> list[float]:
    response = httpx.post(
        f"http://{pod['status']['podIP']}:{port}/v1/embeddings",
        json={"model": model, "input": ["weights from a volume"]},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    vector = response.json()["data"][0]["embedding"]
    assert len(vector) == 384
    return list(vector)


def test_a_pvc_source_pool_serves_minilm(
    cluster: Cluster, namespace: str, start_operator: StartOperator, persistent_volumes: list[str]
) -> None:
    # The package's folder holds the weights in model/: the claim's root, read as pvc://weights/model.
    persistent_volumes.append(bind_host_path(cluster, namespace, "weights", minilm_package()))
    port = free_port()
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(port))
    apply(cluster, _process_node_pool("minilm", "pvc://weights/model"), namespace)
    wait_status(
        cluster,
        namespace,
        "minilm",
        lambda s: s.get("readyReplicas") == 1,
        timeout=240,
        message="the pvc:// pool's worker Ready",
    )
    (pod,) = worker_pods(cluster, namespace, "minilm")
    _embed(pod, port, "minilm")


@pytest.fixture
def hub() -> Iterator[LocalHub]:
    with LocalHub({REPO: minilm_package() / "model"}) as running:
        yield running


def _downloading(status: dict[str, Any], others: int, total: int) -> bool:
    """A worker Loading with the small files and part of the weights in the cache."""
    return any(
        w["state"] == "Loading"
        and w.get("downloadTotalBytes") == total
        and others < (w.get("downloadedBytes") or 0) < total
        for w in status.get("workers") or []
    )


@pytest.fixture
def cache_dir(cluster: Cluster, namespace: str, persistent_volumes: list[str], tmp_path: Path) -> Path:
    """The directory behind the claim ``hub-cache`` (ReadWriteMany, bound to a hostPath PV)."""
    directory = tmp_path / "model-cache"
    directory.mkdir()
    persistent_volumes.append(bind_host_path(cluster, namespace, "hub-cache", directory, "ReadWriteMany"))
    return directory


def test_workers_share_the_model_cache_and_report_download_progress(
    cluster: Cluster, namespace: str, start_operator: StartOperator, hub: LocalHub, cache_dir: Path
) -> None:
    total = sum(f.size for f in hub.files(REPO).values())
    others = total - hub.files(REPO)[WEIGHTS].size
    port = free_port()
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(port))
    pool = _process_node_pool("cached", f"hf://{REPO}")
    pool["spec"]["model"]["cache"] = {"type": "pvc", "claimName": "hub-cache"}
    pool["spec"]["podTemplate"]["env"] = [
        {"name": "HF_ENDPOINT", "value": hub.url},
        {"name": "HF_HUB_OFFLINE", "value": "0"},  # the process node's default is offline
        # A held download sends nothing for a while: the client must not give up on it meanwhile.
        {"name": "HF_HUB_DOWNLOAD_TIMEOUT", "value": "300"},
    ]
    hub.hold(WEIGHTS)
    recorder = StatusRecorder(cluster, namespace).start()
    try:
        apply(cluster, pool, namespace)
        wait_for(
            lambda: any(_downloading(s, others, total) for s in recorder.statuses("cached")),
            timeout=240,
            interval=0.3,
            message="status.workers[] shows the download in progress while Loading",
        )
    finally:
        recorder.stop()
        hub.release()
    wait_status(
        cluster,
        namespace,
        "cached",
        lambda s: s.get("readyReplicas") == 1,
        timeout=240,
        message="first Ready",
    )
    first_bodies, first_summary = hub.bodies(), hub.summary()
    assert first_bodies == {name: 1 for name in hub.files(REPO)}, hub.requests
    # In the shared volume: HF_HOME is huggingface/ in the cache volume.
    assert list((cache_dir / "huggingface" / "hub").glob("models--*/snapshots/*/model.safetensors"))

    served = dict(hub.requests)
    cluster.kubectl(
        "patch", POOLS, "cached", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":2}}'
    )
    status = wait_status(
        cluster,
        namespace,
        "cached",
        lambda s: s.get("readyReplicas") == 2,
        timeout=240,
        message="second Ready",
    )
    assert hub.bodies() == first_bodies  # the second worker fetched no file
    new = {
        f"{m} {p}": n - served.get((m, p), 0) for (m, p), n in hub.requests.items() if n != served.get((m, p))
    }
    assert all(key.startswith("GET /api/models/") for key in new), new
    pods = worker_pods(cluster, namespace, "cached")
    vectors = [_embed(pod, port, "cached") for pod in pods]
    assert vectors[0] == vectors[1]
    for pod in pods:
        stats = httpx.get(f"http://{pod['status']['podIP']}:{port}/stats", timeout=10).json()
        assert stats["download"] == {"downloaded_bytes": total, "total_bytes": total}
    assert all("downloadedBytes" not in w for w in status["workers"])  # only while Loading
    # The hub's request counts, for the test's output (-s).
    print(json.dumps({"first worker": first_summary, "both workers": hub.summary()}))
