"""Two operator replicas on one leader election Lease, against the real API server: one acts, provably.

Real: kube-apiserver (its audit log), kube-scheduler, controller-manager, two ``modelpool-operator``
processes with leader election on (``modelpool_operator.leader``), each running as a ServiceAccount of its
own (bound to cluster-admin for the test) so that the audit log (hack/audit-policy.yaml records the
``modelpool-audit`` namespace's ServiceAccounts) tells which replica made every request. Simulated: only
the kubelet of the KWOK GPU nodes.

* Only the leader writes: the standby's requests are reads of the Lease and nothing else (no pod, no status,
  no write of any kind), while the leader creates the pool's workers; the Lease's holderIdentity, the
  ModelBudget's status.activeOperator and the ``modelpool_operator_leader`` metric name the leader.
* A leader killed with SIGKILL (no release) is replaced within leaseDuration + retryPeriod (measured and
  printed), and the new leader acts (scales the pool up).
* A leader paused (SIGSTOP) past its renew deadline is replaced; resumed (SIGCONT), it exits 9 without a
  single request after its pause: no write after losing the lease.
* SIGTERM on the leader releases the Lease: a standby takes it at its next try (measured and printed).
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelpool_contract.times import parse_time
from modelpool_operator.leader import (
    DEFAULT_LEASE_DURATION_S,
    DEFAULT_RENEW_DEADLINE_S,
    DEFAULT_RETRY_PERIOD_S,
    EXIT_LOST_LEASE,
)
from testkit.auditlog import token_kubeconfig
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, get_json, wait_for
from testkit.services import stop_all
from tests.operator.integration.opharness import (
    POOLS,
    OperatorProcess,
    budget_manifest,
    pool_manifest,
    worker_pods,
)
from tests.rbacaudit import (
    AUDITED_NAMESPACE,
    apply_docs,
    audited_requests,
    delete_docs,
    render_chart,
    require_audit_log,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# client-go's (and controller-runtime's) defaults, as the chart sets them: the real failover is measured.
# The operator's defaults (the chart's too): the test measures what a user gets.
LEASE_S, RENEW_S, RETRY_S = DEFAULT_LEASE_DURATION_S, DEFAULT_RENEW_DEADLINE_S, DEFAULT_RETRY_PERIOD_S
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
# A process's start on a busy machine (imports), and the slack of the polls that measure a takeover.
START_S = 120.0
POLL_S = 0.2


@dataclass
class Replica:
    name: str  # its identity (POD_NAME) and ServiceAccount
    process: OperatorProcess
    metrics_port: int

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{AUDITED_NAMESPACE}:{self.name}"

    def leader_metric(self) -> float | None:
        try:
            text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return None
        found = re.search(r"^modelpool_operator_leader (\S+)$", text, re.M)
        return float(found.group(1)) if found else None


@dataclass
class Election:
    cluster: Cluster
    namespace: str
    lease: str
    tmp: Path
    replicas: list[Replica]
    # The replicas render the same workers (the probe port is part of the pod, hence of its template hash),
    # as a Deployment's replicas do: a new leader adopts the workers, it does not roll them.
    probe_port: int = field(default_factory=free_port)

    def start(self, name: str) -> Replica:
        self.cluster.kubectl("create", "serviceaccount", name, "-n", AUDITED_NAMESPACE)
        self.cluster.kubectl(
            "create", "clusterrolebinding", name, "--clusterrole=cluster-admin",
            f"--serviceaccount={AUDITED_NAMESPACE}:{name}",
        )  # fmt: skip
        kubeconfig = token_kubeconfig(self.cluster, AUDITED_NAMESPACE, name, self.tmp / f"{name}.kubeconfig")
        port = free_port()
        env = {
            "POD_NAME": name,
            "MODELPOOL_OPERATOR_LEADER_ELECTION": "true",
            "MODELPOOL_OPERATOR_LEADER_ELECTION_LEASE_NAME": self.lease,
            "MODELPOOL_OPERATOR_LEADER_ELECTION_NAMESPACE": self.namespace,
            "MODELPOOL_OPERATOR_METRICS_PORT": str(port),
            "MODELPOOL_OPERATOR_SERVER_PROBE_PORT": str(self.probe_port),
        }
        process = OperatorProcess(
            self.cluster, [self.namespace], self.tmp / f"{name}.log", kubeconfig=kubeconfig, **env
        )
        replica = Replica(name, process, port)
        self.replicas.append(replica)
        wait_for(
            lambda: not process.alive() or "is a candidate for lease" in process.log_tail(10**7),
            timeout=START_S,
            interval=0.3,
            message=f"{name} started as a candidate",
        )
        assert process.alive(), process.log_tail()
        return replica

    def holder(self) -> str:
        lease = get_json(self.cluster, "lease", self.lease, "-n", self.namespace)
        return str(lease["spec"].get("holderIdentity") or "")

    def lease_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = get_json(self.cluster, "lease", self.lease, "-n", self.namespace)["spec"]
        return spec

    def wait_holder(self, name: str, timeout: float) -> float:
        """Seconds until ``name`` holds the Lease (polled every ``POLL_S``)."""
        started = time.monotonic()

        def held() -> bool:
            found = self.cluster.kubectl(
                "get", "lease", self.lease, "-n", self.namespace, "-o", "jsonpath={.spec.holderIdentity}",
                check=False,
            )  # fmt: skip
            return found.returncode == 0 and found.stdout.strip() == name

        wait_for(held, timeout=timeout, interval=POLL_S, message=f"{name} holds the lease")
        return time.monotonic() - started


def _writes(cluster: Cluster, replica: Replica, *, after: datetime | None = None) -> list[str]:
    """The write requests ``replica`` made (its Lease's included), as 'verb resource name'."""
    out = []
    for event in audited_requests(cluster, replica.username):
        if event["verb"] not in WRITES:
            continue
        if after is not None and _received(event) <= after:
            continue
        ref = event["objectRef"]
        out.append(f"{event['verb']} {ref.get('resource')}/{ref.get('subresource') or ''} {ref.get('name')}")
    return out


def _non_lease(writes: list[str]) -> list[str]:
    return [w for w in writes if not w.split()[1].startswith("leases/")]


def _requests_after(cluster: Cluster, replica: Replica, after: datetime) -> list[str]:
    return [
        f"{e['verb']} {e['objectRef'].get('resource')} {e['objectRef'].get('name')}"
        for e in audited_requests(cluster, replica.username)
        if _received(e) > after
    ]


def _received(event: dict[str, Any]) -> datetime:
    """When the API server received the audited request (its audit log always says)."""
    received = parse_time(event["requestReceivedTimestamp"])
    assert received is not None, event
    return received


@pytest.fixture
def election(
    crds: Cluster, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Election]:
    require_audit_log(crds)
    found = Election(crds, namespace, f"mp-leader-{secrets.token_hex(3)}", tmp_path, [])
    apply(crds, budget_manifest("100Gi"))
    yield found
    failed = bool(getattr(request.node, "rep_call", None) and request.node.rep_call.failed)
    live = [r for r in found.replicas if r.process.alive()]
    if live:  # the pool's finalizer goes while an operator runs
        crds.kubectl("delete", POOLS, "--all", "-n", namespace, "--timeout=60s", check=False)
    try:
        stop_all([r.process for r in found.replicas], show_logs=failed, what="operator")
    finally:
        for replica in found.replicas:
            crds.kubectl("delete", "clusterrolebinding", replica.name, "--ignore-not-found", check=False)
            crds.kubectl(
                "delete", "serviceaccount", replica.name, "-n", AUDITED_NAMESPACE, "--ignore-not-found",
                check=False,
            )  # fmt: skip
        crds.kubectl("delete", "modelbudget", "default", "--ignore-not-found", "--wait=false", check=False)
        crds.kubectl(
            "patch", "modelbudget", "default", "--type", "merge", "-p", '{"metadata":{"finalizers":null}}',
            check=False,
        )  # fmt: skip
        crds.kubectl("wait", "--for=delete", "modelbudget/default", "--timeout=30s", check=False)


def _leader_and_standby(election: Election) -> tuple[Replica, Replica]:
    tag = secrets.token_hex(2)
    leader = election.start(f"op-{tag}-a")
    election.wait_holder(leader.name, timeout=30)
    standby = election.start(f"op-{tag}-b")
    wait_for(
        lambda: f"{leader.name} is the leader; {standby.name} stands by" in standby.process.log_tail(10**7),
        timeout=30,
        message="the second replica stands by",
    )
    return leader, standby


def _active_operator(cluster: Cluster) -> str:
    return str((get_json(cluster, "modelbudget", "default").get("status") or {}).get("activeOperator") or "")


def test_only_the_leader_acts_and_a_killed_leader_is_replaced_within_the_lease_duration(
    election: Election,
) -> None:
    cluster, namespace = election.cluster, election.namespace
    leader, standby = _leader_and_standby(election)
    apply(cluster, pool_manifest("led", replicas=2, max_replicas=4), namespace)
    wait_for(lambda: len(worker_pods(cluster, namespace, "led")) == 2, timeout=60, message="2 workers")
    wait_for(lambda: _active_operator(cluster) == leader.name, timeout=30, message="activeOperator: leader")
    assert leader.leader_metric() == 1.0 and standby.leader_metric() == 0.0

    # The workers are the leader's; the standby wrote nothing (its requests: reads of the Lease).
    created = [w for w in _writes(cluster, leader) if w.startswith("create pods/")]
    assert len(created) == 2, created
    assert _writes(cluster, standby) == []
    standby_reads = {
        (e["verb"], e["objectRef"]["resource"]) for e in audited_requests(cluster, standby.username)
    }
    assert standby_reads == {("get", "leases")}, standby_reads

    # SIGKILL: no release. The standby takes over once the record it saw is leaseDuration old.
    killed_at = time.monotonic()
    leader.process.kill()
    took = election.wait_holder(standby.name, timeout=LEASE_S + RETRY_S + 10)
    failover = time.monotonic() - killed_at
    print(
        f"\nfailover after SIGKILL of the leader: {failover:.1f} s (lease {LEASE_S:g} s, retry {RETRY_S:g} s)"
    )
    # client-go's bound, plus the slack of the polls (the standby's and this test's kubectl every 0.2 s).
    assert took <= LEASE_S + RETRY_S + 2.5, f"failover took {took:.1f} s"
    assert election.lease_spec()["leaseTransitions"] == 1

    # The new leader acts: it scales the pool up and names itself in the budget's status.
    cluster.kubectl("patch", POOLS, "led", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":3}}')
    wait_for(lambda: len(worker_pods(cluster, namespace, "led")) == 3, timeout=60, message="3 workers")
    assert any(w.startswith("create pods/") for w in _writes(cluster, standby))
    wait_for(lambda: _active_operator(cluster) == standby.name, timeout=30, message="activeOperator: new")
    wait_for(lambda: standby.leader_metric() == 1.0, timeout=10, message="the new leader's metric")

    # SIGTERM (a rolling update, a drain): the leader releases the Lease on its way out (exit 0), and a
    # third replica standing by takes it at its next try, not after the lease duration.
    third = election.start(standby.name.removesuffix("-b") + "-c")
    wait_for(
        lambda: f"{standby.name} is the leader; {third.name} stands by" in third.process.log_tail(10**7),
        timeout=30,
        message="the third replica stands by",
    )
    stopped_at = time.monotonic()
    assert standby.process.stop() == 0
    assert f"{standby.name} released lease" in standby.process.log_tail(10**7)
    took = election.wait_holder(third.name, timeout=LEASE_S)
    handover = time.monotonic() - stopped_at
    print(f"handover after SIGTERM of the leader: {handover:.1f} s (its stop included; retry {RETRY_S:g} s)")
    assert took <= RETRY_S + 2.0, f"the released lease was taken after {took:.1f} s"
    assert election.lease_spec()["leaseTransitions"] == 2
    # The third replica acts: the pool's deletion completes (its finalizer is the operator's to remove).
    cluster.kubectl("delete", POOLS, "led", "-n", namespace, "--timeout=60s")


def test_a_paused_leader_is_replaced_and_exits_on_resume_without_a_request(election: Election) -> None:
    cluster, namespace = election.cluster, election.namespace
    leader, standby = _leader_and_standby(election)
    apply(cluster, pool_manifest("paused", replicas=1, max_replicas=4), namespace)
    wait_for(lambda: len(worker_pods(cluster, namespace, "paused")) == 1, timeout=60, message="1 worker")

    leader.process.proc.send_signal(signal.SIGSTOP)
    paused_at = datetime.now(UTC)
    try:
        took = election.wait_holder(standby.name, timeout=LEASE_S + RETRY_S + 10)
        print(f"\ntakeover from a paused (SIGSTOP) leader: {took:.1f} s")
        # The new leader acts while the old one is frozen (a change the old one would act on too).
        cluster.kubectl(
            "patch", POOLS, "paused", "-n", namespace, "--type=merge", "-p", '{"spec":{"replicas":2}}'
        )
        wait_for(lambda: len(worker_pods(cluster, namespace, "paused")) == 2, timeout=60, message="2 workers")
    finally:
        leader.process.proc.send_signal(signal.SIGCONT)
    code = leader.process.proc.wait(30)
    assert code == EXIT_LOST_LEASE, (code, leader.process.log_tail())
    assert "exiting (9) to restart as a candidate" in leader.process.log_tail(10**7)
    # Not one request after the pause (a second's margin for one already on the wire when it stopped):
    # the fence ran before any callback once the process resumed.
    margin = datetime.fromtimestamp(paused_at.timestamp() + 1, UTC)
    assert _requests_after(cluster, leader, margin) == []
    assert _non_lease(_writes(cluster, standby))  # the new leader wrote (the second worker)
    assert _writes(cluster, leader, after=margin) == []
    assert election.holder() == standby.name
    json.dumps(election.lease_spec())  # the Lease as the API server keeps it (printed on failure)


def test_the_operator_may_create_only_its_own_lease(crds: Cluster, tmp_path: Path) -> None:
    """RBAC cannot narrow ``create`` by name, so the chart's Role lets the operator create any Lease of the
    release namespace; the chart's policy ``<release>-modelpool-operator-lease`` admits only its election
    Lease (asked with ``kubectl --as`` the operator's ServiceAccount, with the chart's rendered RBAC)."""
    require_audit_log(crds)  # the release namespace (modelpool-audit) exists
    release = f"le-{secrets.token_hex(3)}"
    docs = render_chart(crds, release, {"gateway": {"enabled": False}}, tmp_path)
    kinds = {"ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy"}
    kinds |= {"ValidatingAdmissionPolicyBinding"}
    wanted = [
        d
        for d in docs
        if d["kind"] in kinds
        and (d["kind"] == "ServiceAccount" or d["metadata"]["name"].endswith(("-leader-election", "-lease")))
    ]
    assert {d["kind"] for d in wanted} == kinds, sorted(d["metadata"]["name"] for d in wanted)
    apply_docs(crds, wanted)
    operator = f"system:serviceaccount:{AUDITED_NAMESPACE}:{release}-modelpool-operator"
    own = f"{release}-modelpool-operator"

    def create(name: str) -> Any:
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}
        return crds.kubectl(
            "create", "-n", AUDITED_NAMESPACE, "-f", "-", "--dry-run=server", f"--as={operator}",
            input=json.dumps(lease), check=False,
        )  # fmt: skip

    try:
        refused = wait_for(
            lambda: (r := create("kube-scheduler")).returncode != 0 and "creates only its leader" in r.stderr,
            timeout=60,
            interval=0.5,
            message="the lease policy is enforced",
        )
        assert refused
        assert create(own).returncode == 0, create(own).stderr
        # Elsewhere RBAC refuses already (the Role is the release namespace's).
        can = crds.kubectl(
            "auth", "can-i", "create", "leases", "-n", "default", f"--as={operator}", check=False
        )
        assert can.stdout.strip() == "no", can.stdout
    finally:
        delete_docs(crds, wanted)
