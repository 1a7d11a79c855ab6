"""The API server's audit log (hack/audit-policy.yaml: the requests of the ServiceAccounts of the audited
namespace, and every write in the quiet namespaces) and the kubeconfig that makes a ServiceAccount's
requests audited ones: what the RBAC and identity tests (``tests/rbacaudit.py``) and the upgrade check's
leader kill (``bench/upgrade``) read; and the writes of a window (``AuditTail``, ``writes_in``,
``unexpected_writes``: the quiet control plane test, ``bench.controlplane``'s writes per minute).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from testkit.cluster import Cluster


def audit_events(cluster: Cluster) -> list[dict[str, Any]]:
    """Every audited request so far that names a resource (its ``objectRef``), in the log's order."""
    log = cluster.audit_log
    if log is None or not log.exists():
        raise RuntimeError("the cluster has no audit log (hack/cluster.sh sets hack/audit-policy.yaml)")
    events = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("objectRef")]


def token_kubeconfig(
    cluster: Cluster, namespace: str, account: str, path: Path, token: str | None = None
) -> Path:
    """A kubeconfig for the cluster's API server that authenticates with ServiceAccount
    ``namespace/account``'s ``token`` (default: a new one, valid for an hour)."""
    if token is None:
        token = service_account_token(cluster, namespace, account)
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in doc["contexts"] if c["name"] == doc["current-context"])
    context["context"]["user"] = account
    doc["contexts"] = [context]
    doc["users"] = [{"name": account, "user": {"token": token}}]
    path.write_text(yaml.safe_dump(doc))
    return path


def service_account_token(cluster: Cluster, namespace: str, account: str) -> str:
    """A new token of ServiceAccount ``namespace/account``, valid for an hour."""
    return cluster.kubectl("create", "token", account, "-n", namespace, "--duration", "1h").stdout.strip()


# ---- writes in a window (issue 36: a converged control plane writes nothing but leases) ------------------
#: The namespaces whose every write, by anyone, hack/audit-policy.yaml records (and the ModelBudget named
#: ``QUIET_NAMESPACE``): the quiet test's, and the control-plane benchmark's pools' and direct pods'.
QUIET_NAMESPACE = "modelpool-quiet"
BENCH_NAMESPACE = "modelpool-bench"
DIRECT_NAMESPACE = "modelpool-bench-direct"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
#: What may be written at rest: a Lease (the operator's leader election, Kopf's peering, a kubelet's or
#: KWOK's node heartbeat), renewed by its holder every few seconds whatever else happens.
AT_REST = frozenset({"leases", "kopfpeerings", "clusterkopfpeerings"})


def stage_time(event: dict[str, Any]) -> datetime:
    """When the API server finished the request (the event's ``stageTimestamp``), timezone-aware."""
    return datetime.fromisoformat(str(event["stageTimestamp"]).replace("Z", "+00:00"))


def writes_in(events: Iterable[dict[str, Any]], start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Pure: the write requests (``WRITE_VERBS``) that finished in ``[start, end)``."""
    return [e for e in events if e.get("verb") in WRITE_VERBS and start <= stage_time(e) < end]


def unexpected_writes(events: Iterable[dict[str, Any]], ignore: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Pure: the writes among ``events`` that are not a Lease's renewal (``AT_REST``) nor on an object
    named in ``ignore`` (a test's own markers)."""
    ignored = set(ignore)
    return [
        e
        for e in events
        if e.get("verb") in WRITE_VERBS
        and e["objectRef"].get("resource") not in AT_REST
        and e["objectRef"].get("name") not in ignored
    ]


def describe(event: dict[str, Any]) -> str:
    """Pure: one line for a failure's message: when, verb, resource[/subresource], namespace/name, who
    (user agent), the answer's code."""
    ref = event["objectRef"]
    resource = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
    where = "/".join(p for p in (ref.get("namespace"), ref.get("name")) if p)
    agent = str(event.get("userAgent", "")).split(" ")[0]
    code = (event.get("responseStatus") or {}).get("code")
    return f"{event.get('stageTimestamp')} {event.get('verb')} {resource} {where} by {agent} -> {code}"


def per_minute(events: Iterable[dict[str, Any]], seconds: float) -> dict[str, float]:
    """Pure: each kind of write (``verb resource[/subresource] by agent``) per minute over ``seconds``,
    busiest first."""
    counts: dict[str, int] = {}
    for e in events:
        ref = e["objectRef"]
        resource = "/".join(p for p in (ref.get("resource"), ref.get("subresource")) if p)
        kind = f"{e.get('verb')} {resource} by {str(e.get('userAgent', '')).split('/')[0]}"
        counts[kind] = counts.get(kind, 0) + 1
    return {k: round(v * 60 / seconds, 1) for k, v in sorted(counts.items(), key=lambda kv: -kv[1])}


class AuditTail:
    """The audit log read on from where the last read stopped (the log only grows: a session's log holds
    every RBAC test's requests, read once, not once per look)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.events: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        """Every event with an ``objectRef`` so far; the last line is left for the next read while it is
        not complete."""
        with self.path.open("rb") as log:
            log.seek(self.offset)
            data = log.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            if line.strip():
                event = json.loads(line)
                if event.get("objectRef"):
                    self.events.append(event)
        return self.events
