"""``python -m bench.upgrade [--docs]``: the previous release upgraded to this tree under traffic, then its
leader killed under load, audited (issue 31 item 6); exit status 1 on any violation.

On a control plane of its own (``testkit.cluster.start_cluster``: the real kube-apiserver, etcd, scheduler,
controller-manager from bin/, the process node, the audit log of hack/audit-policy.yaml):

1. **Upgrade.** ``helm install`` of the 0.2.0 chart with its operator and gateway code
   (``bench.upgrade.release``), two echo pools of real ``modelpool-server`` workers in a namespace of their
   own, an API key, the ModelBudget (the 0.2.0 chart's hook). Clients (``bench.soak.clients``: polite ones
   honouring ``Retry-After``, a rude one hanging up) send through the gateway pods that are Ready (what a
   Service would route to) the whole time; the soak's auditor (``bench.soak.auditor``: the budget never
   exceeded when a pod appears, no worker evicted while Loading or Processing) and ``UpgradeAuditor``
   (the budget never deleted) watch. The docs' upgrade steps (the keys namespace and key copied first),
   then ``helm upgrade`` to this tree's chart and code; then every worker must run the new release's
   server (made by the new operator, the new default server image) within ``ROLL_S``.
2. **Leader kill.** The chart's operator scaled to 0 and two replicas of this tree's operator started with
   leader election on the chart's Lease, both as the chart's operator ServiceAccount (its RBAC and
   admission policies), each with a token of its own, so the audit log tells which replica wrote what
   (``judge.caller``). Under the same clients, a pool scaled up and down every few seconds, the leader is
   SIGKILLed; measured: the standby's take-over (its first Lease write) and its first act (its first
   other write), from the audit log; violations: any write by a replica outside the time it held the
   Lease, a refused request, a take-over slower than ``leaseDuration + retryPeriod`` plus the polls' slack.
3. **Drain.** A second process node, a pool whose two workers both run there, ``kubectl drain`` of it
   under the same clients (``bench.upgrade.drain``): every moment the pool has no Ready worker is a
   violation.

Requests: sent = answered + retryable (429/503 with Retry-After) + hung up + not connected + lost; any
lost request is a violation (``bench.upgrade.judge``).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import platform
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.soak.auditor import Auditor, converged
from bench.soak.clients import Clients, Sent
from bench.soak.faults import FaultLog
from bench.upgrade import drain as dr
from bench.upgrade import judge
from bench.upgrade import release as rel
from bench.upgrade.report import UpgradeResult, table, write_docs
from modelpool_contract.flags import DEFAULT_SERVER_IMAGE
from modelpool_contract.labels import LABEL_POOL
from modelpool_operator.leader import DEFAULT_LEASE_DURATION_S, DEFAULT_RETRY_PERIOD_S
from testkit.auditlog import audit_events, service_account_token
from testkit.auditlog import token_kubeconfig as account_kubeconfig
from testkit.cluster import Cluster, start_cluster, stop_cluster
from testkit.environment import ROOT, free_port
from testkit.kubectl import apply, get_json, wait_for
from testkit.services import POOLS, OperatorProcess, bearer, create_key, echo_pool

GI = 2**30
POOL_NAMES = ("echo-a", "echo-b")
WORKERS = 2
BUDGET_GIB = 10
SETTLE_S = 240.0
ROLL_S = 120.0
LOAD_S = 15.0
# The chart's leader election defaults: a killed leader's Lease is taken after its duration.
LEASE_S, RETRY_S = DEFAULT_LEASE_DURATION_S, DEFAULT_RETRY_PERIOD_S
#: Issue 31's bound: the standby takes over within 15 s of the leader's death.
TAKEOVER_BOUND_S = 15.0
#: The chart's operator: its ServiceAccount and its leader election Lease (the chart's Role allows no other).
OPERATOR_SA = f"{rel.RELEASE}-modelpool-operator"
LEASE = OPERATOR_SA
DRAINED = "echo-drained"
DRAIN_TIMEOUT_S = 180


class UpgradeAuditor(Auditor):
    """The soak's auditor on the check's pool namespace only, and the budget's absence a violation."""

    def pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        if pod["metadata"].get("namespace") == rel.POOLS_NAMESPACE:
            super().pod_event(kind, pod)

    def objects_listed(self, plural: str, objects: list[dict[str, Any]]) -> None:
        if plural == "modelbudgets" and not any(o["metadata"]["name"] == rel.BUDGET for o in objects):
            self.violate("budget absent", f"ModelBudget {rel.BUDGET} not in a list", "list")
        super().objects_listed(plural, objects)

    def object_event(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        if plural == "modelbudgets" and meta.get("name") == rel.BUDGET:
            if kind == "DELETED" or meta.get("deletionTimestamp"):
                self.violate("budget absent", f"ModelBudget {rel.BUDGET} {kind.lower()}", kind)
        elif plural == "modelpools" and meta.get("namespace") != rel.POOLS_NAMESPACE:
            return
        super().object_event(plural, kind, obj)


@dataclass
class Endpoints:
    """The gateway Service's endpoints as a client would reach them: refreshed every ``interval`` s."""

    pods: dr.PodLister
    port: int
    interval: float = 0.3
    urls: list[str] = field(default_factory=list)
    _turn: itertools.count[int] = field(default_factory=itertools.count)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Endpoints:
        self.urls = rel.gateway_endpoints(self.pods(), self.port)
        self._thread = threading.Thread(target=self._run, daemon=True, name="endpoints")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.urls = rel.gateway_endpoints(self.pods(), self.port)
            except Exception:  # an API server hiccup: keep the last list, as kube-proxy does
                continue

    def target(self) -> str | None:
        urls = self.urls
        return urls[next(self._turn) % len(urls)] if urls else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)


