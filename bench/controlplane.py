"""Control-plane scale benchmark: 100 ModelPools x 10 workers on KWOK nodes (`python -m bench.controlplane`).

Starts the local real control plane (``hack/cluster.sh up`` in a temporary directory; or reuses the one
in ``MODELPOOL_BENCH_KUBECONFIG``), adds KWOK nodes so that 1000 pods fit, runs the real operator (its
console script, all namespaces), creates the pools at once, and measures:

* time until every worker pod is Ready (scheduler + KWOK + the operator's creates),
* time to converge after the pods are ready: until every pool's status shows 10/10 Ready workers,
* the operator's RSS and the API server's request rate at steady state (``apiserver_request_total`` from
  the API server's ``/metrics``, delta over a window; all clients, with the operator's own resources
  broken out).

Targets (docs/design.md, "Testing and speed targets"): converge <= 60 s, RSS <= 300 MiB. Results go to
``.bench/controlplane.json`` and to the README between ``<!-- bench:controlplane:start -->`` and
``<!-- bench:controlplane:end -->``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from bench.report import replace_block
from testkit import prom
from testkit.cluster import guarded_cluster
from testkit.environment import BIN, ROOT
from testkit.kubectl import kubectl

START_MARK = "<!-- bench:controlplane:start -->"
END_MARK = "<!-- bench:controlplane:end -->"
NAMESPACE = f"bench-{uuid.uuid4().hex[:6]}"  # unique: an earlier run's namespace may still be terminating


@dataclass
class Result:
    pools: int
    workers_per_pool: int
    create_to_pods_ready_s: float
    converge_after_pods_ready_s: float
    create_to_converged_s: float
    operator_rss_mib: float
    api_requests_per_min: float
    operator_resource_requests_per_min: float
    window_s: float
    machine: str


def wait(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 1.0) -> float:
    """Seconds until ``predicate`` holds; raises after ``timeout``."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"{what}: not reached within {timeout:.0f}s")
        time.sleep(interval)


# The benchmark's extra KWOK nodes hand out pod IPs from 127.80.0.0/16 up (loopback: the operator scrapes
# every worker's pod IP, and nothing may leave the machine); below the test process nodes' 127.100+.
BENCH_NODE_OCTET = 80
BENCH_NODES_MAX = 20


def extra_nodes(count: int) -> str:
    """KWOK nodes shaped like kwok-gpu-0 (hack/kwok/nodes.yaml), so 1000 pods fit with room to spare."""
    if count > BENCH_NODES_MAX:
        raise ValueError(f"at most {BENCH_NODES_MAX} bench nodes (their pod CIDRs are 127.80-99.0.0/16)")
    nodes = []
    for i in range(count):
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"kwok-bench-{i}",
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"type": "kwok", "kubernetes.io/hostname": f"kwok-bench-{i}"},
                },
                "spec": {"podCIDR": _cidr(i), "podCIDRs": [_cidr(i)]},  # 127.80.0.0/16 up
                "status": {
                    "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "250"},
                    "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8", "pods": "250"},
                },
            }
        )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})


def _cidr(node: int) -> str:
    return f"127.{BENCH_NODE_OCTET + node}.0.0/16"


