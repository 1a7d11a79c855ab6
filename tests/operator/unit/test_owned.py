"""The objects a pool or ModelHost owns (``owned``): which owner a deletion concerns, what the owner's run
forgets so that its next pass makes the object again, and which kinds are watched. The objects are the
operator's own builders' (a Service, a NetworkPolicy, PodDisruptionBudgets, an InferencePool)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, cast

import kopf
import pytest

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
    lost_owner,
    owned_resources,
)
from tests.operator.unit.op_planner import make_spec, view

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


def _lost(event: str | None, body: dict[str, Any]) -> tuple[str, str] | None:
    meta = body["metadata"]
    return lost_owner(event, meta.get("namespace", ""), meta, meta.get("labels", {}))


@pytest.mark.parametrize("index", range(4))
def test_a_deleted_object_of_a_pool_names_the_pool(index: int) -> None:
    assert _lost("DELETED", _pool_objects()[index]) == ("ns", "p")


def test_a_deleted_object_of_a_modelhost_names_its_daemon() -> None:
    assert _lost("DELETED", build_host_budget(HOST)) == host_charge_key("ns", "gpus")


@pytest.mark.parametrize("event", [None, "ADDED", "MODIFIED"])
def test_only_a_deletion_concerns_the_owner(event: str | None) -> None:
    assert _lost(event, build_service(POOL)) is None


def test_an_object_not_of_ours_concerns_no_owner() -> None:
    """Someone else's object with the pool's label, ours without the operator's label, or without an
    owner (the pool's uid unknown when it was made: nothing to tie it to)."""
    foreign = build_service(POOL)
    foreign["metadata"]["ownerReferences"] = [{**foreign["metadata"]["ownerReferences"][0], "kind": "Job"}]
    unlabelled = build_service(POOL)
    del unlabelled["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    orphan = build_service(replace(POOL, uid=""))
    assert [_lost("DELETED", body) for body in (foreign, unlabelled, orphan)] == [None, None, None]


def _memory(run: PoolRun) -> tuple[object, ...]:
    return run.service_ready, run.network_policy, run.disruption_budget, run.inference_pool


def test_a_pools_run_forgets_each_lost_kind_only() -> None:
    body = {"kind": "x"}
    run = PoolRun(("ns", "p"), service_ready=True, network_policy=body, disruption_budget=body)
    run.inference_pool = body
    forget_owned(run, [NETWORK_POLICY])
    assert _memory(run) == (True, None, body, body)
    forget_owned(run, [SERVICE, DISRUPTION_BUDGET, INFERENCE_POOL])
    assert _memory(run) == (False, None, None, None)


def test_an_inference_pool_the_run_removed_stays_removed() -> None:
    run = PoolRun(("ns", "p"), inference_pool=False)
    forget_owned(run, [INFERENCE_POOL])
    assert run.inference_pool is False


def test_a_hosts_run_forgets_its_policy_and_budget() -> None:
    run = HostRun(("ns", "gpus"), network_policy={"a": 1}, disruption_budget={"b": 2})
    forget_owned(run, [NETWORK_POLICY, DISRUPTION_BUDGET, SERVICE])
    assert (run.network_policy, run.disruption_budget) == (None, None)


def test_a_loss_pokes_a_running_daemon_and_is_taken_once() -> None:
    async def scenario() -> None:
        book = Bookkeeping()
        wakeup = book.wakeup(("ns", "p"))
        book.lose(("ns", "p"), SERVICE)
        book.lose(("ns", "p"), NETWORK_POLICY)
        assert wakeup.is_set()
        assert book.take_lost(("ns", "p")) == {SERVICE, NETWORK_POLICY}
        assert book.take_lost(("ns", "p")) == set()

    asyncio.run(scenario())


def test_a_loss_of_a_pool_without_daemon_is_not_remembered() -> None:
    """A deleted pool's objects go with it: nothing is kept for them."""
    book = Bookkeeping()
    book.lose(("ns", "gone"), SERVICE)
    assert book.take_lost(("ns", "gone")) == set()


def test_a_stopped_daemon_forgets_its_losses() -> None:
    async def scenario() -> None:
        book = Bookkeeping()
        book.wakeup(("ns", "p"))
        book.lose(("ns", "p"), SERVICE)
        book.forget(("ns", "p"))
        book.wakeup(("ns", "p"))
        assert book.take_lost(("ns", "p")) == set()

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
