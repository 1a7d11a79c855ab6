"""The control-plane benchmark's pure parts (bench/controlplane.py, issue 36): the direct baseline's pods
are the operator's own, without its owner or labels; Ready times come from the pods' own conditions; the
ratio of the two ways; the writes at rest counted in the pools' namespace only, Lease renewals apart; and
the cost curve still reads the rows of earlier runs, which have no baseline."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.controlplane import (
    DIRECT_LABEL,
    NAMESPACE,
    curve_table,
    direct_pods,
    kept_rows,
    lists_of,
    phase_seconds,
    pools_manifest,
    ratio,
    ready_seconds,
    rest_writes,
    write_counts,
)
from modelpool_operator.effects.resources import build_worker_pod
from modelpool_operator.pool import PoolView
from testkit.auditlog import DIRECT_NAMESPACE

T0 = datetime(2026, 12, 7, 1, 0, tzinfo=UTC)


def stamp(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_the_direct_pods_are_the_operators_pods_without_its_owner_or_labels() -> None:
    pods = direct_pods(pools=2, workers=3)
    assert [p["metadata"]["name"] for p in pods] == [f"pool-00{i}-{w}" for i in range(2) for w in range(3)]
    manifest = pools_manifest(2, 3)[1]
    operators = build_worker_pod(PoolView.from_body(manifest), "pool-001-0")
    pod = pods[3]
    assert pod["spec"] == {**operators["spec"]}
    assert pod["metadata"]["namespace"] == DIRECT_NAMESPACE
    assert pod["metadata"]["labels"] == {DIRECT_LABEL: "pool-001"}
    assert "ownerReferences" not in pod["metadata"]
    assert pod["metadata"]["annotations"] == operators["metadata"]["annotations"]
    assert all(p["metadata"]["namespace"] == NAMESPACE for p in pools_manifest(2, 3))


def test_lists_of_one_hundred() -> None:
    docs = [json.loads(d) for d in lists_of([{"n": i} for i in range(250)])]
    assert [len(d["items"]) for d in docs] == [100, 100, 50]
    assert docs[2]["items"][0] == {"n": 200}


def pod(ready_at: float | None, status: str = "True") -> dict[str, Any]:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": stamp(0)}]
    if ready_at is not None:
        conditions.append({"type": "Ready", "status": status, "lastTransitionTime": stamp(ready_at)})
    return {"status": {"conditions": conditions}}


def test_ready_times_come_from_the_pods_own_ready_conditions() -> None:
    pods = [pod(7), pod(3), pod(None), pod(9, status="False")]
    assert ready_seconds(pods, T0) == [3.0, 7.0]
    # The conditions have whole seconds: a start within a second counts from that second.
    assert ready_seconds([pod(0)], T0 + timedelta(seconds=0.6)) == [0.0]


def test_phases_are_the_last_pods_creation_scheduling_and_readiness() -> None:
    pods = [
        {"metadata": {"creationTimestamp": stamp(1)}, **pod(9)},
        {"metadata": {"creationTimestamp": stamp(4)}, **pod(None)},
    ]
    pods[1]["status"]["conditions"][0]["lastTransitionTime"] = stamp(6)
    assert phase_seconds(pods, T0 + timedelta(seconds=0.4)) == {
        "created": 4.0,
        "scheduled": 6.0,
        "ready": 9.0,
    }


def test_the_ratio_is_of_the_medians() -> None:
    assert ratio([30, 26, 40], [20, 19, 21]) == 30 / 20
    assert ratio([30], []) is None


def write(verb: str, resource: str, namespace: str, at: float, agent: str = "kopf/1.45.2") -> dict[str, Any]:
    return {
        "verb": verb,
        "objectRef": {"resource": resource, "namespace": namespace, "name": "x"},
        "stageTimestamp": stamp(at),
        "userAgent": agent,
    }


def test_writes_at_rest_are_the_pools_namespaces_lease_renewals_apart() -> None:
    events = [
        write("create", "pods", NAMESPACE, 1),  # before the window
        write("update", "leases", NAMESPACE, 12),
        write("create", "events", NAMESPACE, 15),
        write("patch", "modelpools", NAMESPACE, 20),
        write("create", "pods", DIRECT_NAMESPACE, 21),
    ]
    found = rest_writes(events, NAMESPACE, T0 + timedelta(seconds=10), T0 + timedelta(seconds=40))
    assert found is not None
    assert found.per_min == 4.0
    assert found.by_kind == {"create events by kopf": 2.0, "patch modelpools by kopf": 2.0}
    # A log that never recorded the namespace (an older audit policy) says nothing, not "quiet".
    assert rest_writes(events, "elsewhere", T0, T0 + timedelta(seconds=40)) is None
    # A creation's writes are counted, not rated.
    assert write_counts(events, NAMESPACE, T0, T0 + timedelta(seconds=40)) == {
        "create pods by kopf": 1.0,
        "create events by kopf": 1.0,
        "patch modelpools by kopf": 1.0,
    }


def test_the_curve_reads_rows_with_and_without_the_baseline() -> None:
    old = {
        "pools": 300,
        "workers_per_pool": 10,
        "create_to_pods_ready_s": 101.0,
        "converge_after_pods_ready_s": 0.4,
        "operator_rss_mib": 197.0,
        "operator_cpu_percent": 6.0,
        "api_requests_per_min": 2459.0,
        "operator_resource_requests_per_min": 1285.0,
        "load_average": "3.36",
    }
    new = {
        **old,
        "pools": 100,
        "direct_pods_ready_s": [20.0],
        "ready_ratio": 1.1,
        "writes_per_min": 0.0,
    }
    rows = curve_table([old, new]).splitlines()
    assert rows[2].startswith("| 100 x 10 | 101 s | 20 s (1.10x) |") and "| 0 |" in rows[2]
    assert rows[3].startswith("| 300 x 10 | 101 s | - |")
    assert all(row.count("|") == rows[0].count("|") for row in rows)


OLD_100 = "| 100 x 10 | 26 s | 0.2 s | 174 MiB | 3 % | 1839 (1048) | 138 MiB | 0.37 ms | 3.29 |"
OLD_300 = "| 300 x 10 | 101 s | 0.4 s | 197 MiB | 6 % | 2459 (1285) | 137 MiB | 0.49 ms | 3.36 |"
NEW_1000 = (
    "| 1000 x 10 | 646 s | 20 s (1.10x) | 2.9 s | 319 MiB | 16 % | 2499 (1117) | 0 | 150 MiB | 0.5 ms | 4.9 |"
)


def test_the_docs_rows_of_sizes_not_measured_here_are_kept_in_the_new_columns() -> None:
    block = "\n".join(
        [
            "Control plane at scale (...):",
            "",
            "| pools x workers | create -> pods Ready | converge after Ready | ... | load avg |",
            "|---|---|---|---|---|---|---|---|---|",
            OLD_100,
            OLD_300,
            NEW_1000,
        ]
    )
    assert kept_rows(block, {100}) == [
        "| 300 x 10 | 101 s | - | 0.4 s | 197 MiB | 6 % | 2459 (1285) | - | 137 MiB | 0.49 ms | 3.36 |",
        NEW_1000,
    ]
