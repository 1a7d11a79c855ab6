"""The audit log's writes as the quiet control plane test and the control-plane benchmark count them
(testkit/auditlog.py): a window's writes by the log's own clock, a Lease's renewal never counted against
rest, a log read on from where it stopped (its last line only once complete), and the audit policy
recording the namespaces those two use."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from testkit.auditlog import (
    BENCH_NAMESPACE,
    DIRECT_NAMESPACE,
    QUIET_NAMESPACE,
    AuditTail,
    describe,
    per_minute,
    unexpected_writes,
    writes_in,
)
from testkit.environment import ROOT

T0 = datetime(2026, 12, 7, 0, 0, tzinfo=UTC)


def event(verb: str, resource: str, name: str, at: float, agent: str = "kopf/1.45.2", **ref: str) -> Any:
    stamp = (T0 + timedelta(seconds=at)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "verb": verb,
        "objectRef": {"resource": resource, "namespace": QUIET_NAMESPACE, "name": name, **ref},
        "stageTimestamp": stamp,
        "userAgent": f"{agent} (linux/amd64)",
        "responseStatus": {"code": 200},
    }


def test_a_window_holds_the_writes_that_finished_in_it_by_the_logs_clock() -> None:
    events = [
        event("create", "pods", "early", 0.5),
        event("get", "pods", "read", 2),  # a read is no write
        event("patch", "modelpools", "p", 2, subresource="status"),
        event("update", "endpoints", "p", 9.999),
        event("delete", "pods", "late", 10),  # the end is open
    ]
    found = writes_in(events, T0 + timedelta(seconds=1), T0 + timedelta(seconds=10))
    assert [(e["verb"], e["objectRef"]["name"]) for e in found] == [("patch", "p"), ("update", "p")]


def test_lease_renewals_and_the_tests_own_marks_are_not_unexpected() -> None:
    events = [
        event("update", "leases", "modelpool-quiet", 1, agent="OpenAPI-Generator/33"),
        event("patch", "configmaps", "quiet-window", 2, agent="kubectl/v1.34.4"),
        event("create", "events", "p.18eed", 3, agent="kube-controller-manager/v1.34.4"),
        event("patch", "modelpools", "p", 4, subresource="status"),
    ]
    found = unexpected_writes(events, ignore={"quiet-window"})
    assert [e["objectRef"]["resource"] for e in found] == ["events", "modelpools"]
    assert describe(found[1]) == (
        "2026-12-07T00:00:04.000000Z patch modelpools/status modelpool-quiet/p by kopf/1.45.2 -> 200"
    )


def test_writes_per_minute_by_kind_busiest_first() -> None:
    events = [
        event("update", "endpoints", "a", 1, agent="kube-controller-manager/v1.34.4"),
        event("update", "endpoints", "b", 2, agent="kube-controller-manager/v1.34.4"),
        event("patch", "modelpools", "p", 3, subresource="status"),
    ]
    assert per_minute(events, 30) == {
        "update endpoints by kube-controller-manager": 4.0,
        "patch modelpools/status by kopf": 2.0,
    }


def test_the_tail_reads_on_from_where_it_stopped_and_waits_for_a_complete_line(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    first = json.dumps(event("create", "pods", "a", 1))
    second = json.dumps(event("create", "pods", "b", 2))
    log.write_text(first + "\n" + json.dumps({"verb": "get"}) + "\n" + second[:20])
    tail = AuditTail(log)
    assert [e["objectRef"]["name"] for e in tail.read()] == ["a"]  # no objectRef: not a resource's
    with log.open("a") as out:
        out.write(second[20:] + "\n")
    assert [e["objectRef"]["name"] for e in tail.read()] == ["a", "b"]
    assert [e["objectRef"]["name"] for e in tail.read()] == ["a", "b"]


def test_the_audit_policy_records_every_write_in_the_namespaces_the_quiet_checks_use() -> None:
    policy = yaml.safe_load((ROOT / "hack" / "audit-policy.yaml").read_text())
    recorded = {
        namespace
        for rule in policy["rules"]
        if rule["level"] != "None" and {"create", "update", "patch", "delete"} <= set(rule.get("verbs", []))
        for namespace in rule.get("namespaces", [])
    }
    assert {QUIET_NAMESPACE, BENCH_NAMESPACE, DIRECT_NAMESPACE} <= recorded
    assert policy["rules"][-1] == {"level": "None"}  # nothing else is recorded
