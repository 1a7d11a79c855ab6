"""The API server's audit log (hack/audit-policy.yaml: the requests of the ServiceAccounts of the audited
namespace) and the kubeconfig that makes a ServiceAccount's requests audited ones: what the RBAC and
identity tests (``tests/rbacaudit.py``) and the upgrade check's leader kill (``bench/upgrade``) read.
"""

from __future__ import annotations

import json
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
