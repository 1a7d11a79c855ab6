"""Routing a shared pool (``spec.host``) to the host pods that hold its model: the pure choice (awake first,
else sleeping, else hold), the host pod's view, the registry's index of pools by host pod, and why a held
request for a shared pool is answered as it is."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio import client

from modelpool_contract.placements import ANNOTATION_MODELS, LABEL_HOST, models_annotation
from modelpool_contract.states import WorkerState
from modelpool_gateway.cache import Registry
from modelpool_gateway.hold import hold_reason, hopeless
from modelpool_gateway.picker import ASLEEP, AWAKE, Candidate, pick, shared_candidates
from modelpool_gateway.state import HostPod, Key, Pool, host_pod_from_pod, pool_from_object
from modelpool_gateway.watch import host_pod_watch

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
POOL: Key = ("ns", "minilm")
STATES: list[str] = [
    "Pending",
    "Loading",
    "Ready",
    "Processing",
    "Idle",
    "Sleeping",
    "Waking",
    "Evicting",
    "Failed",
]


def host_pod(name: str, models: dict[str, str], *, host: str = "gpu", ready: bool = True) -> HostPod:
    return HostPod("ns", name, host, "127.0.0.1", 8000, ready=ready, deleting=False, models=models)


def shared_pool(**fields: Any) -> Pool:
    return Pool("ns", "minilm", host="gpu", **fields)


def names(pods: list[HostPod]) -> list[str]:
    return sorted(p.name for p in pods)


# ---- the choice (pure) ----


def test_awake_hosts_are_chosen_before_sleeping_ones() -> None:
    pods = [
        host_pod("h0", {"minilm": "Sleeping"}),
        host_pod("h1", {"minilm": "Idle"}),
        host_pod("h2", {"minilm": "Processing"}),
        host_pod("h3", {"minilm": "Loading"}),
    ]
    assert names(shared_candidates("minilm", "gpu", pods)) == ["h1", "h2"]


def test_sleeping_hosts_when_none_is_awake_and_none_while_loading_or_waking() -> None:
    pods = [host_pod("h0", {"minilm": "Sleeping"}), host_pod("h1", {"minilm": "Waking"})]
    assert names(shared_candidates("minilm", "gpu", pods)) == ["h0"]
    starting = [host_pod("h0", {"minilm": "Loading"}), host_pod("h1", {"minilm": "Waking"})]
    assert shared_candidates("minilm", "gpu", starting) == []
    assert shared_candidates("minilm", "gpu", []) == []


def test_unreachable_other_hosts_and_other_models_are_never_candidates() -> None:
    pods = [
        host_pod("h0", {"minilm": "Ready"}, ready=False),  # not Ready: its awake model does not count
        host_pod("h1", {"minilm": "Ready"}, host="other"),  # another ModelHost's pod (a stale placement)
        host_pod("h2", {"gpt": "Ready"}),
        host_pod("h3", {"minilm": "Sleeping"}),
    ]
    assert names(shared_candidates("minilm", "gpu", pods)) == ["h3"]


def test_the_least_loaded_awake_host_is_picked_by_its_whole_load() -> None:
    """The load is the host pod's: requests of other pools to the same pod count too."""
    pods = shared_candidates(
        "minilm", "gpu", [host_pod("h0", {"minilm": "Ready"}), host_pod("h1", {"minilm": "Idle"})]
    )
    loads = {("ns", "h0"): 3, ("ns", "h1"): 1}
    chosen = pick([Candidate(p.key, loads[p.key]) for p in pods])
    assert chosen == ("ns", "h1")


@given(st.lists(st.tuples(st.sampled_from(STATES), st.booleans()), max_size=8))
def test_never_a_sleeping_host_while_an_awake_one_can_be_reached(placed: list[tuple[str, bool]]) -> None:
    pods = [host_pod(f"h{i}", {"minilm": state}, ready=ready) for i, (state, ready) in enumerate(placed)]
    chosen = shared_candidates("minilm", "gpu", pods)
    awake = [p for p in pods if p.reachable and p.models["minilm"] in AWAKE]
    asleep = [p for p in pods if p.reachable and p.models["minilm"] in ASLEEP]
    assert chosen == (awake or asleep)


# ---- the views ----


