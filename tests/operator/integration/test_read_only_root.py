"""Every task loads and serves with the read-only root filesystem the operator gives its workers.

The real operator creates one worker per task (text-embedding with real MiniLM, the other four with the
tiny models of ``testkit/tiny_models.py``) on the process node, which enforces
``readOnlyRootFilesystem`` (``testkit/processnode/rootfs.py``: the host's filesystem is read-only to the
server, its tmp and home emptyDirs are not).  All five load at once; each answers one request.  The
server's own mount table shows the read-only root, and no worker has a service account token.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, container_status
from tests.operator.integration.opharness import (
    PROCESS_NODE,
    StartOperator,
    minilm_source,
    pool_manifest,
    wait_status,
    worker_pods,
)
from tests.server.tiny_fixtures import (
    gradient_png,
    tiny_image_embedding,
    tiny_text_generation,
    tiny_text_to_image,
    tiny_vision,
)

__all__ = ["tiny_image_embedding", "tiny_text_generation", "tiny_text_to_image", "tiny_vision"]

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PNG = "data:image/png;base64," + base64.b64encode(gradient_png()).decode()


def _request(task: str, model: str) -> tuple[str, dict[str, Any]]:
    """One request of each task: its route and body."""
    if task == "text-embedding":
        return "/v1/embeddings", {"model": model, "input": ["a read-only root"]}
    if task == "image-embedding":
        return "/v1/embeddings", {"model": model, "input": [PNG.split(",", 1)[1]]}
    if task == "text-generation":
        return "/v1/completions", {"model": model, "prompt": "Hello, world!", "max_tokens": 3}
    if task == "vision":
        content = [{"type": "image_url", "image_url": {"url": PNG}}]
        return "/v1/chat/completions", {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 3,
        }
    body = {
        "model": model,
        "prompt": "a red square",
        "size": "64x64",
        "response_format": "b64_json",
        "steps": 1,
    }
    return "/v1/images/generations", body


def _answered(task: str, body: dict[str, Any]) -> bool:
    if task == "text-embedding":
        return len(body["data"][0]["embedding"]) == 384
    if task == "image-embedding":
        return len(body["data"][0]["embedding"]) == 16
    if task == "text-generation":
        return isinstance(body["choices"][0]["text"], str)
    if task == "vision":
        return isinstance(body["choices"][0]["message"]["content"], str)
    return base64.b64decode(body["data"][0]["b64_json"]).startswith(b"\x89PNG")


def _root_options(pid: str) -> list[str]:
    """The mount options of ``/`` as the process sees it (its own mount namespace)."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return fields[5].split(",")
    raise AssertionError(f"no / in /proc/{pid}/mountinfo")


@pytest.fixture
def sources(
    tiny_text_generation: Path, tiny_image_embedding: Path, tiny_vision: Path, tiny_text_to_image: Path
) -> dict[str, tuple[str, str]]:
    """Each task's model source and its pool's memory."""
    return {
        "text-embedding": (minilm_source(), "2Gi"),
        "text-generation": (str(tiny_text_generation), "1Gi"),
        "image-embedding": (str(tiny_image_embedding), "1Gi"),
        "vision": (str(tiny_vision), "1Gi"),
        "text-to-image": (str(tiny_text_to_image), "1Gi"),
    }


def test_every_task_loads_and_serves_with_a_read_only_root(
    cluster: Cluster, namespace: str, start_operator: StartOperator, sources: dict[str, tuple[str, str]]
) -> None:
    port = free_port()
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(port))
    for task, (source, memory) in sources.items():
        pool = pool_manifest(task, memory=memory, source=source, task=task, node_selector=PROCESS_NODE)
        pool["spec"]["resources"]["gpus"] = 0
        # Five servers on a few shared cores: one compute thread each.
        pool["spec"]["podTemplate"]["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
        apply(cluster, pool, namespace)
    for task in sources:  # all five load at once; waiting on each in turn costs the slowest load
        wait_status(
            cluster,
            namespace,
            task,
            lambda s: s.get("readyReplicas") == 1,
            timeout=300,
            message=f"{task} Ready",
        )
    for task in sources:
        (pod,) = worker_pods(cluster, namespace, task)
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert not any(v.get("projected") for v in spec["volumes"]), "no service account token volume"
        assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        status = container_status(pod, "server")
        assert status is not None
        pid = status["containerID"].removeprefix("process://")
        assert "ro" in _root_options(pid), task
        route, body = _request(task, task)
        response = httpx.post(f"http://{pod['status']['podIP']}:{port}{route}", json=body, timeout=120)
        assert response.status_code == 200, (task, response.text)
        assert _answered(task, response.json()), (task, response.json())
