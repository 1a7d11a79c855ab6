"""Worker pods pass the `restricted` Pod Security Standard, and secrets stay out of the ModelPool.

On the real API server: a namespace labelled ``pod-security.kubernetes.io/enforce=restricted`` (its
admission refuses a pod that does not comply: checked first, so the admission is known to be on), a pool
whose workers take a token from a Secret (``env[].valueFrom``) and an API key mounted from a Secret
(``auth.apiKeySecret``): every worker is admitted and becomes Ready, with a read-only root filesystem and
no ServiceAccount token; a pool that asks for the token (``podTemplate.automountServiceAccountToken``) is
admitted too. With a real ``modelpool-server`` on
the process node, the Secret's value reaches the server process's environment while the ModelPool only
names the Secret.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, container_status, wait_for
from tests.operator.integration.opharness import (
    PROCESS_NODE,
    StartOperator,
    events,
    get_pool,
    minilm_source,
    pool_manifest,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster]

TOKEN = "hf_not-a-real-token-4f2a"
API_KEY = "sk-pool-not-a-real-key-77"


def _restricted(cluster: Cluster, namespace: str) -> None:
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    # The control: a pod that is not restricted is refused, so the admission below means something.
    plain = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "unrestricted", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}]},
    }
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(plain), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr, refused.stderr


def _secret(cluster: Cluster, namespace: str, name: str, **data: str) -> None:
    literals = [f"--from-literal={key}={value}" for key, value in data.items()]
    cluster.kubectl("create", "secret", "generic", name, "-n", namespace, *literals)


def test_workers_are_admitted_in_a_restricted_namespace_with_secrets_by_reference(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    _restricted(cluster, namespace)
    _secret(cluster, namespace, "hf", token=TOKEN)
    _secret(cluster, namespace, "api-keys", pool=API_KEY)
    pool = pool_manifest("locked", replicas=2, memory="1Gi")
    pool["spec"]["podTemplate"]["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    ]
    pool["spec"]["auth"] = {"apiKeySecret": {"name": "api-keys", "key": "pool"}}
    start_operator(namespace)
    apply(cluster, pool, namespace)
    wait_status(
        cluster, namespace, "locked", lambda s: s.get("readyReplicas") == 2, timeout=90, message="2 admitted"
    )
    assert not [e for e in events(cluster, namespace, "locked") if e["reason"] == "CreateFailed"]
    for pod in worker_pods(cluster, namespace, "locked"):
        assert pod["spec"]["automountServiceAccountToken"] is False
        # The ServiceAccount admission adds no token volume to a pod that opts out.
        assert not [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access")]
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"tmp", "home"} <= {m["name"] for m in container["volumeMounts"]}
        assert {
            "name": "HF_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
        } in container["env"]
        args = container["args"]
        assert args[args.index("--api-key-file") + 1] == "/etc/modelpool/api-key/api-key"
    stored = json.dumps(get_pool(cluster, namespace, "locked"))
    assert TOKEN not in stored and API_KEY not in stored

    # A pool that needs the API (its own ServiceAccount) asks for the token; restricted admits it too.
    trusted = pool_manifest("trusted", replicas=1, memory="1Gi")
    trusted["spec"]["podTemplate"]["automountServiceAccountToken"] = True
    apply(cluster, trusted, namespace)
    wait_status(
        cluster, namespace, "trusted", lambda s: s.get("readyReplicas") == 1, timeout=90, message="admitted"
    )
    (pod,) = worker_pods(cluster, namespace, "trusted")
    assert pod["spec"]["automountServiceAccountToken"] is True
    assert [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access")]


@pytest.mark.slow
def test_a_secret_reaches_the_real_server_process_and_never_the_spec(
    cluster: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    _restricted(cluster, namespace)
    _secret(cluster, namespace, "hf", token=TOKEN)
    port = free_port()
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PORT=str(port))
    pool = pool_manifest("minilm", memory="2Gi", source=minilm_source(), node_selector=PROCESS_NODE)
    pool["spec"]["resources"]["gpus"] = 0
    pool["spec"]["podTemplate"]["env"] = [
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    ]
    apply(cluster, pool, namespace)
    wait_status(
        cluster, namespace, "minilm", lambda s: s.get("readyReplicas") == 1, timeout=240, message="Ready"
    )
    (pod,) = worker_pods(cluster, namespace, "minilm")
    status = container_status(pod, "server")
    assert status is not None and status["containerID"].startswith("process://")
    pid = status["containerID"].removeprefix("process://")
    # The process node runs the container's command as this machine's process: its environment is the
    # kubelet's resolution of the pod's env, the Secret's value included.
    environ = wait_for(
        lambda: Path(f"/proc/{pid}/environ").read_bytes(), timeout=10, message="the server's environment"
    )
    assert f"HF_TOKEN={TOKEN}".encode() in environ.split(b"\0")
    assert TOKEN not in json.dumps(get_pool(cluster, namespace, "minilm"))
