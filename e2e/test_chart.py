"""The Helm chart with the real helm (bin/helm, from `make testbin`): lint, render for each scope, and the
strict values schema. No cluster needed; e2e/test_install.py installs it on one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e.helpers import CHART, CHART_CRDS, by_kind, load_all, one, require_binary, run

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """helm, with its config/cache/data folders in a temporary directory (never the user's)."""
    binary = require_binary("helm")
    home = tmp_path_factory.mktemp("helm-home")
    homes = [f"{v}={home / v.lower()}" for v in ("HELM_CONFIG_HOME", "HELM_CACHE_HOME", "HELM_DATA_HOME")]
    return ["env", *homes, str(binary)]


def template(helm: list[str], *args: str, check: bool = True) -> Any:
    return run([*helm, "template", "mp", str(CHART), "--namespace", "mp-system", *args], check=check)


def render(helm: list[str], *args: str) -> list[dict[str, Any]]:
    return load_all(template(helm, *args).stdout)


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(docs, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def test_lint_strict(helm: list[str]) -> None:
    result = run([*helm, "lint", "--strict", str(CHART)])
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    for values in (
        "scope.clusterWide=false,scope.namespaces={a,b}",
        "peering.enabled=false,crds.enabled=false",
        "budget.create=true,budget.memory=1Ti",
        "config.modelCacheType=hostPath,config.modelCacheHostPath=/var/cache/modelpool",
    ):
        run([*helm, "lint", "--strict", str(CHART), "--set", values])


def test_default_render_cluster_scope(helm: list[str]) -> None:
    docs = render(helm)
    crds = {d["metadata"]["name"]: d for d in by_kind(docs, "CustomResourceDefinition")}
    expected_crds = {
        doc["metadata"]["name"]
        for path in sorted(CHART_CRDS.glob("*.yaml"))
        for doc in load_all(Path(path).read_text())
    }
    assert expected_crds, "the chart has no CRD files: run hack/sync-chart-crds.sh"
    assert set(crds) == expected_crds | {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    for name, crd in crds.items():
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name
        assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "modelpool", name

    c = container(docs)
    assert c["command"] == ["modelpool-operator"]
    assert "--all-namespaces" in c["args"]
    assert "--peering=modelpool-operator" in c["args"]
    assert "--liveness=8080" in c["args"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MODELPOOL_OPERATOR_BUDGET_NAME"] == "default"
    assert env["MODELPOOL_OPERATOR_STATS_INTERVAL_SECONDS"] == "5"
    assert "MODELPOOL_OPERATOR_SERVER_IMAGE" not in env, "empty serverImage: the operator's default"
    assert c["securityContext"].items() >= RESTRICTED_CONTAINER.items()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["image"] == "ghcr.io/modelpool/modelpool-operator:0.1.0"

    peering = one(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "modelpool-operator"
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
    assert not by_kind(docs, "ModelBudget"), "no budget unless budget.create"

    binding = one(docs, "ClusterRoleBinding", "mp-modelpool-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mp-modelpool-operator", "namespace": "mp-system"}
    ]
    assert not by_kind(docs, "RoleBinding")


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_grants_what_the_operator_does(helm: list[str]) -> None:
    docs = render(helm)
    namespaced = _rules(one(docs, "ClusterRole", "mp-modelpool-operator"))
    cluster = _rules(one(docs, "ClusterRole", "mp-modelpool-operator-cluster"))
    for needed in [
        ("modelpool.dev", "modelpools", "watch"),
        ("modelpool.dev", "modelpools/status", "patch"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "pods", "watch"),
        ("", "services", "create"),
        ("", "events", "create"),
        ("coordination.k8s.io", "leases", "update"),
        ("kopf.dev", "kopfpeerings", "patch"),
    ]:
        assert needed in namespaced, needed
    for needed in [
        ("modelpool.dev", "modelbudgets", "watch"),
        ("modelpool.dev", "modelbudgets/status", "patch"),
        ("kopf.dev", "clusterkopfpeerings", "patch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("", "namespaces", "watch"),
    ]:
        assert needed in cluster, needed
    assert not any(verb == "*" or res == "*" for _, res, verb in namespaced | cluster)


def test_namespace_scope(helm: list[str]) -> None:
    docs = render(helm, "--set", "scope.clusterWide=false", "--set", "scope.namespaces={team-a,team-b}")
    args = container(docs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace=")] == ["--namespace=team-a", "--namespace=team-b"]
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert not [
        b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == "mp-modelpool-operator"
    ]
    peerings = by_kind(docs, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert not by_kind(docs, "ClusterKopfPeering")
    cluster_rules = _rules(one(docs, "ClusterRole", "mp-modelpool-operator-cluster"))
    assert ("", "namespaces", "watch") not in cluster_rules

    # No namespaces listed: the release namespace.
    docs = render(helm, "--set", "scope.clusterWide=false")
    assert "--namespace=mp-system" in container(docs)["args"]


def test_switches(helm: list[str]) -> None:
    docs = render(
        helm,
        "--set", "crds.enabled=false",
        "--set", "peering.enabled=false",
        "--set", "liveness.enabled=false",
        "--set", "verbose=true",
        "--set", "config.serverImage=registry.local/server:1",
        "--set", "image.tag=dev",
        "--set", "budget.create=true",
        "--set", "budget.memory=640Gi",
        "--set", "config.budgetName=gpus",
        "--set", "crds.keep=true",
        "--set-json", 'nodeSelector={"pool":"system"}',
        "--set-json", 'tolerations=[{"key":"dedicated","operator":"Exists"}]',
    )  # fmt: skip
    assert not by_kind(docs, "CustomResourceDefinition")
    assert not by_kind(docs, "ClusterKopfPeering")
    c = container(docs)
    assert "--standalone" in c["args"] and "--liveness=0" in c["args"] and "--verbose" in c["args"]
    assert "livenessProbe" not in c
    assert c["image"].endswith(":dev")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MODELPOOL_OPERATOR_SERVER_IMAGE"] == "registry.local/server:1"
    assert env["MODELPOOL_OPERATOR_BUDGET_NAME"] == "gpus"
    budget = one(docs, "ModelBudget")
    assert budget["metadata"]["name"] == "gpus"
    assert budget["spec"] == {"memory": "640Gi"}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]

    # The default model cache reaches the operator's environment (empty values are left out).
    docs = render(helm, "--set", "config.modelCacheType=pvc", "--set", "config.modelCacheClaimName=hub")
    env = {e["name"]: e.get("value") for e in container(docs)["env"]}
    assert env["MODELPOOL_OPERATOR_MODEL_CACHE_TYPE"] == "pvc"
    assert env["MODELPOOL_OPERATOR_MODEL_CACHE_CLAIM_NAME"] == "hub"
    assert "MODELPOOL_OPERATOR_MODEL_CACHE_HOST_PATH" not in env

    # crds.keep=false drops the annotation.
    docs = render(helm, "--set", "crds.keep=false")
    for crd in by_kind(docs, "CustomResourceDefinition"):
        assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicas=2"], "additional properties 'replicas' not allowed"),
        (["--set", "config.statsInterval=3"], "additional properties 'statsInterval' not allowed"),
        (["--set", "crds.enable=false"], "additional properties 'enable' not allowed"),
        (["--set", "budget.memory=lots"], "at '/budget/memory'"),
        (["--set", "config.logFormat=xml"], "at '/config/logFormat'"),
        (["--set", "replicaCount=3"], "at '/replicaCount'"),
        (["--set", "liveness.port=0"], "at '/liveness/port'"),
        (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
        (["--set", "config.modelCacheType=nfs"], "at '/config/modelCacheType'"),
        (["--set", "config.modelCacheType=pvc"], "at '/config/modelCacheClaimName'"),
        (["--set", "config.modelCacheType=hostPath"], "at '/config/modelCacheHostPath'"),
        (
            ["--set", "config.modelCacheType=hostPath", "--set", "config.modelCacheHostPath=rel"],
            "at '/config/modelCacheHostPath'",
        ),
    ],
)
def test_schema_rejects_bad_values(helm: list[str], args: list[str], message: str) -> None:
    result = template(helm, *args, check=False)
    assert result.returncode != 0, f"{args} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr.replace('"', "'"), result.stderr
