"""The process node's Node object and its heartbeat (a Lease renewed every 10 s, status every 30 s),
so the node lifecycle controller in kube-controller-manager keeps it Ready and schedulable."""

from __future__ import annotations

import logging
import platform
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from hack.processnode.kubeapi import MERGE, STRATEGIC_MERGE, Kube, KubeError

JSON = dict[str, Any]
log = logging.getLogger("processnode.node")

LEASE_SECONDS = 40
LEASE_RENEW = 10.0
STATUS_EVERY = 30.0
KUBELET_VERSION = "v1.34.4-processnode"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_object(name: str, labels: dict[str, str], capacity: dict[str, str], host_ip: str) -> JSON:
    """The Node as the kubelet registers it: no KWOK annotation, so KWOK leaves it and its pods alone."""
    all_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "modelpool.dev/process-node": "true",
        "type": "process",
        **labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": {},
    }


def node_status(name: str, capacity: dict[str, str], host_ip: str, boot_id: str) -> JSON:
    now = _now()
    ok = {"status": "False", "lastHeartbeatTime": now}
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "process node agent is posting ready status",
                "lastHeartbeatTime": now,
            },
            {"type": "MemoryPressure", "reason": "KubeletHasSufficientMemory", **ok},
            {"type": "DiskPressure", "reason": "KubeletHasNoDiskPressure", **ok},
            {"type": "PIDPressure", "reason": "KubeletHasSufficientPID", **ok},
        ],
        "nodeInfo": {
            "machineID": boot_id,
            "systemUUID": boot_id,
            "bootID": boot_id,
            "kernelVersion": platform.release(),
            "osImage": "modelpool process node",
            "containerRuntimeVersion": "process://local",
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


class NodeAgent:
    def __init__(self, kube: Kube, name: str, labels: dict[str, str], capacity: dict[str, str], host_ip: str):
        self.kube = kube
        self.name = name
        self.labels = labels
        self.capacity = capacity
        self.host_ip = host_ip
        self.boot_id = str(uuid.uuid4())
        self._uid = ""

    def register(self) -> None:
        obj = node_object(self.name, self.labels, self.capacity, self.host_ip)
        try:
            created = self.kube.request("POST", "/api/v1/nodes", body=obj)
        except KubeError as err:
            if err.status != 409:
                raise
            created = self.kube.request(
                "PATCH",
                f"/api/v1/nodes/{quote(self.name)}",
                body={"metadata": obj["metadata"]},
                content_type=MERGE,
            )
        self._uid = str(created["metadata"]["uid"])
        self.post_status()
        self.renew_lease()
        log.info("registered node %s (%s)", self.name, self.capacity)

    def post_status(self) -> None:
        body = {"status": node_status(self.name, self.capacity, self.host_ip, self.boot_id)}
        self.kube.request(
            "PATCH", f"/api/v1/nodes/{quote(self.name)}/status", body=body, content_type=STRATEGIC_MERGE
        )

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{quote(self.name)}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _micro_now()}
        try:
            self.kube.request("PATCH", path, body={"spec": spec}, content_type=MERGE)
        except KubeError as err:
            if err.status != 404:
                raise
            lease = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": "kube-node-lease",
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self._uid}
                    ],
                },
                "spec": spec,
            }
            self.kube.request(
                "POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", body=lease
            )

    def heartbeat(self, stop: threading.Event, give_up_after: float = 120.0) -> None:
        """Renew the Lease every 10 s and post status every 30 s until `stop`; errors are retried.  When the
        API server has been unreachable for `give_up_after` seconds (its cluster was torn down), set `stop`
        so an orphaned agent ends its processes and exits instead of lingering (0: never)."""
        since_status = 0.0
        last_ok = time.monotonic()
        while not stop.wait(LEASE_RENEW):
            try:
                self.renew_lease()
                since_status += LEASE_RENEW
                if since_status >= STATUS_EVERY:
                    self.post_status()
                    since_status = 0.0
                last_ok = time.monotonic()
            except (KubeError, OSError) as err:
                log.warning("node heartbeat failed: %s", err)
                if give_up_after and time.monotonic() - last_ok > give_up_after:
                    log.error("API server unreachable for %.0fs: stopping", give_up_after)
                    stop.set()
