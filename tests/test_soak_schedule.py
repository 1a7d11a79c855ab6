"""The soak's pure parts: the seeded fault schedule and the auditor's decisions (bench/soak)."""

from __future__ import annotations

import pytest

from bench.soak import schedule as sched
from bench.soak.auditor import (
    budget_limit,
    charge,
    converged,
    eviction_begins,
    eviction_fault,
    lost_events,
    request_outcome,
)
from bench.soak.clients import Sent
from bench.soak.faults import FaultLog

GI = 2**30


def test_schedule_is_a_function_of_the_seed_and_holds_the_required_faults() -> None:
    required = {sched.CONTROL_PLANE_RESTART: 2, sched.GATEWAY_KILL: 1, sched.BUDGET_SHRINK: 1}
    a = sched.schedule(5, 600, 8, required)
    assert a == sched.schedule(5, 600, 8, required)
    assert a != sched.schedule(6, 600, 8, required)
    counts = sched.counts(a)
    assert counts[sched.CONTROL_PLANE_RESTART] == 2 and counts[sched.GATEWAY_KILL] >= 1
    assert len(a) == 600 // 8 and [f.at for f in a] == sorted(f.at for f in a)
    # Every paired fault is undone later: as many grows as shrinks, deletes as creates.
    assert counts[sched.BUDGET_SHRINK] == counts[sched.BUDGET_GROW]
    assert counts.get(sched.POOL_CREATE, 0) == counts.get(sched.POOL_DELETE, 0)
    kinds = [f.kind for f in a]
    assert kinds.index(sched.BUDGET_SHRINK) < kinds.index(sched.BUDGET_GROW)


def test_schedule_refuses_more_required_faults_than_slots() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        sched.schedule(1, 20, 10, {sched.WORKER_KILL: 3})


def _pod(name: str, memory: int = GI, **status: object) -> dict[str, object]:
    meta = {"name": name, "namespace": "soak", "labels": {"modelpool.dev/pool": "p"}}
    meta["annotations"] = {"modelpool.dev/memory-bytes": str(memory)}
    return {"metadata": meta, "status": dict(status)}


def test_charge_follows_the_operators_contract() -> None:
    assert charge(_pod("a", 2 * GI, phase="Running")) == 2 * GI
    assert charge(_pod("a", 2 * GI, phase="Failed")) == 0
    terminated = [{"state": {"terminated": {"exitCode": 137}}}]
    assert charge(_pod("a", 2 * GI, phase="Running", containerStatuses=terminated)) == 0


def test_budget_limit_is_the_largest_budget_in_force_within_the_lag() -> None:
    history = [(0.0, 8 * GI), (100.0, 4 * GI)]
    assert budget_limit(history, 105.0, lag=10) == 8 * GI  # just shrunk: admissions judged on 8 may land
    assert budget_limit(history, 111.0, lag=10) == 4 * GI
    assert budget_limit([], 1.0) is None


def test_eviction_begins_on_annotation_deletion_or_disappearance() -> None:
    pod = _pod("a", phase="Running")
    marked = _pod("a", phase="Running")
    marked["metadata"]["annotations"]["modelpool.dev/evicting"] = "ScaleDown"  # type: ignore[index]
    deleting = _pod("a", phase="Running")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    assert eviction_begins(pod, marked) == "marked for eviction (ScaleDown)"
    assert eviction_begins(pod, deleting) == "deletion began"
    assert eviction_begins(pod, None) == "deleted"
    assert eviction_begins(deleting, None) is None
    assert eviction_begins(pod, pod) is None


def test_request_outcomes_name_the_fault_behind_a_connection_error() -> None:
    log = FaultLog()
    ok = Sent("polite-0", "p", 0.0, 30.0, end=1.0, status=200)
    assert request_outcome(ok, log) == ("answered 200", None)
    late = Sent("polite-0", "p", 0.0, 30.0, end=40.0, status=200)
    assert request_outcome(late, log)[1] is not None
    refused = Sent("rude-0", "p", 100.0, 30.0, end=100.1, error="ConnectError: refused")
    outcome, violation = request_outcome(refused, log)
    assert outcome == "connection error (no fault)" and violation
    window = log.open(sched.GATEWAY_KILL, "pid 1")
    window.start = 99.0
    log.close(window)
    window.end = 100.5
    assert request_outcome(refused, log) == (f"connection error ({sched.GATEWAY_KILL})", None)


def test_a_body_cut_while_a_worker_is_killed_names_the_worker_kill() -> None:
    """A worker SIGKILLed after the gateway relayed its headers cuts the body (seen in a short soak)."""
    log = FaultLog()
    error = "RemoteProtocolError: peer closed connection without sending complete message body"
    cut = Sent("rude-0", "p", 100.0, 30.0, end=100.1, error=error)
    assert request_outcome(cut, log)[1] is not None
    refused = Sent("rude-0", "p", 100.0, 30.0, end=100.1, error="ConnectError: refused")
    window = log.open(sched.WORKER_KILL, "p-0")
    window.start = 99.9
    log.close(window)
    window.end = 100.0
    assert request_outcome(cut, log) == (f"connection error ({sched.WORKER_KILL})", None)
    assert request_outcome(refused, log)[1] is not None  # only a cut body is the killed worker's


