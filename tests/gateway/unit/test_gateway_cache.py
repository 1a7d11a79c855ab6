"""The registry: routable workers per pool, the name index, notifications and relists."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from modelpool_gateway.cache import Registry
from modelpool_gateway.names import Resolved
from modelpool_gateway.state import HostPod, Key, Pool, Worker

POOL: Key = ("ns", "minilm")
NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def worker(name: str, *, ready: bool = True, pool: str = "minilm", namespace: str = "ns") -> Worker:
    return Worker(namespace, name, pool, "10.0.0.1", 8000, serving=True, ready=ready, deleting=False)


def test_routable_workers_follow_pod_changes_and_notify_only_on_change() -> None:
    registry = Registry()
    seen: list[Key] = []
    registry.subscribe(seen.append)
    registry.set_worker(worker("w0", ready=False))
    assert not registry.has_routable(POOL) and seen == []
    registry.set_worker(worker("w0"))
    assert [w.name for w in registry.routable(POOL)] == ["w0"] and seen == [POOL]
    registry.set_worker(worker("w0"))  # the same again (a resync): no notification
    assert seen == [POOL]
    registry.set_worker(worker("w0", ready=False))
    assert not registry.has_routable(POOL) and seen == [POOL, POOL]
    registry.set_worker(worker("w1"))
    registry.delete_worker(("ns", "w1"))
    assert not registry.has_routable(POOL) and len(seen) == 4


def test_pools_feed_the_name_index() -> None:
    registry = Registry()
    registry.set_pool(Pool("ns", "minilm"))
    assert registry.index.resolve("minilm") == Resolved(POOL)
    registry.set_pool(Pool("ns", "minilm", served_model_name="mini"))
    assert registry.index.resolve("mini") == Resolved(POOL)
    registry.delete_pool(POOL)
    assert registry.pool(POOL) is None
    assert registry.index.resolve("mini") != Resolved(POOL)


def test_the_demand_read_from_the_lease_outlives_pool_events() -> None:
    """The watch's pool objects carry no demand (it is in the pool's Lease): what the demand recorder read
    stays until the pool is another one (a new uid)."""
    registry = Registry()
    registry.set_pool(Pool("ns", "minilm", uid="u-1"))
    registry.record_demand(POOL, NOW)
    registry.set_pool(Pool("ns", "minilm", uid="u-1", phase="ScaledToZero"))
    pool = registry.pool(POOL)
    assert pool is not None and (pool.demanded_at, pool.phase) == (NOW, "ScaledToZero")
    registry.set_pool(Pool("ns", "minilm", uid="u-2"))
    assert (registry.pool(POOL) or pool).demanded_at is None
    registry.record_demand(("ns", "gone"), NOW)  # a pool the registry does not know: nothing
    assert registry.pool(("ns", "gone")) is None


def test_a_relist_replaces_only_its_scope() -> None:
    registry = Registry()
    registry.replace_pools(None, [Pool("a", "p1"), Pool("b", "p2")])
    registry.replace_workers(
        None, [worker("w1", pool="p1", namespace="a"), worker("w2", pool="p2", namespace="b")]
    )
    # Namespace a is relisted: p1 and w1 were deleted meanwhile, p3 was created.
    registry.replace_pools("a", [Pool("a", "p3")])
    registry.replace_workers("a", [])
    assert set(registry.pools) == {("a", "p3"), ("b", "p2")}
    assert not registry.has_routable(("a", "p1"))
    assert registry.has_routable(("b", "p2"))


def test_nothing_of_the_gateways_own_namespace_enters_the_registry(caplog: pytest.LogCaptureFixture) -> None:
    """Pools are never served from the release namespace (issue 30): its pools, workers and host pods are
    skipped however they arrive (a cluster-wide list or event), and the first pool skipped is logged once."""
    registry = Registry(own_namespace="mp-system")
    seen: list[Key] = []
    registry.subscribe(seen.append)
    with caplog.at_level(logging.WARNING, logger="modelpool.gateway.registry"):
        registry.replace_pools(None, [Pool("mp-system", "seed-reader"), Pool("ns", "minilm")])
        registry.set_pool(Pool("mp-system", "another"))
        registry.set_worker(worker("w0", namespace="mp-system", pool="seed-reader"))
        registry.set_host_pod(
            HostPod("mp-system", "h0", "host", "10.0.0.2", 8000, True, False, {"seed-reader": "Ready"})
        )
    assert set(registry.pools) == {POOL}
    assert registry.index.resolve("seed-reader") != Resolved(("mp-system", "seed-reader"))
    assert not registry.workers and not registry.host_pods and ("mp-system", "seed-reader") not in seen
    skipped = [r.getMessage() for r in caplog.records if "never routed" in r.getMessage()]
    assert len(skipped) == 1 and "mp-system/seed-reader" in skipped[0], skipped
