"""Volumes on the process node, against the real API server and the real PersistentVolume binder in
kube-controller-manager: pods read and write their emptyDir, hostPath and PVC volumes at their
mountPaths; a pod whose claim is not bound waits in ContainerCreating with a FailedMount event until it
is; emptyDirs go with the pod; and a modelpool-server worker built by the operator's pod builder loads
real MiniLM from a `pvc://` source whose claim is bound to a hostPath PersistentVolume."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool_operator.effects.resources import PodSettings, build_worker_pod
from modelpool_operator.pool import PoolView
from testkit.cluster import Cluster, minilm_package
from testkit.environment import free_port
from testkit.kubectl import (
    PROCESS_NODE_SELECTOR,
    apply,
    bind_host_path,
    claim_manifest,
    container_status,
    get_json,
    host_path_pv,
    is_ready,
    pod_log,
    process_node_pod,
    wait_for,
)
from tests.operator.integration.opharness import pool_manifest

pytestmark = pytest.mark.cluster

# Reports what the container sees at the paths in argv/env, as JSON in its termination message.
PROBE = """
import json, os, sys
host_file, claim_dir, scratch, created = sys.argv[1:5]
with open(os.path.join(scratch, "note.txt"), "w") as f:
    f.write("written in the pod")
with open(os.path.join(created, "out.txt"), "w") as f:
    f.write("left on the host")
report = {
    "host_file": open(host_file).read(),
    "claim_listing": sorted(os.listdir(claim_dir)),
    "model_config": open(os.path.join(os.environ["MODEL_DIR"], "config.json")).read(),
    "scratch": open(os.path.join(scratch, "note.txt")).read(),
    "root": os.environ["PROCESSNODE_ROOT"],
    "argv": sys.argv[1:],
}
with open(os.environ["MODELPOOL_TERMINATION_LOG"], "w") as f:
    json.dump(report, f)
"""


def _pods_dir(cluster: Cluster) -> Path:
    # hack/cluster.sh gives the agent --pods-dir $CLUSTER_DIR/pods, beside its container logs.
    return Path(cluster.processnode_log_dir).parent / "pods"


def _probe_pod(name: str, host_dir: Path, created: Path, claim: str, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "probe",
        "image": "python:3.11",
        "command": ["python3", "-c", PROBE],
        "args": ["/data/host/hello.txt", f"/models/{claim}", "/scratch", "/data/created"],
        "env": [{"name": "MODEL_DIR", "value": f"/models/{claim}/v1"}],
        "volumeMounts": [
            {"name": "host", "mountPath": "/data/host", "readOnly": True},
            {"name": "created", "mountPath": "/data/created"},
            {"name": "model", "mountPath": f"/models/{claim}", "readOnly": True},
            {"name": "scratch", "mountPath": "/scratch"},
        ],
    }
    volumes = [
        {"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}},
        {"name": "created", "hostPath": {"path": str(created), "type": "DirectoryOrCreate"}},
        {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}},
        {"name": "scratch", "emptyDir": {}},
    ]
    return process_node_pod(name, [container], restartPolicy="Never", volumes=volumes, **spec)


def _finished(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod = get_json(cluster, "pod", name, "-n", namespace)
    return pod if pod["status"].get("phase") in ("Succeeded", "Failed") else None


def _layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    (host_dir / "hello.txt").write_text("from a hostPath")
    pv_dir = tmp_path / "pv"
    (pv_dir / "v1").mkdir(parents=True)
    (pv_dir / "v1" / "config.json").write_text('{"model_type": "bert"}')
    return host_dir, pv_dir, tmp_path / "created" / "out"


def test_pod_sees_its_emptydir_hostpath_and_pvc_volumes(
    cluster: Cluster, namespace: str, tmp_path: Path, persistent_volumes: list[str]
) -> None:
    host_dir, pv_dir, created = _layout(tmp_path)
    persistent_volumes.append(bind_host_path(cluster, namespace, "weights", pv_dir))
    apply(cluster, _probe_pod("reader", host_dir, created, "weights"), namespace)

    pod = wait_for(lambda: _finished(cluster, namespace, "reader"), timeout=60, message="reader finished")
    term = (container_status(pod) or {})["state"]["terminated"]
    assert (pod["status"]["phase"], term["exitCode"]) == ("Succeeded", 0), term
    report = json.loads(term["message"])
    root = report["root"]
    assert report["host_file"] == "from a hostPath"
    assert report["claim_listing"] == ["v1"]
    assert json.loads(report["model_config"]) == {"model_type": "bert"}
    assert report["scratch"] == "written in the pod"
    # The rule the process saw: every mounted path in its args under its own root.
    assert report["argv"] == [
        f"{root}/data/host/hello.txt",
        f"{root}/models/weights",
        f"{root}/scratch",
        f"{root}/data/created",
    ]
    assert (created / "out.txt").read_text() == "left on the host"  # DirectoryOrCreate made it

    pod_dir = _pods_dir(cluster) / pod["metadata"]["uid"]
    assert (pod_dir / "volumes" / "scratch" / "note.txt").read_text() == "written in the pod"
    cluster.kubectl("delete", "pod", "reader", "-n", namespace, "--wait=false")
    wait_for(lambda: not pod_dir.exists(), timeout=30, message="the emptyDir removed with the pod")
    assert (pv_dir / "v1" / "config.json").exists() and (host_dir / "hello.txt").exists()


def test_unbound_claim_keeps_the_pod_in_container_creating_until_it_binds(
    cluster: Cluster, namespace: str, tmp_path: Path, persistent_volumes: list[str]
) -> None:
    host_dir, pv_dir, created = _layout(tmp_path)
    storage_class = f"local-{namespace}"
    apply(cluster, claim_manifest("later", storage_class), namespace)
    # Bound to the node directly (as the scheduler would not: it holds pods with unbound claims), so the
    # node itself meets the unbound claim, as a kubelet does.
    pod = _probe_pod("waiter", host_dir, created, "later", nodeName=cluster.process_node)
    apply(cluster, pod, namespace)

    def failed_mount() -> list[dict[str, Any]]:
        listed = get_json(
            cluster,
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=waiter,reason=FailedMount",
        )
        return list(listed["items"])

    event = wait_for(failed_mount, timeout=30, message="FailedMount event for the unbound claim")[0]
    assert event["type"] == "Warning" and event["source"]["component"] == "kubelet"
    assert f"error processing PVC {namespace}/later: PVC is not bound" in event["message"]
    waiting = get_json(cluster, "pod", "waiter", "-n", namespace)
    assert waiting["status"]["phase"] == "Pending"
    assert (container_status(waiting) or {})["state"]["waiting"]["reason"] == "ContainerCreating"
    started = {c["type"]: c["status"] for c in waiting["status"]["conditions"]}
    assert started["PodReadyToStartContainers"] == "False"

    pv = f"pv-{namespace}"
    persistent_volumes.append(pv)
    apply(cluster, host_path_pv(pv, pv_dir, storage_class, "later", namespace))
    done = wait_for(
        lambda: _finished(cluster, namespace, "waiter"), timeout=90, message="waiter ran once bound"
    )
    assert done["status"]["phase"] == "Succeeded"
    report = json.loads((container_status(done) or {})["state"]["terminated"]["message"])
    assert report["claim_listing"] == ["v1"]


@pytest.mark.slow
def test_operator_built_worker_loads_minilm_from_a_pvc_source(
    cluster: Cluster, namespace: str, persistent_volumes: list[str]
) -> None:
    persistent_volumes.append(bind_host_path(cluster, namespace, "weights", minilm_package()))
    pool = pool_manifest(
        "minilm", memory="2Gi", source="pvc://weights/model", node_selector=PROCESS_NODE_SELECTOR
    )
    pool["spec"]["resources"]["gpus"] = 0
    port = free_port()
    settings = PodSettings(port=port, startup_period_s=1)
    worker = build_worker_pod(PoolView.from_body(pool), f"minilm-{uuid.uuid4().hex[:5]}", settings)
    # The operator mounts the claim at /models/<claim> and tells the server --pvc-root /models.
    container = worker["spec"]["containers"][0]
    assert {"name": "model", "mountPath": "/models/weights", "readOnly": True} in container["volumeMounts"]
    assert container["args"][container["args"].index("--pvc-root") + 1] == "/models"
    apply(cluster, worker, namespace)
    name = worker["metadata"]["name"]

    def ready_or_failed() -> dict[str, Any] | None:
        pod = get_json(cluster, "pod", name, "-n", namespace)
        return pod if is_ready(pod) or pod["status"].get("phase") == "Failed" else None

    pod = wait_for(ready_or_failed, timeout=240, interval=0.5, message="worker Ready (MiniLM from the PVC)")
    assert is_ready(pod), container_status(pod)
    response = httpx.post(
        f"http://{pod['status']['podIP']}:{port}/v1/embeddings",
        json={"model": "minilm", "input": ["weights from a persistent volume"]},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == 384
    cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false")


# Tries a write at each path in argv; its report (path -> "ok" or the errno's name) is the termination
# message, so the termination log itself must stay writable.
WRITER = """
import errno, json, os, sys
report = {}
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        report[path] = "ok"
    except OSError as err:
        report[path] = errno.errorcode[err.errno]