@dataclass
class Tally:
    """Every ended request's outcome; lost ones are violations of the auditor."""

    auditor: Auditor
    counts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, sent: Sent) -> None:
        what, why = judge.outcome(sent)
        with self.lock:
            self.counts[what] += 1
        if what == judge.LOST:
            self.auditor.violate("request lost", f"{sent.client} -> {sent.pool}: {why}", "request")

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.counts)


@dataclass
class Run:
    cluster: Cluster
    workdir: Path
    ports: rel.Ports
    auditor: UpgradeAuditor
    key: str = ""
    notes: list[str] = field(default_factory=list)

    def pools(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get_json(self.cluster, POOLS, "-n", rel.POOLS_NAMESPACE)["items"]
        return items

    def workers(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get_json(
            self.cluster, "pods", "-n", rel.POOLS_NAMESPACE, "-l", LABEL_POOL
        )["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def converged(self) -> list[str]:
        return converged(self.pools(), self.workers())


def _ports() -> rel.Ports:
    return rel.Ports(*(free_port() for _ in range(6)))


def install_previous(run: Run, old_tree: Path) -> float:
    c = run.cluster
    for ns in (rel.SYSTEM_NAMESPACE, rel.POOLS_NAMESPACE):
        c.kubectl("create", "namespace", ns)
    chart_values = rel.values(ports=run.ports, budget_memory=f"{BUDGET_GIB}Gi", old_tree=old_tree)
    took = rel.helm(c, "install", old_tree, chart_values, run.workdir)
    # 0.2.0's gateway reads its admin keys in the release namespace.
    run.key = create_key(c, rel.SYSTEM_NAMESPACE, "upgrade-clients", namespaces="*")
    for name in POOL_NAMES:
        pool = echo_pool(name, replicas=WORKERS, activation_timeout_seconds=10)
        apply(c, pool, rel.POOLS_NAMESPACE)
    wait_for(lambda: not run.converged(), timeout=SETTLE_S, interval=1, message="the pools converged (0.2.0)")
    return took


def prepare_upgrade(run: Run) -> None:
    """What docs/install.md "Upgrading" says to do before this upgrade: the keys namespace and the key
    Secrets copied there (the new gateway reads no key of the release namespace); the budget exists (the
    0.2.0 hook made it: kept, as the docs promise)."""
    c = run.cluster
    c.kubectl("create", "namespace", rel.KEYS_NAMESPACE)
    create_key(c, rel.KEYS_NAMESPACE, "upgrade-clients", key=run.key, namespaces="*")
    get_json(c, "modelbudget", rel.BUDGET)  # raises when absent


def upgrade(run: Run) -> tuple[float, datetime]:
    at = datetime.now(UTC)
    took = rel.helm(
        run.cluster, "upgrade", ROOT,
        rel.values(ports=run.ports, budget_memory=f"{BUDGET_GIB}Gi", old_tree=None), run.workdir,
    )  # fmt: skip
    return took, at


def wait_rolled(run: Run, upgraded_at: datetime) -> tuple[float | None, list[str]]:
    """Seconds until the pools converged with every worker on the new release (None: not within
    ``ROLL_S``) and what was left then."""
    start = time.monotonic()
    left: list[str] = []

    def done() -> bool:
        nonlocal left
        workers = [judge.worker_check(p) for p in run.workers()]
        left = run.converged() + judge.not_upgraded(workers, upgraded_at, DEFAULT_SERVER_IMAGE)
        return not left

    try:
        wait_for(done, timeout=ROLL_S, interval=1, message="every worker on the new release")
    except Exception:
        return None, left
    return time.monotonic() - start, []


# ---- the leader kill -----------------------------------------------------------------------------------
@dataclass
class Replica:
    name: str  # its identity (POD_NAME), the Lease's holderIdentity
    process: OperatorProcess
    caller: str  # its ServiceAccount and token in the audit log (``judge.caller``)


def token_kubeconfig(cluster: Cluster, account: str, path: Path) -> tuple[Path, str]:
    """A kubeconfig that authenticates as ServiceAccount ``modelpool-audit/account`` (audited) with a token
    of its own, and that token's ``judge.caller`` in the audit log."""
    token = service_account_token(cluster, rel.SYSTEM_NAMESPACE, account)
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    path = account_kubeconfig(cluster, rel.SYSTEM_NAMESPACE, account, path, token)
    return path, f"system:serviceaccount:{rel.SYSTEM_NAMESPACE}:{account}#JTI={claims['jti']}"


def start_replica(run: Run, name: str) -> Replica:
    """A replica of this tree's operator as the chart's operator would run it: its ServiceAccount (the
    chart's RBAC and admission policies apply), its leader election Lease, a token of its own."""
    c = run.cluster
    kubeconfig, caller = token_kubeconfig(c, OPERATOR_SA, run.workdir / f"{name}.kubeconfig")
    env = {
        "POD_NAME": name,
        "MODELPOOL_OPERATOR_LEADER_ELECTION": "true",
        "MODELPOOL_OPERATOR_LEADER_ELECTION_LEASE_NAME": LEASE,
        "MODELPOOL_OPERATOR_LEADER_ELECTION_NAMESPACE": rel.SYSTEM_NAMESPACE,
        "MODELPOOL_OPERATOR_BUDGET_NAME": rel.BUDGET,
        "MODELPOOL_OPERATOR_MISSING_BUDGET": "refuse",
        "MODELPOOL_OPERATOR_SERVER_PORT": str(run.ports.server),
        "MODELPOOL_OPERATOR_SERVER_PROBE_PORT": str(run.ports.server_probe),
    }
    process = OperatorProcess(
        c, [rel.POOLS_NAMESPACE], run.workdir / f"{name}.log", kubeconfig=kubeconfig, **env
    )
    wait_for(
        lambda: not process.alive() or "is a candidate for lease" in process.log_tail(10**7),
        timeout=120,
        interval=0.3,
        message=f"{name} started as a candidate",
    )
    if not process.alive():
        raise RuntimeError(f"{name} exited at start:\n{process.log_tail()}")
    return Replica(name, process, caller)


def holder(cluster: Cluster) -> str:
    found = cluster.kubectl(
        "get",
        "lease",
        LEASE,
        "-n",
        rel.SYSTEM_NAMESPACE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
        check=False,
    )
    return found.stdout.strip() if found.returncode == 0 else ""


@dataclass
class Scaler:
    """Scales one pool between ``WORKERS`` and ``WORKERS + 1`` every ``every`` seconds."""

    cluster: Cluster
    pool: str
    every: float = 5.0
    edits: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Scaler:
        self._thread = threading.Thread(target=self._run, daemon=True, name="scaler")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            replicas = WORKERS + (1 - self.edits % 2)
            patch = json.dumps({"spec": {"replicas": replicas}})
            done = self.cluster.kubectl(
                "patch", POOLS, self.pool, "-n", rel.POOLS_NAMESPACE, "--type=merge", "-p", patch, check=False
            )
            self.edits += done.returncode == 0

    def stop(self) -> None:
        """Stop, and leave the pool at ``WORKERS``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        patch = json.dumps({"spec": {"replicas": WORKERS}})
        self.cluster.kubectl(
            "patch", POOLS, self.pool, "-n", rel.POOLS_NAMESPACE, "--type=merge", "-p", patch
        )


def leader_kill(run: Run, result: UpgradeResult) -> list[Replica]:
    c = run.cluster
    c.kubectl("scale", "deployment", OPERATOR_SA, "-n", rel.SYSTEM_NAMESPACE, "--replicas=0")
    selector = "app.kubernetes.io/component=operator"
    wait_for(
        lambda: not get_json(c, "pods", "-n", rel.SYSTEM_NAMESPACE, "-l", selector)["items"],
        timeout=60,
        message="the chart's operator stopped",
    )
    began = datetime.now(UTC)
    tag = uuid.uuid4().hex[:4]
    replicas = [start_replica(run, f"op-{tag}-a")]
    wait_for(lambda: holder(c) == replicas[0].name, timeout=60, interval=0.3, message="a leader")
    replicas.append(start_replica(run, f"op-{tag}-b"))
    leader, standby = replicas
    wait_for(
        lambda: f"{leader.name} is the leader; {standby.name} stands by" in standby.process.log_tail(10**7),
        timeout=60,
        message="the second replica stands by",
    )
    scaler = Scaler(c, POOL_NAMES[0]).start()
    time.sleep(LOAD_S)  # load and scaling under the first leader: the run's timeline, not a wait on a state
    killed = datetime.now(UTC)
    leader.process.proc.send_signal(signal.SIGKILL)
    leader.process.proc.wait(10)
    try:
        wait_for(lambda: holder(c) == standby.name, timeout=LEASE_S + RETRY_S + 30, interval=0.2,
                 message="the standby took the Lease")  # fmt: skip
    except Exception as err:
        run.auditor.violate("takeover", str(err), "leader kill")
    time.sleep(LOAD_S)  # load and scaling under the new leader
    scaler.stop()
    try:
        wait_for(lambda: not run.converged(), timeout=ROLL_S, interval=1, message="converged after the kill")
    except Exception as err:
        run.auditor.violate("converge", f"{err}: {run.converged()}", "after the leader kill")
    time.sleep(2)  # the audit log's batch is written
    events = audit_events(c)
    # The new leader still holds the Lease when the log is read: every write of its in the log is its own.
    if holder(c) != standby.name:
        run.auditor.violate("takeover", f"the Lease is {holder(c)!r}'s at the end", "leader kill")
    ended = datetime.now(UTC)
    leader_from = judge.acquired_at(events, leader.caller, LEASE, began)
    standby_from = judge.acquired_at(events, standby.caller, LEASE, killed)
    act = judge.first_act(events, standby.caller, LEASE, killed)
    result.scale_edits = scaler.edits
    result.takeover_s = None if standby_from is None else (standby_from - killed).total_seconds()
    result.first_act_s = None if act is None else (act - killed).total_seconds()
    held = {
        leader.caller: [(leader_from, killed)] if leader_from else [],
        standby.caller: [(standby_from, ended)] if standby_from else [],
    }
    for replica in (leader, standby):
        user = replica.caller
        result.writes[replica.name] = sum(
            1 for e in events if judge.caller(e) == user and e.get("verb") in judge.WRITES
        )
        outside = judge.writes_while_not_leader(events, user, LEASE, held[user])
        refused = judge.refused(events, user)
        result.writes_not_leader += len(outside)
        result.refused += len(refused)
        for write in outside:
            run.auditor.violate("write while not leader", f"{replica.name}: {write}", "audit log")
        for request in refused:
            run.auditor.violate("refused (403)", f"{replica.name}: {request}", "audit log")
    if result.takeover_s is not None and result.takeover_s > TAKEOVER_BOUND_S:
        run.auditor.violate("takeover", f"took {result.takeover_s:.1f} s", "leader kill")
    if act is None:
        run.auditor.violate("takeover", "the new leader never acted (no write after the kill)", "leader kill")
    return replicas


# ---- the drain -----------------------------------------------------------------------------------------
def drain_phase(run: Run, result: UpgradeResult, pool_names: list[str], tally: Tally) -> None:
    """A pool whose workers all run on a second process node, and that node drained under traffic."""
    c = run.cluster
    node = dr.process_node(c, run.workdir)
    node.start()
    pods = dr.PodLister(c.kubeconfig, rel.POOLS_NAMESPACE)
    try:
        c.kubectl("cordon", c.process_node)
        try:
            apply(c, echo_pool(DRAINED, replicas=WORKERS, activation_timeout_seconds=10), rel.POOLS_NAMESPACE)
            wait_for(
                lambda: dr.ready_workers(pods(), DRAINED) == WORKERS,
                timeout=SETTLE_S,
                interval=0.5,
                message=f"{DRAINED}'s workers Ready on {dr.NODE}",
            )
        finally:
            c.kubectl("uncordon", c.process_node)
        pool_names.append(DRAINED)
        sampler = dr.Sampler(lambda: dr.ready_workers(pods(), DRAINED)).start()
        time.sleep(LOAD_S / 3)  # traffic to the pool before the drain: the run's timeline
        before = tally.snapshot()
        code, result.drain_s, out = dr.drain(c, DRAIN_TIMEOUT_S)
        if code != 0:
            run.auditor.violate("drain", f"kubectl drain exited {code}: {out}", "drain")
        try:
            wait_for(
                lambda: dr.ready_workers(pods(), DRAINED) == WORKERS,
                timeout=ROLL_S,
                interval=0.5,
                message=f"{DRAINED} serving again",
            )
        except Exception as err:
            run.auditor.violate("drain", str(err), "drain")
        time.sleep(LOAD_S / 3)  # traffic after
        gaps = dr.serving_gaps(sampler.stop())
        after = tally.snapshot()
        result.drain_requests = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        result.drain_gap_s = sum(end - start for start, end in gaps)
        for start, end in gaps:
            run.auditor.violate(
                "serving stopped", f"{DRAINED} had no Ready worker for {end - start:.1f} s", "drain"
            )
    finally:
        node.stop()
        c.kubectl("delete", "node", dr.NODE, "--wait=false", check=False)


# ---- the run -------------------------------------------------------------------------------------------
def progress(auditor: Auditor, what: str) -> None:
    print(f"upgrade check: {what}; events audited {dict(auditor.events)}", file=sys.stderr, flush=True)


def run_check(command: str) -> UpgradeResult:
    workdir = Path(tempfile.mkdtemp(prefix="modelpool-upgrade-"))
    name = f"mp-upgrade-{uuid.uuid4().hex[:6]}"
    result = UpgradeResult(command=command, machine="")
    ok = False
    cluster: Cluster | None = None
    try:
        cluster = start_cluster(workdir, name)
        old_tree = rel.previous_tree()
        history: list[tuple[float, int]] = [(time.monotonic(), BUDGET_GIB * GI)]
        auditor = UpgradeAuditor(FaultLog(), history)
        run = Run(cluster, workdir, _ports(), auditor)
        result.install_s = install_previous(run, old_tree)
        auditor.watch(cluster.kubeconfig)
        gateway_pods = dr.PodLister(cluster.kubeconfig, rel.SYSTEM_NAMESPACE, rel.GATEWAY_LABEL)
        endpoints = Endpoints(gateway_pods, run.ports.gateway).start()
        tally = Tally(auditor)
        pools = list(POOL_NAMES)
        clients = Clients(endpoints.target, lambda: list(pools), bearer(run.key), tally, polite=2, rude=1)
        replicas: list[Replica] = []
        try:
            clients.start()
            time.sleep(LOAD_S)  # traffic on 0.2.0 before the upgrade
            prepare_upgrade(run)
            result.upgrade_s, upgraded_at = upgrade(run)
            progress(auditor, f"upgraded in {result.upgrade_s:.1f} s")
            result.roll_s, result.not_rolled = wait_rolled(run, upgraded_at)
            for left in result.not_rolled:
                auditor.violate("not upgraded", left, f"{ROLL_S:.0f} s after the upgrade")
            result.upgrade_requests = tally.snapshot()
            replicas = leader_kill(run, result)
            result.leader_requests = tally.snapshot()
            progress(auditor, f"leader kill: take-over {result.takeover_s} s")
            drain_phase(run, result, pools, tally)
            for sent in clients.stop():
                auditor.violate("request lost", f"{sent.client} -> {sent.pool}: still in flight", "the end")
        finally:
            clients.stop()
            endpoints.stop()
            for replica in replicas:
                replica.process.stop()
            auditor.stop()
        result.requests = tally.snapshot()
        result.violations = list(auditor.violations)
        result.events = dict(auditor.events)
        result.noted = dict(auditor.noted)
        result.machine = f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
        ok = result.ok
        return result
    finally:
        if not ok and cluster is not None and cluster.audit_log is not None and cluster.audit_log.exists():
            shutil.copy(cluster.audit_log, workdir / "audit.log")  # the control plane's folder goes with it
        stop_cluster(workdir, name)
        if ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            sys.stderr.write(
                f"upgrade check: logs (control plane, process node, operators) kept in {workdir}\n"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upgrade", description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = parser.parse_args(argv)
    # SIGTERM (make interrupted, a CI timeout) unwinds like ^C: the control plane is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_check("python -m bench.upgrade")
    print(table(result))
    if args.docs:
        write_docs(result)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
