"""The chart installed by the real helm on a real API server (the local control plane, or kind through
e2e/kind.sh), then used the way a user would: CRDs and `kubectl explain`, bad manifests refused with
actionable messages, printer columns, and the chart's own operator reconciling a pool to Ready.

Locally the operator Deployment is scheduled onto the process node, which runs `modelpool-operator` as a
local process against the API server; the pool's workers land on the KWOK fake GPU nodes. The release is
installed in a namespace of its own (no pool is served from it), namespace-scoped to this module's two pool
namespaces, and uses its own ModelBudget, so it never acts on what other tests create in the same cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from e2e.helpers import CHART, EXAMPLES, eventually, require_binary, run
from modelpool_contract.demand import demand_from_lease, demand_lease_name
from modelpool_contract.gateway_keys import default_keys_namespace
from modelpool_contract.reserved import DEFAULT_NODE_SELECTOR_KEYS, DEFAULT_TOLERATION_KEYS
from testkit import prom

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

INSTALL_TIMEOUT_S = 240
POOL_READY_TIMEOUT_S = 180


@dataclass
class Release:
    """One helm release of the chart and the tools to look at it."""

    name: str
    namespace: str
    budget: str
    kubeconfig: Path
    helm: Path
    kubectl: Path
    external: bool
    helm_home: Path
    metrics_port: int = 0
    # A second namespace in the operator's scope (pools in two namespaces for the uninstall test).
    other_namespace: str = ""
    # The release's own namespace (the operator, the gateway, their Secrets): no pool is served from it, so
    # the pools live in ``namespace`` and ``other_namespace``.
    system_namespace: str = ""

    def env(self) -> dict[str, str]:
        # helm's config/cache/data in a temporary folder, never the user's.
        homes = {
            v: str(self.helm_home / v.lower())
            for v in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME")
        }
        return {"KUBECONFIG": str(self.kubeconfig), **homes}

    def k(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return run([self.kubectl, *args], env=self.env(), check=check, input_text=stdin, timeout=60)

    def get(self, *args: str) -> Any:
        return json.loads(self.k("get", *args, "-o", "json").stdout)

    def h(self, *args: str, check: bool = True, timeout: float = INSTALL_TIMEOUT_S + 30) -> Any:
        return run([self.helm, *args], env=self.env(), check=check, timeout=timeout)


def pool_manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"source": "hf://sentence-transformers/all-MiniLM-L6-v2", "task": "text-embedding"},
        "replicas": 1,
        "resources": {"memory": "1Gi"},
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    return {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


def new_release(
    e2e_kubeconfig: Path, e2e_external: bool, tmp_path_factory: pytest.TempPathFactory
) -> Release:
    """A fresh release's names (its own namespaces and ModelBudget), the namespaces created."""
    helm = require_binary("helm")
    kubectl = require_binary("kubectl")
    suffix = secrets.token_hex(3)
    rel = Release(
        name=f"mpe2e-{suffix}",
        namespace=f"mp-e2e-{suffix}",
        budget=f"e2e-{suffix}",
        kubeconfig=e2e_kubeconfig,
        helm=helm,
        kubectl=kubectl,
        external=e2e_external,
        helm_home=tmp_path_factory.mktemp("helm-home"),
        metrics_port=19000 + secrets.randbelow(1000),
        other_namespace=f"mp-e2e-{suffix}-b",
        system_namespace=f"mp-e2e-{suffix}-sys",
    )
    for namespace in (rel.namespace, rel.other_namespace, rel.system_namespace):
        rel.k("create", "namespace", namespace)
    return rel


