"""Harness of the gateway integration tests: the real ``modelpool-gateway`` process and echo pools.

* ``GatewayProcess``: ``.venv/bin/modelpool-gateway`` (the console script) with the cluster's kubeconfig
  (or a ``kubeconfig`` given, e.g. a ServiceAccount's) and ``env`` added to the test's environment, on a
  loopback port of its own; ``stop()`` sends SIGTERM and returns the exit code, ``kill()`` SIGKILLs.
  Unless started with ``--auth none`` or a keys namespace of the test's own (``--keys-namespace`` or
  ``MODELPOOL_GATEWAY_KEYS_NAMESPACE``), it gets an admin
  namespace of its own holding one key Secret that grants every namespace: ``.key``, and ``.headers``
  (``Authorization: Bearer``) for the test's requests.
* ``create_key``: a key Secret (label ``modelpool.dev/gateway-key``), as an administrator creates one.
* ``echo_pool``: a ModelPool whose workers run on the process node as real ``modelpool-server`` processes
  with a test handler (``tests/server/handlers.py``): echo embeddings or echo generation, fast to load;
  autoscaling off unless asked for.
"""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import psutil

from modelpool_contract.gateway_keys import (
    KEY_FIELD,
    KEY_LABEL_VALUE,
    LABEL_GATEWAY_KEY,
    NAMESPACES_FIELD,
    POOLS_FIELD,
)
from testkit import prom
from testkit.cluster import Cluster
from testkit.environment import ROOT, free_port
from testkit.kubectl import apply, wait_for
from tests.operator.integration.opharness import GROUP_VERSION, OperatorProcess

PROCESS_NODE = {"modelpool.dev/process-node": "true"}
ECHO = "tests.server.handlers:EchoEmbedding"
GENERATION = "tests.server.handlers:EchoGeneration"


def create_key(
    cluster: Cluster,
    namespace: str,
    name: str,
    *,
    key: str | None = None,
    namespaces: str | None = None,
    pools: str | None = None,
) -> str:
    """Create (or replace) key Secret ``namespace/name``; returns its key."""
    key = key or secrets.token_urlsafe(24)
    data = {KEY_FIELD: key}
    if namespaces is not None:
        data[NAMESPACES_FIELD] = namespaces
    if pools is not None:
        data[POOLS_FIELD] = pools
    manifest = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {LABEL_GATEWAY_KEY: KEY_LABEL_VALUE}},
        # data, not stringData: a field left out of a later apply is then removed from the Secret.
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }
    apply(cluster, manifest, namespace)
    return key


def bearer(key: str | None) -> dict[str, str]:
    """The header a client sends with ``key``."""
    return {"Authorization": f"Bearer {key}"} if key else {}


