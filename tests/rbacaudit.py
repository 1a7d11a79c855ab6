"""The chart's RBAC for one of its identities against what that identity really requested: the pieces the
RBAC tests share (the operator's, tests/operator/integration/test_rbac.py, and the gateway's,
tests/gateway/integration/test_gateway_rbac.py).

The chart is rendered by the real helm; its identity's documents are applied; a kubeconfig authenticates
with the ServiceAccount's token; the API server's audit log (hack/audit-policy.yaml records exactly the
ServiceAccounts of ``AUDITED_NAMESPACE``; both read by ``testkit.auditlog``) says which (API group, resource,
verb) it requested and which of those were refused (403). ``assert_exactly_used`` compares that with the
rules granted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from testkit.auditlog import audit_events
from testkit.cluster import Cluster, missing
from testkit.environment import ROOT
from testkit.kubectl import apply

CHART = ROOT / "charts" / "modelpool-operator"
AUDITED_NAMESPACE = "modelpool-audit"  # hack/audit-policy.yaml records this namespace's ServiceAccounts
RBAC_KINDS = {"ClusterRole", "Role"}

Rule = tuple[str, str, str]  # (API group, resource[/subresource], verb)
Doc = dict[str, Any]


def require_audit_log(cluster: Cluster) -> None:
    """Skip (fail in CI) on a cluster without the audit log; create the audited namespace."""
    if cluster.audit_log is None or not cluster.audit_log.exists():
        missing("this cluster has no audit log (start it with hack/cluster.sh, which sets the policy)")
    cluster.kubectl("create", "namespace", AUDITED_NAMESPACE, check=False)


def render_chart(
    cluster: Cluster, release: str, values: dict[str, Any], tmp: Path, namespace: str = AUDITED_NAMESPACE
) -> list[Doc]:
    """``helm template`` of the chart with ``values``, as documents."""
    values_file = tmp / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    out = cluster.helm(
        "template", release, str(CHART), "--namespace", namespace, "--values", str(values_file)
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def apply_docs(cluster: Cluster, docs: list[Doc]) -> None:
    """Apply ``docs`` in their order, in one ``kubectl apply`` (a process per document cost seconds)."""
    if docs:
        apply(cluster, {"apiVersion": "v1", "kind": "List", "items": docs})


def delete_docs(cluster: Cluster, docs: list[Doc]) -> None:
    """Delete what ``apply_docs`` applied (reversed, in one ``kubectl delete``; nothing waited for)."""
    if docs:
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(reversed(docs))})
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=listed)


def granted(docs: list[Doc]) -> set[Rule]:
    """Every (group, resource, verb) the ClusterRoles and Roles of ``docs`` grant."""
    return {
        (group, resource, verb)
        for doc in docs
        if doc["kind"] in RBAC_KINDS
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def rule_of(event: dict[str, Any]) -> Rule:
    """The (group, resource, verb) an audit event's request needed."""
    ref = event["objectRef"]
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return ref.get("apiGroup") or "", resource, event["verb"]


def audited_requests(cluster: Cluster, username: str) -> list[dict[str, Any]]:
    """Every audited request ``username`` made that names a resource."""
    return [e for e in audit_events(cluster) if e["user"]["username"] == username]


def is_refused(event: dict[str, Any]) -> bool:
    return (event.get("responseStatus") or {}).get("code") == 403


def assert_exactly_used(
    who: str, requests: list[dict[str, Any]], rules: set[Rule], not_a_request: frozenset[Rule] = frozenset()
) -> None:
    """No request refused (a missing verb), none outside ``rules``, and no rule unused (an extra verb) but
    those checked by admission rather than requested (``not_a_request``)."""
    used = {rule_of(e) for e in requests}
    refused = {rule_of(e) for e in requests if is_refused(e)}
    assert not refused, f"the chart's RBAC refused requests {who} made (missing): {sorted(refused)}"
    assert not used - rules, f"used by {who} but not granted: {sorted(used - rules)}"
    extra = rules - used - not_a_request
    assert not extra, f"granted to {who} but never used (extra): {sorted(extra)}"
