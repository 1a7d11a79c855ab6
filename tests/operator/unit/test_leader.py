"""Leader election's pure decisions (``modelpool_operator.leader``) and its wiring against an in-memory Lease
API that keeps resourceVersions as the API server does (a stale update is answered 409).

The safety property (hypothesis): whatever the timings allowed by the settings' validation, a candidate
never decides it may take a Lease while the holder whose renewal it observed has not yet been fenced.
The real API server and real processes: tests/operator/integration/test_leader_election.py.
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.settings import ConfigError
from modelpool_operator.leader import (
    Action,
    Fence,
    LeaderElector,
    LeaseRecord,
    Observation,
    Timing,
    acquired_record,
    check_timing,
    decide,
    default_identity,
    fenced,
    micro_time,
    observe,
    released_record,
)
from modelpool_operator.main import build_parser, config_from_args

WALL = datetime(2026, 12, 6, 6, 0, 0, 123456, tzinfo=UTC)


def record(holder: str, duration: int = 15, renew: str = "r1") -> LeaseRecord:
    return LeaseRecord(holder=holder, lease_duration_s=duration, renew_time=renew)


# ---- decide ---------------------------------------------------------------------------------------------


def test_no_lease_is_created() -> None:
    assert decide("a", None, 0.0) is Action.CREATE


def test_own_lease_is_renewed_even_when_old() -> None:
    # The same pod restarted (the kubelet keeps POD_NAME): it takes its lease back at once.
    assert decide("a", Observation(record("a"), 0.0), 10_000.0) is Action.RENEW


def test_released_lease_is_taken_at_once() -> None:
    assert decide("b", Observation(record("", duration=1), 100.0), 100.0) is Action.ACQUIRE


def test_held_lease_waits_until_unchanged_for_its_duration() -> None:
    seen = Observation(record("a", duration=15), 100.0)
    assert decide("b", seen, 100.0) is Action.WAIT
    assert decide("b", seen, 114.99) is Action.WAIT
    assert decide("b", seen, 115.0) is Action.ACQUIRE


def test_observation_time_is_kept_while_the_record_is_unchanged() -> None:
    first = observe(None, record("a", renew="r1"), 1.0)
    assert observe(first, record("a", renew="r1"), 9.0) is first
    renewed = observe(first, record("a", renew="r2"), 9.0)
    assert renewed.observed_at == 9.0


def test_records_written() -> None:
    taken = acquired_record("b", record("a"), Action.ACQUIRE, 15, WALL)
    assert (taken.holder, taken.lease_duration_s, taken.transitions) == ("b", 15, 1)
    assert taken.acquire_time == taken.renew_time == micro_time(WALL) == "2026-12-06T06:00:00.123456Z"
    renewed = acquired_record("b", taken, Action.RENEW, 15, WALL.replace(second=2))
    assert renewed.acquire_time == taken.acquire_time and renewed.transitions == 1
    assert renewed.renew_time == "2026-12-06T06:00:02.123456Z"
    assert acquired_record("a", None, Action.CREATE, 15, WALL).transitions == 0
    released = released_record(renewed, WALL)
    assert (released.holder, released.lease_duration_s) == ("", 1)
    with pytest.raises(ValueError, match="nothing to write"):
        acquired_record("b", record("a"), Action.WAIT, 15, WALL)


def test_fence() -> None:
    assert not fenced(None, 1e9, 10)
    assert not fenced(100.0, 109.9, 10)
    assert fenced(100.0, 110.0, 10)
    now = [0.0]
    fence = Fence(10, clock=lambda: now[0])
    assert not fence.expired()
    fence.renewed(5.0)
    now[0] = 14.9
    assert not fence.expired()
    now[0] = 15.0
    assert fence.expired()


@given(
    duration=st.integers(min_value=2, max_value=120),
    deadline_frac=st.floats(min_value=0.05, max_value=0.99),
    renewed_at=st.floats(min_value=0, max_value=1e6),
    seen_after=st.floats(min_value=0, max_value=60),
    now_after=st.floats(min_value=0, max_value=300),
)
def test_a_candidate_never_takes_a_lease_whose_holder_still_acts(
    duration: int, deadline_frac: float, renewed_at: float, seen_after: float, now_after: float
) -> None:
    """The holder's renewal started at ``renewed_at`` (its fence counts from then); the candidate saw the
    renewed record no earlier (``seen_after`` later: the write, then its read). At any later ``now``,
    either the holder is fenced or the candidate waits."""
    renew_deadline = duration * deadline_frac
    assert check_timing(duration, renew_deadline, renew_deadline / 2) is None
    seen = Observation(record("holder", duration=duration), renewed_at + seen_after)
    now = renewed_at + now_after
    holder_acts = not fenced(renewed_at, now, renew_deadline)
    candidate_takes = decide("candidate", seen, max(now, seen.observed_at)) is not Action.WAIT
    assert not (holder_acts and candidate_takes)


# ---- the settings ---------------------------------------------------------------------------------------


def test_timing_is_validated() -> None:
    assert check_timing(15, 10, 2) is None
    assert "shorter than the lease duration" in (check_timing(10, 10, 2) or "")
    assert "shorter than the renew deadline" in (check_timing(15, 10, 10) or "")
    with pytest.raises(ValueError):
        Timing(lease_duration=5, renew_deadline=6, retry_period=1)


def _config(*argv: str) -> Any:
    return config_from_args(build_parser().parse_args(list(argv)))


def test_settings_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config()
    assert config.leader_election is False
    assert config.lease_timing == Timing(12, 8, 2)
    monkeypatch.setenv("MODELPOOL_OPERATOR_LEADER_ELECTION", "true")
    with pytest.raises(ConfigError, match="leader_election_namespace or own_namespace"):
        _config()
    monkeypatch.setenv("MODELPOOL_OPERATOR_OWN_NAMESPACE", "mp-system")
    assert _config().lease_namespace == "mp-system"
    assert _config("--leader-election-namespace", "other").lease_namespace == "other"
    with pytest.raises(ConfigError, match=r"renew deadline .* must be shorter than the lease duration"):
        _config("--leader-election-renew-deadline-seconds", "20")


def test_identity_is_the_pod_name_else_host_and_pid() -> None:
    assert default_identity({"POD_NAME": "op-7d9-x"}) == "op-7d9-x"
    assert default_identity({}).count("_") >= 1


# ---- the wiring, against an in-memory API with resourceVersions -------------------------------------------


@dataclass
class FakeLeases:
    """``CoordinationV1Api``'s three calls the elector uses, on one stored Lease (dict form)."""

    stored: dict[str, Any] | None = None
    version: int = 0
    fail: bool = False
    writes: list[str] = field(default_factory=list)

    def _answer(self) -> Any:
        assert self.stored is not None
        spec = self.stored["spec"]
        return SimpleNamespace(spec=dict(spec), metadata=SimpleNamespace(resource_version=str(self.version)))

    async def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.fail:
            raise ApiException(status=503)
        if self.stored is None:
            raise ApiException(status=404)
        return self._answer()

    async def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.stored is not None:
            raise ApiException(status=409)
        self.stored, self.version = copy.deepcopy(body), self.version + 1
        self.writes.append(f"create {body['spec']['holderIdentity']}")
        return self._answer()

    async def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.fail:
            raise ApiException(status=503)
        if body["metadata"].get("resourceVersion") != str(self.version):
            raise ApiException(status=409)
        self.stored, self.version = copy.deepcopy(body), self.version + 1
        self.writes.append(f"replace {body['spec']['holderIdentity']}")
        return self._answer()


