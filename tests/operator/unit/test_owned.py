"""The objects a pool or ModelHost owns (``owned``): which owner a watch event concerns, what the owner's
run forgets (a deleted object, or one edited: not what the API server adds) so that its next pass makes the
object again, and which kinds are watched. The objects are the
operator's own builders' (a Service, a NetworkPolicy, PodDisruptionBudgets, an InferencePool)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from copy import deepcopy
from dataclasses import replace
from typing import Any, cast

import kopf
import pytest
from op_planner import make_spec, view

from modelpool_contract.api import InferencePoolSpec, ModelHostSpec
from modelpool_operator.bookkeeping import Bookkeeping, HostRun, PoolRun
from modelpool_operator.diffbase import LeanDiffBaseStorage
from modelpool_operator.effects.disruption_budget import build_host_budget, build_pool_budget
from modelpool_operator.effects.inference_pool import build_inference_pool
from modelpool_operator.effects.network_policy import PolicySettings, build_network_policy
from modelpool_operator.effects.resources import build_service
from modelpool_operator.host import HostView, host_charge_key
from modelpool_operator.owned import (
    DISRUPTION_BUDGET,
    DISRUPTION_BUDGETS,
    INFERENCE_POOL,
    INFERENCE_POOLS,
    NETWORK_POLICIES,
    NETWORK_POLICY,
    SERVICE,
    SERVICES,
    forget_owned,
    owned_resources,
    owner_of,
)

POOL = replace(view(make_spec()), uid="uid-p")
HOST = HostView("ns", "gpus", ModelHostSpec.model_validate({"deviceMemory": "8Gi"}), uid="uid-h")
POLICY = PolicySettings(namespace="mp-system", operator_labels={"app": "op"})


def _pool_objects() -> list[dict[str, Any]]:
    picker = InferencePoolSpec.model_validate({"endpointPicker": "epp", "pickerPodLabels": {"app": "epp"}})
    return [
        build_service(POOL),
        build_network_policy(POOL, POLICY),
        build_pool_budget(POOL, 2),
        build_inference_pool(POOL, picker, 8000),
    ]


def _owner(body: dict[str, Any]) -> tuple[str, str] | None:
    meta = body["metadata"]
    return owner_of(meta.get("namespace", ""), meta, meta.get("labels", {}))


@pytest.mark.parametrize("index", range(4))
def test_an_object_of_a_pool_names_the_pool(index: int) -> None:
    assert _owner(_pool_objects()[index]) == ("ns", "p")


def test_an_object_of_a_modelhost_names_its_daemon() -> None:
    assert _owner(build_host_budget(HOST)) == host_charge_key("ns", "gpus")


def test_an_object_not_of_ours_concerns_no_owner() -> None:
    """Someone else's object with the pool's label, ours without the operator's label, or without an
    owner (the pool's uid unknown when it was made: nothing to tie it to)."""
    foreign = build_service(POOL)
    foreign["metadata"]["ownerReferences"] = [{**foreign["metadata"]["ownerReferences"][0], "kind": "Job"}]
    unlabelled = build_service(POOL)
    del unlabelled["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    orphan = build_service(replace(POOL, uid=""))
    assert [_owner(body) for body in (foreign, unlabelled, orphan)] == [None, None, None]


def _memory(run: PoolRun) -> tuple[object, ...]:
    return run.service, run.network_policy, run.disruption_budget, run.inference_pool


def test_a_pools_run_forgets_each_deleted_kind_only() -> None:
    body = {"kind": "x"}
    run = PoolRun(("ns", "p"), service=body, network_policy=body, disruption_budget=body)
    run.inference_pool = body
    forget_owned(run, {NETWORK_POLICY: None})
    assert _memory(run) == (body, None, body, body)
    forget_owned(run, dict.fromkeys([SERVICE, DISRUPTION_BUDGET, INFERENCE_POOL]))
    assert _memory(run) == (None, None, None, None)


def _served(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the API server keeps it: defaults added, a status, someone's extra label."""
    live = deepcopy(body)
    live["metadata"] |= {"uid": "u1", "resourceVersion": "7"}
    live["metadata"]["labels"]["team"] = "ml"
    live["status"] = {"observedGeneration": 1}
    if live["kind"] == "Service":
        live["spec"] |= {"clusterIP": "None", "sessionAffinity": "None", "ipFamilies": ["IPv4"]}
    if live["kind"] == "NetworkPolicy":
        for rule in live["spec"]["ingress"]:
            rule.setdefault("ports", [])
    return live


@pytest.mark.parametrize("index", range(4))
def test_an_object_as_served_has_not_drifted_from_what_was_written(index: int) -> None:
    written = _pool_objects()[index]
    run = PoolRun(("ns", "p"), service=written, network_policy=written, disruption_budget=written)
    run.inference_pool = written
    forget_owned(run, {written["kind"]: _served(written)})
    assert _memory(run) == (written, written, written, written)


@pytest.mark.parametrize(
    ("index", "edit"),
    [
        (0, lambda o: o["spec"]["ports"][0].update(port=1)),
        (1, lambda o: o["spec"]["ingress"].pop()),
        (1, lambda o: o["metadata"]["labels"].pop("modelpool.dev/pool")),
        (2, lambda o: o["spec"].update(minAvailable=0)),
        (3, lambda o: o["spec"].pop("selector")),
    ],
)
def test_an_edited_object_is_forgotten_so_the_next_pass_writes_it_again(
    index: int, edit: Callable[[dict[str, Any]], object]
) -> None:
    written = _pool_objects()[index]
    live = _served(written)
    edit(live)
    run = PoolRun(("ns", "p"), service=written, network_policy=written, disruption_budget=written)
    run.inference_pool = written
    forget_owned(run, {written["kind"]: live})
    assert _memory(run)[index] is None
    assert [m for i, m in enumerate(_memory(run)) if i != index] == [written] * 3


def test_an_inference_pool_the_run_removed_stays_removed() -> None:
    run = PoolRun(("ns", "p"), inference_pool=False)
    forget_owned(run, {INFERENCE_POOL: None})
    assert run.inference_pool is False


def test_a_hosts_run_forgets_its_policy_and_budget() -> None:
    run = HostRun(("ns", "gpus"), network_policy={"a": 1}, disruption_budget={"b": 2})
    forget_owned(run, dict.fromkeys([NETWORK_POLICY, DISRUPTION_BUDGET, SERVICE]))
    assert (run.network_policy, run.disruption_budget) == (None, None)


def test_a_loss_pokes_a_running_daemon_and_is_taken_once() -> None:
    async def scenario() -> None:
        book = Bookkeeping()
        wakeup = book.wakeup(("ns", "p"))
        book.lose(("ns", "p"), SERVICE)
        book.lose(("ns", "p"), NETWORK_POLICY)
        assert wakeup.is_set()
        assert book.take_lost(("ns", "p")) == {SERVICE: None, NETWORK_POLICY: None}
        assert book.take_lost(("ns", "p")) == {}

    asyncio.run(scenario())


def test_only_a_change_of_the_written_fields_pokes_the_daemon() -> None:
    """First sight is remembered; a status write (a budget's, at every pod change) wakes nothing; an edit
    of the spec does, with the object as seen; a deletion told before an edit stands."""

    async def scenario() -> None:
        book = Bookkeeping()
        wakeup = book.wakeup(("ns", "p"))
        budget = build_pool_budget(POOL, 2)
        book.saw(("ns", "p"), DISRUPTION_BUDGET, budget)
        book.saw(("ns", "p"), DISRUPTION_BUDGET, budget | {"status": {"currentHealthy": 2}})
        assert not wakeup.is_set() and book.take_lost(("ns", "p")) == {}
        edited = deepcopy(budget)
        edited["spec"]["minAvailable"] = 0
        book.saw(("ns", "p"), DISRUPTION_BUDGET, edited)
        assert wakeup.is_set() and book.take_lost(("ns", "p")) == {DISRUPTION_BUDGET: edited}
        book.lose(("ns", "p"), SERVICE)
        book.saw(("ns", "p"), SERVICE, build_service(POOL))  # made again: first sight after the deletion
        assert book.take_lost(("ns", "p")) == {SERVICE: None}

    asyncio.run(scenario())


def test_a_loss_of_a_pool_without_daemon_is_not_remembered() -> None:
    """A deleted pool's objects go with it: nothing is kept for them."""
    book = Bookkeeping()
    book.lose(("ns", "gone"), SERVICE)
    book.saw(("ns", "gone"), SERVICE, build_service(POOL))
    assert book.take_lost(("ns", "gone")) == {}


def test_a_stopped_daemon_forgets_its_losses() -> None:
    async def scenario() -> None:
        book = Bookkeeping()
        book.wakeup(("ns", "p"))
        book.lose(("ns", "p"), SERVICE)
        book.forget(("ns", "p"))
        book.wakeup(("ns", "p"))
        assert book.take_lost(("ns", "p")) == {}

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("network_policies", "inference_pools", "expected"),
    [
        (False, False, (SERVICES, DISRUPTION_BUDGETS)),
        (True, False, (SERVICES, DISRUPTION_BUDGETS, NETWORK_POLICIES)),
        (True, True, (SERVICES, DISRUPTION_BUDGETS, NETWORK_POLICIES, INFERENCE_POOLS)),
    ],
)
def test_only_the_kinds_the_operator_makes_are_watched(
    network_policies: bool, inference_pools: bool, expected: tuple[Any, ...]
) -> None:
    assert owned_resources(network_policies=network_policies, inference_pools=inference_pools) == expected


@pytest.mark.parametrize("index", range(4))
def test_kopf_keeps_no_essence_of_an_owned_object(index: int) -> None:
    storage = LeanDiffBaseStorage(prefix="modelpool.dev", key="last-handled-configuration")
    assert storage.build(body=kopf.Body(cast(Any, _pool_objects()[index]))) == {}
