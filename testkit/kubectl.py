"""kubectl, and the small conveniences built on it: the one wrapper every test, benchmark and hack script
runs kubectl (and helm) through, deadline-bound waits, and manifests for the process node.

Every wait in the test suite goes through `wait_for`, so none can hang: it returns the predicate's first
truthy value or raises with the message and the last value seen.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from testkit.environment import BIN
from testkit.waiting import WaitTimeoutError, wait_for

T = TypeVar("T")


class Cluster(Protocol):
    """What these helpers need of a cluster (``testkit.cluster.Cluster`` is one): its kubectl, and where
    the process node writes its containers' output."""

    @property
    def processnode_log_dir(self) -> Path: ...

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...


# The process node is tainted so that only pods meant for it land there: they select it and tolerate.
PROCESS_NODE_SELECTOR = {"modelpool.dev/process-node": "true"}
PROCESS_NODE_TOLERATION = {"key": "modelpool.dev/process-node", "operator": "Exists", "effect": "NoSchedule"}


def process_node_pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A Pod for the process node: it selects the node and tolerates its taint; `spec` adds fields."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": PROCESS_NODE_SELECTOR,
            "tolerations": [PROCESS_NODE_TOLERATION],
            **spec,
            "containers": containers,
        },
    }


class KubectlError(AssertionError):
    """kubectl (or helm) exited non-zero; the message names the command and carries its stderr."""


def run_tool(
    kubeconfig: Path,
    tool: str,
    args: Sequence[str],
    *,
    check: bool = True,
    input: str | None = None,
    timeout: float = 120,
    bin_dir: Path = BIN,
) -> subprocess.CompletedProcess[str]:
    """Run ``bin_dir/tool --kubeconfig KUBECONFIG ARGS``; with ``check``, a non-zero exit raises
    KubectlError with its stderr."""
    argv = [str(bin_dir / tool), "--kubeconfig", str(kubeconfig), *args]
    done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise KubectlError(f"{tool} {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
    return done


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None, timeout: float = 300) -> str:
    """``kubectl ARGS`` against ``kubeconfig``, its stdout (a non-zero exit raises KubectlError): the form
    the benchmarks and hack scripts use, which hold a kubeconfig rather than a ``Cluster``."""
    return run_tool(kubeconfig, "kubectl", args, input=stdin, timeout=timeout).stdout


def get_json(cluster: Cluster, *args: str) -> dict[str, Any]:
    """`kubectl get ARGS -o json`, decoded."""
    out = cluster.kubectl("get", *args, "-o", "json").stdout
    data: dict[str, Any] = json.loads(out)
    return data


def apply(cluster: Cluster, manifest: dict[str, Any] | str, namespace: str | None = None) -> None:
    """`kubectl apply -f -` with a dict (as JSON) or YAML text."""
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
    cluster.kubectl(*args, input=text)


def container_status(pod: dict[str, Any], container: str | None = None) -> dict[str, Any] | None:
    """The status of one container (the first when no name is given), or None before the kubelet wrote it."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if container is None or cs.get("name") == container:
            return dict(cs)
    return None


def is_ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def pod_log(cluster: Cluster, namespace: str, pod: str, container: str) -> str:
    """A process-node container's output (stdout and stderr, every restart appended)."""
    path = Path(cluster.processnode_log_dir) / namespace / pod / f"{container}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def wait_established(cluster: Cluster, *crds: str, timeout: float = 60) -> None:
    """Wait until each CRD reports Established=True.  (`kubectl wait --for=condition=Established` fails
    outright, instead of waiting, when it reads a CRD the API server has not yet given any condition.)"""
    established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'

    def is_established(crd: str) -> bool:
        return cluster.kubectl("get", f"crd/{crd}", "-o", established).stdout == "True"

    for crd in crds:
        wait_for(functools.partial(is_established, crd), timeout=timeout, message=f"CRD {crd} Established")


# ---- persistent volumes (the process node maps a hostPath PV's claim to its directory) ------------------


def claim_manifest(name: str, storage_class: str, access_mode: str = "ReadWriteOnce") -> dict[str, Any]:
    """A PersistentVolumeClaim of 1Gi in ``storage_class`` (a class of its own keeps other PVs away)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "storageClassName": storage_class,
            "accessModes": [access_mode],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def host_path_pv(
    name: str,
    path: Path,
    storage_class: str,
    claim: str,
    namespace: str,
    *,
    access_mode: str = "ReadWriteOnce",
) -> dict[str, Any]:
    """A hostPath PV pre-bound to one claim (claimRef), so no other test's claim can take it."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "storageClassName": storage_class,
            "capacity": {"storage": "1Gi"},
            "accessModes": [access_mode],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": namespace, "name": claim},
            "hostPath": {"path": str(path), "type": "Directory"},
        },
    }


def claim_bound(cluster: Cluster, namespace: str, claim: str) -> bool:
    pvc = get_json(cluster, "pvc", claim, "-n", namespace)
    return bool(pvc["status"].get("phase") == "Bound")


def bind_host_path(
    cluster: Cluster, namespace: str, claim: str, path: Path, access_mode: str = "ReadWriteOnce"
) -> str:
    """A claim in ``namespace`` bound (by the real PV binder) to a hostPath PV at ``path``; returns the PV's
    name (cluster-scoped: the ``persistent_volumes`` fixture deletes it)."""
    storage_class = f"local-{namespace}-{claim}"
    apply(cluster, claim_manifest(claim, storage_class, access_mode), namespace)
    pv = f"pv-{namespace}-{claim}"
    apply(cluster, host_path_pv(pv, path, storage_class, claim, namespace, access_mode=access_mode))
    wait_for(lambda: claim_bound(cluster, namespace, claim), timeout=60, message=f"PVC {claim} bound")
    return pv


__all__ = [
    "PROCESS_NODE_SELECTOR",
    "PROCESS_NODE_TOLERATION",
    "Cluster",
    "KubectlError",
    "WaitTimeoutError",
    "apply",
    "bind_host_path",
    "claim_bound",
    "claim_manifest",
    "container_status",
    "get_json",
    "host_path_pv",
    "is_ready",
    "kubectl",
    "pod_log",
    "process_node_pod",
    "run_tool",
    "wait_established",
    "wait_for",
]