print("wrote what it could")
with open(os.environ["MODELPOOL_TERMINATION_LOG"], "w") as f:
    json.dump(report, f)
"""


def test_a_read_only_root_fails_writes_outside_the_writable_volumes(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    host_dir, _, created = _layout(tmp_path)
    outside = tmp_path / "outside.txt"
    container = {
        "name": "writer",
        "image": "python:3.11",
        "command": ["python3", "-c", WRITER],
        "args": [str(outside), "/scratch/in.txt", "/data/host/x.txt", "/data/created/x.txt"],
        "securityContext": {"readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "host", "mountPath": "/data/host", "readOnly": True},
            {"name": "created", "mountPath": "/data/created"},
            {"name": "scratch", "mountPath": "/scratch"},
        ],
    }
    volumes = [
        {"name": "host", "hostPath": {"path": str(host_dir), "type": "Directory"}},
        {"name": "created", "hostPath": {"path": str(created), "type": "DirectoryOrCreate"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    pod = process_node_pod("writer", [container], restartPolicy="Never", volumes=volumes)
    apply(cluster, pod, namespace)

    done = wait_for(lambda: _finished(cluster, namespace, "writer"), timeout=60, message="writer finished")
    term = (container_status(done) or {})["state"]["terminated"]
    assert (done["status"]["phase"], term["exitCode"]) == ("Succeeded", 0), term
    report = json.loads(term["message"])
    root = _pods_dir(cluster) / done["metadata"]["uid"] / "root" / "writer"
    assert report == {
        str(outside): "EROFS",  # the host's filesystem stands for the image: read-only
        f"{root}/scratch/in.txt": "ok",  # an emptyDir
        f"{root}/data/host/x.txt": "EROFS",  # a readOnly mount
        f"{root}/data/created/x.txt": "ok",  # a writable hostPath
    }
    assert not outside.exists() and (created / "x.txt").read_text() == "x"
    # Its stdout reached the log the agent opened before the root turned read-only.
    assert "wrote what it could" in pod_log(cluster, namespace, "writer", "writer")
