"""Only the pods the operator made count (``observe.ownership``, issue 30): the pods index takes a pod only
when its controller owner is the pool (or ModelHost) its label names, and every daemon's view keeps only
the pods whose owner uid is that pool's now. Foreign pods are reported once each. A counted pod is
charged from its owner (``budget.worker_charge``): the larger of the spec now and the operator's recorded
charge, never the pod's annotation."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.api import API_VERSION, MODELHOST_KIND, MODELPOOL_KIND, parse_host_spec
from modelpool_operator.budget import worker_charge
from modelpool_operator.host import host_charge_key, host_pool_label
from modelpool_operator.observe.observation import observe_all, slim_pod
from modelpool_operator.observe.ownership import (
    ForeignPods,
    OwnedPods,
    OwnerRecord,
    Tombstones,
    claimed_key,
    host_record,
    owned_by,
    pool_record,
    worker_charges,
)
from modelpool_operator.observe.worker_state import observe_worker
from modelpool_operator.owners import Owner, controller_owner
from modelpool_operator.placement.charge import host_charge
from modelpool_operator.pool import PoolKey


def ref(kind: str = MODELPOOL_KIND, name: str = "p", uid: str = "uid-p", **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "name": name, "uid": uid, "controller": True, **extra}


def pod(name: str, *refs: dict[str, Any], pool: str = "p") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "labels": {}}
    meta["labels"]["modelpool.dev/pool"] = pool
    if refs:
        meta["ownerReferences"] = list(refs)
    return {"metadata": meta, "spec": {"containers": []}, "status": {"phase": "Pending"}}


def test_a_pod_without_our_controller_reference_is_not_indexed() -> None:
    assert claimed_key("ns", pod("ghost", pool="ghost")["metadata"], "ghost") is None
    # another controller, another group, not the controller, a partial reference
    for bad in (
        ref(kind="ReplicaSet", name="p"),
        {**ref(), "apiVersion": "apps/v1"},
        {**ref(), "apiVersion": "modelpool.dev.evil.example/v1alpha1"},
        {**ref(), "controller": False},
        {k: v for k, v in ref().items() if k != "uid"},
    ):
        assert claimed_key("ns", pod("w", bad)["metadata"], "p") is None, bad


def test_the_owner_must_be_the_pool_the_label_names() -> None:
    assert claimed_key("ns", pod("w", ref(name="p"))["metadata"], "p") == ("ns", "p")
    assert claimed_key("ns", pod("w", ref(name="other"))["metadata"], "p") is None
    # a host pod: labelled host_<name>, owned by the ModelHost <name>
    host_ref = ref(kind=MODELHOST_KIND, name="h", uid="uid-h")
    label = host_pool_label("h")
    assert claimed_key("ns", pod("h-0", host_ref, pool=label)["metadata"], label) == host_charge_key(
        "ns", "h"
    )
    # a pool's owner cannot claim a host label, nor a host's owner a pool's
    assert claimed_key("ns", pod("w", ref(name="h"))["metadata"], label) is None
    assert claimed_key("ns", pod("h-0", host_ref)["metadata"], "h") is None


def test_slim_pod_keeps_the_controller_reference_only() -> None:
    body = pod("w", {**ref(), "blockOwnerDeletion": True}, ref(kind="Other", name="x", controller=False))
    slim = slim_pod(body)
    assert slim["metadata"]["ownerReferences"] == [ref()]
    assert controller_owner(slim["metadata"]) == Owner(MODELPOOL_KIND, "p", "uid-p")
    assert "ownerReferences" not in slim_pod(pod("ghost"))["metadata"]


def test_the_view_keeps_only_pods_owned_by_the_pool_of_that_uid_now() -> None:
    mine, forged, stale = pod("w1", ref()), pod("w2", ref(uid="made-up")), pod("w3", ref(uid="old-p"))
    index = {("ns", "p"): [mine, forged, stale], ("ns", "gone"): [pod("g", ref(name="gone"), pool="gone")]}
    dropped: list[str] = []
    view = OwnedPods(
        index, {("ns", "p"): OwnerRecord("uid-p")}.get, lambda p: dropped.append(p["metadata"]["name"])
    )
    assert view.get(("ns", "p")) == [mine]
    assert dropped == ["w2", "w3"]
    # a pool that does not exist (now) has no pods: its key is not in the view
    assert set(view) == {("ns", "p")}
    assert ("ns", "gone") not in view and view.get(("ns", "gone")) is None
    assert len(view) == 1


def test_observe_all_over_the_view_never_sees_a_foreign_pod() -> None:
    from datetime import UTC, datetime

    from modelpool_operator.observe.observation import ObservationCache
    from modelpool_operator.observe.worker_state import LifecycleSettings

    index = {("ns", "p"): [pod("w1", ref()), pod("w2", ref(uid="made-up"))]}
    view = OwnedPods(index, {("ns", "p"): OwnerRecord("uid-p")}.get)
    workers = observe_all(
        ObservationCache(LifecycleSettings()),
        view,
        observed={},
        cached_stats=lambda pods: {},
        own=None,
        own_stats={},
        now=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert [w.name for w in workers[("ns", "p")]] == ["w1"]


def test_a_deleted_pools_terminating_pods_stay_charged_until_they_are_gone() -> None:
    # The pool was deleted (its watch's DELETED event buried its record): its pods, still terminating,
    # are counted and charged from that record; a forged reference to the dead uid is not its tombstone's
    # business only if it does not carry that uid, and the tombstone goes with the last of its pods.
    dead = OwnerRecord("uid-old", declared=2 * GI, recorded={"w1": 3 * GI})
    tombstones = Tombstones()
    tombstones.bury(("ns", "p"), dead)
    w1, w2, forged = pod("w1", ref(uid="uid-old")), pod("w2", ref(uid="uid-old")), pod("x", ref(uid="nope"))
    index: dict[tuple[str, str], list[dict[str, Any]]] = {("ns", "p"): [w1, w2, forged]}
    no_records: dict[PoolKey, OwnerRecord] = {}
    view = OwnedPods(index, no_records.get, None, tombstones)
    assert set(view) == {("ns", "p")} and view.get(("ns", "p")) == [w1, w2]
    assert (view.charge(("ns", "p"), "w1"), view.charge(("ns", "p"), "w2")) == (3 * GI, 2 * GI)
    # A new pool of the same name meanwhile: its pods and the old ones both count, each never below
    # either record's charge.
    new = pod("n1", ref(uid="uid-new"))
    index[("ns", "p")].append(new)
    view = OwnedPods(index, {("ns", "p"): OwnerRecord("uid-new", declared=GI)}.get, None, tombstones)
    assert view.get(("ns", "p")) == [w1, w2, new]
    assert view.charge(("ns", "p"), "n1") == 2 * GI
    # The old pods gone: the tombstone goes with them, and the new pool's pods are charged its own way.
    index[("ns", "p")] = [new]
    assert view.get(("ns", "p")) == [new] and len(tombstones) == 0
    assert view.charge(("ns", "p"), "n1") == GI


def test_a_tombstone_goes_when_its_key_has_no_pod_left() -> None:
    tombstones = Tombstones()
    tombstones.bury(("ns", "gone"), OwnerRecord("uid-gone", declared=GI))
    tombstones.bury(("ns", "none"), None)  # a deleted object without a uid: nothing to keep
    view = OwnedPods(
        {("ns", "p"): [pod("w", ref())]}, {("ns", "p"): OwnerRecord("uid-p")}.get, None, tombstones
    )
    assert len(tombstones) == 1
    assert set(view) == {("ns", "p")} and len(tombstones) == 0
    tombstones.bury(("ns", "gone"), OwnerRecord("uid-gone", declared=GI))
    assert view.get(("ns", "gone")) is None and len(tombstones) == 0


def test_tombstones_are_bounded() -> None:
    from modelpool_operator.observe import ownership

    tombstones = Tombstones()
    for i in range(ownership._TOMBSTONES_MAX + 5):
        tombstones.bury(("ns", f"p{i}"), OwnerRecord(f"uid-{i}"))
    assert len(tombstones) == ownership._TOMBSTONES_MAX
    assert tombstones.get(("ns", "p0")) is None and tombstones.get(("ns", "p5")) is not None


def test_a_foreign_pod_is_reported_once() -> None:
    seen = ForeignPods()
    ghost = pod("ghost")["metadata"]
    assert seen.first_sight(ghost) is True
    assert seen.first_sight(ghost) is False
    assert seen.first_sight(pod("other")["metadata"]) is True


names = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
uids = st.sampled_from(["uid-a", "uid-b", "uid-c"])
kinds = st.sampled_from([MODELPOOL_KIND, MODELHOST_KIND, "ReplicaSet"])


@given(kind=kinds, owner=names, uid=uids, label=names, known=uids, controller=st.booleans())
def test_a_counted_pod_is_always_owned_by_the_pool_of_its_key(
    *, kind: str, owner: str, uid: str, label: str, known: str, controller: bool
) -> None:
    """Whatever a pod says about itself, it is counted under a key only when its controller reference is
    ours, names that key's pool and carries the uid the pool has now."""
    body = pod("w", ref(kind=kind, name=owner, uid=uid, controller=controller), pool=label)
    key = claimed_key("ns", body["metadata"], label)
    if key is None:
        return
    assert controller and kind in (MODELPOOL_KIND, MODELHOST_KIND)
    assert label == (host_pool_label(owner) if kind == MODELHOST_KIND else owner)
    counted = OwnedPods({key: [slim_pod(body)]}, {key: OwnerRecord(known)}.get).get(key)
    assert (counted == [slim_pod(body)]) == (uid == known)
    assert owned_by(body, key, known) == (uid == known)


