"""The process node's Node object and its heartbeat (a Lease renewed every 10 s, status every 30 s),
so the node lifecycle controller in kube-controller-manager keeps it Ready and schedulable.

The node registers with a taint (like the kubelet's --register-with-taints), so only pods that tolerate it
land here.  Like a kubelet, the heartbeat never gives up on its own: while the API server is away it
retries with a bounded back-off, and once it answers again the node status is posted at once.
"""

from __future__ import annotations

import logging
import platform
import threading
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from testkit.processnode.kubeapi import MERGE, STRATEGIC_MERGE, ClusterGuard, Kube, KubeError
from testkit.processnode.podspec import backoff_delay

JSON = dict[str, Any]
log = logging.getLogger("processnode.node")

LEASE_SECONDS = 40
LEASE_RENEW = 10.0
STATUS_EVERY = 30.0
KUBELET_VERSION = "v1.34.4-processnode"
HEARTBEAT_RETRY_INITIAL = 1.0  # first retry of a failed heartbeat; doubling up to LEASE_RENEW
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_taint(text: str) -> JSON:
    """`KEY[=VALUE]:EFFECT` (the kubelet's --register-with-taints form) -> a taint object."""
    spec, sep, effect = text.rpartition(":")
    key, _, value = spec.partition("=")
    if not sep or not key or effect not in TAINT_EFFECTS:
        raise ValueError(f"taint {text!r}: expected KEY[=VALUE]:EFFECT with EFFECT one of {TAINT_EFFECTS}")
    taint: JSON = {"key": key, "effect": effect}
    if value:
        taint["value"] = value
    return taint


def with_taints(existing: list[JSON], ours: list[JSON]) -> list[JSON]:
    """Pure: the node's taints plus ours (by key and effect); taints others set (not-ready, cordons) stay."""
    have = {(t.get("key"), t.get("effect")) for t in existing}
    return [*existing, *(t for t in ours if (t["key"], t["effect"]) not in have)]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_object(name: str, labels: dict[str, str], taints: list[JSON]) -> JSON:
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
        "spec": {"taints": taints} if taints else {},
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
    def __init__(
        self,
        kube: Kube,
        name: str,
        labels: dict[str, str],
        capacity: dict[str, str],
        host_ip: str,
        *,
        taints: list[JSON] | None = None,
    ) -> None:
        self.kube = kube
        self.name = name
        self.labels = labels
        self.capacity = capacity
        self.host_ip = host_ip
        self.taints = list(taints or [])
        self.boot_id = str(uuid.uuid4())
        self._uid = ""

    def register(self) -> None:
        obj = node_object(self.name, self.labels, self.taints)
        path = f"/api/v1/nodes/{quote(self.name)}"
        try:
            created = self.kube.request("POST", "/api/v1/nodes", body=obj)
        except KubeError as err:
            if err.status != 409:
                raise
            # Registered before (this agent restarted): refresh the labels and add our taints, keeping
            # any the control plane or an admin added.
            current = self.kube.request("GET", path)
            taints = with_taints((current.get("spec") or {}).get("taints") or [], self.taints)
            body = {"metadata": {"labels": obj["metadata"]["labels"]}, "spec": {"taints": taints}}
            created = self.kube.request("PATCH", path, body=body, content_type=MERGE)
        self._uid = str(created["metadata"]["uid"])
        self.post_status()
        self.renew_lease()
        log.info("registered node %s (%s, taints %s)", self.name, self.capacity, self.taints)

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

    def beat(self, post_status: bool) -> None:
        """One heartbeat: renew the Lease, and post the status when asked; a Node deleted meanwhile (404)
        is registered again."""
        try:
            self.renew_lease()
            if post_status:
                self.post_status()
        except KubeError as err:
            if err.status != 404:
                raise
            log.warning("node %s is gone: registering it again", self.name)
            self.register()

    def heartbeat(self, stop: threading.Event, guard: ClusterGuard, give_up_after: float = 120.0) -> None:
        """Renew the Lease every 10 s and post status every 30 s until `stop`.  A failed beat is retried
        after 1, 2, 4, 8, 10, 10 ... s; the first beat that succeeds again posts the status at once, so a
        node the controller marked NotReady during a control-plane restart is Ready within a beat.  After
        `give_up_after` seconds without an answer (0: never), or when the server that answers again is
        another cluster (`guard`), `stop` is set so the agent of a cluster that was torn down ends its
        processes and exits instead of lingering."""
        last_status = last_ok = time.monotonic()
        failures = 0
        wait = LEASE_RENEW
        while not stop.wait(wait):
            now = time.monotonic()
            post = failures > 0 or now - last_status >= STATUS_EVERY
            try:
                if failures and not guard.same_cluster():
                    stop.set()
                    return
                self.beat(post_status=post)
            except KubeError as err:
                failures += 1
                wait = backoff_delay(failures, HEARTBEAT_RETRY_INITIAL, LEASE_RENEW)
                log.warning("node heartbeat failed (retrying in %.0fs): %s", wait, err)
                if give_up_after and now - last_ok > give_up_after:
                    log.error("API server unreachable for %.0fs: stopping", give_up_after)
                    stop.set()
                continue
            if failures:
                log.info("node heartbeat and status posted again after %d failed attempts", failures)
            if post:
                last_status = now
            failures, last_ok, wait = 0, now, LEASE_RENEW
