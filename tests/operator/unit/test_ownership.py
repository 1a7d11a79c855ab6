"""Only the pods the operator made count (``observe.ownership``, issue 30): the pods index takes a pod only
when its controller owner is the pool (or ModelHost) its label names, and every daemon's view keeps only
the pods whose owner uid is that pool's now. Foreign pods are reported once each."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.api import API_VERSION, MODELHOST_KIND, MODELPOOL_KIND
from modelpool_operator.host import host_charge_key, host_pool_label
from modelpool_operator.observe.observation import observe_all, slim_pod
from modelpool_operator.observe.ownership import (
    ForeignPods,
    OwnedPods,
    Owner,
    claimed_key,
    controller_owner,
    owned_by,
)


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
    view = OwnedPods(index, {("ns", "p"): "uid-p"}.get, lambda p: dropped.append(p["metadata"]["name"]))
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
    view = OwnedPods(index, {("ns", "p"): "uid-p"}.get)
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
    counted = OwnedPods({key: [slim_pod(body)]}, {key: known}.get).get(key)
    assert (counted == [slim_pod(body)]) == (uid == known)
    assert owned_by(body, key, known) == (uid == known)
