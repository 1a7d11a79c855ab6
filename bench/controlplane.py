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
``.bench/controlplane.json`` and to docs/benchmarks.md between ``<!-- bench:controlplane:start -->`` and
``<!-- bench:controlplane:end -->``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from bench.kwok import kwok_pool, wait
from bench.report import replace_block
from testkit import prom
from testkit.cluster import guarded_cluster
from testkit.environment import BIN, ROOT, free_port
from testkit.kubectl import kubectl
from testkit.services import POLICY_ENV

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
    # The operator's CPU use at steady state (100: one core), and the API requests by resource and verb.
    operator_cpu_percent: float
    requests_per_min_by_kind: dict[str, float]
    load_average: str
    machine: str
    # ``--gateway``: two gateways side by side (``bench.gateway_scale.GatewayScale``), else None.
    gateway: dict[str, Any] | None = None


# The benchmark's extra KWOK nodes hand out pod IPs from 127.80.0.0/16 up (loopback: the operator scrapes
# every worker's pod IP, and nothing may leave the machine); below the test process nodes' 127.100+.
BENCH_NODE_OCTET = 80
BENCH_NODES_MAX = 20
# Pods per bench node (a /16 each holds 65,534 addresses); 20 nodes hold 20,000 pods.
BENCH_NODE_PODS = 1000
# CPUs per bench node: every worker requests one by the operator's default (DEFAULT_WORKER_CPU), so a node
# full of pods must have a CPU for each, and some to spare (the scheduler, not the CPUs, is measured here).
BENCH_NODE_CPU = str(2 * BENCH_NODE_PODS)


def nodes_needed(pods: int) -> int:
    """Bench nodes for ``pods`` worker pods with a tenth to spare (the cluster's own KWOK nodes are left for
    the tests' pools)."""
    return max(1, -(-(pods + pods // 10) // BENCH_NODE_PODS))


def extra_nodes(count: int) -> str:
    """KWOK nodes shaped like kwok-gpu-0 (hack/kwok/nodes.yaml) but holding ``BENCH_NODE_PODS`` pods each."""
    if count > BENCH_NODES_MAX:
        raise ValueError(f"at most {BENCH_NODES_MAX} bench nodes (their pod CIDRs are 127.80-99.0.0/16)")
    nodes = []
    pods = str(BENCH_NODE_PODS)
    cpu = BENCH_NODE_CPU
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
                    "allocatable": {"cpu": cpu, "memory": "5Ti", "nvidia.com/gpu": "8", "pods": pods},
                    "capacity": {"cpu": cpu, "memory": "5Ti", "nvidia.com/gpu": "8", "pods": pods},
                },
            }
        )
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes})


def _cidr(node: int) -> str:
    return f"127.{BENCH_NODE_OCTET + node}.0.0/16"


def pools_manifest(pools: int, workers: int) -> str:
    items = [kwok_pool(f"pool-{i:03d}", NAMESPACE, workers) for i in range(pools)]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


# The operator's own resources, whose share of the API server's requests is reported separately.
OWN_RESOURCES = frozenset({"modelpools", "modelbudgets", "events"})


def request_counts(metrics_text: str) -> tuple[float, float]:
    """Pure: (all requests, requests on the operator's own resources) from the API server's /metrics
    (the counter ``apiserver_request_total``, summed over its labels)."""
    name = "apiserver_request_total"
    own = prom.total(metrics_text, name, where=lambda labels: labels.get("resource") in OWN_RESOURCES)
    return prom.total(metrics_text, name), own


def requests_by_kind(metrics_text: str) -> dict[str, float]:
    """Pure: ``apiserver_request_total`` by ``resource verb`` (e.g. ``modelpools PATCH``)."""
    counts: dict[str, float] = {}
    for sample in prom.iter_samples(metrics_text, "apiserver_request_total"):
        kind = f"{sample.labels.get('resource', '')} {sample.labels.get('verb', '')}"
        counts[kind] = counts.get(kind, 0.0) + sample.value
    return counts