class GatewayProcess(OperatorProcess):
    """One ``modelpool-gateway`` process (stopped, killed and logged like the operator's)."""

    # Its own command line; the operator's methods (alive, stop, kill, log_tail) manage the process.
    def __init__(
        self,
        cluster: Cluster,
        namespaces: Iterable[str],
        log_path: Path,
        *flags: str,
        kubeconfig: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.key: str | None = None
        self.keys_namespace: str | None = None
        env = env or {}
        given = " ".join(flags)
        chosen = (
            "--auth none" in given or "--keys-namespace" in given or "MODELPOOL_GATEWAY_KEYS_NAMESPACE" in env
        )
        if not chosen:
            self.keys_namespace = f"gwkeys-{uuid.uuid4().hex[:8]}"
            cluster.kubectl("create", "namespace", self.keys_namespace)
            self.key = create_key(cluster, self.keys_namespace, "all-pools", namespaces="*")
            flags = (*flags, "--keys-namespace", self.keys_namespace)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.namespaces = list(namespaces)
        # The cluster's admin kubeconfig unless a test runs the gateway as someone else (a ServiceAccount).
        kubeconfig = kubeconfig or cluster.kubeconfig
        args = [str(ROOT / ".venv" / "bin" / "modelpool-gateway"), "--kubeconfig", str(kubeconfig)]
        for namespace in self.namespaces:
            args += ["--namespace", namespace]
        args += ["--host", "127.0.0.1", "--port", str(self.port), *flags]
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            args,
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def headers(self) -> dict[str, str]:
        """``Authorization: Bearer`` with this gateway's own key (none with ``--auth none``)."""
        return bearer(self.key)

    def stop(self, timeout: float = 20) -> int:
        code = super().stop(timeout)
        if self.keys_namespace is not None:
            self.cluster.kubectl("delete", "namespace", self.keys_namespace, "--wait=false", check=False)
        return code

    def wait_ready(self, timeout: float = 60) -> None:
        """Until ``/readyz`` answers 200 (every watch has listed)."""

        def ready() -> bool:
            assert self.alive(), f"the gateway exited:\n{self.log_tail()}"
            return httpx.get(self.url + "/readyz", timeout=2).status_code == 200

        wait_for(ready, timeout=timeout, interval=0.2, message="the gateway ready")

    def rss_bytes(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def models(self) -> dict[str, dict[str, Any]]:
        """GET /v1/models by pool name."""
        data = httpx.get(self.url + "/v1/models", headers=self.headers, timeout=5).json()["data"]
        return {m["modelpool"]["pool"]: m for m in data}

    def wait_serving(self, pool: str, workers: int, timeout: float = 180) -> None:
        """Until the gateway routes to ``workers`` workers of ``pool``."""
        wait_for(
            lambda: self.models().get(pool, {}).get("modelpool", {}).get("servingWorkers") == workers,
            timeout=timeout,
            interval=0.3,
            message=f"the gateway routes to {workers} workers of {pool}",
        )

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include ``labels``."""
        return prom.total(httpx.get(self.url + "/metrics", timeout=5).text, name, **labels)


def echo_pool(
    name: str,
    *,
    replicas: int = 1,
    handler: str = ECHO,
    task: str = "text-embedding",
    memory: str = "1Gi",
    env: dict[str, str] | None = None,
    served_model_name: str | None = None,
    activation_timeout_seconds: int | None = None,
    queue_capacity: int = 100,
    autoscaling: dict[str, Any] | None = None,
    min_replicas: int = 0,
    max_replicas: int | None = None,
    idle_timeout_seconds: int = 0,
) -> dict[str, Any]:
    """A pool of real ``modelpool-server`` workers with a test handler, on the process node.

    Without ``autoscaling`` the test chooses the worker count: the operator neither scales it with the load
    nor wakes a pool at zero for demand.  With it (``{}``: the defaults) the operator does both."""
    all_env = {"MODELPOOL_HANDLER": handler, "PYTHONPATH": str(ROOT), **(env or {})}
    spec: dict[str, Any] = {
        "model": {"source": "/", "task": task},
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max(replicas, 4) if max_replicas is None else max_replicas,
        "resources": {"memory": memory, "gpus": 0},
        "queue": {"capacity": queue_capacity},
        "idleTimeoutSeconds": idle_timeout_seconds,
        "autoscaling": {"enabled": False} if autoscaling is None else autoscaling,
        "podTemplate": {
            "nodeSelector": PROCESS_NODE,
            "tolerations": [{"key": "modelpool.dev/process-node", "operator": "Exists"}],
            "env": [{"name": k, "value": v} for k, v in all_env.items()],
        },
    }
    if served_model_name:
        spec["servedModelName"] = served_model_name
    if activation_timeout_seconds is not None:
        spec["activationTimeoutSeconds"] = activation_timeout_seconds
    return {"apiVersion": GROUP_VERSION, "kind": "ModelPool", "metadata": {"name": name}, "spec": spec}


def worker_pids(cluster: Cluster, namespace: str, pool: str) -> dict[str, int]:
    """Pod name -> the process-node process of its server container (``containerID: process://PID``)."""
    from tests.operator.integration.opharness import worker_pods

    out = {}
    for pod in worker_pods(cluster, namespace, pool):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            cid = status.get("containerID") or ""
            if cid.startswith("process://") and status.get("state", {}).get("running"):
                out[pod["metadata"]["name"]] = int(cid.removeprefix("process://"))
    return out