def pools_manifest(pools: int, workers: int) -> str:
    items = [
        {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelPool",
            "metadata": {"name": f"pool-{i:03d}", "namespace": NAMESPACE},
            "spec": {
                "model": {"source": "/models/bench", "task": "text-embedding"},
                "replicas": workers,
                "minReplicas": 0,
                "maxReplicas": max(workers, 10),
                # GPUs are not requested: 1000 workers would need 1000 fake GPUs; placement is not what
                # this benchmark measures.
                "resources": {"memory": "1Gi", "gpus": 0},
                "podTemplate": {
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                },
            },
        }
        for i in range(pools)
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


# The operator's own resources, whose share of the API server's requests is reported separately.
OWN_RESOURCES = frozenset({"modelpools", "modelbudgets", "events"})


def request_counts(metrics_text: str) -> tuple[float, float]:
    """Pure: (all requests, requests on the operator's own resources) from the API server's /metrics
    (the counter ``apiserver_request_total``, summed over its labels)."""
    name = "apiserver_request_total"
    own = prom.total(metrics_text, name, where=lambda labels: labels.get("resource") in OWN_RESOURCES)
    return prom.total(metrics_text, name), own


def api_request_counts(kubeconfig: Path) -> tuple[float, float]:
    return request_counts(kubectl(kubeconfig, "get", "--raw", "/metrics"))


def pods_ready(kubeconfig: Path, expected: int) -> bool:
    out = kubectl(
        kubeconfig,
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "modelpool.dev/pool",
        "-o",
        "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
    )
    return sum(1 for line in out.splitlines() if line.strip() == "True") >= expected


def pools_converged(kubeconfig: Path, pools: int, workers: int) -> bool:
    data = json.loads(kubectl(kubeconfig, "get", "modelpools", "-n", NAMESPACE, "-o", "json"))
    done = 0
    for pool in data["items"]:
        status = pool.get("status") or {}
        listed = status.get("workers") or []
        if (
            status.get("readyReplicas") == workers
            and sum(1 for w in listed if w["state"] == "Ready") == workers
        ):
            done += 1
    return done == pools


def write_readme(result: Result) -> None:
    r = result
    table = "\n".join(
        [
            f"Control plane at scale ({r.pools} pools x {r.workers_per_pool} workers on KWOK nodes, "
            f"`python -m bench.controlplane`, {r.machine}):",
            "",
            "| measure | value | target |",
            "|---|---|---|",
            f"| create -> all worker pods Ready | {r.create_to_pods_ready_s:.1f} s | |",
            f"| converge after pods Ready (every pool's status {r.workers_per_pool}/{r.workers_per_pool}) "
            f"| {r.converge_after_pods_ready_s:.1f} s | <= 60 s |",
            f"| operator RSS at steady state | {r.operator_rss_mib:.0f} MiB | <= 300 MiB |",
            f"| API requests/min at steady state (all clients) | {r.api_requests_per_min:.0f} | |",
            f"| of which modelpools/modelbudgets/events | {r.operator_resource_requests_per_min:.0f} | |",
        ]
    )
    replace_block(table, START_MARK, END_MARK)


def run(pools: int, workers: int, steady_window: float, kubeconfig: Path, log: Path) -> Result:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    # Not `kubectl wait --for=condition=Established`: it fails at once on a CRD with no conditions yet.
    established = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
    wait(
        lambda: kubectl(kubeconfig, "get", "crd/modelpools.modelpool.dev", "-o", established) == "True",
        60,
        "ModelPool CRD established",
    )
    kubectl(kubeconfig, "apply", "-f", "-", stdin=extra_nodes(2))
    kubectl(kubeconfig, "create", "namespace", NAMESPACE)
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    with log.open("wb") as out:
        operator = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "modelpool-operator"), "--all-namespaces", "--standalone",
             "--liveness", "0", "--metrics", "0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            time.sleep(3)  # the operator's initial listing
            started = time.monotonic()
            kubectl(kubeconfig, "apply", "-f", "-", stdin=pools_manifest(pools, workers))
            expected = pools * workers
            wait(lambda: pods_ready(kubeconfig, expected), 900, "all worker pods Ready", interval=2)
            pods_ready_at = time.monotonic()
            wait(lambda: pools_converged(kubeconfig, pools, workers), 600, "every pool converged", interval=2)
            converged_at = time.monotonic()

            time.sleep(20)  # settle: the last status writes and events
            total0, own0 = api_request_counts(kubeconfig)
            t0 = time.monotonic()
            time.sleep(steady_window)
            total1, own1 = api_request_counts(kubeconfig)
            window = time.monotonic() - t0
            rss = psutil.Process(operator.pid).memory_info().rss / 2**20
        finally:
            # Delete the pools while the operator runs: it removes its finalizer from each, so the
            # namespace can go afterwards.
            subprocess.run(
                [str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "delete", "modelpools.modelpool.dev",
                 "--all", "-n", NAMESPACE, "--timeout=120s"],
                capture_output=True, timeout=180, check=False,
            )  # fmt: skip
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
    return Result(
        pools=pools,
        workers_per_pool=workers,
        create_to_pods_ready_s=pods_ready_at - started,
        converge_after_pods_ready_s=converged_at - pods_ready_at,
        create_to_converged_s=converged_at - started,
        operator_rss_mib=rss,
        api_requests_per_min=(total1 - total0) * 60 / window,
        operator_resource_requests_per_min=(own1 - own0) * 60 / window,
        window_s=window,
        machine=f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--window", type=float, default=60.0, help="steady-state window (s)")
    parser.add_argument("--no-readme", action="store_true", help="do not update README.md")
    args = parser.parse_args(argv)

    with guarded_cluster("bench", "operator log and cluster logs") as cluster:
        result = run(
            args.pools, args.workers, args.window, cluster.kubeconfig, cluster.workdir / "operator.log"
        )
        if cluster.reused:  # someone else's cluster: leave it without the benchmark's pools
            kubectl(cluster.kubeconfig, "delete", "namespace", NAMESPACE, "--wait=false")

    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    (out / "controlplane.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    if not args.no_readme:
        write_readme(result)
    print(json.dumps(asdict(result), indent=2))
    ok = result.converge_after_pods_ready_s <= 60 and result.operator_rss_mib <= 300
    print("targets met" if ok else "targets MISSED (converge <= 60 s, RSS <= 300 MiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
