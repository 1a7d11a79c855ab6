"""A node drain goes through the pool's PodDisruptionBudget: one worker at a time, each replaced by the
operator within the ModelBudget before the next goes, and the pool never below its replicas less
``spec.disruption.maxUnavailable`` serving (issue 31, item 3). A replacement takes another name than the
worker it replaces (``planner.disrupted``): the evicted name may stay in the budget's
``status.disruptedPods`` for 2 minutes, and a replacement of that name would count for nothing meanwhile.
The same for a ModelHost's host pods (``modelhost-<host>``): the drain evicts one, the other waits until
its replacement is Ready, and the shared pool on them is placed again on the new host pods.

Real API server, scheduler, disruption controller and ``kubectl drain`` (the Eviction API); two KWOK nodes
of the test's own (a label and a taint no other test's pods select or tolerate), so cordoning one touches
nobody else's pods. The pod watcher sees every change of the pods and keeps the fewest ready ones; the
host pods are answered on their pod IPs by ``testkit.hostsim`` (as ``modelpool-server --shared-host``).
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from modelpool_contract.placements import LABEL_HOST
from modelpool_operator.host import host_pool_label
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.hostsim import Audit, HostSim
from testkit.kubectl import apply, get_json, is_ready, wait_for
from testkit.services import KWOK_GPU_PLACEMENT, host_manifest, shared_pool_manifest
from tests.operator.integration.opharness import (
    GI,
    BudgetedOperator,
    now,
    pool_manifest,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster]

REPLICAS = 4
MAX_UNAVAILABLE = 1
TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}


def _node(name: str, label: str, cidr: str) -> dict[str, Any]:
    capacity = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8", "pods": "50"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"type": label, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {"taints": [TAINT], "podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {"allocatable": capacity, "capacity": capacity},
    }


@pytest.fixture
def drain_nodes(crds: Cluster, namespace: str) -> Iterator[tuple[str, list[str]]]:
    """Two KWOK nodes labelled ``type=<label>`` for this test alone; deleted afterwards. Each hands out pod
    IPs of its own (a simulated host binds its pod's IP: two pods may not share one)."""
    label = f"drain-{namespace}"
    names = [f"{label}-a", f"{label}-b"]
    for index, name in enumerate(names):
        apply(crds, _node(name, label, f"127.{81 + index}.0.0/16"))
    # A node's Ready condition is a pod's shape: testkit's ``is_ready`` reads both.
    wait_for(
        lambda: all(is_ready(get_json(crds, "node", n)) for n in names),
        timeout=60,
        message="the test's KWOK nodes Ready",
    )
    yield label, names
    for name in names:
        crds.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


def _budget_status(crds: Cluster, namespace: str, name: str) -> dict[str, Any]:
    done = crds.kubectl("get", "pdb", name, "-n", namespace, "-o", "json", check=False)
    return (json.loads(done.stdout).get("status") or {}) if done.returncode == 0 else {}


def _all_ready(crds: Cluster, namespace: str, timeout: float, message: str) -> None:
    """Wait until every one of the pool's ``REPLICAS`` workers is ready, as its status says."""
    wait_status(
        crds,
        namespace,
        "drained",
        lambda s: s.get("readyReplicas") == REPLICAS,
        timeout=timeout,
        message=message,
    )


def test_a_drain_evicts_a_pools_workers_one_at_a_time_and_serving_never_drops_below_the_budget(
    crds: Cluster, namespace: str, drain_nodes: tuple[str, list[str]], budgeted_operator: BudgetedOperator
) -> None:
    label, nodes = drain_nodes
    # The budget holds the pool's workers and nothing more: a replacement fits only once the evicted
    # worker is gone, as the operator's admission rules say.
    watcher, _ = budgeted_operator(f"{REPLICAS}Gi")
    manifest = pool_manifest(
        "drained",
        replicas=REPLICAS,
        min_replicas=REPLICAS,
        max_replicas=REPLICAS,
        node_selector={"type": label},
    )
    manifest["spec"]["disruption"] = {"maxUnavailable": MAX_UNAVAILABLE}
    apply(crds, manifest, namespace)
    _all_ready(crds, namespace, 60, "4 ready")
    # The operator's budget, as the disruption controller sees it: one of the four may go.
    wait_for(
        lambda: (
            _budget_status(crds, namespace, "modelpool-drained").get("disruptionsAllowed") == MAX_UNAVAILABLE
        ),
        timeout=30,
        message="the pool's PodDisruptionBudget allows one disruption",
    )
    pods = worker_pods(crds, namespace, "drained")
    on_node = {n: [p for p in pods if p["spec"].get("nodeName") == n] for n in nodes}
    # The default soft spread put them on both nodes: drain the one that holds more (at least two).
    node = max(nodes, key=lambda n: len(on_node[n]))
    assert len(on_node[node]) >= 2 and all(on_node.values()), {n: len(v) for n, v in on_node.items()}

    watcher.arm_ready_floor("drained", REPLICAS - MAX_UNAVAILABLE)
    drained_at = now()
    drained = crds.kubectl(
        "drain", node, "--pod-selector=modelpool.dev/pool=drained", "--delete-emptydir-data",
        "--ignore-daemonsets", "--timeout=50s", timeout=60,
    )  # fmt: skip
    output = drained.stdout + drained.stderr
    budget = _budget_status(crds, namespace, "modelpool-drained")
    assert drained.returncode == 0, f"{output}\nthe budget's status: {json.dumps(budget)}"
    evicted = {p["metadata"]["name"] for p in on_node[node]}
    assert all(f"evicting pod {namespace}/{name}" in output for name in evicted), output
    # kubectl asked for both evictions at once; the budget let the second go only once the first worker's
    # replacement served: never fewer than replicas - maxUnavailable ready (every pod change was seen).
    t0 = watcher.history[0][0]
    trace = "\n".join(f"{t - t0:.3f} {kind} {name} {phase}" for t, kind, name, phase in watcher.history)
    assert watcher.min_ready_after["drained"] >= REPLICAS - MAX_UNAVAILABLE, f"{output}\n{trace}"
    deleted = [name for _, kind, name, _ in watcher.history if kind == "DELETED"]
    assert sorted(deleted) == sorted(evicted), trace
    # Each replacement under a name of its own: the budget counted it as soon as it was Ready.
    added = {name for t, kind, name, _ in watcher.history if kind == "ADDED" and t > drained_at}
    assert not added & evicted, trace
    _all_ready(crds, namespace, 30, "4 ready again")
    after = worker_pods(crds, namespace, "drained")
    assert all(p["spec"].get("nodeName") != node for p in after), "a worker on the cordoned node"
    watcher.stop()
    assert watcher.min_ready_after["drained"] >= REPLICAS - MAX_UNAVAILABLE, trace
    assert watcher.max_memory <= REPLICAS * GI, "the replacements were admitted within the budget"


HOST = "hosts"
#: How a refused eviction reads in ``kubectl drain``'s output (the Eviction API's 429, retried).
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget"


def _host_status(crds: Cluster, namespace: str) -> dict[str, Any]:
    return get_json(crds, "modelhost", HOST, "-n", namespace).get("status") or {}


def _serving(sim: HostSim, model: str) -> int:
    """The simulated host pods on which ``model`` serves now."""
    states = sim.placements().get(model, {}).values()
    return sum(1 for state in states if state in ("Ready", "Idle", "Processing"))


class _Drain:
    """``kubectl drain`` running in the background, its output (stdout and stderr) read as it comes, so a
    test can act once kubectl has said something (an eviction refused)."""

    def __init__(self, cluster: Cluster, *args: str) -> None:
        argv = [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(cluster.kubeconfig), "drain", *args]
        self._process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name="drain-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(list(self._lines))

    def wait(self, timeout: float) -> int:
        code = self._process.wait(timeout)
        self._reader.join(10)
        return code

    def kill(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)


class _Holders(Audit):
    """The auditor of the simulated hosts, keeping the fewest host pods that held the pool's model once
    armed (a host pod drained takes its models with it)."""

    def __init__(self) -> None:
        super().__init__(replicas_of=lambda _: 2)
        self.fewest: int | None = None

    def released(self, pod: str, name: str) -> None:
        super().released(pod, name)
        with self.lock:
            if self.fewest is not None:
                self.fewest = min(self.fewest, len(self.holders.get(name, set())))


def test_a_drain_evicts_a_modelhosts_host_pods_one_at_a_time_and_its_pool_is_placed_again(
    crds: Cluster, namespace: str, drain_nodes: tuple[str, list[str]], budgeted_operator: BudgetedOperator
) -> None:
    """Both host pods of a ModelHost (replicas 2, maxUnavailable 1: minAvailable 1) on the drained node: the
    drain evicts one; the other's eviction is refused (``REFUSED``) while the first one's replacement cannot
    be Ready (the test keeps the other node cordoned: the gate it controls), and goes once the replacement
    is Ready there, so a Ready host pod is there at every instant; the shared pool on them (a replica on
    each) is placed on the new host pods and serves two replicas again."""
    label, (drained_node, other) = drain_nodes
    port = free_port()
    # The budget holds the two host pods (each charged its 4 GiB device): a replacement fits once the
    # evicted one is gone.
    watcher, _ = budgeted_operator("8Gi", MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(port))
    audit = _Holders()
    sim = HostSim(crds.kubeconfig, namespace, port, audit=audit, load_s=0.3).start()
    drain: _Drain | None = None
    try:
        crds.kubectl("cordon", other)  # both host pods on the node to drain
        placement = {
            "nodeSelector": {"type": label},
            "tolerations": KWOK_GPU_PLACEMENT["tolerations"],
            "disruption": {"maxUnavailable": MAX_UNAVAILABLE},
        }
        host = host_manifest(HOST, replicas=2, gpusPerHost=1, deviceMemory="4Gi", **placement)
        apply(crds, host, namespace)
        apply(crds, shared_pool_manifest("emb", host=HOST, gib=1, replicas=2), namespace)
        wait_status(
            crds, namespace, "emb", lambda s: s.get("readyReplicas") == 2, timeout=90,
            message="the shared pool on both host pods",
        )  # fmt: skip
        wait_for(
            lambda: _budget_status(crds, namespace, f"modelhost-{HOST}").get("disruptionsAllowed") == 1,
            timeout=30,
            message="the host pods' PodDisruptionBudget allows one disruption",
        )
        pods = get_json(crds, "pods", "-n", namespace, "-l", f"{LABEL_HOST}={HOST}")["items"]
        assert {p["spec"].get("nodeName") for p in pods} == {drained_node}, pods

        pool_label = host_pool_label(HOST)
        watcher.arm_ready_floor(pool_label, 1)
        with audit.lock:
            audit.fewest = len(audit.holders.get("emb", set()))
        drain = running = _Drain(
            crds, drained_node, f"--pod-selector={LABEL_HOST}={HOST}", "--delete-emptydir-data",
            "--ignore-daemonsets", "--timeout=90s",
        )  # fmt: skip
        # Both nodes cordoned: the first evicted host pod's replacement stays Pending, and the budget refuses
        # the second eviction (kubectl retries it every 5 s) ...
        wait_for(lambda: REFUSED in running.output, timeout=60, message="the second eviction refused")
        assert watcher.min_ready_after[pool_label] == 1, running.output
        # ... until the replacement is Ready on the node the test lets it have.
        crds.kubectl("uncordon", other)
        code = running.wait(timeout=100)
        output = running.output
        budget = _budget_status(crds, namespace, f"modelhost-{HOST}")
        assert code == 0, f"{output}\nthe budget's status: {json.dumps(budget)}"
        t0 = watcher.history[0][0]
        trace = "\n".join(f"{t - t0:.3f} {kind} {name} {phase}" for t, kind, name, phase in watcher.history)
        assert watcher.min_ready_after[pool_label] >= 1, f"{output}\n{trace}"
        wait_for(
            lambda: _host_status(crds, namespace).get("readyReplicas") == 2,
            timeout=60,
            message="both host pods Ready again",
        )
        after = get_json(crds, "pods", "-n", namespace, "-l", f"{LABEL_HOST}={HOST}")["items"]
        assert {p["spec"].get("nodeName") for p in after} == {other}, after
        # The pool's model went with each drained host pod and is placed on the new ones (the simulated
        # hosts serve only the host pods that exist now).
        wait_for(
            lambda: _serving(sim, "emb") == 2,
            timeout=60,
            message="the pool's model Ready on both new host pods",
        )
        wait_status(
            crds, namespace, "emb", lambda s: s.get("readyReplicas") == 2, timeout=60,
            message="the shared pool served by both new host pods",
        )  # fmt: skip
        assert sim.audit.violations == [], sim.audit.violations
        # A host pod's readiness is its process's, not its models': the budget let the second host pod go
        # once the first one's replacement was Ready, whether or not the model was loaded there yet.
        print(f"fewest host pods holding the pool's model during the drain: {audit.fewest}")
        watcher.stop()
    finally:
        if drain is not None:
            drain.kill()
        sim.stop()