def test_a_host_pod_is_read_with_its_placements() -> None:
    pod = {
        "metadata": {
            "namespace": "ns",
            "name": "gpu-0",
            "labels": {LABEL_HOST: "gpu"},
            "annotations": {ANNOTATION_MODELS: models_annotation({"minilm": "Sleeping", "gpt": "Ready"})},
        },
        "spec": {"containers": [{"name": "server", "ports": [{"name": "http", "containerPort": 9000}]}]},
        "status": {"podIP": "127.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    view = host_pod_from_pod(pod)
    assert view == HostPod(
        "ns", "gpu-0", "gpu", "127.0.0.9", 9000, True, False, {"minilm": "Sleeping", "gpt": "Ready"}
    )
    upstream = view.upstream("minilm")
    assert (upstream.key, upstream.pool, upstream.base_url, upstream.routable) == (
        ("ns", "gpu-0"), "minilm", "http://127.0.0.9:9000", True
    )  # fmt: skip
    assert host_pod_from_pod({"metadata": {"name": "worker", "labels": {}}}) is None
    unreadable = {
        "metadata": {"name": "gpu-1", "labels": {LABEL_HOST: "gpu"}, "annotations": {ANNOTATION_MODELS: "{"}}
    }
    assert host_pod_from_pod(unreadable) == HostPod("", "gpu-1", "gpu", None, 8000, False, False, {})


def test_a_shared_pool_sends_its_pools_name_upstream() -> None:
    """As a worker's: a served name may hold a "/", which a v2 URL's model segment cannot carry."""
    spec = {
        "model": {"source": "hf://x/y", "task": "text-embedding"},
        "resources": {"memory": "1Gi"},
        "host": "gpu",
        "servedModelName": "x/minilm",
    }
    pool = pool_from_object({"metadata": {"namespace": "ns", "name": "minilm"}, "spec": spec})
    assert (pool.host, pool.model_name) == ("gpu", "minilm")
    assert Pool("ns", "minilm", host="gpu").model_name == "minilm"
    assert Pool("ns", "minilm", served_model_name="x/minilm").model_name == "minilm"  # a worker: its pool's


# ---- the registry ----


def test_the_registry_routes_a_shared_pool_to_its_hosts_and_tells_its_holds() -> None:
    registry = Registry()
    seen: list[Key] = []
    registry.subscribe(seen.append)
    registry.set_pool(shared_pool())
    registry.set_host_pod(host_pod("h0", {"minilm": "Loading", "gpt": "Ready"}))
    assert not registry.has_routable(POOL) and registry.placed(POOL) == [("h0", "Loading")]
    assert ("ns", "gpt") in seen and POOL in seen
    seen.clear()
    registry.set_host_pod(host_pod("h0", {"minilm": "Ready", "gpt": "Ready"}))
    assert [w.name for w in registry.routable(POOL)] == ["h0"] and POOL in seen
    registry.set_host_pod(host_pod("h1", {"minilm": "Idle"}))
    assert sorted(w.name for w in registry.routable(POOL)) == ["h0", "h1"]
    seen.clear()
    registry.set_host_pod(host_pod("h0", {"gpt": "Ready"}))  # unloaded from h0: h0 is told for minilm too
    assert [w.name for w in registry.routable(POOL)] == ["h1"] and POOL in seen
    registry.delete_host_pod(("ns", "h1"))
    assert not registry.has_routable(POOL) and registry.placed(POOL) == []


def test_a_relist_drops_host_pods_gone_meanwhile() -> None:
    registry = Registry()
    registry.set_pool(shared_pool())
    registry.set_host_pod(host_pod("h0", {"minilm": "Ready"}))
    registry.replace_host_pods("ns", [host_pod("h1", {"minilm": "Sleeping"})])
    assert [w.name for w in registry.routable(POOL)] == ["h1"]
    registry.replace_host_pods("other", [])  # another namespace's relist leaves these alone
    assert registry.has_routable(POOL)
    registry.replace_host_pods("ns", [])
    assert not registry.has_routable(POOL)


def test_a_dedicated_pool_of_the_same_name_ignores_host_placements() -> None:
    registry = Registry()
    registry.set_pool(Pool("ns", "minilm"))
    registry.set_host_pod(host_pod("h0", {"minilm": "Ready"}))
    assert not registry.has_routable(POOL) and registry.placed(POOL) == []


def test_the_host_pod_watch_selects_host_pods_and_feeds_the_registry() -> None:
    registry = Registry()
    registry.set_pool(shared_pool())
    # The list calls are never made here: the test feeds the spec's callbacks as the watch loop would.
    core = cast(
        client.CoreV1Api, SimpleNamespace(list_namespaced_pod=print, list_pod_for_all_namespaces=print)
    )
    spec = host_pod_watch(registry, core, "ns")
    assert (spec.selector, spec.name, spec.resource) == (LABEL_HOST, "host-pods@ns", "pods")
    pod = {
        "metadata": {
            "namespace": "ns",
            "name": "h0",
            "labels": {LABEL_HOST: "gpu"},
            "annotations": {ANNOTATION_MODELS: models_annotation({"minilm": "Idle"})},
        },
        "status": {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert spec.slim is not None
    spec.on_list([spec.slim(pod), spec.slim({"metadata": {"name": "worker"}})])
    assert [w.name for w in registry.routable(POOL)] == ["h0"]
    spec.on_event("DELETED", pod)
    assert not registry.has_routable(POOL)
    spec.on_event("ADDED", pod)
    assert registry.has_routable(POOL)


# ---- why a held request for a shared pool is answered as it is ----


def test_loading_or_waking_on_a_host_is_named() -> None:
    reason = hold_reason(shared_pool(), NOW, [("h0", "Sleeping"), ("h1", "Waking")])
    assert reason.kind == "waking" and "host pod h1 has it Waking (and 1 more)" in reason.message
    assert hold_reason(shared_pool(), NOW, [("h0", "Loading")]).kind == "loading"
    failed = hold_reason(shared_pool(), NOW, [("h0", "Failed")])
    assert failed.kind == "not_serving" and "h0 Failed" in failed.message


def test_a_pool_on_no_host_gets_the_operators_reason() -> None:
    why = "no host of ModelHost gpu has room for 4Gi"
    reason = hold_reason(shared_pool(degraded=why), NOW, [])
    assert reason.kind == "failed" and why in reason.message
    assert hold_reason(shared_pool(budget_exceeded="figures"), NOW, []).kind == "budget_exceeded"
    waiting = hold_reason(shared_pool(), NOW, [])
    assert waiting.kind == "waiting_for_operator" and "ModelHost gpu" in waiting.message
    assert hopeless(shared_pool(), NOW, []) is None  # held: the operator may place it
    assert hopeless(shared_pool(wakes_on_demand=False), NOW, []) is not None


def test_host_states_round_trip_into_the_view() -> None:
    states: dict[str, WorkerState] = {"a": "Sleeping", "b": "Waking", "c": "Ready"}
    annotations = {ANNOTATION_MODELS: json.dumps(states)}
    pod = {"metadata": {"name": "h", "labels": {LABEL_HOST: "gpu"}, "annotations": annotations}}
    view = host_pod_from_pod(pod)
    assert view is not None and dict(view.models) == states
