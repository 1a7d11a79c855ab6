"""The upgrade check's pure decisions (bench/upgrade/judge.py, drain.py) and its chart values
(bench/upgrade/release.py): what a request came to, a replica's writes outside its leadership in audit
events, the take-over, the workers left on the previous release, a pool's serving gaps during a drain, and
the values each release is installed with."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.soak.clients import Sent
from bench.upgrade import judge
from bench.upgrade.drain import ready_workers, serving_gaps
from bench.upgrade.release import KEYS_NAMESPACE, POOLS_NAMESPACE, Ports, gateway_endpoints, values

T0 = datetime(2026, 12, 6, 9, 0, 0, tzinfo=UTC)
LEASE = "mp-upgrade-leader"
SA = "system:serviceaccount:modelpool-audit:mp-upgrade-modelpool-operator"
# Two replicas of one ServiceAccount, each with a token of its own.
A = f"{SA}#JTI=aaaa"
B = f"{SA}#JTI=bbbb"


def sent(**fields: Any) -> Sent:
    s = Sent("polite-0", "echo-a", start=100.0, deadline=30.0, end=101.0)
    for key, value in fields.items():
        setattr(s, key, value)
    return s


def test_request_outcomes() -> None:
    assert judge.outcome(sent(status=200))[0] == judge.ANSWERED
    assert judge.outcome(sent(status=429, retry_after="5"))[0] == judge.RETRYABLE
    assert judge.outcome(sent(status=503, retry_after="1"))[0] == judge.RETRYABLE
    # A 503 without Retry-After is no documented retryable answer; nor is a 502 with one.
    assert judge.outcome(sent(status=503))[0] == judge.LOST
    assert judge.outcome(sent(status=502, retry_after="1"))[0] == judge.LOST
    assert judge.outcome(sent(status=401))[0] == judge.LOST
    assert judge.outcome(sent(hung_up=True))[0] == judge.HUNG_UP
    assert judge.outcome(sent(error="ConnectError: [Errno 111] Connection refused"))[0] == judge.NOT_CONNECTED
    assert judge.outcome(sent(error="RemoteProtocolError: peer closed connection"))[0] == judge.LOST
    # An answer after the deadline and its grace is lost, whatever it was.
    assert judge.outcome(sent(status=200, end=100.0 + 30.0 + judge.GRACE_S + 1))[0] == judge.LOST


def event(user: str, verb: str, resource: str, name: str, at: datetime, *, code: int = 200) -> dict[str, Any]:
    return {
        "user": {"username": SA, "extra": {judge.CREDENTIAL_ID: [user.split("#")[1]]}},
        "verb": verb,
        "objectRef": {"resource": resource, "name": name, "namespace": "ns"},
        "requestReceivedTimestamp": at.isoformat().replace("+00:00", "Z"),
        "responseStatus": {"code": code},
    }


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_caller_is_the_user_and_its_token() -> None:
    assert judge.caller(event(A, "get", "pods", "p", s(0))) == A
    assert judge.caller({"user": {"username": "admin"}}) == "admin#"


def test_takeover_first_act_and_refusals_from_the_audit_log() -> None:
    events = [
        event(A, "create", "leases", LEASE, s(0), code=201),
        event(A, "create", "pods", "w-1", s(1), code=201),
        event(B, "get", "leases", LEASE, s(12)),
        event(B, "update", "leases", LEASE, s(15), code=409),  # a lost race is no take-over
        event(B, "create", "pods", "w-0", s(15.5), code=403),  # refused: no act
        event(B, "update", "leases", "other-lease", s(16)),  # another Lease is an act, not the election
        event(B, "update", "leases", LEASE, s(27)),
        event(B, "create", "pods", "w-2", s(28), code=201),
    ]
    killed = s(10)
    assert judge.acquired_at(events, A, LEASE, s(-1)) == s(0)
    assert judge.acquired_at(events, B, LEASE, killed) == s(27)
    assert judge.first_act(events, B, LEASE, killed) == s(16)
    assert judge.acquired_at(events, B, LEASE, s(30)) is None
    assert judge.refused(events, B) == ["create pods ns/w-0"]
    assert judge.refused(events, A) == []


def test_writes_while_not_the_leader() -> None:
    events = [
        event(A, "create", "leases", LEASE, s(0), code=201),
        event(A, "patch", "modelpools", "p", s(5)),
        event(A, "get", "pods", "w", s(12)),  # reads are not writes
        event(A, "patch", "modelpools", "p", s(12)),  # after its kill at 10 s: impossible, so reported
        event(B, "update", "leases", LEASE, s(3)),  # Lease writes are the election itself
        event(B, "create", "pods", "w", s(4)),  # while A led
        event(B, "create", "pods", "w", s(30)),
    ]
    held = {A: [(s(0), s(10))], B: [(s(27), s(60))]}
    a = judge.writes_while_not_leader(events, A, LEASE, held[A])
    b = judge.writes_while_not_leader(events, B, LEASE, held[B])
    assert len(a) == 1 and "patch modelpools ns/p" in a[0]
    assert len(b) == 1 and "create pods ns/w" in b[0] and "09:00:04" in b[0]
    # A replica that never held the Lease may not write at all.
    assert len(judge.writes_while_not_leader(events, B, LEASE, [])) == 2


def pod(name: str, created: datetime, image: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "creationTimestamp": created.isoformat().replace("+00:00", "Z")},
        "spec": {"containers": [{"name": "server", "image": image}]},
    }


def test_workers_not_on_the_new_release() -> None:
    new = "ghcr.io/modelpool/modelpool-server:0.3.0"
    workers = [
        judge.worker_check(pod("kept", s(0), new)),
        judge.worker_check(pod("old-image", s(20), "ghcr.io/modelpool/modelpool-server:0.2.0")),
        judge.worker_check(pod("rolled", s(20), new)),
    ]
    left = judge.not_upgraded(workers, s(10), new)
    assert [line.split(":")[0] for line in left] == ["kept", "old-image"]
    assert "not rolled" in left[0]


PORTS = Ports(liveness=1, metrics=2, gateway=3, gateway_metrics=4, server=5, server_probe=6)


def test_the_previous_release_runs_its_own_code_with_its_charts_keys() -> None:
    old = values(ports=PORTS, budget_memory="8Gi", old_tree=Path("/tmp/old"))
    assert old["command"][:2] == ["env", "PYTHONPATH=/tmp/old/operator:/tmp/old"]
    assert old["command"][2].endswith("/modelpool-operator")
    assert old["gateway"]["command"][2].endswith("/modelpool-gateway")
    # Keys the 0.2.0 chart does not know would be refused by its schema.
    assert "updateStrategy" not in old and "metrics" not in old["gateway"] and "auth" not in old["gateway"]
    assert old["scope"]["namespaces"] == [POOLS_NAMESPACE]
    assert old["budget"] == {"create": True, "memory": "8Gi"}


def test_the_upgrade_follows_the_upgrade_notes() -> None:
    new = values(ports=PORTS, budget_memory="8Gi", old_tree=None)
    assert len(new["command"]) == 1 and new["command"][0].endswith("/.venv/bin/modelpool-operator")
    # One replica and Recreate for the upgrade from Kopf peering; rollingUpdate removed (null), which
    # the API refuses beside Recreate.
    assert new["replicaCount"] == 1
    assert new["updateStrategy"] == {"type": "Recreate", "rollingUpdate": None}
    assert new["gateway"]["auth"] == {"keysNamespace": KEYS_NAMESPACE, "createKeysNamespace": False}
    assert "modelpool.dev/process-node" in new["config"]["allowedNodeSelectorKeys"]
    assert "modelpool.dev/process-node" in new["config"]["allowedTolerationKeys"]
    assert set(new["config"]["allowedEnvNames"]) == {"MODELPOOL_HANDLER", "PYTHONPATH"}
    # The same worker ports under both releases: the pods' shape changes only by the releases' code.
    old = values(ports=PORTS, budget_memory="8Gi", old_tree=Path("/tmp/old"))
    assert (new["config"]["serverPort"], new["config"]["serverProbePort"]) == (
        old["config"]["serverPort"],
        old["config"]["serverProbePort"],
    )


def test_serving_gaps_from_samples() -> None:
    assert serving_gaps([(0.0, 2), (1.0, 1), (2.0, 2)]) == []
    assert serving_gaps([(0.0, 2), (1.0, 0), (2.0, 0), (3.5, 1), (4.0, 0), (5.0, 2)]) == [
        (1.0, 3.5),
        (4.0, 5.0),
    ]
    # Still without a worker at the last sample: the gap ends there.
    assert serving_gaps([(0.0, 0), (2.0, 0)]) == [(0.0, 2.0)]
    assert serving_gaps([]) == []


def worker(pool: str, ready: bool, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {"modelpool.dev/pool": pool}}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-06T09:00:00Z"
    return {"metadata": meta, "status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_ready_workers_leaves_out_terminating_and_other_pools() -> None:
    pods = [worker("p", True), worker("p", True, deleting=True), worker("p", False), worker("q", True)]
    assert ready_workers(pods, "p") == 1


def test_gateway_endpoints_are_the_ready_pods_not_terminating() -> None:
    def gw(ip: str, ready: bool, deleting: bool = False) -> dict[str, Any]:
        pod = worker("gw", ready, deleting)
        pod["status"]["podIP"] = ip
        return pod

    pods = [gw("127.1.1.1", True), gw("127.1.1.2", False), gw("127.1.1.3", True, deleting=True)]
    pods.append(worker("gw", True))  # no address yet
    assert gateway_endpoints(pods, 8080) == ["http://127.1.1.1:8080"]
