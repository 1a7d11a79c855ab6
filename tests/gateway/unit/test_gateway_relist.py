"""A relist of a thousand pools rebuilds the name index once, not once per pool (the gateway watching every
pool of bench.controlplane --pools 1000: a million index entries per relist)."""

from __future__ import annotations

import pytest

from modelpool_gateway import cache
from modelpool_gateway.cache import Registry
from modelpool_gateway.names import NameIndex, Resolved
from modelpool_gateway.state import Key, Pool


def test_a_relist_builds_the_name_index_once_and_then_notifies(monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[int] = []

    def counted(pools: object) -> NameIndex:
        index = NameIndex.build(pools)  # type: ignore[arg-type]
        builds.append(len(index.keys))
        return index

    registry = Registry()
    registry.set_pool(Pool("old", "gone"))
    seen: list[Key] = []
    registry.subscribe(
        lambda key: seen.append(key) if isinstance(registry.index.resolve(key[1]), Resolved) else None
    )
    monkeypatch.setattr(cache, "NameIndex", type("Counted", (), {"build": staticmethod(counted)}))
    registry.replace_pools(None, [Pool("ns", f"p{i}") for i in range(1000)])
    assert builds == [1000]
    assert registry.index.resolve("p999") == Resolved(("ns", "p999"))
    # Each listener ran with the whole index in place: every new pool resolved when it was told.
    assert len(seen) == 1000 and "gone" not in {name for _, name in seen}
    registry.replace_pools(None, [Pool("ns", f"p{i}") for i in range(1000)])  # the same again
    assert builds == [1000]
