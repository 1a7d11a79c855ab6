"""A quiet control plane (issue 36): once its pools have converged, nothing is written but Leases.

The real control plane (hack/cluster.sh), the real operator with leader election on (as the chart runs
it), three pools of two workers: two on the KWOK nodes (no process behind them: their stats stay unknown)
and one of real ``modelpool-server`` echo workers on the process node (``/stats`` read every second). Once
every pool's status shows its workers Ready with nothing in progress, every worker pod is Ready by its
own condition, and no pool has changed for ``SETTLED_S`` (all waited for, never slept for), the
API server's audit log (hack/audit-policy.yaml records every write in ``QUIET_NAMESPACE``, by anyone, and
on the ModelBudget of that name) must show, over a window of ``WINDOW_S``, no write but the renewals of a
Lease: no status patch, no Event, no pod, no Endpoints or EndpointSlice, by the operator, the controllers,
KWOK or the process node.

The window is the measurement, so it is a fixed duration: ``WINDOW_S`` = 20 s holds, with the test
settings (``TEST_ENV``), six resyncs of every pool (3 s), twenty stats reads of every echo worker (1 s),
the KWOK workers' stats retried at their 2 s cap, and ten renewals of the leader Lease (2 s): whatever a
pass, a scrape or a retry rewrites shows up in it several times. The window's ends are marks the test
writes itself (a ConfigMap created, then patched), so its bounds are the log's own clock.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from modelpool_contract.states import SERVING_STATES
from testkit.auditlog import (
    QUIET_NAMESPACE,
    AuditTail,
    describe,
    stage_time,
    unexpected_writes,
    writes_in,
)
from testkit.cluster import Cluster, missing
from testkit.kubectl import apply, wait_for
from testkit.services import POOLS, budget_manifest, echo_pool, pool_manifest
from tests.operator.integration.opharness import StartOperator

pytestmark = pytest.mark.cluster

WINDOW_S = 20.0
SETTLED_S = 3.0
REPLICAS = 2
#: The ConfigMap whose creation opens the window and whose patch closes it (ignored in the count).
MARK = "quiet-window"
LEASE = "modelpool-quiet"


@pytest.fixture
def quiet(crds: Cluster) -> Iterator[AuditTail]:
    """``QUIET_NAMESPACE`` made anew (the audit policy names it: it cannot be a random one) with the
    ModelBudget of that name; the audit log read from here on."""
    log = crds.audit_log
    if log is None or not log.exists():
        missing("this cluster has no audit log (start it with hack/cluster.sh, which sets the policy)")
    assert log is not None
    # A namespace of an earlier run on a reused cluster may still be going.
    wait_for(
        lambda: crds.kubectl("get", "namespace", QUIET_NAMESPACE, check=False).returncode != 0,
        timeout=120,
        interval=0.5,
        message=f"namespace {QUIET_NAMESPACE} of an earlier run gone",
    )
    tail = AuditTail(log)
    tail.read()  # everything before this test: read once, never looked at again
    crds.kubectl("create", "namespace", QUIET_NAMESPACE)
    wait_for(
        lambda: (
            crds.kubectl("get", "serviceaccount", "default", "-n", QUIET_NAMESPACE, check=False).returncode
            == 0
        ),
        timeout=30,
        message="the namespace's default ServiceAccount",
    )
    apply(crds, {**budget_manifest("64Gi"), "metadata": {"name": QUIET_NAMESPACE}})
    try:
        yield tail
    finally:
        crds.kubectl("delete", "modelbudget", QUIET_NAMESPACE, "--ignore-not-found", "--wait=false")
        # The operator has stopped (start_operator's teardown ran first): nobody removes its finalizer.
        crds.kubectl(
            "patch", "modelbudget", QUIET_NAMESPACE, "--type", "merge", "-p",
            '{"metadata":{"finalizers":null}}', check=False,
        )  # fmt: skip
        crds.kubectl("delete", "namespace", QUIET_NAMESPACE, "--wait=false", check=False)


def converged(pools: list[dict[str, Any]], pods: list[dict[str, Any]], expected: int, replicas: int) -> bool:
    """Pure: every one of ``expected`` pools has seen its spec and shows ``replicas`` workers, all serving,
    none of them in progress; and every worker pod is Ready by its own condition (a real worker's
    ``/stats`` says Ready before its kubelet's readiness probe has passed and been written)."""
    if len(pools) != expected or len(pods) != expected * replicas:
        return False
    return all(_settled(pool, replicas) for pool in pools) and all(_ready(pod) for pod in pods)


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _settled(pool: dict[str, Any], replicas: int) -> bool:
    status = pool.get("status") or {}
    workers = status.get("workers") or []
    progressing: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Progressing"), {}
    )
    return (
        status.get("observedGeneration") == pool["metadata"].get("generation")
        and status.get("readyReplicas") == replicas
        and len(workers) == replicas
        and all(w.get("state") in SERVING_STATES for w in workers)
        and progressing.get("status") == "False"
    )


class Settled:
    """A condition: what ``read`` returns has not changed for ``SETTLED_S`` (called again and again)."""

    def __init__(self, read: Callable[[], object]) -> None:
        self.read = read
        self.last: object = None
        self.since = time.monotonic()

    def __call__(self) -> bool:
        now, value = time.monotonic(), self.read()
        if value != self.last:
            self.last, self.since = value, now
        return now - self.since >= SETTLED_S


