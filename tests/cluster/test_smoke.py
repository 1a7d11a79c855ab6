"""Smoke tests of the local control plane (docs/cluster.md; docs/design.md for how the tests use it).

Real: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl (built by `make testbin`).
Simulated: the kwok-gpu-* nodes (KWOK writes their pods' status).  Real processes: pods on the process node.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubectl import apply, container_status, get_json, is_ready, pod_log, process_node_pod, wait_for

pytestmark = pytest.mark.cluster
KWOK_NODES = [f"kwok-gpu-{i}" for i in range(4)]


def test_nodes_list_gpu_capacity_and_versions(cluster: Cluster) -> None:
    nodes = {n["metadata"]["name"]: n for n in get_json(cluster, "nodes")["items"]}
    for name in KWOK_NODES:
        assert nodes[name]["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert nodes[name]["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
    proc = nodes[cluster.process_node]
    assert proc["metadata"]["labels"]["modelpool.dev/process-node"] == "true"
    assert "kwok.x-k8s.io/node" not in (proc["metadata"].get("annotations") or {})
    assert proc["status"]["capacity"]["nvidia.com/gpu"] == "8"
    # What a user sees: `kubectl get nodes` with the GPU column.
    table = cluster.kubectl(
        "get", "nodes", "-o", "custom-columns=NAME:.metadata.name,GPU:.status.capacity.nvidia\\.com/gpu"
    ).stdout
    for name in [*KWOK_NODES, cluster.process_node]:
        assert any(line.split() == [name, "8"] for line in table.splitlines()), table
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.34.4"
    assert version["clientVersion"]["gitVersion"] == "v1.34.4"
    # helm (upstream, built by make testbin) talks to the same API server (other tests may own releases).
    assert isinstance(json.loads(cluster.helm("list", "--all-namespaces", "-o", "json").stdout), list)
    assert "v3.21" in cluster.helm("version", "--short").stdout


def test_deployment_lands_on_kwok_gpu_nodes_and_is_garbage_collected(
    cluster: Cluster, namespace: str
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "gpu-web"}},
            "template": {
                "metadata": {"labels": {"app": "gpu-web"}},
                "spec": {
                    "nodeSelector": {"type": "kwok"},
                    "containers": [
                        {
                            "name": "main",
                            "image": "example.invalid/gpu-web:1",
                            # 5 GPUs each: no node fits two, so the scheduler must spread them.
                            "resources": {"limits": {"nvidia.com/gpu": "5"}},
                        }
                    ],
                },
            },
        },
    }
    apply(cluster, deployment, namespace)

    def three_running() -> list[dict[str, Any]] | None:
        pods = get_json(cluster, "pods", "-n", namespace, "-l", "app=gpu-web")["items"]
        ok = [p for p in pods if p["status"].get("phase") == "Running" and is_ready(p)]
        return ok if len(ok) == 3 else None

    pods = wait_for(three_running, timeout=60, message="3 Running+Ready gpu-web pods")
    nodes = {p["spec"]["nodeName"] for p in pods}
    assert len(nodes) == 3 and nodes <= set(KWOK_NODES)
    for p in pods:  # the ReplicaSet (controller-manager) owns them
        assert p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    wait_for(
        lambda: (
            get_json(cluster, "deployment", "gpu-web", "-n", namespace)["status"].get("availableReplicas")
            == 3
        ),
        timeout=30,
        message="deployment available",
    )
    cluster.kubectl("delete", "deployment", "gpu-web", "-n", namespace, "--wait=false")
    wait_for(
        lambda: not get_json(cluster, "pods", "-n", namespace, "-l", "app=gpu-web")["items"],
        timeout=60,
        message="garbage collection removed the deployment's pods",
    )


def test_process_node_is_tainted_so_untolerating_gpu_pods_stay_off_it(
    cluster: Cluster, namespace: str
) -> None:
    node = get_json(cluster, "node", cluster.process_node)
    taint = {"key": "modelpool.dev/process-node", "value": "true", "effect": "NoSchedule"}
    assert taint in node["spec"]["taints"]
    # Five pods of 5 GPUs, no selector, no toleration: no node fits two, and only the four KWOK nodes are
    # open to them, so one (or more, if other tests hold KWOK GPUs) stays Pending; the process node
    # with its 8 advertised GPUs would take it if it were not tainted.
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-any"},
        "spec": {
            "replicas": 5,
            "selector": {"matchLabels": {"app": "gpu-any"}},
            "template": {
                "metadata": {"labels": {"app": "gpu-any"}},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": "example.invalid/gpu-any:1",
                            "resources": {"limits": {"nvidia.com/gpu": "5"}},
                        }
                    ],
                },
            },
        },
    }
    apply(cluster, deployment, namespace)

    def unschedulable(pod: dict[str, Any]) -> str | None:
        for c in pod["status"].get("conditions") or []:
            if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") == "Unschedulable":
                return str(c.get("message", ""))
        return None

    def all_decided() -> list[dict[str, Any]] | None:
        pods = get_json(cluster, "pods", "-n", namespace, "-l", "app=gpu-any")["items"]
        decided = [p for p in pods if p["spec"].get("nodeName") or unschedulable(p) is not None]
        return pods if len(pods) == 5 and len(decided) == 5 else None

    pods = wait_for(all_decided, timeout=60, message="each gpu-any pod placed or found unschedulable")
    placed = [p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")]
    assert placed and set(placed) <= set(KWOK_NODES), placed
    pending = [m for p in pods if (m := unschedulable(p)) is not None]
    # The scheduler's reason for the process node (the only tainted node; 1.34 names no taint key).
    assert pending and all("1 node(s) had untolerated taint" in m for m in pending), pending


@pytest.mark.parametrize(("chaos", "reason", "code"), [("oom", "OOMKilled", 137), ("crash", "Error", 1)])
def test_chaos_label_ends_the_container(
    cluster: Cluster, namespace: str, chaos: str, reason: str, code: int
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": chaos, "labels": {"kwok.modelpool.test/chaos": chaos}},
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "example.invalid/x:1"}],
        },
    }
    apply(cluster, pod, namespace)

    def terminated() -> dict[str, Any] | None:
        cs = container_status(get_json(cluster, "pod", chaos, "-n", namespace))
        term: dict[str, Any] | None = (cs or {}).get("state", {}).get("terminated")
        return term

    term = wait_for(terminated, timeout=30, message=f"chaos={chaos} pod terminated")
    assert (term["reason"], term["exitCode"]) == (reason, code)
    assert get_json(cluster, "pod", chaos, "-n", namespace)["status"]["phase"] == "Failed"


def test_chaos_load_failed_carries_the_message(cluster: Cluster, namespace: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "lf",
            "labels": {"kwok.modelpool.test/chaos": "load-failed"},
            "annotations": {"kwok.modelpool.test/chaos-message": "no such model: /models/x"},
        },
        "spec": {
            "nodeSelector": {"type": "kwok"},
            "containers": [{"name": "main", "image": "example.invalid/x:1"}],
        },
    }
    apply(cluster, pod, namespace)

    def terminated() -> dict[str, Any] | None:
        cs = container_status(get_json(cluster, "pod", "lf", "-n", namespace))
        term: dict[str, Any] | None = (cs or {}).get("state", {}).get("terminated")
        return term

    term = wait_for(terminated, timeout=30, message="load-failed pod terminated")
    assert (term["exitCode"], term["message"]) == (3, "no such model: /models/x")


def _http_pod(name: str, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "web",
        "image": "python:3.11",
        "command": ["python3", "-m", "http.server", "--bind", "$(MY_IP)", "8080"],
        "env": [{"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    }
    container.update(extra)
    return process_node_pod(name, [container], terminationGracePeriodSeconds=5)


def test_process_node_runs_a_real_server_restarts_it_and_deletes_gracefully(
    cluster: Cluster, namespace: str
) -> None:
    apply(cluster, _http_pod("web"), namespace)

    def ready() -> dict[str, Any] | None:
        p = get_json(cluster, "pod", "web", "-n", namespace)
        return p if is_ready(p) else None

    pod = wait_for(ready, timeout=30, message="web pod Ready on the process node")
    assert pod["spec"]["nodeName"] == cluster.process_node
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.") and ip != "127.0.0.1"
    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as resp:
        assert resp.status == 200
    assert "GET / HTTP" in pod_log(cluster, namespace, "web", "web")  # http.server logs each request

    # Kill the process from outside: the container terminates with 137 and is restarted.
    cs = container_status(pod)
    assert cs is not None and cs["containerID"].startswith("process://")
    os.kill(int(cs["containerID"].removeprefix("process://")), signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        p = get_json(cluster, "pod", "web", "-n", namespace)
        s = container_status(p) or {}
        return p if s.get("restartCount", 0) >= 1 and is_ready(p) else None

    pod = wait_for(restarted, timeout=30, message="container restarted and Ready again")
    last = (container_status(pod) or {})["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (137, "Error")
    assert pod["status"]["podIP"] == ip  # the pod keeps its address across container restarts
    with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as resp:
        assert resp.status == 200

    # Deletion: SIGTERM ends http.server at once; the agent then removes the pod object.
    cluster.kubectl("delete", "pod", "web", "-n", namespace, "--wait=false")
    wait_for(
        lambda: cluster.kubectl("get", "pod", "web", "-n", namespace, check=False).returncode != 0,
        timeout=20,
        message="pod removed after graceful termination",
    )


def test_process_node_termination_message_and_restart_policy(cluster: Cluster, namespace: str) -> None:
    script = 'echo "model weights not found" > "$MODELPOOL_TERMINATION_LOG"; echo to-stdout; exit 3'
    fallback = "echo last words from the log; exit 4"
    pod = process_node_pod(
        "fails",
        restartPolicy="Never",
        containers=[
            {"name": "msg", "image": "busybox", "command": ["sh", "-c", script]},
            {
                "name": "fallback",
                "image": "busybox",
                "command": ["sh", "-c", fallback],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            },
        ],
    )
    apply(cluster, pod, namespace)

    def failed() -> dict[str, Any] | None:
        p = get_json(cluster, "pod", "fails", "-n", namespace)
        return p if p["status"].get("phase") == "Failed" else None

    done = wait_for(failed, timeout=30, message="pod Failed")
    msg = (container_status(done, "msg") or {})["state"]["terminated"]
    assert (msg["exitCode"], msg["reason"], msg["message"]) == (3, "Error", "model weights not found")
    fb = (container_status(done, "fallback") or {})["state"]["terminated"]
    assert (fb["exitCode"], fb["message"].strip()) == (4, "last words from the log")
    assert (container_status(done, "msg") or {})["restartCount"] == 0
    assert pod_log(cluster, namespace, "fails", "msg").strip() == "to-stdout"


def test_process_node_liveness_failure_restarts_with_crashloop_backoff(
    cluster: Cluster, namespace: str
) -> None:
    # The liveness probe targets a port nothing listens on: the kubelet's answer is kill and restart.
    pod = _http_pod(
        "unhealthy",
        livenessProbe={"tcpSocket": {"port": 9}, "periodSeconds": 1, "failureThreshold": 2},
    )
    apply(cluster, pod, namespace)

    def restarted() -> dict[str, Any] | None:
        cs = container_status(get_json(cluster, "pod", "unhealthy", "-n", namespace)) or {}
        return cs if cs.get("restartCount", 0) >= 1 else None

    cs = wait_for(restarted, timeout=40, message="liveness failure restarted the container")
    assert cs["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM ended http.server

    def crashloop() -> bool:
        cs = container_status(get_json(cluster, "pod", "unhealthy", "-n", namespace)) or {}
        return (cs.get("state", {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"

    wait_for(crashloop, timeout=40, interval=0.1, message="CrashLoopBackOff between restarts")
