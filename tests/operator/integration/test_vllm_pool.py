"""A ModelPool with ``spec.engine: vllm`` on the local control plane: the real operator renders ``--engine
vllm``, the process node runs the worker (vLLM's CPU build from ``make vllm-env``, a tiny Llama built
here), the pool's status shows the worker Loading, then serving with vLLM's figures (``generation.engine``
vllm, its KV cache), a completion through the openai client on the pod's address, and the pool's deletion
drains the worker away.  A pool asking vLLM for another task is refused by the API server with the
contract's words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from modelpool_contract.api import MSG_ENGINE_TASK, MSG_VLLM_ENGINE
from testkit import tiny_models
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply
from testkit.vllm import vllm_args, vllm_env, vllm_settings
from tests.operator.integration.opharness import (
    PROCESS_NODE,
    StartOperator,
    pool_manifest,
    wait_pods_gone,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(900)]

CONTEXT = 128
# vLLM's start on two shared cores: from ~30 s to minutes.
READY_S = 600


def _vllm_pool(model: Path) -> dict[str, Any]:
    pool = pool_manifest(
        "llm", memory="2Gi", source=str(model), task="text-generation", node_selector=PROCESS_NODE
    )
    spec = pool["spec"]
    spec["engine"] = "vllm"
    # vLLM's settings as a pool author writes them: the operator passes them as the worker's --vllm-args.
    spec["vllm"] = vllm_settings(CONTEXT).wire()
    spec["resources"]["gpus"] = 0
    env = {**vllm_env(), "OMP_NUM_THREADS": "1"}
    spec["podTemplate"]["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return pool


def test_a_vllm_pool_loads_serves_and_drains(
    cluster: Cluster, namespace: str, start_operator: StartOperator, tmp_path: Path
) -> None:
    model = tiny_models.build_vllm_llama(tmp_path / "llama", context=CONTEXT)
    port = free_port()
    allowed = "MODELPOOL_VLLM_PYTHON,VLLM_CPU_KVCACHE_SPACE,OMP_NUM_THREADS"
    start_operator(
        namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(port), MODELPOOL_OPERATOR_ALLOWED_ENV_NAMES=allowed
    )
    apply(cluster, _vllm_pool(model), namespace)
    seen: set[str] = set()

    def serving(status: dict[str, Any]) -> bool:
        seen.update(w["state"] for w in status.get("workers") or [])
        return status.get("readyReplicas") == 1

    status = wait_status(cluster, namespace, "llm", serving, timeout=READY_S, message="the vLLM worker Ready")
    assert "Loading" in seen, seen
    (worker,) = status["workers"]
    assert worker["generation"]["engine"] == "vllm" and worker["generation"]["kvCacheTokens"] > 0, worker
    (pod,) = worker_pods(cluster, namespace, "llm")
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--engine") + 1] == "vllm"
    assert f"--vllm-args={vllm_args(CONTEXT)}" in args
    url = f"http://{pod['status']['podIP']}:{port}/v1"
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
    completion = client.completions.create(
        model="llm", prompt="Hello, world!", max_tokens=5, temperature=0, extra_body={"ignore_eos": True}
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    cluster.kubectl("delete", "modelpool", "llm", "-n", namespace, "--wait=false")
    wait_pods_gone(cluster, namespace, "llm", timeout=120)


def test_vllm_for_another_task_is_refused_by_the_api_server(crds: Cluster, namespace: str) -> None:
    pool = pool_manifest("emb", task="text-embedding")
    pool["spec"]["engine"] = "vllm"
    manifest = json.dumps(pool)
    done = crds.kubectl("create", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest, check=False)
    assert done.returncode != 0 and MSG_ENGINE_TASK in done.stderr, done.stderr


def _dry_run(crds: Cluster, namespace: str, pool: dict[str, Any]) -> tuple[bool, str]:
    done = crds.kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(pool), check=False
    )
    return done.returncode == 0, done.stderr


def test_vllm_settings_are_checked_by_the_api_server(crds: Cluster, namespace: str) -> None:
    """spec.vllm: accepted on a vllm pool, refused without spec.engine vllm (the model's message) and out
    of its bounds or enum, by the API server itself."""
    pool = pool_manifest("gen", task="text-generation")
    pool["spec"]["vllm"] = vllm_settings(CONTEXT).wire()
    accepted, why = _dry_run(crds, namespace, pool)
    assert not accepted and MSG_VLLM_ENGINE in why, why
    pool["spec"]["engine"] = "vllm"
    pool["spec"]["vllm"].update(gpuMemoryUtilization=0.5, quantization="awq", kvCacheDtype="fp8")
    accepted, why = _dry_run(crds, namespace, pool)
    assert accepted, why
    for field, value in [("maxNumSeqs", 1025), ("maxModelLen", 8), ("gpuMemoryUtilization", 1.0)]:
        bad = json.loads(json.dumps(pool))
        bad["spec"]["vllm"][field] = value
        accepted, why = _dry_run(crds, namespace, bad)
        assert not accepted and f"spec.vllm.{field}" in why, why
    pool["spec"]["vllm"]["quantization"] = "int3"
    accepted, why = _dry_run(crds, namespace, pool)
    assert not accepted and "spec.vllm.quantization" in why and "Unsupported value" in why, why
