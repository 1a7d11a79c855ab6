"""The process node's image mode against the real API server: a second process node (``--run-images``)
runs pods from an image in the local store with runc.  What the container sees is reported by the
container itself (its termination message): the image's root (read-only when the pod says so), its
user or the pod's runAsUser/fsGroup, the image's entrypoint, env and working directory under the pod's
args and env, the pod's volumes bound at their mountPaths (emptyDir, Secret, downward API, a PVC bound to
a hostPath PV, the admission-injected kube-api-access projected volume), the API server reached the
in-cluster way with the ServiceAccount's own identity, and the pod's loopback address in the machine's
network namespace.  A running container's process is checked from the host (/proc/<pid>: its root is
the overlay over the image's layer, its uid), its exec probe runs in it, and deleting the pod or killing
the agent leaves no container behind."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.cluster import Cluster
from testkit.imagenode import (
    TOLERATIONS,
    ImageNode,
    container_pid,
    image_node,
    probe_image,
    process_uid,
    root_lower_dir,
)
from testkit.kubectl import (
    apply,
    bind_host_path,
    container_status,
    get_json,
    is_ready,
    wait_for,
)
from testkit.processnode.images import ImageStore

pytestmark = pytest.mark.cluster

JSON = dict[str, Any]

# Runs in the container (the image's entrypoint is `python3 -c`, so this is the pod's first arg) and
# writes what it sees to the termination-log file the process node binds at /dev/termination-log.
REPORT = r"""
import json, os, socket, ssl, urllib.request, urllib.error
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
out = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "cwd": os.getcwd(),
       "env": {k: os.environ.get(k) for k in ["PROBE_IMAGE_ENV", "FROM_POD", "POD_IP", "MODELPOOL_HOST",
               "KUBERNETES_SERVICE_HOST", "HOME", "PATH"]},
       "hostname": socket.gethostname(), "namespace": open(sa + "/namespace").read()}
try:
    open("/etc/written-by-pod", "w").write("x")
    out["root_write"] = "ok"
except OSError as err:
    out["root_write"] = err.strerror
open("/scratch/note", "w").write("from the pod")
out["secret"] = open("/etc/secret/key").read()
out["labels"] = open("/etc/podinfo/labels").read()
out["model"] = open("/models/weights.txt").read()
s = socket.socket(); s.bind((os.environ["POD_IP"], 8080)); s.close(); out["bound"] = True
ctx = ssl.create_default_context(cafile=sa + "/ca.crt")
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
req = urllib.request.Request(f"https://{host}:{port}/api/v1/namespaces/{out['namespace']}/secrets",
                             headers={"Authorization": "Bearer " + open(sa + "/token").read()})
try:
    urllib.request.urlopen(req, context=ctx, timeout=10)
    out["api"] = "allowed"
except urllib.error.HTTPError as err:
    out["api"] = json.loads(err.read()).get("message", "")