def chart_values(rel: Release) -> dict[str, Any]:
    """The values the e2e releases are installed with: namespace-scoped to the release's two pool
    namespaces, its own budget (created by the operator: budget.create), short intervals, and locally the
    operator and the gateway on the process node."""
    values: dict[str, Any] = {
        "scope": {"clusterWide": False, "namespaces": [rel.namespace, rel.other_namespace]},
        # One replica (the process node runs it as a local process: two would share its ports), elected
        # all the same: the chart's leader election Lease and its Role are exercised.
        "replicaCount": 1,
        "liveness": {"port": 18000 + secrets.randbelow(1000)},
        # The process node runs the operator as a local process: its metrics port is this machine's.
        "metrics": {"port": rel.metrics_port},
        "config": {
            "budgetName": rel.budget,
            # The KWOK nodes the test pools select and tolerate (the operator's policy allows no others).
            "allowedNodeSelectorKeys": [*DEFAULT_NODE_SELECTOR_KEYS, "type"],
            "allowedTolerationKeys": [*DEFAULT_TOLERATION_KEYS, "kwok.x-k8s.io/node"],
            "statsIntervalSeconds": 1,
            "resyncIntervalSeconds": 2,
            "backoffBaseSeconds": 1,
            "logFormat": "plain",
        },
        "budget": {"create": True, "memory": "100Gi"},
    }
    if rel.external:
        # kind (e2e/kind.sh): the images built from the Dockerfile and loaded into the nodes.
        repository, _, tag = os.environ["MODELPOOL_E2E_OPERATOR_IMAGE"].rpartition(":")
        values["image"] = {"repository": repository, "tag": tag, "pullPolicy": "Never"}
        values["config"]["serverImage"] = os.environ["MODELPOOL_E2E_SERVER_IMAGE"]
    else:
        # The process node runs the operator and the gateway as local processes (no image is pulled).
        on_process_node = {
            "nodeSelector": {"modelpool.dev/process-node": "true"},
            "tolerations": [{"key": "modelpool.dev/process-node", "operator": "Exists"}],
        }
        values.update(on_process_node)
        values["gateway"] = {
            **on_process_node,
            "replicaCount": 1,
            # Pods there share the machine's ports: the gateway listens on its own loopback pod address.
            "port": 19000 + secrets.randbelow(1000),
            # Its metrics port, on the same address: not the default 8081, which a tool may hold.
            "metrics": {"port": 20000 + secrets.randbelow(1000)},
            "extraEnv": [
                {"name": "MODELPOOL_GATEWAY_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
            ],
        }
    return values


def helm_apply(rel: Release, command: str, values: dict[str, Any], folder: Path) -> None:
    """``helm install`` or ``helm upgrade`` the chart from the tree with ``values`` and wait for it."""
    values_file = folder / f"values-{secrets.token_hex(3)}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    rel.h(
        command, rel.name, str(CHART),
        "--namespace", rel.system_namespace,
        "--values", str(values_file),
        # CRDs applied by other tests in this cluster become the release's (and stay: keep).
        "--take-ownership",
        "--wait", "--timeout", f"{INSTALL_TIMEOUT_S}s",
    )  # fmt: skip