def _elector(api: FakeLeases, identity: str, now: list[float]) -> LeaderElector:
    timing = Timing(15, 10, 2)
    return LeaderElector(
        api, name="op", namespace="ns", identity=identity, timing=timing,
        fence=Fence(timing.renew_deadline, clock=lambda: now[0]), clock=lambda: now[0],
    )  # fmt: skip


async def test_two_candidates_one_leader_then_takeover_after_the_lease_duration() -> None:
    api, now = FakeLeases(), [0.0]
    a, b = _elector(api, "a", now), _elector(api, "b", now)
    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    assert b.holder() == "a"
    now[0] = 14.0  # a renews no more (killed): b waits the whole duration from when it saw the record
    assert await b.try_acquire_or_renew() is False
    now[0] = 15.0
    assert await b.try_acquire_or_renew() is True
    assert api.stored is not None and api.stored["spec"]["leaseTransitions"] == 1
    # a comes back with its stale view: its update carries the old resourceVersion, or it sees b's record.
    assert await a.try_acquire_or_renew() is False
    assert a.holder() == "b"
    assert api.writes == ["create a", "replace b"]


async def test_a_stale_write_loses_the_race() -> None:
    api, now = FakeLeases(), [0.0]
    a, b = _elector(api, "a", now), _elector(api, "b", now)
    assert await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    now[0] = 20.0
    # Both saw the lease expire; b reads first, then a renews in between: b's update carries a stale
    # resourceVersion and is refused.
    real_read = api.read_namespaced_lease

    async def read_then_a_renews(name: str, namespace: str, **kw: Any) -> Any:
        answer = await real_read(name, namespace, **kw)
        api.read_namespaced_lease = real_read  # type: ignore[method-assign]
        assert await a.try_acquire_or_renew()
        return answer

    api.read_namespaced_lease = read_then_a_renews  # type: ignore[method-assign]
    assert await b.try_acquire_or_renew() is False
    assert api.stored is not None and api.stored["spec"]["holderIdentity"] == "a"


