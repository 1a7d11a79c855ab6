"""``python -m bench.soak [--minutes 30] [--seed 1]``: one soak run on a control plane of its own.

The run: start the cluster (KWOK node leases of 20 s), start the auditor's watches, install the pools and
start the operator and the gateway, wait until every pool has converged, start the clients and the RSS
sampler, apply the seeded faults (``schedule``) one after the other at their offsets, then wait (at most
``CONVERGE_S``) until every pool has converged again with no orphan pod and no pool stuck deleting, stop
the clients (every request in flight ends within its deadline) and judge.  The table is printed and, with
``--docs``, written into docs/benchmarks.md; the exit status is 1 when any invariant was violated.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.soak import schedule as sched
from bench.soak.auditor import Auditor, converged, lost_events, rss_grew
from bench.soak.clients import Clients
from bench.soak.faults import FaultLog, apply_fault
from bench.soak.report import SoakResult, table, write_docs
from bench.soak.rig import KWOK_NODE_LEASE_SECONDS, Plan, Rig
from bench.soak.rss import RssSampler
from testkit.cluster import Cluster, start_cluster, stop_cluster
from testkit.kubectl import WaitTimeoutError, is_ready, wait_for

CONVERGE_S = 120.0
SETTLE_S = 300.0  # the first convergence: MiniLM workers load on a busy machine
DEFAULT_PLAN = Plan(minilm_pools=2, kwok_pools=3, workers=2)
SHORT_PLAN = Plan(minilm_pools=1, kwok_pools=1, workers=2)


def required_faults(minutes: float) -> dict[str, int]:
    """At least two control-plane restarts in a run of 4 minutes or more (one in a shorter one), and
    every kind of fault the soak knows at least once (the short run: the five kinds the test names)."""
    restarts = 2 if minutes >= 4 else 1
    return {
        sched.CONTROL_PLANE_RESTART: restarts,
        sched.WORKER_KILL: 1,
        sched.OPERATOR_KILL: 1,
        sched.GATEWAY_KILL: 1,
        sched.KWOK_OOM: 1,
        **({sched.KWOK_CRASH: 1, sched.KWOK_LOAD_FAILED: 1, sched.POOL_EDIT: 1} if minutes >= 3 else {}),
        **({sched.POOL_CREATE: 1, sched.BUDGET_SHRINK: 1} if minutes >= 3 else {}),
    }


def run(
    minutes: float,
    seed: int,
    *,
    plan: Plan,
    spacing: float,
    command: str,
    faults: list[sched.Fault] | None = None,
) -> SoakResult:
    """One soak on a cluster of its own (stopped afterwards; its logs kept and named when it failed)."""
    faults = (
        faults
        if faults is not None
        else sched.schedule(seed, minutes * 60, spacing, required_faults(minutes))
    )
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-soak-"))
    name = f"mp-soak-{uuid.uuid4().hex[:6]}"
    result: SoakResult | None = None
    try:
        cluster = _start_cluster(workdir, name)
        rig = Rig(cluster, workdir, plan)
        result = _soak(rig, faults, minutes, command)
        return result
    finally:
        stop_cluster(workdir, name)
        if result is not None and result.ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            sys.stderr.write(
                f"soak: logs (operator, gateway, control plane, process node) kept in {workdir}\n"
            )


def _start_cluster(workdir: Path, name: str) -> Cluster:
    """``start_cluster`` with short KWOK node leases (read at creation; the variable is put back after,
    so clusters other code creates in this process are not changed)."""
    before = os.environ.get("KWOK_NODE_LEASE_SECONDS")
    os.environ["KWOK_NODE_LEASE_SECONDS"] = KWOK_NODE_LEASE_SECONDS
    try:
        return start_cluster(workdir, name)
    finally:
        if before is None:
            del os.environ["KWOK_NODE_LEASE_SECONDS"]
        else:
            os.environ["KWOK_NODE_LEASE_SECONDS"] = before


def _soak(rig: Rig, faults: list[sched.Fault], minutes: float, command: str) -> SoakResult:
    log = FaultLog()
    budget_history: list[tuple[float, int]] = [(time.monotonic(), rig.plan.budget_gib * 2**30)]
    auditor = Auditor(log, budget_history)
    rig.install_crds()
    auditor.watch(rig.cluster.kubeconfig)
    rig.install()
    try:
        # Converged, and every worker pod Ready as its own condition says: the pools' status can show a
        # worker serving a probe period before its pod turns Ready, and the faults pick Ready pods (a first
        # worker-kill at 0.1 s once found none and was counted as a fault with nothing to act on).
        wait_for(lambda: not converged(rig.pools(), pods := rig.worker_pods()) and all(map(is_ready, pods)),
                 timeout=SETTLE_S, interval=1, message="the pools converged before the faults")  # fmt: skip
        # Traffic goes to the pools with a server behind them; KWOK pools have none (their workers are
        # simulated), they exercise the control plane.
        pools = sorted(
            p["metadata"]["name"] for p in rig.pools() if p["metadata"]["name"].startswith("minilm-")
        )
        clients = Clients(rig.gateway_url, lambda: pools, rig.headers, auditor.judge_request).start()
        rss = RssSampler(rig.pids).start()
        began = time.monotonic()
        for fault in faults:
            wait = began + fault.at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            window = apply_fault(rig, log, fault, budget_history)
            if window.error:
                auditor.violate(
                    "fault", f"{fault.kind} could not be applied or undone: {window.error}", fault.kind
                )
            print(
                f"soak {time.monotonic() - began:6.1f}s {fault.kind}: "
                f"{window.error or window.target or 'skipped'}",
                flush=True,
            )
        faulted = time.monotonic() - began
        converge_s = _converge(rig, auditor)
        for sent in clients.stop():
            auditor.violate("request", f"{sent.client} -> {sent.pool}: still in flight at the end", "the end")
        rss.stop()
        _judge_rss(auditor, rss)
        _judge_events(auditor, rig.workdir / "operator.log")
    finally:
        rig.stop()
        print(auditor.stop())
    return SoakResult(
        command=command,
        seconds=faulted,
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        faults=log.counts(),
        requests=dict(auditor.requests),
        violations=auditor.violations,
        converge_s=converge_s,
        rss=rss.summary(),
        events=dict(auditor.events),
        noted=dict(auditor.noted),
    )


def _converge(rig: Rig, auditor: Auditor) -> float | None:
    """Seconds until every pool converged (a violation, naming what was left, after ``CONVERGE_S``)."""
    start = time.monotonic()
    last: list[str] = []

    def done() -> bool:
        nonlocal last
        last = converged(rig.pools(), rig.worker_pods())
        return not last

    try:
        wait_for(done, timeout=CONVERGE_S, interval=1, message="converged")
    except WaitTimeoutError:
        auditor.violate(
            "converge", f"not converged {CONVERGE_S:.0f}s after the last fault: {last}", "the end"
        )
        return None
    return time.monotonic() - start


def _judge_rss(auditor: Auditor, rss: RssSampler) -> None:
    for role, (first, last, *_) in rss.summary().items():
        if rss_grew(first, last):
            auditor.violate("rss", f"{role} RSS {first / 2**20:.0f} -> {last / 2**20:.0f} MiB", "the end")


def _judge_events(auditor: Auditor, log: Path) -> None:
    """Nothing lost: an Event the API server refused (Kopf logs it and drops it) is a violation."""
    lost = lost_events(log.read_text(errors="replace")) if log.exists() else []
    if lost:
        auditor.violate(
            "event", f"{len(lost)} Event(s) refused by the API server, the first: {lost[0][:300]}", "log"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--minutes", type=float, default=30.0, help="how long faults are applied (default 30)"
    )
    parser.add_argument("--seed", type=int, default=1, help="the fault schedule's seed (default 1)")
    parser.add_argument("--spacing", type=float, default=8.0, help="seconds between faults (default 8)")
    parser.add_argument(
        "--docs",
        "--readme",
        action="store_true",
        help="write the table into the soak section of docs/benchmarks.md",
    )
    args = parser.parse_args(argv)
    command = f"python -m bench.soak --minutes {args.minutes:g} --seed {args.seed}"
    result = run(args.minutes, args.seed, plan=DEFAULT_PLAN, spacing=args.spacing, command=command)
    text = table(result)
    print(text)
    if args.docs:
        write_docs(result)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