def _listed(cluster: Cluster, kind: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(
        cluster.kubectl("get", kind, "-n", QUIET_NAMESPACE, "-o", "json").stdout
    )["items"]
    return items


def _marked(tail: AuditTail, verb: str) -> dict[str, Any] | None:
    """The last audit event of the test's own ``verb`` on the mark, once the log has one."""
    marks = [
        e
        for e in tail.read()
        if e["verb"] == verb
        and e["objectRef"].get("resource") == "configmaps"
        and e["objectRef"].get("name") == MARK
    ]
    return marks[-1] if marks else None


def test_a_converged_control_plane_writes_nothing_but_leases(
    crds: Cluster, quiet: AuditTail, start_operator: StartOperator
) -> None:
    tail = quiet
    start_operator(
        QUIET_NAMESPACE,
        MODELPOOL_OPERATOR_BUDGET_NAME=QUIET_NAMESPACE,
        MODELPOOL_OPERATOR_LEADER_ELECTION="true",
        MODELPOOL_OPERATOR_LEADER_ELECTION_NAMESPACE=QUIET_NAMESPACE,
        MODELPOOL_OPERATOR_LEADER_ELECTION_LEASE_NAME=LEASE,
    )
    # minReplicas = replicas: the autoscaler (on, as by default) has no reason to move them while idle.
    manifests = [
        pool_manifest("kwok-a", replicas=REPLICAS, min_replicas=REPLICAS),
        pool_manifest("kwok-b", replicas=REPLICAS, min_replicas=REPLICAS),
        echo_pool("echo", replicas=REPLICAS, min_replicas=REPLICAS, autoscaling={}),
    ]
    for manifest in manifests:
        apply(crds, manifest, QUIET_NAMESPACE)
    try:
        wait_for(
            lambda: converged(_listed(crds, POOLS), _listed(crds, "pods"), len(manifests), REPLICAS),
            timeout=240,
            interval=0.5,
            message="every pool converged",
        )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n{json.dumps([p.get('status') for p in _listed(crds, POOLS)])[:6000]}"
        ) from None

    # Converged, the pools' last writes may still be on their way: the reaction to a pod's readiness (a real
    # worker's ``/stats`` says Ready before its kubelet's probe does), the autoscaler's first reading of
    # the load. The window opens once no pool has changed for ``SETTLED_S`` (a pass follows an event
    # within 0.3 s, stats are read every second): a status rewritten more often never settles, and one
    # rewritten less often is caught in the window.
    settled = Settled(
        lambda: {p["metadata"]["name"]: p["metadata"]["resourceVersion"] for p in _listed(crds, POOLS)}
    )
    wait_for(settled, timeout=120, interval=0.5, message=f"no pool changed for {SETTLED_S:g} s")
    at_open = {pool["metadata"]["name"]: pool.get("status") for pool in _listed(crds, POOLS)}
    crds.kubectl("create", "configmap", MARK, "-n", QUIET_NAMESPACE)
    opened = wait_for(lambda: _marked(tail, "create"), timeout=30, message="the window's opening in the log")
    # The log records this namespace: the pools' pods were created (else the policy is an older one).
    created = [e for e in tail.read() if e["verb"] == "create" and e["objectRef"].get("resource") == "pods"]
    if not created:
        missing("the audit log does not record the quiet namespace (a cluster started with an older policy)")

    start = stage_time(opened)
    end = start + timedelta(seconds=WINDOW_S)
    until = time.monotonic() + WINDOW_S

    def window() -> list[dict[str, Any]] | None:
        """The writes of the window so far; returned (ending the wait) at the first unexpected one, or once
        the closing mark is in the log."""
        found = unexpected_writes(writes_in(tail.read(), start, end), ignore={MARK})
        if found:
            return found
        if time.monotonic() < until:
            return None
        closed = _marked(tail, "patch")
        if closed is not None and stage_time(closed) >= end:
            return []
        # Closed by a write of the test's own after the end: every write finished before it is logged.
        mark = f"window={time.monotonic_ns()}"
        crds.kubectl("label", "configmap", MARK, "-n", QUIET_NAMESPACE, mark, "--overwrite")
        return None

    # ``wait_for`` takes a truthy value: the window's verdict is wrapped.
    found = wait_for(lambda: (w,) if (w := window()) is not None else None, timeout=WINDOW_S + 60)[0]
    if found:
        now = {pool["metadata"]["name"]: pool.get("status") for pool in _listed(crds, POOLS)}
        changed = {
            name: (at_open.get(name), status) for name, status in now.items() if status != at_open.get(name)
        }
        pytest.fail(
            "written after convergence:\n"
            + "\n".join(map(describe, found))
            + f"\nstatuses changed since the window opened (then, now): {json.dumps(changed)[:8000]}",
            pytrace=False,
        )

    # The window saw the control plane alive: the leader renewed its Lease (excluded as at rest).
    renewals = [
        e
        for e in writes_in(tail.read(), start, end)
        if e["objectRef"].get("resource") == "leases" and e["objectRef"].get("name") == LEASE
    ]
    assert renewals, "no Lease renewal in the window: was the log read at all?"
