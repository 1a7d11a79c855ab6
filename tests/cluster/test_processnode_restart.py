"""The process node outlives a restart of the control plane, as a kubelet does.

On a cluster of this module's own (the session's shared cluster keeps running for the other tests):
`kwokctl stop cluster` (`Cluster.stop_control_plane`) takes etcd, the API server, the controller-manager
and the scheduler away while a pod runs; the agent keeps its processes and keeps retrying; the pod's
container finishes while nobody can be told; `kwokctl start cluster` (`Cluster.start_control_plane`)
brings the control plane back, and then the node is Ready again,
the finished pod's status is written, and a pod created afterwards runs.  A second stop is followed by
`hack/cluster.sh up` (what `make cluster-up` runs), which must start the stopped cluster again with the
same agent.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import (
    CLUSTER_SH_LOG,
    Cluster,
    pod_octet,
    require_prerequisites,
    start_cluster,
    stop_cluster,
)
from testkit.kubectl import apply, get_json, process_node_pod, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
NAMESPACE = "restart"
# Waits for the container until the gate file exists (bounded, so a broken test never leaves it behind).
GATED = """
import os, sys, time
end = time.time() + 300
while not os.path.exists(sys.argv[1]) and time.time() < end:
    time.sleep(0.1)
sys.exit(0 if os.path.exists(sys.argv[1]) else 1)
"""


@dataclass
class OwnCluster:
    cluster: Cluster
    workdir: Path
    name: str
    ip_octet: int

    @property
    def agent_log(self) -> Path:
        return self.workdir / "logs" / "processnode.log"

    def agent_pid(self) -> int:
        return int((self.workdir / "processnode.pid").read_text())


@pytest.fixture(scope="module")
def own(request: pytest.FixtureRequest) -> Iterator[OwnCluster]:
    require_prerequisites()
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-restart-"))
    name = f"mp-restart-{uuid.uuid4().hex[:6]}"
    octet = pod_octet(75)  # not the session cluster's pod address range
    failed_before = request.session.testsfailed
    try:
        cluster = start_cluster(workdir, name, ip_octet=octet)
    except BaseException:
        stop_cluster(workdir, name)
        raise
    try:
        yield OwnCluster(cluster, workdir, name, octet)
    finally:
        stop_cluster(workdir, name)
        if request.session.testsfailed > failed_before:
            sys.stderr.write(f"\n[cluster] restart test failed: its cluster's logs kept in {workdir}\n")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _pod(name: str, args: list[str]) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11", "command": ["python3", "-c", *args]}
    return process_node_pod(name, [container], restartPolicy="Never", terminationGracePeriodSeconds=1)


def _phase(cluster: Cluster, name: str) -> str:
    return str(get_json(cluster, "pod", name, "-n", NAMESPACE)["status"].get("phase", ""))


def _runs_to_completion(cluster: Cluster, name: str) -> None:
    apply(cluster, _pod(name, ["print('ran')"]), NAMESPACE)
    wait_for(lambda: _phase(cluster, name) == "Succeeded", timeout=60, message=f"pod {name} Succeeded")


def _logged_since(own: OwnCluster, offset: int, *needles: str) -> bool:
    with own.agent_log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode("utf-8", "replace")
    return all(n in text for n in needles)


def _back_after(cluster: Cluster, node: str, since: datetime) -> bool:
    """The node's agent renewed its Lease and posted Ready after `since`."""
    lease = get_json(cluster, "lease", node, "-n", "kube-node-lease")
    ready = next(c for c in get_json(cluster, "node", node)["status"]["conditions"] if c["type"] == "Ready")
    renewed = datetime.fromisoformat(lease["spec"]["renewTime"])
    # lastHeartbeatTime has whole seconds: compare with `since` rounded down.
    posted = datetime.fromisoformat(ready["lastHeartbeatTime"])
    return renewed > since and ready["status"] == "True" and posted >= since.replace(microsecond=0)


def _stop_and_see_the_agent_retry(own: OwnCluster) -> None:
    offset = own.agent_log.stat().st_size
    own.cluster.stop_control_plane()
    wait_for(
        lambda: _logged_since(own, offset, "node heartbeat failed", "pod watch failed"),
        timeout=60,
        message="the agent noticed the API server gone (heartbeat and watch failing)",
    )


def test_process_node_rides_out_control_plane_restarts(own: OwnCluster, tmp_path: Path) -> None:
    cluster, node = own.cluster, own.cluster.process_node
    cluster.kubectl("create", "namespace", NAMESPACE)
    wait_for(
        lambda: (
            cluster.kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode == 0
        ),
        timeout=30,
        message="default ServiceAccount",
    )
    gate = tmp_path / "gate"
    apply(cluster, _pod("gated", [GATED, str(gate)]), NAMESPACE)
    wait_for(lambda: _phase(cluster, "gated") == "Running", timeout=60, message="gated pod Running")
    pid = own.agent_pid()

    # 1. kwokctl stop / start: the agent keeps its pod running and retrying, then catches up.
    _stop_and_see_the_agent_retry(own)
    offset = own.agent_log.stat().st_size
    gate.touch()  # the container ends while the API server is away
    wait_for(
        lambda: _logged_since(own, offset, f"pod {NAMESPACE}/gated: status patch failed, retrying"),
        timeout=30,
        message="the agent tried to report the finished container",
    )
    since = datetime.now(UTC)
    own.cluster.start_control_plane()
    wait_for(lambda: _back_after(cluster, node, since), timeout=90, message="node Ready again, lease renewed")
    wait_for(
        lambda: _phase(cluster, "gated") == "Succeeded",
        timeout=60,
        message="the pod status written once the API server was back",
    )
    _runs_to_completion(cluster, "after-start")
    assert own.agent_pid() == pid  # the same agent rode it out

    # 2. kwokctl stop, then `hack/cluster.sh up` (make cluster-up) on the stopped cluster.
    _stop_and_see_the_agent_retry(own)
    since = datetime.now(UTC)
    start_cluster(own.workdir, own.name, ip_octet=own.ip_octet)  # raises when `up` fails
    assert own.agent_pid() == pid
    assert "restarting the agent" not in (own.workdir / CLUSTER_SH_LOG).read_text()
    assert _back_after(cluster, node, since)
    _runs_to_completion(cluster, "after-up")
