"""The process node's pure rules: `$(VAR)` expansion, the environment, restart policy, back-off, status."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from testkit.processnode.agent import IpPool
from testkit.processnode.podspec import (
    SpecError,
    backoff_delay,
    build_argv,
    build_env,
    exit_code_of,
    expand,
    grace_seconds,
    resolve_port,
    should_restart,
)
from testkit.processnode.podstatus import ConditionClock, ContainerRecord, Terminated, pod_phase, pod_status
from testkit.processnode.probes import ProbeState


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("--bind $(POD_IP)", "--bind 127.42.0.1"),
        ("$(UNDEFINED) stays", "$(UNDEFINED) stays"),
        ("$$(POD_IP) is escaped", "$(POD_IP) is escaped"),
        ("cost $5", "cost $5"),
        ("trailing $", "trailing $"),
        ("$(POD_IP", "$(POD_IP"),
        ("$(A)$(A)", "xx"),
    ],
)
def test_expand_follows_kubernetes_rules(text: str, expected: str) -> None:
    assert expand(text, {"POD_IP": "127.42.0.1", "A": "x"}) == expected


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "web"}},
    "spec": {"nodeName": "process-node-0", "serviceAccountName": "default"},
}


def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    data = {
        ("configmap", "ns", "cm"): {"MODE": "fast", "LEVEL": "3"},
        ("secret", "ns", "sec"): {"TOKEN": base64.b64encode(b"s3cret").decode()},
    }
    return data.get((kind, namespace, name))


def test_build_env_resolves_values_refs_and_order() -> None:
    container = {
        "name": "c",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "URL", "value": "http://$(IP):8080/$(NAME)"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "TOKEN"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x", "optional": True}}},
        ],
    }
    env = build_env(POD, container, {"PATH": "/bin"}, pod_ip="127.42.0.7", host_ip="127.0.0.1", lookup=lookup)
    assert env["IP"] == "127.42.0.7"
    assert env["URL"] == "http://127.42.0.7:8080/p"
    assert env["NODE"] == "process-node-0"
    assert env["APP"] == "web"
    assert env["TOKEN"] == "s3cret"
    assert env["CM_MODE"] == "fast"
    assert env["PATH"] == "/bin"
    assert "OPT" not in env


def test_build_env_missing_required_ref_is_a_config_error() -> None:
    container = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "x"}}}],
    }
    with pytest.raises(SpecError) as err:
        build_env(POD, container, {}, pod_ip="127.0.0.2", host_ip="127.0.0.1", lookup=lookup)
    assert err.value.reason == "CreateContainerConfigError"


def test_argv_needs_a_command_and_expands_args() -> None:
    env = {"POD_IP": "127.1.2.3"}
    spec = {"name": "c", "command": ["python", "-m", "http.server"], "args": ["--bind", "$(POD_IP)"]}
    assert build_argv(spec, env) == ["python", "-m", "http.server", "--bind", "127.1.2.3"]
    with pytest.raises(SpecError):
        build_argv({"name": "c", "image": "nginx"}, env)


def test_ports_grace_and_exit_codes() -> None:
    container = {"ports": [{"name": "http", "containerPort": 8080}]}
    assert resolve_port(container, "http") == 8080
    assert resolve_port(container, 9000) == 9000
    assert resolve_port(container, "9001") == 9001
    with pytest.raises(SpecError):
        resolve_port(container, "grpc")
    assert grace_seconds({"spec": {}}) == 30
    assert grace_seconds({"spec": {"terminationGracePeriodSeconds": 5}}) == 5
    assert grace_seconds({"metadata": {"deletionGracePeriodSeconds": 0}, "spec": {}}) == 0
    assert exit_code_of(-9) == 137
    assert exit_code_of(-15) == 143
    assert exit_code_of(3) == 3


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 2, True),
        ("Never", 1, False),
    ],
)
def test_restart_policy(policy: str, code: int, restart: bool) -> None:
    assert should_restart(policy, code) is restart


def test_backoff_doubles_and_caps() -> None:
    assert [backoff_delay(n, 10, 300) for n in range(7)] == [0, 10, 20, 40, 80, 160, 300]


def test_probe_thresholds() -> None:
    probe = ProbeState({"periodSeconds": 1, "failureThreshold": 2, "successThreshold": 1}, started=100.0)
    assert probe.due(100.0)
    probe.record(True, 100.0)
    assert probe.passed and not probe.due(100.5)
    probe.record(False, 101.0)
    assert probe.passed  # one failure is below the threshold
    probe.record(False, 102.0)
    assert probe.failed and not probe.passed


def test_ip_pool_is_unique_and_reuses_released() -> None:
    pool = IpPool(42)
    a, b = pool.allocate(), pool.allocate()
    assert a != b and a.startswith("127.42.")
    pool.release(a)
    assert pool.allocate(preferred=a) == a
    assert pool.allocate(preferred="10.0.0.1") not in (a, b, "10.0.0.1")


def _term(code: int) -> Terminated:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    return Terminated(
        code, "Completed" if code == 0 else "Error", "", t, t + timedelta(seconds=1), "process://1"
    )


def test_phase_and_status_shape() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    rec = ContainerRecord(name="c", image="img")
    assert pod_phase([rec]) == "Pending"
    rec.state, rec.started_at, rec.ever_ran, rec.ready, rec.started = "running", now, True, True, True
    clock = ConditionClock()
    status = pod_status([rec], pod_ip="127.42.1.1", host_ip="127.0.0.1", start_time=now, clock=clock, now=now)
    assert status["phase"] == "Running"
    cs = status["containerStatuses"][0]
    # Explicit nulls: a strategic-merge patch must replace the state, not merge waiting into running.
    assert cs["state"] == {
        "waiting": None,
        "running": {"startedAt": "2026-01-01T00:00:00Z"},
        "terminated": None,
    }
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["status"] == "True"
    later = now + timedelta(seconds=5)
    again = pod_status(
        [rec], pod_ip="127.42.1.1", host_ip="127.0.0.1", start_time=now, clock=clock, now=later
    )
    assert again == status  # nothing changed, so nothing to patch
    rec.state, rec.terminated, rec.final, rec.ready = "terminated", _term(1), True, False
    failed = pod_status(
        [rec], pod_ip="127.42.1.1", host_ip="127.0.0.1", start_time=now, clock=clock, now=later
    )
    assert failed["phase"] == "Failed"
    assert failed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    assert {c["type"]: c for c in failed["conditions"]}["Ready"][
        "lastTransitionTime"
    ] == "2026-01-01T00:00:05Z"
    rec.terminated = _term(0)
    assert pod_phase([rec]) == "Succeeded"


def test_build_env_resource_field_ref_divides_as_the_kubelet_does() -> None:
    ref = {"containerName": "c", "resource": "requests.cpu", "divisor": "1m"}
    container = {
        "name": "c",
        "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}},
        "env": [
            {"name": "MILLI", "valueFrom": {"resourceFieldRef": ref}},
            {"name": "CPUS", "valueFrom": {"resourceFieldRef": {**ref, "divisor": "1"}}},
            {
                "name": "MEM",
                "valueFrom": {"resourceFieldRef": {"resource": "requests.memory", "divisor": "1Mi"}},
            },
        ],
    }
    env = build_env(POD, container, {}, pod_ip="127.42.0.7", host_ip="127.0.0.1", lookup=lookup)
    assert (env["MILLI"], env["CPUS"], env["MEM"]) == ("1500", "2", "1024")  # rounded up, as the kubelet
