"""The wake timing that ``bench.gateway``'s wake row and ``make demo`` print (bench/wake.py): the stretches
and the bench's row on their own, then the watch against the real API server, which must report the
first new demand in the pool's demand Lease (not one from before, nor a later renewal) and the pool's first
pod from its creation to Ready (a pod on a KWOK node, which KWOK makes Ready)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bench.gateway import wake_row
from bench.wake import Wake, WakeWatch
from modelpool_contract.api import API_VERSION, MODELPOOL_KIND
from modelpool_contract.demand import demand_lease, renew
from modelpool_contract.labels import LABEL_POOL
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import apply, wait_established, wait_for

LEASES = "leases.coordination.k8s.io"


def test_stretches_run_from_the_request_to_the_answer_and_name_what_was_not_seen() -> None:
    woke = Wake(
        sent=100.0, answered=112.5, demanded=100.25, created=100.5, loaded=104.0, ready=112.0, worker="w",
        dimensions=4,
    )  # fmt: skip
    assert woke.seconds == 12.5
    assert woke.stretches() == {
        "request -> demand recorded": 0.25,
        "demand -> pod created": 0.25,
        "pod created -> model loaded": 3.5,
        "model loaded -> Ready": 8.0,
        "Ready -> answered": 0.5,
    }
    unseen = Wake(
        sent=0.0, answered=3.0, demanded=None, created=1.0, loaded=None, ready=2.0, worker="w", dimensions=4
    )
    assert unseen.stretches()["request -> demand recorded"] is None
    assert unseen.stretches()["demand -> pod created"] is None
    assert unseen.stretches()["model loaded -> Ready"] is None
    assert "request -> demand recorded (not seen)" in unseen.describe()


def test_the_bench_row_gives_the_median_the_range_and_the_split() -> None:
    row = wake_row(
        {
            "median_s": 10.5,
            "min_s": 9.94,
            "max_s": 12.0,
            "rounds": [10.5, 9.94, 12.0],
            "stretches_median_s": {
                "request -> demand recorded": 0.01,
                "demand -> pod created": 0.3,
                "pod created -> model loaded": 3.0,
                "model loaded -> Ready": 7.0,
                "Ready -> answered": None,
            },
        }
    )
    assert "| 10.5 s (range 9.9-12.0 s) |" in row and "3 rounds" in row
    split = "request -> demand recorded +0.01 s -> pod created +0.30 s -> model loaded +3.00 s"
    assert f"{split} -> Ready +7.00 s -> answered (not seen) (medians)" in row


def _pool(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name},
        "spec": {
            "model": {"source": "/models/m", "task": "text-embedding"},
            "replicas": 0,
            "minReplicas": 0,
            "maxReplicas": 1,
            "resources": {"memory": "1Gi"},
        },
    }


@pytest.mark.cluster
def test_the_watch_sees_the_first_new_demand_and_the_first_pod_created_then_ready(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    wait_established(cluster, "modelpools.modelpool.dev")
    apply(cluster, _pool("zero"), namespace)
    # A demand from before (the Lease of an earlier wake).
    lease = demand_lease(
        pool="zero",
        pool_uid=None,
        moment=datetime(2026, 1, 1, tzinfo=UTC),
        holder="gw",
        duration_s=6,
        pool_api_version=API_VERSION,
        pool_kind=MODELPOOL_KIND,
    )
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(lease))
    kubeconfig = cluster.kubeconfig
    watch = WakeWatch(kubeconfig, namespace, "zero").start()
    try:
        assert watch.pods_before == 0 and watch.demanded is None  # the old demand is not this wake's
        first = datetime(2026, 11, 26, 12, 0, 0, 250_000, tzinfo=UTC)
        for moment in (first, first + timedelta(seconds=5.25)):  # a first write, a renewal
            current = json.loads(cluster.kubectl("get", LEASES, lease["metadata"]["name"], "-n", namespace,
                                                 "-o", "json").stdout)  # fmt: skip
            body = renew(current, moment=moment, holder="gw", duration_s=6)
            cluster.kubectl("replace", "-n", namespace, "-f", "-", input=json.dumps(body))
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "zero-0", "labels": {LABEL_POOL: "zero"}},
            "spec": {
                "nodeSelector": {"type": "kwok"},
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                "containers": [{"name": "server", "image": "fake"}],
            },
        }
        apply(cluster, pod, namespace)
        wait_for(lambda: watch.ready, timeout=60, message="the watch sees the pod Ready")
    finally:
        watch.stop()
    assert watch.demanded == pytest.approx(1795694400.25)  # 2026-11-26T12:00:00.250Z: the first new value
    assert watch.created is not None and watch.ready is not None and watch.created <= watch.ready