def per_minute(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Pure: the rate of each kind between two ``requests_by_kind``, busiest first (at least 1/min)."""
    rates = {k: (v - before.get(k, 0.0)) * 60 / seconds for k, v in after.items()}
    return {k: round(v, 1) for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v >= 1}


def api_request_counts(kubeconfig: Path) -> tuple[float, float]:
    return request_counts(kubectl(kubeconfig, "get", "--raw", "/metrics"))


def progress(what: str, done: int, total: int, pid: int | None = None) -> None:
    """One line on stderr per poll: a run at 1,000 pools lasts half an hour; this is how it is watched."""
    rss = f", operator RSS {psutil.Process(pid).memory_info().rss / 2**20:.0f} MiB" if pid else ""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{time.strftime('%H:%M:%S')} {what}: {done}/{total}{rss}, load {load}", file=sys.stderr, flush=True
    )


def pods_ready(kubeconfig: Path, expected: int, pid: int | None = None) -> bool:
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
    ready = sum(1 for line in out.splitlines() if line.strip() == "True")
    progress("pods Ready", ready, expected, pid)
    return ready >= expected


def pools_converged(kubeconfig: Path, pools: int, workers: int, pid: int | None = None) -> bool:
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
    progress("pools converged", done, pools, pid)
    return done == pools


def curve_table(results: list[dict[str, Any]]) -> str:
    """Pure: the cost curve, one row per size (``.bench/controlplane-<pools>.json``, smallest first)."""

    def gateway(r: dict[str, Any], field: str, fmt: str) -> str:
        return format(r["gateway"][field], fmt) if r.get("gateway") else "-"

    rows = [
        "| pools x workers | create -> pods Ready | converge after Ready (<= 120 s) "
        "| operator RSS (<= 500 MiB) | operator CPU | API req/min (operator's resources) "
        "| gateway RSS, peak (<= 200 MiB) "
        "| gateway added p50: 10 pools / all | load avg |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: int(r["pools"])):
        rows.append(
            f"| {r['pools']} x {r['workers_per_pool']} | {r['create_to_pods_ready_s']:.0f} s "
            f"| {r['converge_after_pods_ready_s']:.1f} s | {r['operator_rss_mib']:.0f} MiB "
            f"| {r.get('operator_cpu_percent', float('nan')):.0f} % "
            f"| {r['api_requests_per_min']:.0f} ({r['operator_resource_requests_per_min']:.0f}) "
            f"| {gateway(r, 'big_rss_mib', '.0f')}, {gateway(r, 'big_peak_rss_mib', '.0f')} MiB "
            f"| {gateway(r, 'small_added_p50_ms', '.2f')} / {gateway(r, 'big_added_p50_ms', '.2f')} ms "
            f"| {r.get('load_average', '')} |"
        )
    return "\n".join(rows)


def write_docs(result: Result, out: Path) -> None:
    """docs/benchmarks.md's cost curve from every size measured so far (each run writes its own JSON)."""
    results = [json.loads(f.read_text()) for f in sorted(out.glob("controlplane-*.json"))]
    r = result
    table = "\n".join(
        [
            "Control plane at scale (`python -m bench.controlplane --pools N --gateway`, "
            f"{r.workers_per_pool} workers per pool on KWOK nodes, {r.machine}, shared with other work: "
            "load averages beside each row; each row is one run):",
            "",
            curve_table(results),
        ]
    )
    replace_block(table, START_MARK, END_MARK)


def crd_established(kubeconfig: Path) -> bool:
    """Whether the ModelPool CRD is Established. Not `kubectl wait --for=condition=Established`, nor a
    jsonpath filter on the conditions: both fail at once on a CRD that has no conditions yet."""
    crd = json.loads(kubectl(kubeconfig, "get", "crd/modelpools.modelpool.dev", "-o", "json"))
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def run(  # noqa: PLR0917 (the bench's one entry point; main passes its arguments in order)
    pools: int, workers: int, steady_window: float, kubeconfig: Path, log: Path, gateway: bool = False
) -> Result:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    wait(lambda: crd_established(kubeconfig), 60, "ModelPool CRD established")
    kubectl(kubeconfig, "apply", "-f", "-", stdin=extra_nodes(nodes_needed(pools * workers)))
    kubectl(kubeconfig, "create", "namespace", NAMESPACE)
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    # The echo worker of ``--gateway`` runs on the process node: a port nothing else on the machine uses.
    worker_port = free_port()
    env["MODELPOOL_OPERATOR_SERVER_PORT"] = str(worker_port)
    env.update(POLICY_ENV)  # the test nodes and handlers, beyond the default allowlists
    gateways = None
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
            # In lists of 100 (kubectl sends one request per object: 1,000 pools took over 300 s here).
            manifests = json.loads(pools_manifest(pools, workers))["items"]
            for first in range(0, pools, 100):
                chunk = manifests[first : first + 100]
                kubectl(
                    kubeconfig,
                    "create",
                    "-f",
                    "-",
                    stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": chunk}),
                )
            expected = pools * workers
            # Listing every pod costs the API server (and this machine) more the more there are: at 10,000
            # pods (50 MB of JSON a list) the pods are counted every 15 s, the pools every 5 s.
            poll = 2 if expected <= 3000 else 5
            pods_poll = 2 if expected <= 3000 else 15
            wait(
                lambda: pods_ready(kubeconfig, expected, operator.pid),
                1800,
                "all worker pods Ready",
                interval=pods_poll,
            )
            pods_ready_at = time.monotonic()
            wait(
                lambda: pools_converged(kubeconfig, pools, workers, operator.pid),
                900,
                "every pool converged",
                interval=poll,
            )
            converged_at = time.monotonic()

            time.sleep(20)  # settle: the last status writes and events
            text0 = kubectl(kubeconfig, "get", "--raw", "/metrics")
            cpu0 = sum(psutil.Process(operator.pid).cpu_times()[:2])
            t0 = time.monotonic()
            time.sleep(steady_window)
            text1 = kubectl(kubeconfig, "get", "--raw", "/metrics")
            window = time.monotonic() - t0
            cpu1 = sum(psutil.Process(operator.pid).cpu_times()[:2])
            (total0, own0), (total1, own1) = request_counts(text0), request_counts(text1)
            kinds = per_minute(requests_by_kind(text0), requests_by_kind(text1), window)
            rss = psutil.Process(operator.pid).memory_info().rss / 2**20
            if gateway:
                from bench import gateway_scale  # it imports this module

                gateways = asdict(gateway_scale.measure(kubeconfig, log.parent, worker_port))
        finally:
            # Delete the pools while the operator runs: it removes its finalizer from each, so the
            # namespace can go afterwards.
            with contextlib.suppress(subprocess.TimeoutExpired):  # the operator is stopped regardless
                subprocess.run(
                    [str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "delete",
                     "modelpools.modelpool.dev", "--all", "-n", NAMESPACE, "--timeout=120s"],
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
        operator_cpu_percent=(cpu1 - cpu0) * 100 / window,
        requests_per_min_by_kind=kinds,
        load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        gateway=gateways,
        machine=f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--window", type=float, default=60.0, help="steady-state window (s)")
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    parser.add_argument(
        "--gateway", action="store_true", help="also measure gateways watching 10 pools and every pool"
    )
    args = parser.parse_args(argv)

    with guarded_cluster("bench", "operator log and cluster logs") as cluster:
        result = run(
            args.pools,
            args.workers,
            args.window,
            cluster.kubeconfig,
            cluster.workdir / "operator.log",
            gateway=args.gateway,
        )
        if cluster.reused:  # someone else's cluster: leave it without the benchmark's pools
            kubectl(cluster.kubeconfig, "delete", "namespace", NAMESPACE, "--wait=false")

    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    (out / "controlplane.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    (out / f"controlplane-{result.pools}.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    if not args.no_docs:
        write_docs(result, out)
    print(json.dumps(asdict(result), indent=2))
    ok = result.converge_after_pods_ready_s <= 120 and result.operator_rss_mib <= 500
    print("targets met" if ok else "targets MISSED (converge <= 120 s, RSS <= 500 MiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