# ---- what a counted pod is charged: its owner's word, never the pod's ---------------------------------

GI = 2**30


def pool_body(memory: str = "2Gi", workers: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
        "spec": {
            "model": {"source": "/models/tiny", "task": "text-embedding"},
            "resources": {"memory": memory},
        },
        "status": {"workers": workers or []},
    }


def test_the_charge_is_the_larger_of_the_declaration_and_the_recorded_charge() -> None:
    assert worker_charge(2 * GI, None) == 2 * GI
    assert worker_charge(2 * GI, 3 * GI) == 3 * GI  # made from an older, larger spec: kept
    assert worker_charge(2 * GI, 1 * GI) == 2 * GI  # a recorded charge never lowers the declaration
    assert worker_charge(None, 1 * GI) == 1 * GI  # the spec does not parse now: what was charged
    assert worker_charge(None, None) is None  # nothing known: the container's (``requested_memory``)


@given(declared=st.none() | st.integers(0, 2**50), recorded=st.none() | st.integers(0, 2**50))
def test_the_charge_is_never_below_what_the_owner_declares(
    declared: int | None, recorded: int | None
) -> None:
    charge = worker_charge(declared, recorded)
    for known in (declared, recorded):
        assert charge is not None if known is not None else True
        assert known is None or (charge is not None and charge >= known)
    assert charge in (declared, recorded)


