"""A ModelHost's pass decided whole over one observation (``planner.host_pass.plan_host_pass``, pure),
property-tested: a model goes only to a host pod the ModelHost owns and keeps; the calls, applied as the
host would, never over-commit a device; room is never made with a Loading, Processing or Waking model; the
decision is a function of the observation; and once converged, a pass decides nothing."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from modelpool_contract.api import parse_host_spec
from modelpool_operator.budget import Ledger
from modelpool_operator.host import HostView, host_charge_key
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.ledger import PROTECTED_STATES, Host, over_committed
from modelpool_operator.planner.host_models import SharedPool
from modelpool_operator.planner.host_pass import HostObservation, HostPassPlan, plan_host_pass, stale_models
from tests.operator.unit.test_host_models import NS, _applied, _scene

Scene = tuple[list[Host], list[SharedPool]]


def _view(replicas: int) -> HostView:
    spec = parse_host_spec({"replicas": replicas, "gpusPerHost": 1, "deviceMemory": "6Gi"})
    return HostView(namespace=NS, name="h", spec=spec, uid="u-h")


def _pod(host: HostView, name: str, outdated: bool = False) -> ObservedWorker:
    return ObservedWorker(
        name=name,
        namespace=NS,
        pool=host_charge_key(NS, host.name)[1],
        state="Ready",
        template_hash="0ld" if outdated else host.template_hash,
    )


def _observed(
    host: HostView, hosts: list[Host], pools: list[SharedPool], **fields: object
) -> HostObservation:
    names = frozenset(h.name for h in hosts)
    base = HostObservation(
        host=host,
        pods=[_pod(host, h.name) for h in hosts],
        hosts=hosts,
        ledger=Ledger(total=None, used=0, reserved=0),
        pools=pools,
        owned=names,
        known=names,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


@st.composite
def _pass(draw: st.DrawFn) -> tuple[HostObservation, Scene]:
    """A scene (``test_host_models._scene``) as one pass's observation: a ModelHost of fewer replicas
    than host pods at times, some of them of an older spec, owned or not, their ``/stats`` known or not."""
    hosts, pools = draw(_scene())
    host = _view(draw(st.integers(0, len(hosts))))
    names = [h.name for h in hosts]
    owned = frozenset(draw(st.lists(st.sampled_from(names), unique=True)))
    pods = [_pod(host, name, outdated=draw(st.booleans())) for name in names]
    observed = _observed(host, hosts, pools, pods=pods, owned=owned)
    return observed, (hosts, pools)


@settings(max_examples=200, deadline=None)
@given(_pass())
def test_models_go_only_to_host_pods_the_modelhost_owns_and_keeps(
    given_pass: tuple[HostObservation, Scene],
) -> None:
    observed, _ = given_pass
    planned = plan_host_pass(observed)
    kept = observed.owned - set(planned.pods.delete)
    assert {c.pod for c in planned.models.calls} <= observed.owned
    assert {c.pod for c in planned.models.loads()} <= kept
    assert set(planned.annotations) <= observed.owned & observed.known
    assert plan_host_pass(observed) == planned  # a function of the observation alone


@settings(max_examples=200, deadline=None)
@given(_pass())
def test_a_pass_never_over_commits_a_device_nor_makes_room_with_a_busy_model(
    given_pass: tuple[HostObservation, Scene],
) -> None:
    observed, (hosts, pools) = given_pass
    planned = plan_host_pass(observed)
    after = _applied(hosts, planned.models, pools)
    assert not [o for h in after.values() for o in over_committed(h)]
    for call in planned.models.calls:
        if call.why.startswith(("making room", "the host's memory")):
            [h] = [h for h in hosts if h.name == call.pod]
            resident = next(r for r in h.residents if r.pool == (NS, call.pool))
            assert resident.state not in PROTECTED_STATES, call
        if call.action == "sleep":
            slept = next(h for h in hosts if h.name == call.pod).resident((NS, call.pool))
            assert slept is not None and slept.sleepable, call


def _converged(observed: HostObservation, pools: list[SharedPool]) -> tuple[HostObservation, HostPassPlan]:
    """Passes, each one's calls applied as the host would (a load Ready at once) and its annotations
    written, until one decides no call (a ping-pong between pools would never get there)."""
    for _ in range(12):
        planned = plan_host_pass(observed)
        if not planned.models.calls:
            return observed, planned
        after = _applied(list(observed.hosts), planned.models, pools)
        # A loaded model reports its pool's priority (``observe.hosts``), as the others do.
        priority = {p.name: p.priority for p in pools}
        hosts = [
            h.with_residents(
                replace(r, state="Ready", priority=priority[r.pool[1]]) if r.state == "Pending" else r
                for r in h.residents
            )
            for h in (after[h.name] for h in observed.hosts)
        ]
        observed = replace(observed, hosts=hosts, annotations=dict(planned.annotations))
    raise AssertionError(f"no convergence: {planned.models.calls}")


@settings(max_examples=200, deadline=None)
@given(_scene())
def test_once_converged_a_pass_decides_nothing(scene: Scene) -> None:
    hosts, pools = scene
    observed, last = _converged(_observed(_view(len(hosts)), hosts, pools), pools)
    again = plan_host_pass(replace(observed, annotations=dict(last.annotations)))
    assert again.models.calls == () and not again.news
    assert (again.pods.create, again.pods.delete) == ((), ())
    assert again.annotations == last.annotations


def test_no_call_while_a_host_pods_stats_are_refetched_and_a_stale_model_is_unloaded() -> None:
    hosts, pools = [Host("h-0", (6 * 2**30,))], [SharedPool("emb", 1, '{"source": "/m", "task": "t"}')]
    observed = _observed(_view(1), hosts, pools)
    assert [c.action for c in plan_host_pass(observed).models.calls] == ["load"]
    assert plan_host_pass(replace(observed, refetching=True)).models.calls == ()
    assert stale_models(pools, {("h-0", "emb"): ("/old", "t"), ("h-0", "x"): ("/x", "t")}) == {("h-0", "emb")}
    assert stale_models(pools, {("h-0", "emb"): ("/m", "t")}) == set()
