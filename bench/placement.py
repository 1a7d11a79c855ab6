"""Placement audit at scale (issue 21's KWOK check): ``python -m bench.placement``.

100 shared pools (declared 2-8 GiB, priorities 0-3, a tenth of them with two replicas) created at once on
a ModelHost of 8 KWOK host pods (``gpusPerHost`` 1, ``deviceMemory`` 24 GiB: a handful of models awake
each; ``hostMemory`` 96 GiB for the sleeping ones), each host pod answered on its pod IP by a simulated
shared host (``testkit.hostsim``: the real control handler and host decisions, loads of ``--load-s``),
the real operator and API server; then churn (pools deleted and created, replicas and priorities
changed, traffic on some models). The auditor checks every transition on every host: no device or host
RAM over its capacity, no load refused for room, no Loading/Waking model slept or unloaded, no pool
loaded on more host pods than its replicas (a thrash); every eviction is checked against the priority rule
(a sleep, of any priority, takes the lowest priority then the least recently used idle model; an unload
only a lower priority than the newcomer's), and every pool left short against the room that rule could
have made (sleeping idle models of any priority).

Reports the violations (must be 0), the time until the placements settle (create, then churn), the
control calls and evictions, the operator's RSS and the load average; into ``.bench/placement.json``
and docs/benchmarks.md between ``<!-- bench:placement:start -->`` and ``<!-- bench:placement:end -->``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.report import replace_block
from testkit.cluster import guarded_cluster
from testkit.environment import ROOT, free_port
from testkit.hostsim import Audit, HostSim
from testkit.kubectl import kubectl
from testkit.services import POLICY_ENV, shared_pool_manifest

START_MARK = "<!-- bench:placement:start -->"
END_MARK = "<!-- bench:placement:end -->"
GI = 1 << 30
KWOK = {
    "nodeSelector": {"type": "kwok"},
    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
}
GROUP = "modelpool.dev/v1alpha1"


@dataclass
class Result:
    pools: int
    hosts: int
    device_gib: int
    host_gib: int
    load_s: float
    create_to_settled_s: float
    churn_to_settled_s: float
    violations: int
    violation_samples: list[str]
    transitions: int
    calls: dict[str, int]
    evictions: int
    wrong_evictions: list[str]
    host_made_room: int
    short_pools: int
    wrongly_short: list[str]
    operator_rss_mib: float
    load_average: str
    machine: str
    churn: dict[str, int] = field(default_factory=dict)


def pool(name: str, gib: int, priority: int, replicas: int) -> dict[str, Any]:
    return shared_pool_manifest(name, host="gpus", gib=gib, priority=priority, replicas=replicas)


def create(kubeconfig: Path, namespace: str, items: list[dict[str, Any]]) -> None:
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=listed)


def established(kubeconfig: Path, crd: str) -> bool:
    conditions = json.loads(kubectl(kubeconfig, "get", crd, "-o", "json")).get("status", {}).get("conditions")
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions or [])


def settle(sim: HostSim, wanted: dict[str, tuple[int, int, int]], timeout: float) -> float:
    """Seconds from now until the hosts settle (``HostSim.converged``: no control call for 5 s, ...). The
    quiet window must start after this call: a churn that the operator has not acted on yet would otherwise
    count as settled at once (the quiet before it was the previous phase's)."""
    started = time.monotonic()
    while time.monotonic() - started < 5.0 or not sim.converged(wanted, quiet_s=5.0):
        if time.monotonic() - started > timeout:
            raise TimeoutError(
                f"not settled in {timeout:g} s: {sim.short(wanted)} {sim.wrongly_short(wanted)}"
            )
        time.sleep(1)
    return time.monotonic() - started - 5.0  # the quiet period is not part of it


def run(args: argparse.Namespace, kubeconfig: Path, log: Path) -> Result:
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    for crd in ("modelpools", "modelhosts", "modelbudgets"):
        deadline = time.monotonic() + 60  # not `kubectl wait`: it fails at once on a CRD with no conditions
        while not established(kubeconfig, f"crd/{crd}.modelpool.dev"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{crd} CRD not established")
            time.sleep(0.5)
    namespace, budget = f"placement-{uuid.uuid4().hex[:6]}", f"placement-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, "create", "namespace", namespace)
    budget_doc = {
        "apiVersion": GROUP,
        "kind": "ModelBudget",
        "metadata": {"name": budget},
        "spec": {"memory": "1Ti"},
    }
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(budget_doc))
    rng = random.Random(21)
    wanted = {
        f"m{i:03d}": (2 if i % 10 == 0 else 1, (2 + 2 * (i * 7 % 4)) * GI, i * 3 % 4)
        for i in range(args.pools)
    }
    priority = {name: p for name, (_, _, p) in wanted.items()}
    audit = Audit(lambda m: priority.get(m, 0), lambda m: wanted[m][0] if m in wanted else 0)
    port = free_port()
    env = dict(
        os.environ,
        KUBECONFIG=str(kubeconfig),
        MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(port),
        MODELPOOL_OPERATOR_BUDGET_NAME=budget,
        **POLICY_ENV,  # the KWOK nodes, beyond the default allowlists
    )
    sim = HostSim(kubeconfig, namespace, port, audit=audit, load_s=args.load_s)
    with log.open("wb") as out:
        operator = subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "modelpool-operator"), "--namespace", namespace, "--standalone",
             "--liveness", "0", "--metrics", "0"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            sim.start()
            host = {"replicas": args.hosts, "gpusPerHost": 1, "deviceMemory": f"{args.device_gib}Gi",
                    "hostMemory": f"{args.host_gib}Gi", **KWOK}  # fmt: skip
            create(
                kubeconfig,
                namespace,
                [{"apiVersion": GROUP, "kind": "ModelHost", "metadata": {"name": "gpus"}, "spec": host}],
            )
            while len(sim.hosts) < args.hosts:
                time.sleep(0.5)
            create(kubeconfig, namespace, [pool(n, g // GI, p, r) for n, (r, g, p) in wanted.items()])
            created = settle(sim, wanted, args.timeout)
            # Churn: traffic on a fifth of the models, a tenth deleted, as many new, replicas and
            # priorities changed.
            names = sorted(wanted)
            for name in rng.sample(names, len(names) // 5):
                sim.touch(name)
            gone = rng.sample(names, len(names) // 10)
            for name in gone:
                del wanted[name]
            kubectl(kubeconfig, "delete", "modelpools", *gone, "-n", namespace, "--wait=false")
            new = {f"n{i:03d}": (1, (2 + 2 * (i % 4)) * GI, 3 - i % 4) for i in range(len(gone))}
            rest = sorted(wanted)
            scaled = {name: (2, *wanted[name][1:]) for name in rng.sample(rest, 5)}
            raised = {name: (*wanted[name][:2], 3) for name in rng.sample(sorted(set(rest) - set(scaled)), 5)}
            for changes in (new, scaled, raised):
                wanted.update(changes)
                priority.update({name: p for name, (_, _, p) in changes.items()})
            create(
                kubeconfig,
                namespace,
                [pool(n, g // GI, p, r) for n, (r, g, p) in {**new, **scaled, **raised}.items()],
            )
            churned = settle(sim, wanted, args.timeout)
            short, wrongly_short = sim.short(wanted), sim.wrongly_short(wanted)
            rss = psutil.Process(operator.pid).memory_info().rss / 2**20
        finally:
            sim.stop()
            kubectl(kubeconfig, "delete", "modelpools,modelhosts", "--all", "-n", namespace, "--wait=false")
            operator.send_signal(signal.SIGTERM)
            try:
                operator.wait(30)
            except subprocess.TimeoutExpired:
                operator.kill()
    kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false")
    kubectl(kubeconfig, "delete", "modelbudget", budget, "--wait=false")
    return Result(
        pools=args.pools,
        hosts=args.hosts,
        device_gib=args.device_gib,
        host_gib=args.host_gib,
        load_s=args.load_s,
        create_to_settled_s=created,
        churn_to_settled_s=churned,
        violations=len(audit.violations),
        violation_samples=audit.violations[:5],
        transitions=audit.transitions,
        calls=dict(audit.calls),
        evictions=len(audit.evictions),
        wrong_evictions=audit.wrong_evictions()[:5],
        host_made_room=audit.host_made_room,
        short_pools=len(short),
        wrongly_short=wrongly_short[:5],
        operator_rss_mib=rss,
        load_average=" ".join(f"{x:.2f}" for x in os.getloadavg()),
        machine=f"{psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        churn={
            "deleted": len(gone),
            "created": len(new),
            "replicas_changed": len(scaled),
            "priority_raised": len(raised),
        },
    )


def table(r: Result) -> str:
    calls = ", ".join(f"{k} {v}" for k, v in sorted(r.calls.items()))
    return "\n".join([
        f"Placement audit (`python -m bench.placement`: {r.pools} shared pools, declared 2-8 GiB, priorities "
        f"0-3, over {r.hosts} KWOK host pods of {r.device_gib} GiB device / {r.host_gib} GiB host RAM, "
        f"simulated hosts loading in {r.load_s:g} s; then churn: {r.churn}; {r.machine}, load average "
        f"{r.load_average}):",
        "",
        "| violations (0) | wrong evictions (0) | pools short that had room (0) | pools short "
        "| create -> settled | churn -> settled | transitions audited | control calls | evictions "
        "| operator RSS |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| {r.violations} | {len(r.wrong_evictions)} | {len(r.wrongly_short)} | {r.short_pools} "
        f"| {r.create_to_settled_s:.1f} s | {r.churn_to_settled_s:.1f} s | {r.transitions} | {calls} "
        f"| {r.evictions} | {r.operator_rss_mib:.0f} MiB |",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pools", type=int, default=100)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--device-gib", type=int, default=24)
    parser.add_argument("--host-gib", type=int, default=96)
    parser.add_argument("--load-s", type=float, default=1.0, help="a simulated load's duration")
    parser.add_argument("--timeout", type=float, default=600.0, help="the wait for the placements to settle")
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    args = parser.parse_args(argv)
    with guarded_cluster("placement", "operator log and cluster logs") as cluster:
        result = run(args, cluster.kubeconfig, cluster.workdir / "operator.log")
    out = ROOT / ".bench"
    out.mkdir(exist_ok=True)
    (out / "placement.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
    if not args.no_docs:
        replace_block(table(result), START_MARK, END_MARK)
    print(json.dumps(asdict(result), indent=2))
    ok = result.violations == 0 and not result.wrong_evictions and not result.wrongly_short
    print("audit clean" if ok else "audit FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
