"""Control-plane scale benchmark: 100 ModelPools x 10 workers on KWOK nodes (`python -m bench.controlplane`).

Starts the local real control plane (``hack/cluster.sh up`` in a temporary directory; or reuses the one
in ``MODELPOOL_BENCH_KUBECONFIG``), adds KWOK nodes so that 1000 pods fit, and in each round (``--rounds``,
the order alternating) measures two ways of making the same pods on that cluster:

* **through the operator** (its console script, all namespaces): the pools created at once; the time until
  every worker pod is Ready, read from the pods' own Ready conditions (``lastTransitionTime``, whole
  seconds; a poll only notices that all are), then until every pool's status shows 10/10 Ready workers;
  at steady state the operator's RSS and CPU, the API server's request rate (``apiserver_request_total``,
  all clients) and the **writes per minute** from the API server's audit log (every write in the pools'
  namespace, by anyone: the operator's, the controllers', KWOK's; Lease renewals apart);
* **directly** (issue 36's baseline): the operator's exact worker pods (``build_worker_pod``), without an
  operator, its labels or a pool, created with kubectl in the same lists; Ready times the same way, and the
  writes per minute at rest.

It prints the ratio of the two create -> all Ready times (target: within 1.25x). Targets (docs/design.md,
"Testing and speed targets"): converge <= 120 s after the pods are Ready, RSS <= 500 MiB; writes at rest
under 10 a minute per 100 idle pools (issue 36). Results go to ``.bench/controlplane.json`` and to
docs/benchmarks.md between ``<!-- bench:controlplane:start -->`` and ``<!-- bench:controlplane:end -->``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import psutil

from bench.kwok import kwok_pool, wait
from bench.report import BENCHMARKS, replace_block
from modelpool_contract.times import parse_time
from modelpool_operator.effects.resources import build_worker_pod
from modelpool_operator.pool import PoolView
from testkit import prom
from testkit.auditlog import (
    BENCH_NAMESPACE,
    DIRECT_NAMESPACE,
    AuditTail,
    unexpected_writes,
    writes_in,
)
from testkit.auditlog import per_minute as writes_per_minute
from testkit.cluster import guarded_cluster
from testkit.environment import BIN, ROOT, free_port
from testkit.kubectl import kubectl
from testkit.services import POLICY_ENV

START_MARK = "<!-- bench:controlplane:start -->"
END_MARK = "<!-- bench:controlplane:end -->"
# Fixed: hack/audit-policy.yaml records every write in these two namespaces (testkit.auditlog).
NAMESPACE = BENCH_NAMESPACE
#: The direct baseline's pods carry this label (not the pool's: nothing of the operator's selects them).
DIRECT_LABEL = "bench.modelpool.test/direct"
#: kubectl processes creating the lists at once (the operator creates a pool's pods concurrently too).
CREATORS = 4


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
    # Issue 36: every round's create -> all pods Ready (from the pods' Ready conditions) through the operator
    # and directly, the ratio of their medians; the writes per minute at rest (audit log, Leases apart) in
    # the pools' namespace and in the direct pods', and the pools' by kind.
    operator_pods_ready_s: list[float] = field(default_factory=list)
    direct_pods_ready_s: list[float] = field(default_factory=list)
    ready_ratio: float | None = None
    writes_per_min: float | None = None
    direct_writes_per_min: float | None = None
    writes_per_min_by_kind: dict[str, float] = field(default_factory=dict)
    # The first round's writes from the create until converged (operator) or all Ready (direct), by kind.
    creation_writes_by_kind: dict[str, float] = field(default_factory=dict)
    direct_creation_writes_by_kind: dict[str, float] = field(default_factory=dict)
    # The first round's last pod created, scheduled and Ready, seconds after the create, both ways.
    operator_phases: dict[str, float] = field(default_factory=dict)
    direct_phases: dict[str, float] = field(default_factory=dict)
    # The first round's API requests (reads too, every client) from the create until converged (operator)
    # or all Ready (direct), by ``resource verb`` (``apiserver_request_total``): what the operator adds.
    creation_requests_by_kind: dict[str, float] = field(default_factory=dict)
    direct_creation_requests_by_kind: dict[str, float] = field(default_factory=dict)
    # The first round's CPU seconds over the same spans, by process (the operator's, and the cluster's own:
    # kube-apiserver, etcd, kwok, the scheduler, the controller-manager): who competes with KWOK's writes.
    creation_cpu_s: dict[str, float] = field(default_factory=dict)
    direct_creation_cpu_s: dict[str, float] = field(default_factory=dict)
    # ``--operator-nice``: the operator's niceness (0: as the cluster's processes).
    operator_nice: int = 0


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


def pools_manifest(pools: int, workers: int) -> list[dict[str, Any]]:
    return [kwok_pool(f"pool-{i:03d}", NAMESPACE, workers) for i in range(pools)]


def direct_pods(pools: int, workers: int) -> list[dict[str, Any]]:
    """Pure: the pods the operator would make for ``pools_manifest``, built by its own ``build_worker_pod``
    (spec, resources, probes, annotations), in ``DIRECT_NAMESPACE``, without an owner and with
    ``DIRECT_LABEL`` for labels (no operator, nor its indices, ever counts them)."""
    pods = []
    for manifest in pools_manifest(pools, workers):
        view = PoolView.from_body(
            {**manifest, "metadata": {**manifest["metadata"], "namespace": DIRECT_NAMESPACE}}
        )
        for i in range(workers):
            pod = build_worker_pod(view, f"{view.name}-{i}")
            pod["metadata"] = {
                "name": pod["metadata"]["name"],
                "namespace": DIRECT_NAMESPACE,
                "labels": {DIRECT_LABEL: view.name},
                "annotations": pod["metadata"].get("annotations", {}),
            }
            pods.append(pod)
    return pods


def lists_of(items: list[dict[str, Any]], size: int = 100) -> list[str]:
    """Pure: ``items`` as kubectl ``List`` documents of ``size`` (kubectl sends one request per object)."""
    return [
        json.dumps({"apiVersion": "v1", "kind": "List", "items": items[first : first + size]})
        for first in range(0, len(items), size)
    ]


def create_all(kubeconfig: Path, items: list[dict[str, Any]]) -> None:
    """Create ``items`` with ``CREATORS`` kubectl processes at once, a list of 100 each."""
    with ThreadPoolExecutor(CREATORS) as creators:
        list(creators.map(lambda doc: kubectl(kubeconfig, "create", "-f", "-", stdin=doc), lists_of(items)))


def ready_seconds(pods: list[dict[str, Any]], started: datetime) -> list[float]:
    """Pure: each Ready pod's time from ``started`` to its own Ready condition's ``lastTransitionTime``,
    sorted. The condition has whole seconds (the API's resolution): ``started`` is cut to its second too,
    so each time is within a second of the truth either way, never below zero."""
    started = started.replace(microsecond=0)
    times = []
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "Ready" and condition.get("status") == "True":
                at = parse_time(condition.get("lastTransitionTime"))
                if at is not None:
                    times.append((at - started).total_seconds())
    return sorted(times)


def phase_seconds(pods: list[dict[str, Any]], started: datetime) -> dict[str, float]:
    """Pure: when the last pod was created, scheduled and Ready, seconds after ``started`` (cut to its
    second, as the pods' own timestamps are): where a slower way loses its time."""
    base = started.replace(microsecond=0)
    last: dict[str, float] = {}
    for pod in pods:
        stamps = {"created": pod["metadata"].get("creationTimestamp")}
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("status") == "True" and condition.get("type") in ("PodScheduled", "Ready"):
                phase = "scheduled" if condition["type"] == "PodScheduled" else "ready"
                stamps[phase] = condition.get("lastTransitionTime")
        for phase, stamp in stamps.items():
            at = parse_time(stamp)
            if at is not None:
                last[phase] = max(last.get(phase, 0.0), (at - base).total_seconds())
    return {phase: last[phase] for phase in ("created", "scheduled", "ready") if phase in last}


def ratio(operator: list[float], direct: list[float]) -> float | None:
    """Pure: the median of the operator's rounds over the median of the direct ones."""
    if not operator or not direct or statistics.median(direct) <= 0:
        return None
    return statistics.median(operator) / statistics.median(direct)


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


def counted(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Pure: how many requests of each kind between two ``requests_by_kind``, busiest first (at least 1)."""
    return per_minute(before, after, 60.0)


def per_minute(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Pure: the rate of each kind between two ``requests_by_kind``, busiest first (at least 1/min)."""
    rates = {k: (v - before.get(k, 0.0)) * 60 / seconds for k, v in after.items()}
    return {k: round(v, 1) for k, v in sorted(rates.items(), key=lambda kv: -kv[1]) if v >= 1}


def cpu_seconds(kubeconfig: Path, operator: int | None = None) -> dict[str, float]:
    """User and system CPU seconds so far of the cluster's processes (those whose command line names the
    cluster's directory) by name, and of the ``operator``'s process."""
    where = str(kubeconfig.parent)
    seconds: dict[str, float] = {}
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["pid"] == operator:
                name = "operator"
            elif any(where in arg for arg in proc.info["cmdline"] or ()):
                name = proc.info["name"]
            else:
                continue
            seconds[name] = seconds.get(name, 0.0) + sum(proc.cpu_times()[:2])
    return seconds


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Pure: the CPU seconds each process spent between two ``cpu_seconds``, busiest first."""
    spent = {k: round(v - before.get(k, 0.0), 1) for k, v in after.items()}
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def api_request_counts(kubeconfig: Path) -> tuple[float, float]:
    return request_counts(kubectl(kubeconfig, "get", "--raw", "/metrics"))


def progress(what: str, done: int, total: int, pid: int | None = None) -> None:
    """One line on stderr per poll: a run at 1,000 pools lasts half an hour; this is how it is watched."""
    rss = f", operator RSS {psutil.Process(pid).memory_info().rss / 2**20:.0f} MiB" if pid else ""
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{time.strftime('%H:%M:%S')} {what}: {done}/{total}{rss}, load {load}", file=sys.stderr, flush=True
    )


def namespace_pods(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        kubectl(kubeconfig, "get", "pods", "-n", namespace, "-o", "json")
    )["items"]
    return items


def pods_ready(kubeconfig: Path, namespace: str, expected: int, pid: int | None = None) -> bool:
    out = kubectl(
        kubeconfig,
        "get",
        "pods",
        "-n",
        namespace,
        "-o",
        "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
    )
    ready = sum(1 for line in out.splitlines() if line.strip() == "True")
    progress(f"pods Ready in {namespace}", ready, expected, pid)
    return ready >= expected


def pods_gone(kubeconfig: Path, namespace: str) -> bool:
    left = kubectl(kubeconfig, "get", "pods", "-n", namespace, "-o", "name").split()
    progress(f"pods left in {namespace}", len(left), 0)
    return not left


#: A pool of no workers that the operator is ready once it has written its status: the clock of a round
#: starts then, not after a guess at the operator's start (3 s were not enough under load: its imports
#: alone took longer, and the pods of the first pools were late for want of an operator).
CANARY = "canary"


def operator_ready(kubeconfig: Path, operator: subprocess.Popen[bytes]) -> None:
    """Create the ``CANARY`` pool and wait until the operator has written its status."""
    canary = kwok_pool(CANARY, NAMESPACE, 0)
    canary["spec"].update(replicas=0, maxReplicas=1)
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(canary))

    def seen() -> bool:
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited {operator.returncode}")
        pool = json.loads(kubectl(kubeconfig, "get", "modelpools", CANARY, "-n", NAMESPACE, "-o", "json"))
        return bool((pool.get("status") or {}).get("phase"))

    wait(seen, 300, "the operator wrote the canary pool's status", interval=0.5)


def pools_converged(kubeconfig: Path, pools: int, workers: int, pid: int | None = None) -> bool:
    data = json.loads(kubectl(kubeconfig, "get", "modelpools", "-n", NAMESPACE, "-o", "json"))
    done = 0
    for pool in data["items"]:
        if pool["metadata"]["name"] == CANARY:
            continue
        status = pool.get("status") or {}
        listed = status.get("workers") or []
        if (
            status.get("readyReplicas") == workers
            and sum(1 for w in listed if w["state"] == "Ready") == workers
        ):
            done += 1
    progress("pools converged", done, pools, pid)
    return done == pools


def audit_log(kubeconfig: Path) -> Path | None:
    """The cluster's audit log (hack/cluster.sh keeps kwokctl's files beside the kubeconfig)."""
    return next(iter(sorted(kubeconfig.parent.glob("kwok/clusters/*/logs/audit.log"))), None)


@dataclass(frozen=True)
class Writes:
    """The writes of a window in one namespace, Lease renewals apart: per minute, and by kind."""

    per_min: float
    by_kind: dict[str, float]


def _namespace_writes(
    events: list[dict[str, Any]], namespace: str, start: datetime, end: datetime
) -> list[dict[str, Any]] | None:
    if not any(e["objectRef"].get("namespace") == namespace for e in events):
        return None
    return [
        e
        for e in unexpected_writes(writes_in(events, start, end))
        if e["objectRef"].get("namespace") == namespace
    ]


def rest_writes(
    events: list[dict[str, Any]], namespace: str, start: datetime, end: datetime
) -> Writes | None:
    """Pure: the writes at rest in ``namespace`` between ``start`` and ``end`` (None when the log never
    recorded that namespace: a cluster started with an older audit policy)."""
    found = _namespace_writes(events, namespace, start, end)
    if found is None:
        return None
    seconds = (end - start).total_seconds()
    return Writes(round(len(found) * 60 / seconds, 1), writes_per_minute(found, seconds))


def write_counts(
    events: list[dict[str, Any]], namespace: str, start: datetime, end: datetime
) -> dict[str, float]:
    """Pure: how many writes of each kind ``namespace`` took between ``start`` and ``end`` (a creation's),
    Lease renewals apart; empty when the log never recorded that namespace."""
    found = _namespace_writes(events, namespace, start, end)
    return writes_per_minute(found, 60.0) if found else {}


def logged(kubeconfig: Path) -> list[dict[str, Any]]:
    """Every event of the cluster's audit log so far (none without one)."""
    log = audit_log(kubeconfig)
    return AuditTail(log).read() if log is not None else []


def watch_writes(kubeconfig: Path, namespace: str, seconds: float) -> Writes | None:
    """The writes at rest in ``namespace`` over the next ``seconds`` (the window is the measurement)."""
    log = audit_log(kubeconfig)
    if log is None:
        return None
    tail = AuditTail(log)
    start = datetime.now(UTC)
    time.sleep(seconds)
    end = datetime.now(UTC)
    return rest_writes(tail.read(), namespace, start, end)


def curve_table(results: list[dict[str, Any]]) -> str:
    """Pure: the cost curve, one row per size (``.bench/controlplane-<pools>.json``, smallest first)."""

    def gateway(r: dict[str, Any], field: str, fmt: str) -> str:
        return format(r["gateway"][field], fmt) if r.get("gateway") else "-"

    def direct(r: dict[str, Any]) -> str:
        if not r.get("direct_pods_ready_s"):
            return "-"
        return f"{statistics.median(r['direct_pods_ready_s']):.0f} s ({r['ready_ratio']:.2f}x)"

    def writes(r: dict[str, Any]) -> str:
        return "-" if r.get("writes_per_min") is None else f"{r['writes_per_min']:.0f}"

    rows = [
        "| pools x workers | create -> pods Ready | direct (ratio) | converge after Ready (<= 120 s) "
        "| operator RSS (<= 500 MiB) | operator CPU | API req/min (operator's resources) "
        "| writes/min at rest | gateway RSS, peak (<= 200 MiB) "
        "| gateway added p50: 10 pools / all | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: int(r["pools"])):
        rows.append(
            f"| {r['pools']} x {r['workers_per_pool']} | {r['create_to_pods_ready_s']:.0f} s | {direct(r)} "
            f"| {r['converge_after_pods_ready_s']:.1f} s | {r['operator_rss_mib']:.0f} MiB "
            f"| {r.get('operator_cpu_percent', float('nan')):.0f} % "
            f"| {r['api_requests_per_min']:.0f} ({r['operator_resource_requests_per_min']:.0f}) "
            f"| {writes(r)} "
            f"| {gateway(r, 'big_rss_mib', '.0f')}, {gateway(r, 'big_peak_rss_mib', '.0f')} MiB "
            f"| {gateway(r, 'small_added_p50_ms', '.2f')} / {gateway(r, 'big_added_p50_ms', '.2f')} ms "
            f"| {r.get('load_average', '')} |"
        )
    return "\n".join(rows)


#: The curve's columns before the direct baseline and the writes at rest (issue 36) were measured.
OLD_COLUMNS = 9


def kept_rows(block: str, measured: set[int]) -> list[str]:
    """Pure: the rows of the docs' current curve (``block``) for the sizes not ``measured`` here (no JSON of
    theirs on this machine), in the table's columns: a row from before the baseline gets ``-`` for it and
    for the writes at rest."""
    rows = []
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        size = cells[0].split(" x ")[0]
        if not line.startswith("| ") or not size.isdigit() or int(size) in measured:
            continue
        if len(cells) == OLD_COLUMNS:
            cells = [*cells[:2], "-", *cells[2:6], "-", *cells[6:]]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def write_docs(result: Result, out: Path) -> None:
    """docs/benchmarks.md's cost curve from every size measured so far (each run writes its own JSON; the
    docs' rows of sizes without one here are kept)."""
    results = [json.loads(f.read_text()) for f in sorted(out.glob("controlplane-*.json"))]
    current = BENCHMARKS.read_text().split(START_MARK, 1)[-1].split(END_MARK, 1)[0]
    measured = curve_table(results).splitlines()
    old = kept_rows(current, {int(r["pools"]) for r in results})
    rows = measured[:2] + sorted(measured[2:] + old, key=lambda row: int(row.split()[1]))
    r = result
    table = "\n".join(
        [
            "Control plane at scale (`python -m bench.controlplane --pools N --gateway`, "
            f"{r.workers_per_pool} workers per pool on KWOK nodes, {r.machine}, shared with other work: "
            "load averages beside each row; each row is one run; *direct*: the same pods created "
            "without the operator on the same cluster, and the ratio; *writes/min at rest*: the audit "
            "log's writes in the pools' namespace, by anyone, Lease renewals apart):",
            "",
            *rows,
        ]
    )
    replace_block(table, START_MARK, END_MARK)


def crd_established(kubeconfig: Path) -> bool:
    """Whether the ModelPool CRD is Established. Not `kubectl wait --for=condition=Established`, nor a
    jsonpath filter on the conditions: both fail at once on a CRD that has no conditions yet."""
    crd = json.loads(kubectl(kubeconfig, "get", "crd/modelpools.modelpool.dev", "-o", "json"))
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def fresh_namespace(kubeconfig: Path, namespace: str) -> None:
    """``namespace`` made anew: an earlier run's (a reused cluster) may still be going."""
    wait(
        lambda: not kubectl(kubeconfig, "get", "namespaces", "-o", "name").count(f"namespace/{namespace}\n"),
        300,
        f"namespace {namespace} of an earlier run gone",
        interval=2,
    )
    kubectl(kubeconfig, "create", "namespace", namespace)


@dataclass
class DirectRound:
    """What one direct round measured."""

    pods_ready_s: float
    writes: Writes | None
    creation: dict[str, float]
    phases: dict[str, float]
    requests: dict[str, float]
    cpu: dict[str, float]


def direct_round(kubeconfig: Path, pools: int, workers: int, window: float) -> DirectRound:
    """The baseline: the operator's pods created directly (no operator running); create -> all Ready from
    their conditions, then the writes at rest over ``window``; the pods deleted and waited gone."""
    pods = direct_pods(pools, workers)
    requests0 = requests_by_kind(kubectl(kubeconfig, "get", "--raw", "/metrics"))
    cpu0 = cpu_seconds(kubeconfig)
    started = datetime.now(UTC)
    create_all(kubeconfig, pods)
    poll = 2 if len(pods) <= 3000 else 15
    wait(
        lambda: pods_ready(kubeconfig, DIRECT_NAMESPACE, len(pods)), 1800, "direct pods Ready", interval=poll
    )
    cpu = cpu_spent(cpu0, cpu_seconds(kubeconfig))
    requests = counted(requests0, requests_by_kind(kubectl(kubeconfig, "get", "--raw", "/metrics")))
    made = namespace_pods(kubeconfig, DIRECT_NAMESPACE)
    ready = ready_seconds(made, started)
    creation = write_counts(logged(kubeconfig), DIRECT_NAMESPACE, started, datetime.now(UTC))
    phases = phase_seconds(made, started)
    writes = watch_writes(kubeconfig, DIRECT_NAMESPACE, window)
    kubectl(kubeconfig, "delete", "pods", "--all", "-n", DIRECT_NAMESPACE, "--wait=false")
    wait(lambda: pods_gone(kubeconfig, DIRECT_NAMESPACE), 900, "direct pods gone", interval=poll)
    return DirectRound(ready[-1], writes, creation, phases, requests, cpu)


@dataclass
class OperatorRound:
    """What one round through the operator measured (``Result`` takes the first round's)."""

    pods_ready_s: float
    converge_after_pods_ready_s: float
    create_to_converged_s: float
    rss_mib: float
    cpu_percent: float
    requests: tuple[float, float]
    window_s: float
    kinds: dict[str, float]
    writes: Writes | None
    creation: dict[str, float]
    phases: dict[str, float]
    gateway: dict[str, Any] | None
    creation_requests: dict[str, float]
    creation_cpu: dict[str, float]


def start_operator(
    env: dict[str, str], out: IO[bytes], profile: Path | None, nice: int = 0
) -> subprocess.Popen[bytes]:
    """The operator (its console script, all namespaces), or under cProfile writing to ``profile``; at
    the niceness ``nice`` (``--operator-nice``)."""
    program = [str(ROOT / ".venv" / "bin" / "modelpool-operator")]
    if profile is not None:
        program = [str(ROOT / ".venv" / "bin" / "python"), "-m", "cProfile", "-o", str(profile), "-m",
                   "modelpool_operator"]  # fmt: skip
    if nice:
        program = ["nice", "-n", str(nice), *program]
    return subprocess.Popen(
        [*program, "--all-namespaces", "--standalone", "--liveness", "0", "--metrics", "0"],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop_operator(operator: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Kopf stops, cProfile writes its statistics), killed after 30 s."""
    operator.send_signal(signal.SIGTERM)
    try:
        operator.wait(30)
    except subprocess.TimeoutExpired:
        operator.kill()


def operator_round(  # noqa: PLR0917 (the bench's rounds pass their settings in order)
    kubeconfig: Path,
    pools: int,
    workers: int,
    steady_window: float,
    log: Path,
    gateway: bool,
    profile: Path | None = None,
    nice: int = 0,
) -> OperatorRound:
    """The pools through the operator: created at once, Ready, converged, then the steady state (RSS, CPU,
    requests, writes at rest); the pools deleted while the operator runs, their pods waited gone. With
    ``profile``, the operator runs under cProfile until the steady state ends (another deletes the pools)."""
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    # The echo worker of ``--gateway`` runs on the process node: a port nothing else on the machine uses.
    worker_port = free_port()
    env["MODELPOOL_OPERATOR_SERVER_PORT"] = str(worker_port)
    env.update(POLICY_ENV)  # the test nodes and handlers, beyond the default allowlists
    gateways = None
    expected = pools * workers
    # Listing every pod costs the API server (and this machine) more the more there are: at 10,000 pods
    # (50 MB of JSON a list) the pods are counted every 15 s, the pools every 5 s.
    poll = 2 if expected <= 3000 else 5
    pods_poll = 2 if expected <= 3000 else 15
    with log.open("ab") as out:
        operator = start_operator(env, out, profile, nice)
        try:
            operator_ready(kubeconfig, operator)
            requests0 = requests_by_kind(kubectl(kubeconfig, "get", "--raw", "/metrics"))
            creation_cpu0 = cpu_seconds(kubeconfig, operator.pid)
            started = datetime.now(UTC)
            began = time.monotonic()
            # In lists of 100 (kubectl sends one request per object: 1,000 pools took over 300 s here).
            create_all(kubeconfig, pools_manifest(pools, workers))
            wait(
                lambda: pods_ready(kubeconfig, NAMESPACE, expected, operator.pid),
                1800,
                "all worker pods Ready",
                interval=pods_poll,
            )
            pods_ready_at = time.monotonic()
            made = namespace_pods(kubeconfig, NAMESPACE)
            pods_ready_s, phases = ready_seconds(made, started)[-1], phase_seconds(made, started)
            wait(
                lambda: pools_converged(kubeconfig, pools, workers, operator.pid),
                900,
                "every pool converged",
                interval=poll,
            )
            converged_at = time.monotonic()
            creation_cpu = cpu_spent(creation_cpu0, cpu_seconds(kubeconfig, operator.pid))
            metrics = kubectl(kubeconfig, "get", "--raw", "/metrics")
            creation_requests = counted(requests0, requests_by_kind(metrics))
            creation = write_counts(logged(kubeconfig), NAMESPACE, started, datetime.now(UTC))

            time.sleep(20)  # settle: the last status writes and events
            text0 = kubectl(kubeconfig, "get", "--raw", "/metrics")
            cpu0 = sum(psutil.Process(operator.pid).cpu_times()[:2])
            t0 = time.monotonic()
            writes = watch_writes(kubeconfig, NAMESPACE, steady_window)
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
            if profile is not None:  # the profile ends with the steady state; the deletion is another's
                stop_operator(operator)
                operator = start_operator(env, out, None, nice)
            # Delete the pools while the operator runs: it removes its finalizer from each, so the
            # namespace can go afterwards.
            with contextlib.suppress(subprocess.TimeoutExpired):  # the operator is stopped regardless
                subprocess.run(
                    [str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "delete",
                     "modelpools.modelpool.dev", "--all", "-n", NAMESPACE, "--timeout=300s"],
                    capture_output=True, timeout=360, check=False,
                )  # fmt: skip
            stop_operator(operator)
    wait(lambda: pods_gone(kubeconfig, NAMESPACE), 900, "the pools' pods gone", interval=pods_poll)
    return OperatorRound(
        pods_ready_s=pods_ready_s,
        converge_after_pods_ready_s=converged_at - pods_ready_at,
        create_to_converged_s=converged_at - began,
        rss_mib=rss,
        cpu_percent=(cpu1 - cpu0) * 100 / window,
        requests=((total1 - total0) * 60 / window, (own1 - own0) * 60 / window),
        window_s=window,
        kinds=kinds,
        writes=writes,
        creation=creation,
        phases=phases,
        gateway=gateways,
        creation_requests=creation_requests,
        creation_cpu=creation_cpu,
    )


def run(  # noqa: PLR0917 (the bench's one entry point; main passes its arguments in order)
    pools: int,
    workers: int,
    steady_window: float,
    kubeconfig: Path,
    log: Path,
    gateway: bool = False,
    rounds: int = 1,
    profile: Path | None = None,
    nice: int = 0,
) -> Result:
    """``rounds`` of both ways, the first through the operator first, then alternating."""
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    wait(lambda: crd_established(kubeconfig), 60, "ModelPool CRD established")
    kubectl(kubeconfig, "apply", "-f", "-", stdin=extra_nodes(nodes_needed(pools * workers)))
    fresh_namespace(kubeconfig, NAMESPACE)
    fresh_namespace(kubeconfig, DIRECT_NAMESPACE)
    first: OperatorRound | None = None
    through: list[float] = []
    directs: list[DirectRound] = []
    for number in range(rounds):
        order = ("operator", "direct") if number % 2 == 0 else ("direct", "operator")
        for way in order:
            if way == "operator":
                first_round = first is None
                measured = operator_round(
                    kubeconfig,
                    pools,
                    workers,
                    steady_window,
                    log,
                    gateway and first_round,
                    profile if first_round else None,
                    nice,
                )
                first = first or measured
                through.append(measured.pods_ready_s)
            else:
                directs.append(direct_round(kubeconfig, pools, workers, min(steady_window, 30.0)))
            direct = [d.pods_ready_s for d in directs]
            print(f"round {number + 1}: through the operator {through}, direct {direct}", file=sys.stderr)
    assert first is not None
    rest, baseline = first.writes, directs[0] if directs else None
    direct = [d.pods_ready_s for d in directs]
    return Result(
        pools=pools,
        workers_per_pool=workers,
        create_to_pods_ready_s=first.pods_ready_s,
        converge_after_pods_ready_s=first.converge_after_pods_ready_s,
        create_to_converged_s=first.create_to_converged_s,
        operator_rss_mib=first.rss_mib,
        api_requests_per_min=first.requests[0],
        operator_resource_requests_per_min=first.requests[1],
        window_s=first.window_s,
        operator_cpu_percent=first.cpu_percent,
        requests_per_min_by_kind=first.kinds,
        load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        gateway=first.gateway,
        machine=f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        operator_pods_ready_s=through,
        direct_pods_ready_s=direct,
        ready_ratio=ratio(through, direct),
        writes_per_min=rest.per_min if rest else None,
        direct_writes_per_min=baseline.writes.per_min if baseline and baseline.writes else None,
        writes_per_min_by_kind=rest.by_kind if rest else {},
        creation_writes_by_kind=first.creation,
        direct_creation_writes_by_kind=baseline.creation if baseline else {},
        operator_phases=first.phases,
        direct_phases=baseline.phases if baseline else {},
        creation_requests_by_kind=first.creation_requests,
        direct_creation_requests_by_kind=baseline.requests if baseline else {},
        creation_cpu_s=first.creation_cpu,
        direct_creation_cpu_s=baseline.cpu if baseline else {},
        operator_nice=nice,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--window", type=float, default=60.0, help="steady-state window (s)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds of both ways (through the operator, direct), alternating",
    )
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    parser.add_argument(
        "--gateway", action="store_true", help="also measure gateways watching 10 pools and every pool"
    )
    parser.add_argument(
        "--operator-nice",
        type=int,
        default=0,
        help="run the operator at this niceness: on a shared machine the cluster's processes (on a real "
        "cluster, other machines) then go first, and what is left is the operator's effect on the API",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="run the first round's operator under cProfile until its steady state ends, writing here",
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
            rounds=args.rounds,
            profile=args.profile.resolve() if args.profile else None,
            nice=args.operator_nice,
        )
        if cluster.reused:  # someone else's cluster: leave it without the benchmark's namespaces
            kubectl(cluster.kubeconfig, "delete", "namespace", NAMESPACE, DIRECT_NAMESPACE, "--wait=false")

    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    (out / "controlplane.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    (out / f"controlplane-{result.pools}.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    if not args.no_docs:
        write_docs(result, out)
    print(json.dumps(asdict(result), indent=2))
    if result.ready_ratio is not None:
        print(
            f"create -> all pods Ready: through the operator / direct = {result.ready_ratio:.2f}x (<= 1.25)"
        )
    ok = result.converge_after_pods_ready_s <= 120 and result.operator_rss_mib <= 500
    print("targets met" if ok else "targets MISSED (converge <= 120 s, RSS <= 500 MiB)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
