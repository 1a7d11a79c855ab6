"""A ModelHost's pass (pure): which host pods to create and delete, and the ModelHost's status.

The ModelHost keeps ``spec.replicas`` host pods named ``<host>-0 .. <host>-<replicas-1>``: a missing one is
created when the ModelBudget admits its charge (``placement.hosts_admitted``: its whole devices, as a
dedicated worker is charged), a failed or exited one, or one of an older spec (its template hash label),
is deleted (the next pass makes it again, once it is gone), one beyond ``replicas`` is deleted. The
status (``placement.host_status``) lists each host pod with its devices and
models, and the memory totals the printer columns show.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from modelpool_contract.api import ModelHostStatus
from modelpool_contract.placements import LABEL_HOST
from modelpool_operator.budget import Ledger
from modelpool_operator.host import HostView, host_template_hash
from modelpool_operator.observe.worker_state import ObservedWorker
from modelpool_operator.placement.charge import host_charge, hosts_admitted
from modelpool_operator.placement.ledger import Host
from modelpool_operator.placement.status import ObservedHost, host_status

#: States of a host pod that is gone for good: deleted so that the next pass makes it afresh.
_ENDED = frozenset({"Failed", "Dead"})


@dataclass(frozen=True)
class HostPlan:
    """What one pass of a ModelHost does: create these indices' pods, delete these pods, write the status;
    ``short``: host pods the budget did not admit (waiting for memory)."""

    create: tuple[int, ...]
    delete: tuple[str, ...]
    status: ModelHostStatus
    short: int = 0


def _index(host: HostView, pod: str) -> int | None:
    prefix = f"{host.name}-"
    tail = pod[len(prefix) :] if pod.startswith(prefix) else ""
    return int(tail) if tail.isdigit() else None


def _doomed(host: HostView, pod: ObservedWorker, current: str) -> bool:
    """Failed or exited, beyond ``replicas``, not named as a host pod of this ModelHost, or of an older
    spec (``current``: the template hash now)."""
    index = _index(host, pod.name)
    outdated = pod.template_hash != current
    return pod.state in _ENDED or index is None or index >= host.spec.replicas or outdated


def plan_host(
    host: HostView, pods: Sequence[ObservedWorker], hosts: Sequence[Host], ledger: Ledger
) -> HostPlan:
    """The pass of ``host`` over its observed pods (``hosts``: their ledgers' view, by pod name) and the
    budget's ``ledger`` (which already counts the existing host pods, and reserves those created but not
    observed yet)."""
    replicas = host.spec.replicas
    current = host_template_hash(host.spec)
    delete = sorted(w.name for w in pods if not w.deleting and _doomed(host, w, current))
    # A pod being deleted still holds its name (its replacement comes once it is gone); one created but not
    # observed yet is reserved under it.
    reserved = ledger.by_pool.get(host.charge_key, {})
    present = {_index(host, w.name) for w in pods} | {_index(host, name) for _, name in reserved}
    missing = [i for i in range(replicas) if i not in present]
    admitted = hosts_admitted(ledger, host_charge(host.spec), len(missing))
    by_name = {h.name: h for h in hosts}
    observed = [
        ObservedHost(host=by_name[w.name], state=w.state, node=w.node) for w in pods if w.name in by_name
    ]
    status = host_status(observed, desired=replicas, selector=f"{LABEL_HOST}={host.name}")
    return HostPlan(
        create=tuple(missing[:admitted]), delete=tuple(delete), status=status, short=len(missing) - admitted
    )