@pytest.fixture(scope="module")
def release(
    e2e_kubeconfig: Path, e2e_external: bool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    rel = new_release(e2e_kubeconfig, e2e_external, tmp_path_factory)
    try:
        helm_apply(rel, "install", chart_values(rel), tmp_path_factory.mktemp("values"))
        yield rel
    finally:
        remove_everything(rel)


def remove_everything(rel: Release) -> None:
    """Delete the pools and the budget while the operator still runs (it owns their finalizers), then the
    release and the namespace; whatever still carries a finalizer after that has its finalizers removed."""
    namespaces = (rel.namespace, rel.other_namespace)
    for namespace in namespaces:
        rel.k("delete", "modelpools", "--all", "-n", namespace, "--timeout=30s", check=False)
    rel.k("delete", "modelbudget", rel.budget, "--ignore-not-found", "--timeout=30s", check=False)
    rel.h(
        "uninstall", rel.name, "--namespace", rel.system_namespace, "--wait", "--timeout", "60s", check=False
    )
    unfinalize = ["--type", "merge", "-p", '{"metadata": {"finalizers": null}}']
    for namespace in namespaces:
        for pool in rel.k("get", "modelpools", "-n", namespace, "-o", "name", check=False).stdout.split():
            rel.k("patch", pool, "-n", namespace, *unfinalize, check=False)
    if rel.k("get", "modelbudget", rel.budget, "-o", "name", check=False).returncode == 0:
        rel.k("patch", "modelbudget", rel.budget, *unfinalize, check=False)
        rel.k("delete", "modelbudget", rel.budget, "--ignore-not-found", "--wait=false", check=False)
    # The keys namespace the chart created is kept by uninstall (resource-policy keep): deleted here.
    for namespace in (*namespaces, rel.system_namespace, default_keys_namespace(rel.system_namespace)):
        rel.k("delete", "namespace", namespace, "--wait=false", "--ignore-not-found", check=False)


def test_operator_runs(release: Release) -> None:
    deployment = release.get(
        "deployment",
        "-n", release.system_namespace,
        "-l", f"app.kubernetes.io/instance={release.name},app.kubernetes.io/component=operator",
    )  # fmt: skip
    [item] = deployment["items"]
    assert item["status"].get("readyReplicas") == 1
    pods = release.get("pods", "-n", release.system_namespace, "-l", "app.kubernetes.io/component=operator")[
        "items"
    ]
    assert len(pods) == 1
    if not release.external:
        assert pods[0]["spec"]["nodeName"].startswith("process-node")
    # Created by the operator at its startup (budget.create), not by the chart: no helm annotation.
    budget = eventually(
        lambda: (
            release.get("modelbudget", release.budget)
            if release.k("get", "modelbudget", release.budget, check=False).returncode == 0
            else None
        ),
        timeout=60,
        what=f"ModelBudget {release.budget} created by the operator",
    )
    assert budget["spec"]["memory"] == "100Gi"
    assert not any(k.startswith("helm.sh/") for k in (budget["metadata"].get("annotations") or {}))
    # Elected through the chart's Lease (its Role, its admission policy), under its pod's name.
    name = pods[0]["metadata"]["name"]
    lease = release.get("lease", f"{release.name}-modelpool-operator", "-n", release.system_namespace)
    assert lease["spec"]["holderIdentity"] == name
    eventually(
        lambda: (
            (release.get("modelbudget", release.budget).get("status") or {}).get("activeOperator") == name
        ),
        timeout=60,
        what="the budget's status.activeOperator names the operator's pod",
    )


def test_crds_installed_and_kept_on_uninstall_policy(release: Release) -> None:
    for name in ("modelpools.modelpool.dev", "modelbudgets.modelpool.dev"):
        crd = release.get("crd", name)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        established = [c for c in crd["status"]["conditions"] if c["type"] == "Established"]
        assert established and established[0]["status"] == "True"


def test_kubectl_explain_documents_the_queue(release: Release) -> None:
    def explained() -> str | None:
        result = release.k("explain", "modelpool.spec.queue", check=False)
        return result.stdout if result.returncode == 0 and "capacity" in result.stdout else None

    text = eventually(explained, timeout=60, what="kubectl explain modelpool.spec.queue")
    for field in ("capacity", "maxBatchSize", "maxBatchDelayMs", "requestTimeoutSeconds"):
        assert field in text
    assert "429" in text, "field descriptions (Retry-After on a full queue) reach kubectl explain"


@pytest.mark.parametrize(
    ("case", "spec", "expected"),
    [
        ("bad-task", {"model": {"task": "summarize"}}, ["spec.model.task", 'Unsupported value: "summarize"']),
        (
            "replicas-over-max",
            {"replicas": 5, "maxReplicas": 2},
            ["spec.replicas must be less than or equal to spec.maxReplicas"],
        ),
        ("bad-memory", {"resources": {"memory": "lots"}}, ["spec.resources.memory"]),
        ("bad-source", {"model": {"source": "s3://bucket/model"}}, ["spec.model.source", "hf://"]),
        ("unknown-field", {"replica": 2}, ['unknown field "spec.replica"']),
    ],
)
def test_invalid_pools_are_refused_with_actionable_messages(
    release: Release, case: str, spec: dict[str, Any], expected: list[str]
) -> None:
    manifest = pool_manifest(f"invalid-{case}", release.namespace, **spec)
    result = release.k("create", "--dry-run=server", "-f", "-", stdin=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"{case} was accepted: {result.stdout}"
    for text in expected:
        assert text in result.stderr, f"{case}: {text!r} not in {result.stderr!r}"


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_accepted_by_the_api_server(release: Release, example: Path) -> None:
    documents = [doc for doc in yaml.safe_load_all(example.read_text()) if doc]
    for doc in documents:
        if doc["kind"] == "ModelBudget":  # cluster-scoped: other tests' "default" budget may be terminating
            doc["metadata"]["name"] = f"example-{release.budget}"
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
    result = release.k(
        "create", "--dry-run=server", "-n", release.namespace, "-f", "-", stdin=manifest, check=False
    )
    assert result.returncode == 0, f"{example.name}: {result.stderr}"


def test_schema_typo_fails_the_install_before_touching_the_cluster(release: Release) -> None:
    result = release.h(
        "install", f"{release.name}-typo", str(CHART), "--namespace", release.system_namespace,
        "--set", "scope.clusterwide=false", check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "additional properties 'clusterwide' not allowed" in result.stderr.replace('"', "'")
    assert (
        release.h("status", f"{release.name}-typo", "-n", release.system_namespace, check=False).returncode
        != 0
    )


def test_operator_reconciles_a_kwok_pool_to_ready_with_budget_accounting(release: Release) -> None:
    if release.external:
        pytest.skip("KWOK fake GPU nodes exist only on the local control plane")
    manifest = pool_manifest(
        "kwok-pool",
        release.namespace,
        replicas=2,
        maxReplicas=4,
        resources={"gpus": 1, "memory": "10Gi"},
        idleTimeoutSeconds=0,
        podTemplate={
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
        },
    )
    release.k("apply", "-f", "-", stdin=json.dumps(manifest))

    def ready() -> dict[str, Any] | None:
        pool = release.get("modelpools", "kwok-pool", "-n", release.namespace)
        status = pool.get("status") or {}
        return pool if status.get("readyReplicas") == 2 else None

    pool = eventually(ready, timeout=POOL_READY_TIMEOUT_S, interval=1, what="kwok-pool readyReplicas=2")
    status = pool["status"]
    assert sorted(w["state"] for w in status["workers"]) == ["Ready", "Ready"]
    assert all(w["node"].startswith("kwok-") for w in status["workers"])
    assert status["observedGeneration"] == pool["metadata"]["generation"]

    pods = release.get("pods", "-n", release.namespace, "-l", "modelpool.dev/pool=kwok-pool")["items"]
    assert len(pods) == 2
    for pod in pods:
        [owner] = pod["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("ModelPool", "kwok-pool")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"

    def budget_used() -> dict[str, Any] | None:
        budget = release.get("modelbudget", release.budget)
        pools = (budget.get("status") or {}).get("pools") or []
        mine = [p for p in pools if p["name"] == "kwok-pool" and p["namespace"] == release.namespace]
        return budget if mine and mine[0].get("memoryBytes") == 20 * 2**30 else None

    eventually(budget_used, timeout=60, interval=1, what=f"ModelBudget {release.budget} to charge 20Gi")

    # Printer columns as a user sees them.
    table = release.k("get", "modelpools", "-n", release.namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "TASK", "READY", "DESIRED", "STATE", "MEMORY", "AGE"]
    row = next(line.split() for line in table[1:] if line.startswith("kwok-pool"))
    assert row[1:5] == ["text-embedding", "2/2", "2", "Ready"]
    budgets = release.k("get", "modelbudget", release.budget).stdout.splitlines()
    assert budgets[0].split() == ["NAME", "TOTAL", "USED", "RESERVED", "AGE"]
    assert budgets[1].split()[1] == "100Gi"
    # -o wide: what each worker is charged against what was measured (KWOK workers measure nothing), and
    # a generation pool's tokens in flight (none here).
    wide = release.k("get", "modelpools", "-n", release.namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[-3:] == ["DECLARED", "MEASURED", "TOKENS"]
    wide_row = next(line for line in wide[1:] if line.startswith("kwok-pool"))
    declared = wide[0].index("DECLARED")
    # An unset MEASURED (and TOKENS) prints as nothing.
    assert wide_row[declared:].split() == ["10Gi"]

    # The chart's operator serves its metrics (on this machine: the process node runs it locally).
    def ready_in_metrics() -> bool:
        text = httpx.get(f"http://127.0.0.1:{release.metrics_port}/metrics", timeout=5, trust_env=False).text
        labels = {"namespace": release.namespace, "pool": "kwok-pool", "state": "Ready"}
        return prom.value(text, "modelpool_operator_workers", **labels) == 2

    eventually(ready_in_metrics, timeout=30, interval=1, what="modelpool_operator_workers{state=Ready} == 2")


def test_the_names_users_type_address_one_resource(release: Release) -> None:
    """`kubectl get modelpool NAME` (singular), `mp`, `modelbudget`/`mb`: each names one resource type. A CRD
    category spelled like a kind's singular name makes kubectl expand it to every member of the category
    ("you must specify only one resource")."""
    pool = pool_manifest("naming", release.namespace, replicas=0, minReplicas=0)
    release.k("apply", "-f", "-", stdin=json.dumps(pool))
    for kind in ("modelpool", "modelpools", "mp", "modelpools.modelpool.dev"):
        result = release.k("get", kind, "naming", "-n", release.namespace, "-o", "name", check=False)
        assert result.returncode == 0, f"kubectl get {kind} naming: {result.stderr.strip()}"
        assert result.stdout.strip() == "modelpool.modelpool.dev/naming"
    for kind in ("modelbudget", "mb"):
        result = release.k("get", kind, release.budget, "-o", "name", check=False)
        assert result.returncode == 0, f"kubectl get {kind} {release.budget}: {result.stderr.strip()}"


def test_the_chart_s_operator_gives_each_pool_a_network_policy_naming_its_own_pods(release: Release) -> None:
    """On by default: the installed operator makes the pool's NetworkPolicy, owned by the pool, and its peers
    select the release's real operator and gateway pods (no CNI enforces it here: its shape is checked)."""
    pool = pool_manifest("fenced", release.namespace, replicas=0, minReplicas=0)
    release.k("apply", "-f", "-", stdin=json.dumps(pool))

    def policy() -> dict[str, Any] | None:
        found = release.k(
            "get", "networkpolicy", "modelpool-fenced", "-n", release.namespace, "-o", "json", check=False
        )
        return json.loads(found.stdout) if found.returncode == 0 else None

    made = eventually(policy, timeout=60, interval=1, what="NetworkPolicy modelpool-fenced")
    [owner] = made["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"]) == ("ModelPool", "fenced")
    assert made["spec"]["podSelector"] == {"matchLabels": {"modelpool.dev/pool": "fenced"}}
    probes, serving = made["spec"]["ingress"]
    [operator] = probes["from"]
    assert serving["from"][0] == operator and len(serving["from"]) == 2
    gateway = serving["from"][1]
    # The operator's and the gateway's pods: in the release's own namespace, where no pool is.
    ns = {"matchLabels": {"kubernetes.io/metadata.name": release.system_namespace}}
    assert operator["namespaceSelector"] == gateway["namespaceSelector"] == ns
    for peer, component in ((operator, "operator"), (gateway, "gateway")):
        selector = ",".join(f"{k}={v}" for k, v in peer["podSelector"]["matchLabels"].items())
        pods = release.get("pods", "-n", release.system_namespace, "-l", selector)["items"]
        assert pods and {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pods} == {component}


def test_the_gateway_runs_with_least_privilege_and_routes_by_model(release: Release) -> None:
    gateway = f"{release.name}-modelpool-operator-gateway"
    deployment = release.get("deployment", gateway, "-n", release.system_namespace)
    assert deployment["status"].get("readyReplicas") == deployment["spec"]["replicas"]
    assert gateway in release.h("get", "notes", release.name, "-n", release.system_namespace).stdout

    account = f"system:serviceaccount:{release.system_namespace}:{gateway}"
    # Exactly the verbs the gateway uses (tests/gateway/integration/test_gateway_rbac.py reads them from the
    # API server's audit log).
    allowed = [("list", "modelpools"), ("watch", "modelpools"), ("list", "pods"), ("watch", "pods"),
               ("get", "leases.coordination.k8s.io"), ("create", "leases.coordination.k8s.io"),
               ("update", "leases.coordination.k8s.io")]  # fmt: skip
    # Nothing that writes a pool (its image, its env: the operator would roll them out to every worker).
    denied = [("patch", "modelpools"), ("update", "modelpools"), ("create", "modelpools"),
              ("create", "pods"), ("delete", "modelpools"), ("patch", "pods"), ("get", "secrets"),
              ("get", "pods"), ("patch", "modelpools --subresource=status"), ("list", "modelbudgets"),
              ("delete", "leases.coordination.k8s.io"), ("patch", "leases.coordination.k8s.io")]  # fmt: skip
    for verb, resource in allowed + denied:  # where the pools are
        answer = release.k(
            "auth", "can-i", verb, *resource.split(), "-n", release.namespace, "--as", account, check=False
        )
        expected = "yes" if (verb, resource) in allowed else "no"
        assert answer.stdout.strip() == expected, f"{verb} {resource}: {answer.stdout.strip()}"
    # Its API key Secrets are read in the keys namespace only: never the release namespace's Secrets (the
    # control seed, Helm's releases), nor its pods.
    keys_namespace = default_keys_namespace(release.system_namespace)
    secret_reads = [
        ("list", keys_namespace, "yes"),
        ("watch", keys_namespace, "yes"),
        ("list", release.system_namespace, "no"),
        ("list", "default", "no"),
    ]
    for verb, where, expected in secret_reads:
        answer = release.k("auth", "can-i", verb, "secrets", "-n", where, "--as", account, check=False)
        assert answer.stdout.strip() == expected, f"{verb} secrets in {where}: {answer.stdout.strip()}"
    answer = release.k(
        "auth", "can-i", "list", "pods", "-n", release.system_namespace, "--as", account, check=False
    )
    assert answer.stdout.strip() == "no"

    if release.external:
        return  # the traffic below goes to the gateway pod's loopback address on the process node
    # At zero with autoscaling off: the operator starts no worker for it, whatever the demand.
    zero = pool_manifest("gw-zero", release.namespace, replicas=0, activationTimeoutSeconds=60)
    zero["spec"]["autoscaling"] = {"enabled": False}
    # Woken by demand, but its worker never fits the release's budget (100Gi): held, and the demand recorded.
    wake = pool_manifest(
        "gw-wake", release.namespace, replicas=0, minReplicas=0, maxReplicas=1, activationTimeoutSeconds=1
    )
    wake["spec"]["autoscaling"] = {"enabled": True}
    wake["spec"]["resources"] = {"memory": "200Gi"}
    for pool in (zero, wake):
        release.k("apply", "-f", "-", stdin=json.dumps(pool))
    [pod] = release.get("pods", "-n", release.system_namespace, "-l", "app.kubernetes.io/component=gateway")[
        "items"
    ]
    url = f"http://{pod['status']['podIP']}:{pod['spec']['containers'][0]['ports'][0]['containerPort']}"
    # An API key as the NOTES say: a labelled Secret in the keys namespace, granting the pools' namespace.
    key = secrets.token_hex(24)
    release.k(
        "create", "secret", "generic", "gw-key", "-n", keys_namespace,
        f"--from-literal=key={key}", f"--from-literal=namespaces={release.namespace}",
    )  # fmt: skip
    release.k("label", "secret", "gw-key", "-n", keys_namespace, "modelpool.dev/gateway-key=true")
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.get(url + "/v1/models", timeout=5).status_code == 401

    def listed() -> list[str] | None:
        response = httpx.get(url + "/v1/models", headers=headers, timeout=5)
        models = [m["id"] for m in response.json()["data"]] if response.status_code == 200 else []
        return models if {"gw-zero", "gw-wake"} <= set(models) else None

    eventually(listed, timeout=30, what="the gateway lists gw-zero and gw-wake")
    body = {"model": "gw-zero", "input": ["x"]}
    never = httpx.post(url + "/v1/embeddings", json=body, headers=headers, timeout=30)
    # At zero with autoscaling off: the operator starts no worker for it, so it is not held (60 s) at all.
    assert never.status_code == 503 and never.json()["error"]["type"] == "scaled_to_zero", never.text
    assert never.elapsed.total_seconds() < 5
    held = httpx.post(url + "/v1/embeddings", json={**body, "model": "gw-wake"}, headers=headers, timeout=30)
    assert held.status_code == 503, held.text
    assert held.json()["error"]["type"] in ("waiting_for_operator", "budget_exceeded"), held.text
    unknown = httpx.post(
        url + "/v1/embeddings", json={"model": "nope", "input": ["x"]}, headers=headers, timeout=30
    )
    assert unknown.status_code == 404
    lease = release.get("leases.coordination.k8s.io", demand_lease_name("gw-wake"), "-n", release.namespace)
    assert demand_from_lease(lease) is not None, "the gateway recorded the demand in the pool's Lease"
    pool = release.get("modelpools", "gw-wake", "-n", release.namespace)
    assert lease["metadata"]["ownerReferences"][0]["uid"] == pool["metadata"]["uid"]


def test_uninstall_leaves_no_finalizer_behind_and_keeps_the_crds(release: Release) -> None:
    """Pools left in two namespaces at ``helm uninstall``: the pre-delete hook stops the operator and takes
    its finalizer off them, so deleting their namespaces afterwards completes (it used to hang)."""
    namespaces = (release.namespace, release.other_namespace)
    for namespace in namespaces:
        zero = pool_manifest("left-behind", namespace, replicas=0, minReplicas=0)
        release.k("apply", "-f", "-", stdin=json.dumps(zero))

    def finalized() -> bool:
        pools = [release.get("modelpools", "left-behind", "-n", ns) for ns in namespaces]
        return all(p["metadata"].get("finalizers") for p in pools)

    eventually(finalized, timeout=60, what="the operator's finalizer on both pools")
    release.h(
        "uninstall", release.name, "--namespace", release.system_namespace, "--wait", "--timeout", "180s"
    )
    assert release.k("get", "crd", "modelpools.modelpool.dev").returncode == 0
    left = release.k("get", "deployments", "-n", release.system_namespace, "-o", "name").stdout.strip()
    assert not left, f"the operator Deployment outlived uninstall: {left}"
    for namespace in namespaces:  # the pools are kept (like the CRDs), without the operator's finalizer
        assert not release.get("modelpools", "left-behind", "-n", namespace)["metadata"].get("finalizers")
    hooks = release.k(
        "get", "jobs,serviceaccounts,roles", "-n", release.system_namespace, "-o", "name"
    ).stdout
    assert "cleanup" not in hooks, f"the hook's objects outlived it: {hooks}"

    for namespace in namespaces:
        release.k("delete", "namespace", namespace, "--wait=false")

    def gone() -> bool:
        found = release.k("get", "namespaces", *namespaces, "-o", "name", "--ignore-not-found").stdout
        return not found.strip()

    eventually(gone, timeout=60, what="both namespaces deleted (nothing left waiting for the operator)")
