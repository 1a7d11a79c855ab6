"""Autoscaling a generation pool on tokens in flight or KV-cache use (``spec.autoscaling.metric``; issue 20
item 4), and the generation figures each worker's status entry carries: the spec's rules, each worker's
load in the metric's unit, the decision (hypothesis: the count asked for is the load over the target,
within the bounds), the phase's sample, Event and window, and the observed worker's status entry."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from modelpool_contract.api import (
    MSG_KV_CACHE_TARGET,
    MSG_TOKENS_TARGET,
    PoolGeneration,
    WorkerGeneration,
    parse_pool_spec,
)
from modelpool_contract.demand import Demand
from modelpool_contract.times import rfc3339_ms
from modelpool_operator.observe.stats import _news as stats_news
from modelpool_operator.observe.worker_state import ObservedWorker, observe_worker
from modelpool_operator.planner import LoadSample, autoscale, plan
from modelpool_operator.planner.autoscale import (
    count_refusals,
    decide,
    observe_load,
    per_worker_target,
    pool_load,
    record,
    worker_load,
)
from modelpool_operator.planner.status import generation_summary
from tests.operator.unit.op_planner import ledger_for, view, w
from tests.operator.unit.op_pods import at
from tests.operator.unit.test_autoscale import NOW, auto_spec, run_until, scaled

CACHE = 2048


def generating(name: str, reserved: int | None, cache: int | None = CACHE, **kw: Any) -> ObservedWorker:
    """A serving worker of the continuous-batching engine with ``reserved`` KV-cache tokens in flight."""
    worker = w(name, "Processing" if reserved else "Ready", in_flight=1 if reserved else 0, **kw)
    return replace(
        worker,
        stats_known=True,
        generation_engine="continuous-batching",
        generations_running=1 if reserved else 0,
        kv_cache_reserved=reserved,
        kv_cache_tokens=cache,
    )


def tokens_spec(target: int = 1000, **overrides: Any) -> Any:
    return auto_spec(autoscaling={"metric": "tokens", "targetTokensPerWorker": target}, **overrides)


def kv_spec(target: float = 0.5, **overrides: Any) -> Any:
    return auto_spec(autoscaling={"metric": "kvCache", "targetKvCache": target}, **overrides)


# ---- the spec --------------------------------------------------------------------------------------------


def _spec(**autoscaling: Any) -> Any:
    body = {"model": {"source": "/m", "task": "text-generation"}, "resources": {"memory": "1Gi"}}
    return parse_pool_spec(body | {"autoscaling": autoscaling, "queue": {"capacity": 5}})


@pytest.mark.parametrize(
    ("autoscaling", "needle"),
    [
        ({"metric": "tokens"}, MSG_TOKENS_TARGET),
        ({"metric": "tokens", "targetTokensPerWorker": 0}, "targetTokensPerWorker"),
        ({"metric": "kvCache"}, MSG_KV_CACHE_TARGET),
        ({"metric": "kvCache", "targetKvCache": 0}, "targetKvCache"),
        ({"metric": "kvCache", "targetKvCache": 1.01}, "targetKvCache"),
        ({"metric": "bytes"}, "metric"),
        ({"targetPerWorker": 6}, "spec.queue.capacity"),  # requests keep the queue's bound
    ],
)
def test_a_metric_needs_its_own_target_in_range(autoscaling: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(needle)):
        _spec(**autoscaling)


def test_the_queue_bound_is_for_requests_only_and_the_default_metric_is_requests() -> None:
    tokens = _spec(metric="tokens", targetTokensPerWorker=4096, targetPerWorker=50).autoscaling
    assert (tokens.metric, per_worker_target(tokens)) == ("tokens", 4096.0)
    assert per_worker_target(_spec(metric="kvCache", targetKvCache=1).autoscaling) == 100.0
    assert _spec(targetPerWorker=5).autoscaling.metric == "requests"


# ---- each worker's load, and the pool's -----------------------------------------------------------------


def test_a_worker_load_is_in_the_metric_unit_and_unknown_without_the_figures() -> None:
    worker = replace(generating("p-a", 512), queue_depth=3)
    assert [worker_load(worker, m) for m in ("requests", "tokens", "kvCache")] == [4, 512.0, 25.0]
    serial = replace(w("p-b", "Ready"), stats_known=True, generation_engine="serial")
    assert (
        worker_load(serial, "requests"),
        worker_load(serial, "tokens"),
        worker_load(serial, "kvCache"),
    ) == (
        0,
        None,
        None,
    )
    # A serial worker's tokens are unknown: the load is partial, so nothing scales down on it.
    assert observe_load([generating("p-a", 512), serial], "tokens") == (512.0, False)
    assert observe_load([serial], "kvCache") == (None, False)


def test_refusals_count_in_tokens_and_held_requests_only_in_requests() -> None:
    before = generating("p-a", 600)
    worker = replace(before, requests_total=10, rejected_total=0, stats_time=100.0, uid="u")
    baseline = count_refusals(worker, None)
    later = replace(worker, requests_total=20, rejected_total=5, stats_time=110.0)
    measured = pool_load([later], {"p-a": baseline} if baseline else {}, None, "tokens")
    assert measured.load == pytest.approx(600 + 600 * 0.5)  # 5 refused per 10 admitted
    loading = [w("p-b", "Loading")]
    assert pool_load(loading, {}, 7, "requests").load == 7
    assert pool_load(loading, {}, 7, "tokens").load is None  # their size in tokens is unknown


# ---- the decision ----------------------------------------------------------------------------------------


def _decide(current: int, spec: Any, load: float) -> Any:
    """The decision for a load steady over both windows, no countdown running."""
    return decide(
        current, spec, NOW, stable_load=load, burst_load=load, complete=True, down_since=None, down_to=None
    )


@given(
    reserved=st.lists(st.integers(0, CACHE), min_size=1, max_size=8),
    target=st.integers(1, CACHE),
    current=st.integers(1, 8),
)
def test_tokens_ask_for_the_reserved_tokens_over_the_target(
    reserved: list[int], target: int, current: int
) -> None:
    spec = tokens_spec(target, maxReplicas=20)
    load, complete = observe_load([generating(f"p-{i}", r) for i, r in enumerate(reserved)], "tokens")
    assert complete and load == sum(reserved)
    d = decide(
        current, spec, NOW, stable_load=load, burst_load=load, complete=True, down_since=None, down_to=None
    )
    assert d.recommended == min(20, max(1, math.ceil(sum(reserved) / target)))
    assert d.desired >= min(d.recommended, 20) or d.desired == current  # up at once; down after the delay
    if d.recommended < 20:
        assert d.recommended * target >= sum(reserved)  # enough workers to bring each to the target


@given(
    uses=st.lists(st.integers(0, 100), min_size=1, max_size=8),
    target=st.integers(1, 100),
)
def test_kv_cache_asks_for_the_mean_use_brought_to_the_target(uses: list[int], target: int) -> None:
    spec = kv_spec(target / 100, maxReplicas=50)
    workers = [generating(f"p-{i}", CACHE * u // 100) for i, u in enumerate(uses)]
    load, _ = observe_load(workers, "kvCache")
    assert load is not None
    d = _decide(1, spec, load)
    mean = sum(uses) / len(uses)
    assert d.recommended == min(50, max(1, math.ceil(round(len(uses) * mean / target, 6))))


# ---- the phase -------------------------------------------------------------------------------------------


def test_autoscale_on_tokens_scales_up_with_the_numbers_and_drops_samples_of_another_metric() -> None:
    workers = [generating("p-a", 2000), generating("p-b", 1500)]
    old = (LoadSample(at(990), 1.0), LoadSample(at(995), 3500.0, "tokens"))
    draft = run_until(autoscale, view(tokens_spec(1000), scaled(2)), workers, load_window=old)
    autoscale(draft)
    assert draft.scaling.window == (LoadSample(at(995), 3500.0, "tokens"), LoadSample(NOW, 3500.0, "tokens"))
    assert draft.target == 4 and draft.scaling.observed_load == 3500
    [event] = draft.events
    assert event.message == "load 3500.0 over 60s (target 1000 tokens per worker): 2 -> 4 workers"
    assert record(old, LoadSample(NOW, 7.0), 60) == (old[0], LoadSample(NOW, 7.0))


def test_autoscale_on_kv_cache_names_the_share() -> None:
    workers = [generating("p-a", CACHE), generating("p-b", CACHE // 2)]  # 100 % and 50 %: 150 > 2 x 50
    draft = run_until(autoscale, view(kv_spec(0.5), scaled(2)), workers, load_window=())
    autoscale(draft)
    assert draft.target == 3
    assert draft.events[0].message == "load 150.0 over 60s (target 50% KV cache per worker): 2 -> 3 workers"


def test_a_pool_at_zero_still_wakes_on_demand_whatever_the_metric() -> None:
    zero = scaled(0, scaled_to_zero_at=rfc3339_ms(at(900)))
    pool = replace(view(tokens_spec(minReplicas=0, replicas=0), zero), demand=Demand(at(999)))
    out = plan(pool, [], ledger_for(None), now=NOW)
    assert out.status.target_replicas == 1 and len(out.create) == 1
    assert out.status.autoscaling.held_requests is None  # not counted in tokens


# ---- the worker's status entry --------------------------------------------------------------------------


def _pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"modelpool.dev/pool": "p"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "server"}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [{"name": "server", "ready": True, "state": {"running": {}}}],
        },
    }


def test_the_worker_status_carries_the_generation_figures_only_for_generating_models() -> None:
    stats = {
        "state": "Processing",
        "generation": {
            "engine": "continuous-batching",
            "kv_cache_tokens": 4096,
            "kv_cache_reserved_tokens": 1024,
            "running": 3,
        },
    }
    entry = observe_worker(_pod("p-a"), stats, NOW).to_status()
    assert entry.generation == WorkerGeneration(
        engine="continuous-batching",
        running=3,
        tokens_in_flight=1024,
        kv_cache_tokens=4096,
        kv_cache_use=0.25,
    )
    assert entry.wire()["generation"] == {
        "engine": "continuous-batching",
        "running": 3,
        "tokensInFlight": 1024,
        "kvCacheTokens": 4096,
        "kvCacheUse": 0.25,
    }
    serial = {"state": "Ready", "generation": {"engine": "serial"}}
    assert observe_worker(_pod("p-b"), serial, NOW).to_status().wire()["generation"] == {"engine": "serial"}
    embedding = observe_worker(_pod("p-c"), {"state": "Ready", "generation": None}, NOW).to_status()
    assert embedding.generation is None and "generation" not in embedding.wire()


def test_the_pool_status_sums_the_serving_workers_figures() -> None:
    loading = replace(generating("p-c", 512), state="Loading")
    workers = [generating("p-a", 1024), generating("p-b", 0), loading]
    serial = replace(w("p-d", "Ready"), stats_known=True, generation_engine="serial")
    summary = generation_summary([*workers, serial])
    assert summary == PoolGeneration(running=1, tokens_in_flight=1024, kv_cache_use=0.25)
    assert generation_summary([serial, w("p-e", "Ready")]) is None
    out = plan(view(tokens_spec(), scaled(2)), workers[:2], ledger_for(None, workers[:2]), now=NOW)
    assert out.status.generation == summary
    assert plan(view(auto_spec(), scaled(1)), [w("p-a")], ledger_for(None), now=NOW).status.generation is None


def test_a_change_of_tokens_in_flight_alone_is_news_for_the_pool() -> None:
    """The scraper wakes the pool's loop when the tokens in flight change though the request count does
    not (one generation ended and a longer one began): under metric tokens that is a new load."""
    before = {"state": "Processing", "in_flight": 1, "generation": {"kv_cache_reserved_tokens": 100}}
    after = before | {"generation": {"kv_cache_reserved_tokens": 900}}
    assert stats_news(before) != stats_news(after)
