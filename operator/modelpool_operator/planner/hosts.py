"""A ModelHost's pass (pure): which host pods to create and delete, and the ModelHost's status.

The ModelHost keeps ``spec.replicas`` host pods named ``<host>-0 .. <host>-<replicas-1>``: a missing one is
created when the ModelBudget admits its charge (``placement.hosts_admitted``: its whole devices, as a
dedicated worker is charged), a failed or exited one is deleted (the next pass makes it again, once it is
gone), one beyond ``replicas`` is deleted. One a drain evicted is made again once its PodDisruptionBudget
no longer records its name (``held``, ``planner.disrupted``). The status (``placement.host_status``) lists
each host pod with its devices and models, and the memory totals the printer columns show.

A host pod of an older spec (its template hash label) is replaced by a roll, like a Deployment's with
``maxUnavailable: 1`` (and no surge: a replacement takes the same name, so it comes once the old pod is
gone): every model on a host pod goes with it, so a Ready one of an older spec is deleted only while every
other host pod (``<host>-0 .. <host>-<replicas-1>``) is Ready and not being deleted, one per pass, the
lowest index first; its replacement must be Ready before the next one goes. One of an older spec that is
not Ready serves nothing and is deleted at once (else a spec whose pods never got Ready would hold back
its own fix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from modelpool_contract.api import ModelHostStatus
from modelpool_contract.placements import LABEL_HOST
from modelpool_contract.states import SERVING_STATES
from modelpool_operator.budget import Ledger
from modelpool_operator.host import HostView
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.charge import host_charge, hosts_admitted
from modelpool_operator.placement.ledger import Host
from modelpool_operator.placement.status import ObservedHost, host_status

#: States of a host pod that is gone for good: deleted so that the next pass makes it afresh.
_ENDED = frozenset({"Failed", "Dead"})


@dataclass(frozen=True)
class HostPlan:
    """What one pass of a ModelHost does: create these indices' pods, delete these pods, write the status;
    ``short``: host pods the budget did not admit (waiting for memory); ``closed``: why the budget admits
    nothing at all (invalid, or missing under missing_budget=refuse), when that is why."""

    create: tuple[int, ...]
    delete: tuple[str, ...]
    status: ModelHostStatus
    short: int = 0
    closed: str = ""


def _index(host: HostView, pod: str) -> int | None:
    prefix = f"{host.name}-"
    tail = pod[len(prefix) :] if pod.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def _serving(pod: ObservedWorker) -> bool:
    return pod.state in SERVING_STATES and not pod.deleting


def _doomed(host: HostView, pod: ObservedWorker, current: str) -> bool:
    """Failed or exited, beyond ``replicas``, not named as a host pod of this ModelHost, or of an older
    spec (``current``: the template hash now) and not serving (a serving one goes by ``_rolled``)."""
    index = _index(host, pod.name)
    outdated = pod.template_hash != current and not _serving(pod)
    return pod.state in _ENDED or index is None or index >= host.spec.replicas or outdated


def _rolled(host: HostView, pods: Sequence[ObservedWorker], current: str) -> tuple[str, ...]:
    """The serving host pod of an older spec to delete in this pass, the lowest index: none unless every
    index below ``replicas`` has a serving pod (not being deleted), so that at most one host pod is down
    for the roll at a time (the one this deletes: the others all serve)."""
    replicas = host.spec.replicas
    serving = {index: w for w in pods if _serving(w) and (index := _index(host, w.name)) is not None}
    if any(index not in serving for index in range(replicas)):
        return ()
    outdated = [serving[i].name for i in range(replicas) if serving[i].template_hash != current]
    return tuple(outdated[:1])


def plan_host(
    host: HostView,
    pods: Sequence[ObservedWorker],
    hosts: Sequence[Host],
    ledger: Ledger,
    *,
    held: frozenset[str] = frozenset(),
) -> HostPlan:
    """The pass of ``host`` over its observed pods (``hosts``: their ledgers' view, by pod name) and the
    budget's ``ledger`` (which already counts the existing host pods, and reserves those created but not
    observed yet). A missing host pod whose name is ``held`` (a drain evicted it and the ModelHost's
    PodDisruptionBudget still records the name: ``planner.disrupted``) is not made in this pass."""
    replicas = host.spec.replicas
    current = host.template_hash
    delete = sorted(
        {w.name for w in pods if not w.deleting and _doomed(host, w, current)}
        | set(_rolled(host, pods, current))
    )
    # A pod being deleted still holds its name (its replacement comes once it is gone); one created but not
    # observed yet is reserved under it.
    reserved = ledger.by_pool.get(host.charge_key, {})
    present = {_index(host, w.name) for w in pods} | {_index(host, name) for _, name in reserved}
    present |= {_index(host, name) for name in held}
    missing = [i for i in range(replicas) if i not in present]
    admitted = hosts_admitted(ledger, host_charge(host.spec), len(missing))
    by_name = {h.name: h for h in hosts}
    observed = [
        ObservedHost(host=by_name[w.name], state=w.state, node=w.node) for w in pods if w.name in by_name
    ]
    status = host_status(observed, desired=replicas, selector=f"{LABEL_HOST}={host.name}")
    return HostPlan(
        create=tuple(missing[:admitted]),
        delete=tuple(delete),
        status=status,
        short=len(missing) - admitted,
        closed=(ledger.invalid or "") if admitted < len(missing) else "",
    )
