"""Readiness from the watches' health: a watch failing longer than the bound is stale and named."""

from __future__ import annotations

from modelpool_gateway.routes import readiness
from modelpool_gateway.watch import WatchHealth, stale_watches

WATCHES = ["modelpools@a", "pods@a"]


def test_a_watch_failing_longer_than_the_bound_is_stale_and_named_with_its_error() -> None:
    health = WatchHealth()
    for name in WATCHES:
        health.ok(name, listed=True)
    health.failed("pods@a", "API 503: unavailable", now=100.0)
    health.failed("pods@a", "ClientConnectorError: refused", now=110.0)  # still failing since 100
    assert stale_watches(health.states, 129.0, 30) == []
    assert stale_watches(health.states, 141.0, 30) == [
        "pods@a: no successful list or watch for 41 s: ClientConnectorError: refused"
    ]
    health.ok("pods@a")  # an event, or a list: healthy again
    assert stale_watches(health.states, 200.0, 30) == []
    health.failed("pods@a", "API 500: x", now=300.0)  # a new failure counts from itself
    assert stale_watches(health.states, 320.0, 30) == []


def test_readiness_waits_for_every_list_then_follows_staleness() -> None:
    health = WatchHealth()
    doc = readiness(WATCHES, {"pods@a"}, health, 0.0, 30)
    assert doc == {"ready": False, "waitingFor": ["modelpools@a"], "stale": []}
    assert readiness(WATCHES, set(WATCHES), health, 0.0, 30)["ready"]
    health.failed("modelpools@a", "API 503: x", now=0.0)
    doc = readiness(WATCHES, set(WATCHES), health, 31.0, 30)
    assert not doc["ready"] and doc["waitingFor"] == [] and doc["stale"][0].startswith("modelpools@a: ")