open("/dev/termination-log", "w").write(json.dumps(out))
"""


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[ImageNode]:
    with image_node(cluster) as n:
        yield n


@pytest.fixture(scope="module")
def image() -> str:
    return probe_image()


def pod_manifest(name: str, node: ImageNode, containers: list[JSON], **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "probe", "run": name}},
        "spec": {"nodeSelector": node.selector, "tolerations": TOLERATIONS, **spec, "containers": containers},
    }


def wait_pod(cluster: Cluster, namespace: str, name: str, done: Any, timeout: float = 90) -> JSON:
    def check() -> JSON | None:
        pod = get_json(cluster, "pod", name, "-n", namespace)
        return pod if done(pod) else None

    return wait_for(check, timeout=timeout, message=f"pod {namespace}/{name}")


def test_a_pod_runs_from_its_image_with_its_volumes_user_and_identity(  # noqa: PLR0917 - fixtures
    cluster: Cluster,
    namespace: str,
    node: ImageNode,
    image: str,
    tmp_path: Path,
    persistent_volumes: list[str],
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "weights.txt").write_text("minilm-ish")
    os.chmod(tmp_path, 0o755)
    persistent_volumes.append(bind_host_path(cluster, namespace, "models", models))
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s"},
        "data": {"key": base64.b64encode(b"s3cret").decode()},
    }
    apply(cluster, secret, namespace)
    container = {
        "name": "report",
        "image": image,
        "args": [REPORT],  # the image's entrypoint (python3 -c) with the pod's args
        "env": [{"name": "FROM_POD", "value": "$(PROBE_IMAGE_ENV)+pod"}],
        "securityContext": {"readOnlyRootFilesystem": True, "runAsUser": 10001, "runAsGroup": 10001},
        "volumeMounts": [
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "secret", "mountPath": "/etc/secret", "readOnly": True},
            {"name": "podinfo", "mountPath": "/etc/podinfo"},
            {"name": "models", "mountPath": "/models", "readOnly": True},
        ],
    }
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "secret", "secret": {"secretName": "s", "defaultMode": 0o440}},
        {
            "name": "podinfo",
            "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]},
        },
        {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}},
    ]
    apply(
        cluster,
        pod_manifest(
            "report",
            node,
            [container],
            restartPolicy="Never",
            volumes=volumes,
            securityContext={"fsGroup": 10001},
        ),
        namespace,
    )
    pod = wait_pod(
        cluster,
        namespace,
        "report",
        lambda p: (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"),
    )
    status = container_status(pod, "report")
    assert status is not None
    term = status["state"]["terminated"]
    assert term["exitCode"] == 0, term
    assert term["containerID"].startswith("runc://")
    seen = json.loads(term["message"])
    assert (seen["uid"], seen["gid"]) == (10001, 10001)
    assert 10001 in seen["groups"]
    assert seen["cwd"] == "/srv"  # the image's WorkingDir
    env = seen["env"]
    assert env["PROBE_IMAGE_ENV"] == "from-the-image" and env["FROM_POD"] == "from-the-image+pod"
    assert env["POD_IP"] == pod["status"]["podIP"] == env["MODELPOOL_HOST"]
    assert env["POD_IP"].startswith("127.") and seen["bound"] is True
    assert env["KUBERNETES_SERVICE_HOST"].startswith("127.")
    assert not env["PATH"].startswith(str(Path.cwd()))  # the image's PATH, not the agent's venv
    assert seen["root_write"] == "Read-only file system"
    assert seen["secret"] == "s3cret"  # mode 0440, readable through the fsGroup
    assert 'app="probe"' in seen["labels"]
    assert seen["model"] == "minilm-ish"
    assert seen["namespace"] == namespace and seen["hostname"] == "report"
    # The API server knew the caller as the pod's ServiceAccount (which may not list secrets).
    assert f"system:serviceaccount:{namespace}:default" in seen["api"]
    # The container wrote into the emptyDir on the host and nothing into the image.
    store = ImageStore().lookup(image)
    assert store is not None and not (store.rootfs / "etc" / "written-by-pod").exists()


def test_a_running_container_is_in_its_image_root_and_stops_with_its_pod(
    cluster: Cluster, namespace: str, node: ImageNode, image: str
) -> None:
    server = {
        "name": "server",
        "image": image,
        # No command: the image's entrypoint `python3 -c` with this program; a writable root.
        "args": [
            "import http.server, os; open('/tmp/written-here', 'w').write('x'); "
            "http.server.HTTPServer((os.environ['POD_IP'], 8080), http.server.SimpleHTTPRequestHandler)"
            ".serve_forever()"
        ],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/tmp/written-here"]}, "periodSeconds": 1},
        "livenessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 2},
    }
    apply(cluster, pod_manifest("server", node, [server], terminationGracePeriodSeconds=5), namespace)
    pod = wait_pod(cluster, namespace, "server", is_ready)
    status = container_status(pod, "server")
    assert status is not None
    pid = container_pid(node, status["containerID"])
    store = ImageStore().lookup(image)
    assert store is not None
    assert root_lower_dir(pid) == str(store.rootfs)
    assert process_uid(pid) == (4321, 4321)  # the image's USER
    assert Path(f"/proc/{pid}/root/tmp/written-here").exists()  # writable root: in the overlay's upper dir
    assert not (store.rootfs / "tmp" / "written-here").exists()
    answer = httpx.get(
        f"http://{pod['status']['podIP']}:8080/", timeout=5
    )  # its working directory (/srv), listed
    assert answer.status_code == 200
    cid = status["containerID"].removeprefix("runc://")
    cluster.kubectl("delete", "pod", "server", "-n", namespace, "--wait=true", "--timeout=60s")
    assert cid not in node.runc.list_ids()
    assert not Path(f"/proc/{pid}").exists()


def test_an_agent_that_died_leaves_no_container(
    cluster: Cluster, namespace: str, node: ImageNode, image: str
) -> None:
    """SIGKILL to the agent leaves its runc container running; the next agent deletes it at start and runs
    the pod anew."""
    sleeper = {"name": "sleep", "image": image, "command": ["sleep", "3600"]}
    apply(cluster, pod_manifest("sleeper", node, [sleeper], terminationGracePeriodSeconds=1), namespace)
    pod = wait_pod(cluster, namespace, "sleeper", is_ready)
    old = container_status(pod, "sleep")
    assert old is not None
    pid = container_pid(node, old["containerID"])
    node.kill()
    assert Path(f"/proc/{pid}").exists()  # the container outlived its agent
    node.start()
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=30, message="stale container deleted")

    def rerun() -> int | None:
        pod = get_json(cluster, "pod", "sleeper", "-n", namespace)
        status = container_status(pod, "sleep") or {}
        if not is_ready(pod) or "containerID" not in status:
            return None
        new = container_pid(node, status["containerID"])
        return new if new != pid else None

    # The pod runs again, in a new container (the same id: its pod's uid and its name).
    assert wait_for(rerun, timeout=60, message="sleeper running again") != pid
    cluster.kubectl("delete", "pod", "sleeper", "-n", namespace, "--wait=true", "--timeout=60s")