def test_a_pools_record_reads_its_spec_and_its_status_never_its_pods() -> None:
    record = pool_record(pool_body("2Gi", [{"name": "w1", "state": "Ready", "memory": "4Gi"}]))
    assert record == OwnerRecord("uid-p", declared=2 * GI, recorded={"w1": 4 * GI})
    broken = pool_body()
    broken["spec"]["resources"]["memory"] = "lots"
    assert pool_record(broken) == OwnerRecord("uid-p", declared=None)
    assert pool_record({"metadata": {"name": "p"}}) is None  # no uid: owns nothing


def test_a_host_record_is_its_host_charge() -> None:
    body = {
        "metadata": {"name": "h", "namespace": "ns", "uid": "uid-h"},
        "spec": {"replicas": 1, "gpusPerHost": 2, "deviceMemory": "3Gi"},
    }
    record = host_record(body)
    assert record is not None and record.uid == "uid-h"
    assert record.declared == host_charge(parse_host_spec(body["spec"])) > 0


def test_an_owned_pod_is_charged_from_its_pool_whatever_its_annotation_says() -> None:
    # The annotation patched to 0 (or to 1 EiB) changes nothing: the pool's spec and status decide.
    workers = [{"name": "old", "state": "Ready", "memory": "4Gi"}]
    record = pool_record(pool_body("2Gi", workers))
    index: dict[tuple[str, str], list[dict[str, Any]]] = {("ns", "p"): []}
    for name, note in (("old", "0"), ("new", str(2**60))):
        body = pod(name, ref())
        body["metadata"]["annotations"] = {"modelpool.dev/memory-bytes": note}
        body["status"] = {"phase": "Pending"}
        index[("ns", "p")].append(slim_pod(body))
    view = OwnedPods(index, {("ns", "p"): record}.get)
    from datetime import UTC, datetime

    from modelpool_operator.observe.observation import ObservationCache
    from modelpool_operator.observe.worker_state import LifecycleSettings

    workers_seen = observe_all(
        ObservationCache(LifecycleSettings()),
        view,
        observed={},
        cached_stats=lambda pods: {},
        own=("ns", "p"),
        own_stats={},
        now=datetime(2026, 1, 1, tzinfo=UTC),
        charges=worker_charges(view),
    )
    charged = {w.name: w.memory for w in workers_seen[("ns", "p")]}
    assert charged == {"old": 4 * GI, "new": 2 * GI}
    # Without an owner's word (a bare index), the container's memory: never the annotation.
    bare = observe_worker(index[("ns", "p")][1], None, datetime(2026, 1, 1, tzinfo=UTC))
    assert bare.requested_memory == 0


async def test_the_pods_index_takes_owned_pods_and_reports_a_foreign_one_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The Kopf index handler itself: a foreign pod is left out (so nothing reads it), logged and counted
    once however many watch events it has; an owned pod is indexed under its pool, slimmed."""
    from types import SimpleNamespace

    from modelpool_operator import handlers
    from modelpool_operator.metrics import OperatorMetrics
    from modelpool_operator.settings import OperatorConfig
    from tests.operator.unit import op_handlers

    memo = handlers.make_memo(OperatorConfig())
    metrics = OperatorMetrics()
    memo.services = SimpleNamespace(metrics=metrics)
    ghost = pod("ghost", pool="ghost")
    for _ in range(3):
        indexed = await op_handlers.pods_by_pool(
            namespace="ns", labels=ghost["metadata"]["labels"], meta=ghost["metadata"], body=ghost, memo=memo
        )
        assert indexed == {}
    assert metrics.registry.get_sample_value("modelpool_operator_foreign_pods_total") == 1
    assert [r.getMessage() for r in caplog.records] == [
        "ignoring pod ns/ghost: labelled modelpool.dev/pool but not owned by its pool or ModelHost"
        " (not counted)"
    ]
    owned = pod("w", ref())
    indexed = await op_handlers.pods_by_pool(
        namespace="ns", labels=owned["metadata"]["labels"], meta=owned["metadata"], body=owned, memo=memo
    )
    assert indexed == {("ns", "p"): slim_pod(owned)}
