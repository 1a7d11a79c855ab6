"""Tests' side of the process node's image mode: a second process node that runs pods from their images
(``python -m testkit.processnode --run-images``) beside the session's process-node-0 (whose pods keep
running as host processes from the checkout), the images the tests need, and what a test checks about
a container run from an image (its process's root and user).

    with image_node(cluster) as node:          # process-node-images, Ready, tainted like process-node-0
        pod = {... "nodeSelector": node.selector, "tolerations": [...]}
        pid = container_pid(node, status["containerID"])          # runc://<id> -> the init's host pid
        root_layer(pid) == store.lookup(image).rootfs; process_uid(pid) == 10001

The images come from ``make images`` (hack/images.sh, the store at /var/lib/containers/storage, vfs):
``require_images`` fails a test with "run make images" when one is missing (never a skip: CI builds them).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from modelpool_contract.version import VERSION
from testkit.cluster import Cluster, pod_octet
from testkit.nodeagent import NodeAgent
from testkit.processnode.images import ImageStore
from testkit.processnode.oci import Runc, state_root

IMAGE_NODE = "process-node-images"
BASE_IMAGE = "localhost/modelpool-base:bookworm"
PROBE_IMAGE = "localhost/processnode-probe:1"


def release_version() -> str:
    """The release version, from the one place it is written (``modelpool_contract.version``)."""
    return VERSION


def project_images() -> dict[str, str]:
    """The project's two images at the release version (operator + gateway; server)."""
    v = release_version()
    return {
        "operator": f"ghcr.io/modelpool/modelpool-operator:{v}",
        "server": f"ghcr.io/modelpool/modelpool-server:{v}",
    }


def require_images(names: Sequence[str]) -> None:
    """Fail (not skip) the test when an image is not in the local store."""
    store = ImageStore()
    absent = [n for n in names if store.lookup(n) is None]
    if absent:
        pytest.fail(f"images not in {store.root}: {', '.join(absent)}: run make images", pytrace=False)


def probe_image() -> str:
    """A small image for the process node's own tests: the project's base image (Debian + Python) with a
    non-root USER, an entrypoint, a cmd, an env and a working directory of its own; built once from
    ``localhost/modelpool-base:bookworm`` (which ``make images`` imports)."""
    store = ImageStore()
    if store.lookup(PROBE_IMAGE) is not None:
        return PROBE_IMAGE
    require_images([BASE_IMAGE])
    env = dict(os.environ, STORAGE_DRIVER="vfs")

    def buildah(*args: str) -> str:
        done = subprocess.run(
            ["buildah", "--storage-driver", "vfs", *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"buildah {' '.join(args)}: {done.stderr[-2000:]}")
        return done.stdout.strip()

    ctr = buildah("from", "--pull-never", BASE_IMAGE)
    try:
        buildah(
            "config",
            "--user",
            "4321:4321",
            "--entrypoint",
            '["python3", "-c"]',
            "--cmd",
            '["print(\\"the image cmd\\")"]',
            "--env",
            "PROBE_IMAGE_ENV=from-the-image",
            "--workingdir",
            "/srv",
            ctr,
        )
        buildah("commit", "--quiet", ctr, PROBE_IMAGE)
    finally:
        subprocess.run(
            ["buildah", "--storage-driver", "vfs", "rm", ctr], env=env, capture_output=True, check=False
        )
    return PROBE_IMAGE


# The image node has the process node's taint and one of its own, so that no pod meant for
# process-node-0 (which select the label both nodes carry) lands on it while it runs.
TAINTS = ["modelpool.dev/process-node=true:NoSchedule", "modelpool.dev/run-images=true:NoSchedule"]
TOLERATIONS = [
    {"key": "modelpool.dev/process-node", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "modelpool.dev/run-images", "operator": "Exists", "effect": "NoSchedule"},
]


class ImageNode(NodeAgent):
    """A process node agent in image mode, started and stopped by a test (``image_node``)."""

    def __init__(self, cluster: Cluster, name: str, ip_octet: int) -> None:
        taints = [arg for taint in TAINTS for arg in ("--taint", taint)]
        super().__init__(cluster, name, ip_octet, args=("--run-images", *taints))
        self.runc = Runc(state_root(name, (self.workdir / "pods").resolve()))

    @property
    def selector(self) -> dict[str, str]:
        return {"kubernetes.io/hostname": self.name}


@contextmanager
def image_node(cluster: Cluster, name: str = IMAGE_NODE, ip_octet: int | None = None) -> Iterator[ImageNode]:
    """A process node in image mode for the duration of the block (its pods are stopped with it)."""
    node = ImageNode(cluster, name, ip_octet if ip_octet is not None else pod_octet(75))
    try:
        node.start()
        yield node
    finally:
        node.stop()
        cluster.kubectl("delete", "node", name, "--wait=false", check=False)


def container_pid(node: ImageNode, container_id: str) -> int:
    """The host pid of a container's init (``runc://<id>`` in its status)."""
    if not container_id.startswith("runc://"):
        raise AssertionError(f"not a container run from an image: {container_id!r}")
    state = node.runc.state(container_id.removeprefix("runc://"))
    if state is None or not state.get("pid"):
        raise AssertionError(f"runc knows no running container {container_id}")
    return int(state["pid"])


def root_lower_dir(pid: int) -> str:
    """The lower directory of the overlay that is a process's root (``/`` in its mountinfo)."""
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if len(fields) > 9 and fields[4] == "/":
                dash = fields.index("-")
                if fields[dash + 1] == "overlay":
                    for option in fields[dash + 3].split(","):
                        if option.startswith("lowerdir="):
                            return option.removeprefix("lowerdir=")
    return ""


def process_uid(pid: int) -> tuple[int, int]:
    """(real uid, real gid) of a process."""
    uid = gid = -1
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])
        elif line.startswith("Gid:"):
            gid = int(line.split()[1])
    return uid, gid


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a container's init and what it started)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out