def test_converged_names_short_pools_orphans_and_stuck_deletions() -> None:
    pool = {
        "metadata": {"name": "p"},
        "spec": {"replicas": 1},
        "status": {"readyReplicas": 1, "workers": [{"name": "a", "state": "Ready"}]},
    }
    pod = _pod("a", phase="Running")
    assert converged([pool], [pod]) == []
    orphan = _pod("b", phase="Running")
    orphan["metadata"]["labels"] = {"modelpool.dev/pool": "gone"}  # type: ignore[index]
    assert converged([pool], [pod, orphan]) == ["orphan pod b"]
    stuck = {**pool, "metadata": {"name": "p", "deletionTimestamp": "x", "finalizers": ["f"]}}
    assert converged([stuck], [pod])[0].startswith("p: deleting")


def test_rss_summary_compares_the_longest_lived_process_after_it_settled() -> None:
    from bench.soak.rss import RssSampler

    sampler = RssSampler(dict)
    sampler.samples["operator"] = [
        (0.0, 1, 100),  # killed early
        (5.0, 1, 500),
        (10.0, 2, 50),  # the successor: start-up, then settled
        (40.0, 2, 80),
        (100.0, 2, 90),
    ]
    first, last, peak, processes, span = sampler.summary(settle=20)["operator"]
    assert (first, last, peak, processes, span) == (80, 90, 500, 2, 60.0)


def test_auditor_reports_each_violation_with_the_event_that_showed_it() -> None:
    import time

    from bench.soak.auditor import Auditor

    auditor = Auditor(FaultLog(), [(time.monotonic() - 60, 2 * GI)])
    auditor.object_event(
        "modelpools",
        "MODIFIED",
        {
            "metadata": {"namespace": "soak", "name": "p"},
            "status": {"workers": [{"name": "a", "state": "Loading"}]},
        },
    )
    auditor.pod_event("ADDED", _pod("a", 2 * GI, phase="Running"))
    assert auditor.violations == []
    auditor.pod_event("ADDED", _pod("b", GI, phase="Running"))  # 3 GiB charged, budget 2 GiB
    assert [(v.rule, v.event) for v in auditor.violations] == [("budget", "pod b ADDED")]
    deleting = _pod("a", 2 * GI, phase="Running")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # type: ignore[index]
    auditor.pod_event("MODIFIED", deleting)  # deleted, unmarked, while the status said Loading
    auditor.stop()  # confirms the suspect: its pool was not deleted
    assert [(v.rule, v.event) for v in auditor.violations][1] == ("eviction", "pod a MODIFIED")
    assert "while Loading" in auditor.violations[1].detail


def _marked(name: str, state: str | None) -> dict[str, object]:
    pod = _pod(name, GI, phase="Running")
    annotations = pod["metadata"]["annotations"]  # type: ignore[index]
    annotations["modelpool.dev/evicting"] = "ScaleDown"
    if state is not None:
        annotations["modelpool.dev/evicted-in-state"] = state
    return pod


def test_an_eviction_is_judged_on_the_state_the_operator_recorded() -> None:
    """Exact, unlike the lagging status: Loading or Processing as recorded, or no record, is a violation;
    the status saying Processing is not."""
    assert eviction_fault(_marked("a", "Idle")) is None
    assert eviction_fault(_marked("a", "Ready")) is None
    assert eviction_fault(_marked("a", "Processing")) == (
        "evicted (ScaleDown) while Processing (the operator's own observation)"
    )
    assert "while Loading" in str(eviction_fault(_marked("a", "Loading")))
    assert eviction_fault(_marked("a", None)) == "evicted (ScaleDown) without modelpool.dev/evicted-in-state"


def test_the_auditor_fails_an_eviction_recorded_in_processing_or_unrecorded() -> None:
    import time

    from bench.soak.auditor import Auditor

    auditor = Auditor(FaultLog(), [(time.monotonic() - 60, 8 * GI)])
    workers = [{"name": n, "state": "Processing"} for n in ("a", "b", "c")]
    auditor.object_event(
        "modelpools",
        "MODIFIED",
        {"metadata": {"namespace": "soak", "name": "p"}, "status": {"workers": workers}},
    )
    for name in ("a", "b", "c"):
        auditor.pod_event("ADDED", _pod(name, GI, phase="Running"))
    auditor.pod_event("MODIFIED", _marked("a", "Ready"))  # the status lagged: not a violation
    auditor.pod_event("MODIFIED", _marked("b", "Processing"))
    auditor.pod_event("MODIFIED", _marked("c", None))
    auditor.pod_event("DELETED", _marked("a", "Ready"))  # the end of a judged eviction: judged once
    auditor.stop()
    assert [(v.rule, v.event) for v in auditor.violations] == [
        ("eviction", "pod b MODIFIED"),
        ("eviction", "pod c MODIFIED"),
    ]
    assert auditor.noted == {"evictions judged, recorded state Ready": 1}


def test_an_event_the_api_server_refused_is_counted_lost() -> None:
    """The 30-minute soak's operator log held 31 of these (an Event message over 1024 bytes)."""
    log = (
        "[2026-11-27 19:09:12,532] kopf._core.engines.p [WARNING ] Failed to post an event. Ignoring and "
        'continuing. Code: 422. Message: Event "kopf-event-gbbch" is invalid\n'
        "[2026-11-27 19:09:12,600] kopf.objects [INFO    ] Handler 'pool_changed' succeeded.\n"
    )
    assert len(lost_events(log)) == 1
    assert lost_events("[x] kopf.objects [INFO    ] Handler 'pool_changed' succeeded.") == []
