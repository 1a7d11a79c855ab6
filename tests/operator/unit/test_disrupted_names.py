"""Names a drain's eviction holds (``planner.disrupted``): a pod seen Ready and selected by its budget that
is now being deleted or gone (not by the operator's own eviction) keeps its name from its replacement for
the disruption controller's DeletionTimeout: a pool's replacement worker takes another index, a ModelHost's
host pod (its index is its name) is made again once the budget, read afresh, no longer records the name.
Either way the budget counts the replacement as soon as it is Ready (the same name would count for nothing
until the controller dropped the evicted pod's entry)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from modelpool_contract.api import parse_host_spec
from modelpool_operator.budget import Ledger
from modelpool_operator.host import HostView
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.planner import plan
from modelpool_operator.planner.disrupted import DELETION_TIMEOUT_S, budgeted, held_names, still_listed
from modelpool_operator.planner.hosts import plan_host
from modelpool_operator.pool import worker_name
from tests.operator.unit.op_planner import ledger_for, make_spec, view, w
from tests.operator.unit.op_pods import GI, at

NOW = at(1000)
NAMES = [worker_name("p", "h1", i) for i in range(3)]


def serving(name: str) -> ObservedWorker:
    """A worker whose pod is Ready with the serving label (the budget selects and counts it)."""
    return replace(w(name, "Ready"), ready_since=at(0))


def test_only_ready_serving_workers_not_on_their_way_out_are_the_budgets() -> None:
    workers = [
        serving(NAMES[0]),
        replace(serving(NAMES[1]), serving=False, evicting_reason="ScaleDown"),  # the operator's eviction
        replace(serving(NAMES[2]), deleting=True),
        w("p-pending", "Pending"),  # not Ready: an eviction does not record it
    ]
    assert budgeted(workers) == {NAMES[0]}
    # A ModelHost's budget selects its host pods by the pool label alone: no serving label needed.
    host_pods = [replace(serving("gpus-0"), serving=False), w("gpus-1", "Pending")]
    assert budgeted(host_pods) == set() and budgeted(host_pods, labelled=False) == {"gpus-0"}


def test_a_budgeted_pod_deleted_or_gone_holds_its_name_until_the_deletion_timeout() -> None:
    before = frozenset(NAMES[:2])
    assert held_names(before, {NAMES[0]: False, NAMES[1]: True}, {}, NOW) == {NAMES[1]: NOW}
    gone = held_names(before, {NAMES[0]: False}, {}, NOW)
    assert gone == {NAMES[1]: NOW}
    # Held from the first pass that saw it go, not renewed by later ones, released at the timeout.
    later = NOW + timedelta(seconds=DELETION_TIMEOUT_S - 1)
    assert held_names(frozenset({NAMES[0]}), {NAMES[0]: False}, gone, later) == gone
    expired = NOW + timedelta(seconds=DELETION_TIMEOUT_S)
    assert held_names(frozenset({NAMES[0]}), {NAMES[0]: False}, gone, expired) == {}


def test_a_pod_the_budget_did_not_select_holds_nothing() -> None:
    # Not budgeted at the last pass (the operator evicted it, or it never served): its going holds nothing.
    assert held_names(frozenset(), {}, {}, NOW) == {}
    assert held_names(frozenset({NAMES[0]}), {NAMES[0]: False}, {}, NOW) == {}


def test_a_held_name_is_free_once_the_budget_no_longer_records_it() -> None:
    held = {"gpus-0": NOW, "gpus-1": NOW}
    # The controller dropped gpus-1 (it saw the pod go); gpus-0 is still recorded as evicted just now.
    assert still_listed(held, {"gpus-0": NOW - timedelta(seconds=1)}, NOW) == {"gpus-0": NOW}
    # A record past the controller's own timeout no longer keeps a replacement from counting.
    old = NOW - timedelta(seconds=DELETION_TIMEOUT_S)
    assert still_listed(held, {"gpus-0": old}, NOW) == {}


def test_the_replacement_of_an_evicted_worker_takes_another_name() -> None:
    spec = make_spec(replicas=3, maxReplicas=3)
    workers = [serving(NAMES[0]), serving(NAMES[2])]
    held = held_names(frozenset(NAMES), {w.name: w.deleting for w in workers}, {}, NOW)
    out = plan(view(spec), workers, ledger_for(100 * GI, workers), now=NOW, taken=frozenset(held))
    assert [c.name for c in out.create] == [worker_name("p", "h1", 3)]
    # Without the hold the first free index is the evicted worker's own name.
    again = plan(view(spec), workers, ledger_for(100 * GI, workers), now=NOW)
    assert [c.name for c in again.create] == [NAMES[1]]


def test_a_drained_host_pod_is_made_again_once_its_name_is_not_held() -> None:
    host = HostView(
        namespace="ns",
        name="gpus",
        spec=parse_host_spec({"replicas": 2, "gpusPerHost": 1, "deviceMemory": "8Gi"}),
        uid="u-1",
    )
    ledger = Ledger(total=None, used=8 * GI, reserved=0)
    pods = [replace(serving("gpus-1"), pool="host_gpus", template_hash=host.template_hash)]
    waiting = plan_host(host, pods, [], ledger, held=frozenset({"gpus-0"}))
    assert waiting.create == () and waiting.short == 0  # waits for the budget, not for memory
    assert plan_host(host, pods, [], ledger).create == (0,)
