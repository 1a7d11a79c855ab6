"""observe_worker over every pod-status shape (kubelet and KWOK chaos), with and without /stats."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelpool_operator.observe.worker_state import LifecycleSettings, observe_worker
from tests.operator.unit.op_pods import GI, at, pod, running, stats, terminated, waiting

NOW = at(100)


def test_pending_unscheduled_then_unschedulable_after_timeout() -> None:
    cond = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes: gpu"}
    ]
    p = pod(phase="Pending", node=None, conditions=cond, container_statuses=False)
    early = observe_worker(p, None, at(30), LifecycleSettings(unschedulable_timeout_s=60))
    assert (early.state, early.reason) == ("Pending", "Scheduling")
    late = observe_worker(p, None, at(61), LifecycleSettings(unschedulable_timeout_s=60))
    assert (late.state, late.reason, late.message) == ("Pending", "Unschedulable", "0/3 nodes: gpu")
    # Still charged: it was admitted, and it may be placed at any moment.
    assert late.memory == 2 * GI


def test_pending_container_creating() -> None:
    w = observe_worker(pod(phase="Pending", state=waiting("ContainerCreating"), conditions=[]), None, NOW)
    assert (w.state, w.reason, w.memory) == ("Pending", "ContainerCreating", 2 * GI)


def test_pending_without_any_status() -> None:
    w = observe_worker(pod(phase="Pending", node=None, conditions=[], container_statuses=False), None, NOW)
    assert (w.state, w.reason) == ("Pending", "Scheduling")


def test_running_without_stats_not_ready_is_loading() -> None:
    w = observe_worker(pod(ready=False), None, NOW)
    assert (w.state, w.reason, w.stats_known) == ("Loading", "Starting", False)
    assert w.since == at(10)


def test_running_ready_without_stats_is_ready_never_failed() -> None:
    # KWOK pods and unreachable /stats: unknown stats never make a worker Failed.
    w = observe_worker(pod(ready=True), None, NOW)
    assert (w.state, w.queue_depth, w.memory) == ("Ready", None, 2 * GI)


@pytest.mark.parametrize("state", ["Loading", "Ready", "Processing", "Idle"])
def test_stats_state_is_the_servers_word(state: str) -> None:
    w = observe_worker(
        pod(ready=state != "Loading"), stats(state, since=42, queue_depth=3, last_request=41), NOW
    )
    assert w.state == state
    assert w.since == at(42)
    assert w.queue_depth == 3
    assert w.last_request_time == at(41)
    assert w.memory == 2 * GI


def test_loading_progress_from_stats_is_clamped() -> None:
    w = observe_worker(pod(), stats("Loading", load_progress=0.25), NOW)
    assert (w.state, w.load_progress) == ("Loading", 0.25)
    w = observe_worker(pod(), stats("Loading", load_progress=7), NOW)
    assert w.load_progress == 1.0


def test_stats_failed_with_load_error() -> None:
    w = observe_worker(pod(), stats("Failed", load_error="no such model"), NOW)
    assert (w.state, w.reason, w.message, w.memory) == ("Failed", "LoadFailed", "no such model", 0)


def test_load_failed_exit_code_3_with_termination_message() -> None:
    p = pod(phase="Failed", state=terminated(3, "Error", "OSError: /models/x has no config.json"))
    w = observe_worker(p, None, NOW)
    assert (w.state, w.reason) == ("Failed", "LoadFailed")
    assert w.message == "OSError: /models/x has no config.json"
    assert w.memory == 0 and w.requested_memory == 2 * GI
    assert w.since == at(20)


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (
            7,
            "InferenceWedged",
            "inference wedged: batch running for 93 s, over the 60 s request timeout + 30 s grace",
        ),
        (6, "DrainTimedOut", "drain timed out after 30 s: 3 requests abandoned"),
    ],
)
def test_the_servers_own_failure_exits_are_named(code: int, reason: str, message: str) -> None:
    w = observe_worker(pod(phase="Failed", state=terminated(code, "Error", message)), None, NOW)
    assert (w.state, w.reason, w.message, w.memory) == ("Failed", reason, message, 0)


def test_oomkilled_137_kwok_chaos_shape() -> None:
    p = pod(phase="Failed", state=terminated(137, "OOMKilled"))
    w = observe_worker(p, stats("Ready"), NOW)  # stale stats never override the kubelet's verdict
    assert (w.state, w.reason, w.memory) == ("Failed", "OOMKilled", 0)
    assert "memory limit" in (w.message or "")


def test_other_exit_code_is_error_with_code() -> None:
    w = observe_worker(pod(phase="Failed", state=terminated(1, "Error")), None, NOW)
    assert (w.state, w.reason) == ("Failed", "Error")
    assert "exit code 1" in (w.message or "")


def test_terminated_while_phase_running_is_failed() -> None:
    # The kubelet may report the container terminated before the pod phase catches up.
    w = observe_worker(pod(phase="Running", state=terminated(139, "Error", "segfault")), None, NOW)
    assert (w.state, w.reason, w.memory) == ("Failed", "Error", 0)
    assert "segfault" in (w.message or "")


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("ImagePullBackOff", "ImagePullBackOff"),
        ("ErrImagePull", "ImagePullBackOff"),
        ("InvalidImageName", "InvalidImageName"),
        ("CreateContainerConfigError", "CreateContainerConfigError"),
    ],
)
def test_waiting_failures(reason: str, expected: str) -> None:
    p = pod(phase="Pending", state=waiting(reason, "pull access denied"), conditions=[])
    w = observe_worker(p, None, NOW)
    assert (w.state, w.reason, w.message, w.memory) == ("Failed", expected, "pull access denied", 0)


def test_crashloopbackoff_reports_the_last_termination() -> None:
    p = pod(
        state=waiting("CrashLoopBackOff", "back-off 5m0s"),
        last_state=terminated(3, "Error", "model not found"),
        restarts=4,
    )
    w = observe_worker(p, None, NOW)
    assert (w.state, w.reason, w.restarts, w.memory) == ("Failed", "CrashLoopBackOff", 4, 0)
    assert w.message == "LoadFailed: model not found"


def test_kubelet_eviction_phase_failed() -> None:
    p = pod(
        phase="Failed",
        state=None,
        pod_reason="Evicted",
        pod_message="low on memory",
        container_statuses=False,
    )
    w = observe_worker(p, None, NOW)
    assert (w.state, w.reason, w.message) == ("Failed", "Evicted", "low on memory")


def test_unresponsive_only_when_the_node_says_so() -> None:
    conds = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "False", "reason": "NodeNotReady", "message": "node unreachable"},
    ]
    w = observe_worker(pod(conditions=conds), None, NOW)
    assert (w.state, w.reason, w.memory) == ("Failed", "Unresponsive", 0)
    # A plain not-ready container (readiness failing) is not Unresponsive: it is still Loading/starting.
    plain = [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]
    assert observe_worker(pod(conditions=plain), None, NOW).state == "Loading"


def test_evicting_annotation_running() -> None:
    w = observe_worker(
        pod(ready=True, evicting="IdleTimeout", evicting_since=90, serving=False), stats("Idle"), NOW
    )
    assert (w.state, w.reason, w.evicting_reason, w.since, w.serving) == (
        "Evicting",
        "IdleTimeout",
        "IdleTimeout",
        at(90),
        False,
    )
    assert w.memory == 2 * GI  # still holds its memory while draining


def test_deleting_running_pod_is_evicting_and_charged() -> None:
    w = observe_worker(pod(ready=True, deleted=95), stats("Ready"), NOW)
    assert (w.state, w.deleting, w.memory) == ("Evicting", True, 2 * GI)


def test_deleting_terminated_pod_is_dead_and_free() -> None:
    w = observe_worker(pod(phase="Failed", state=terminated(3, "Error", "x"), deleted=95), None, NOW)
    assert (w.state, w.memory) == ("Dead", 0)


def test_server_draining_is_evicting() -> None:
    w = observe_worker(pod(ready=False), stats("Evicting"), NOW)
    assert (w.state, w.reason) == ("Evicting", "Draining")


def test_clean_exit_is_dead() -> None:
    w = observe_worker(pod(phase="Succeeded", state=terminated(0, "Completed")), None, NOW)
    assert (w.state, w.reason, w.memory) == ("Dead", "Completed", 0)


def test_labels_and_identity() -> None:
    w = observe_worker(pod("w-7", pool="emb", namespace="team", template_hash="abc", restarts=2), None, NOW)
    assert (w.name, w.pool, w.namespace, w.template_hash, w.restarts, w.node) == (
        "w-7",
        "emb",
        "team",
        "abc",
        2,
        "node-1",
    )
    assert w.key == ("team", "w-7") and w.pool_key == ("team", "emb")


def test_memory_falls_back_to_container_limit() -> None:
    p = pod()
    del p["metadata"]["annotations"]["modelpool.dev/memory-bytes"]
    p["spec"]["containers"][0]["resources"]["limits"]["memory"] = "3Gi"
    assert observe_worker(p, None, NOW).memory == 3 * GI


def test_status_entry_round_trip() -> None:
    entry = observe_worker(pod(ready=True), stats("Idle", last_request=50), NOW).to_status()
    wire = entry.wire()
    assert wire["state"] == "Idle" and wire["memory"] == "2Gi"
    assert wire["lastRequestTime"] == "2026-01-01T12:00:50Z"


# ---- properties --------------------------------------------------------------------------------------

_states = st.one_of(
    st.none(),
    st.builds(running, st.floats(0, 50)),
    st.builds(waiting, st.sampled_from(["ContainerCreating", "CrashLoopBackOff", "ErrImagePull", "Weird"])),
    st.builds(terminated, st.integers(0, 255), st.sampled_from(["Error", "OOMKilled", "Completed"])),
)
_stats = st.one_of(
    st.none(),
    st.builds(
        stats, st.sampled_from(["Loading", "Ready", "Processing", "Idle", "Evicting", "Failed", "bogus"])
    ),
    st.just({"state": 5, "queue_depth": "x"}),
)


@given(
    phase=st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
    state=_states,
    ready=st.booleans(),
    deleted=st.booleans(),
    evicting=st.sampled_from([None, "IdleTimeout", "Preempted"]),
    server=_stats,
)
def test_any_shape_gives_a_state_and_failed_is_never_charged(  # noqa: PLR0917 - hypothesis args
    phase: str, state: dict[str, Any] | None, ready: bool, deleted: bool, evicting: str | None, server: Any
) -> None:
    p = pod(phase=phase, state=state, ready=ready, deleted=95 if deleted else None, evicting=evicting)
    w = observe_worker(p, server, NOW)
    assert w.state in ("Pending", "Loading", "Ready", "Processing", "Idle", "Evicting", "Dead", "Failed")
    if w.state in ("Failed", "Dead"):
        assert w.memory == 0
    else:
        assert w.memory == 2 * GI
    if w.state == "Failed":
        assert w.reason


@given(state=st.sampled_from(["Loading", "Ready", "Processing", "Idle"]), ready=st.booleans())
def test_unknown_stats_never_fail_a_running_worker(state: str, ready: bool) -> None:
    del state
    w = observe_worker(pod(ready=ready), None, NOW)
    assert w.state in ("Loading", "Ready")


def _kwok_chaos_pod(code: int, reason: str, message: str, phase: str) -> dict[str, Any]:
    """Exactly what hack/kwok/stages/chaos.yaml writes into the pod status."""
    p = pod(phase=phase, ready=False)
    p["status"]["conditions"] = [
        {
            "lastTransitionTime": "2026-01-01T12:00:20Z",
            "status": "False",
            "reason": "ContainersNotReady",
            "type": t,
        }
        for t in ("Ready", "ContainersReady")
    ]
    p["status"]["containerStatuses"] = [
        {
            "image": "img",
            "name": "server",
            "ready": False,
            "restartCount": 0,
            "started": False,
            "state": {
                "terminated": {
                    "exitCode": code,
                    "reason": reason,
                    "message": message,
                    "startedAt": "2026-01-01T12:00:10Z",
                    "finishedAt": "2026-01-01T12:00:20Z",
                }
            },
        }
    ]
    return p


@pytest.mark.parametrize("phase", ["Failed", "Running"])  # restartPolicy Never / Always
@pytest.mark.parametrize(
    ("code", "kubelet_reason", "reason"),
    [(137, "OOMKilled", "OOMKilled"), (1, "Error", "Error"), (3, "Error", "LoadFailed")],
)
def test_kwok_chaos_shapes(phase: str, code: int, kubelet_reason: str, reason: str) -> None:
    w = observe_worker(_kwok_chaos_pod(code, kubelet_reason, "simulated by KWOK", phase), None, NOW)
    assert (w.state, w.reason, w.memory) == ("Failed", reason, 0)
    assert "simulated by KWOK" in (w.message or "")
    assert w.since == at(20)


def test_ready_since_is_the_ready_condition_transition() -> None:
    assert observe_worker(pod(ready=True), stats("Idle"), NOW).ready_since == at(30)
    assert observe_worker(pod(ready=False), stats("Loading"), NOW).ready_since is None