async def test_release_lets_the_standby_in_at_once() -> None:
    api, now = FakeLeases(), [0.0]
    a, b = _elector(api, "a", now), _elector(api, "b", now)
    assert await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()
    await a.release()
    assert api.stored is not None and api.stored["spec"]["holderIdentity"] is None
    assert await b.try_acquire_or_renew()  # no wait for the lease duration


async def test_failed_renewals_fence_the_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API fails every renewal: the leader exits (``lost``) once the renew deadline has passed, and
    not before."""
    api, now = FakeLeases(), [0.0]
    a = _elector(api, "a", now)
    a.timing = Timing(15, 10, 0.01)
    assert await a.try_acquire_or_renew()
    exits: list[str] = []

    def lost(reason: str) -> None:
        exits.append(reason)
        raise asyncio.CancelledError

    monkeypatch.setattr("modelpool_operator.leader.lost", lost)
    api.fail = True
    renewing = asyncio.create_task(a.keep_renewing())
    await asyncio.sleep(0.05)
    assert not exits and not renewing.done()  # failing, but within the deadline
    now[0] = 10.0
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(renewing, 5)
    assert exits and "renew deadline" in exits[0]


async def test_a_standby_answers_its_liveness_probe_and_stops_on_sigterm() -> None:
    """While another replica leads, ``lead`` stands by: /healthz answers 200 (Kopf, which serves it, has not
    started: the kubelet would kill the standby otherwise), nothing runs, and SIGTERM ends it with 0."""
    import os
    import signal

    import httpx

    from modelpool_operator.leader import lead
    from testkit.environment import free_port

    api, now = FakeLeases(), [0.0]
    assert await _elector(api, "a", now).try_acquire_or_renew()
    standby = _elector(api, "b", now)
    port = free_port()
    ran: list[bool] = []
    leading: list[bool] = []

    async def work() -> None:
        ran.append(True)

    task = asyncio.create_task(lead(standby, work, on_leading=leading.append, liveness_port=port))
    async with httpx.AsyncClient() as client:
        for _ in range(100):
            try:
                answer = await client.get(f"http://127.0.0.1:{port}/healthz")
                break
            except httpx.ConnectError:
                await asyncio.sleep(0.05)
    assert answer.status_code == 200 and answer.json() == {"standby": "b", "leader": "a"}
    os.kill(os.getpid(), signal.SIGTERM)
    assert await asyncio.wait_for(task, 10) == 0
    assert not ran and leading == [False]
    assert api.writes == ["create a"]
