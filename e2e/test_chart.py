"""The Helm chart with the real helm (bin/helm, from `make testbin`): lint, render for each scope, and the
strict values schema. No cluster needed; e2e/test_install.py installs it on one."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.helpers import CHART, CHART_CRDS, by_kind, load_all, one, require_binary, run
from modelpool_contract.flags import DEFAULT_WORKER_CPU
from modelpool_contract.gateway_keys import default_keys_namespace
from modelpool_contract.labels import PROBE_PORT_NAME
from modelpool_contract.version import VERSION
from modelpool_operator.services import pod_settings
from modelpool_operator.settings import OperatorConfig

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
OPERATOR = "mp-modelpool-operator"
GATEWAY = "mp-modelpool-operator-gateway"


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


def container(docs: list[dict[str, Any]], name: str = OPERATOR) -> dict[str, Any]:
    deployment = one(docs, "Deployment", name)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]  # type: ignore[no-any-return]


def test_lint_strict(helm: list[str]) -> None:
    result = run([*helm, "lint", "--strict", str(CHART)])
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout
    for values in (
        "scope.clusterWide=false,scope.namespaces={a,b}",
        "peering.enabled=true,crds.enabled=false",
        "replicaCount=1,leaderElection.enabled=false,podDisruptionBudget.enabled=false",
        "budget.create=true,budget.memory=1Ti",
        "config.modelCacheType=hostPath,config.modelCacheHostPath=/var/cache/modelpool",
        "gateway.enabled=false",
        "networkPolicy.enabled=false",
        "gateway.namespaces={a,b},gateway.replicaCount=1,gateway.service.type=LoadBalancer",
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
    # Kopf's peering CRDs only with peering.enabled (off: leader election replaces it).
    assert set(crds) == expected_crds
    for name, crd in crds.items():
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name
        assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "modelpool", name

    c = container(docs)
    assert c["command"] == ["modelpool-operator"]
    assert "--all-namespaces" in c["args"]
    assert "--standalone" in c["args"]
    assert "--liveness=8080" in c["args"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MODELPOOL_OPERATOR_BUDGET_NAME"] == "default"
    assert env["MODELPOOL_OPERATOR_STATS_INTERVAL_SECONDS"] == "5"
    assert "MODELPOOL_OPERATOR_SERVER_IMAGE" not in env, "empty serverImage: the operator's default"
    assert c["securityContext"].items() >= RESTRICTED_CONTAINER.items()
    pod = one(docs, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["image"] == f"ghcr.io/modelpool/modelpool-operator:{VERSION}"

    assert not by_kind(docs, "ClusterKopfPeering") and not by_kind(docs, "KopfPeering")
    assert not by_kind(docs, "ModelBudget"), "the chart never templates the budget (the operator creates it)"
    assert env["MODELPOOL_OPERATOR_MISSING_BUDGET"] == "refuse", "no budget: nothing admitted, by default"
    assert "MODELPOOL_OPERATOR_BUDGET_CREATE" not in env
    cluster_role = one(docs, "ClusterRole", f"{OPERATOR}-cluster")
    assert ("modelpool.dev", "modelbudgets", "create") not in _rules(cluster_role), "create only to create"

    binding = one(docs, "ClusterRoleBinding", "mp-modelpool-operator")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "mp-modelpool-operator", "namespace": "mp-system"}
    ]
    # The namespaced bindings (besides the uninstall hook's, test_the_uninstall_hook_...): the gateway's,
    # to read its API key Secrets in the keys namespace (never the release namespace's Secrets), and the
    # operator's leader election Lease in the release namespace.
    lasting = [
        b for b in by_kind(docs, "RoleBinding") if "helm.sh/hook" not in b["metadata"].get("annotations", {})
    ]
    assert sorted((b["metadata"]["name"], b["metadata"]["namespace"]) for b in lasting) == [
        (f"{GATEWAY}-keys", "mp-system-keys"),
        (f"{OPERATOR}-leader-election", "mp-system"),
    ]


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container(docs)["env"]}


def test_the_default_worker_cpu_reaches_the_operator(helm: list[str]) -> None:
    variable = "MODELPOOL_OPERATOR_DEFAULT_WORKER_CPU"
    # The chart's value by default: each worker without resources.cpu requests one CPU.
    assert _operator_env(render(helm))[variable] == DEFAULT_WORKER_CPU
    for value, default_cpu in (("500m", "500m"), ("2", "2"), ("0", None)):
        rendered = _operator_env(render(helm, "--set", f"config.defaultWorkerCpu={value}"))[variable]
        assert rendered == value
        # What the operator makes of the rendered variable: the request its pod builder gives.
        assert pod_settings(OperatorConfig(default_worker_cpu=rendered)).default_cpu == default_cpu
    # Empty: no variable, so the operator's own default applies.
    assert variable not in _operator_env(render(helm, "--set-string", "config.defaultWorkerCpu="))


def test_traces_are_off_until_an_endpoint_is_given_then_the_gateway_and_the_workers_get_it(
    helm: list[str],
) -> None:
    def tracing_env(docs: list[dict[str, Any]], name: str | None = None) -> dict[str, Any]:
        env = container(docs, name)["env"] if name else container(docs)["env"]
        return {e["name"]: e.get("value") for e in env if "OTLP" in e["name"] or "TRACE" in e["name"]}

    docs = render(helm)
    assert tracing_env(docs) == {} and tracing_env(docs, GATEWAY) == {}
    endpoint = "http://otel-collector.monitoring:4318"
    docs = render(helm, "--set", f"tracing.otlpEndpoint={endpoint}", "--set-json", "tracing.sampleRatio=0.25")
    assert tracing_env(docs, GATEWAY) == {
        "MODELPOOL_GATEWAY_OTLP_ENDPOINT": endpoint,
        "MODELPOOL_GATEWAY_TRACE_SAMPLE_RATIO": "0.25",
    }
    operator = tracing_env(docs)
    assert operator == {
        "MODELPOOL_OPERATOR_WORKER_OTLP_ENDPOINT": endpoint,
        "MODELPOOL_OPERATOR_WORKER_TRACE_SAMPLE_RATIO": "0.25",
    }
    # What the operator makes of them: its pod builder's settings, which the workers' flags come from.
    config = OperatorConfig(
        worker_otlp_endpoint=operator["MODELPOOL_OPERATOR_WORKER_OTLP_ENDPOINT"],
        worker_trace_sample_ratio=operator["MODELPOOL_OPERATOR_WORKER_TRACE_SAMPLE_RATIO"],
    )
    settings = pod_settings(config)
    assert (settings.otlp_endpoint, settings.trace_sample_ratio) == (endpoint, 0.25)


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_inference_pools_are_off_until_asked_and_then_granted_and_told(helm: list[str]) -> None:
    variable = "MODELPOOL_OPERATOR_INFERENCE_POOLS_ENABLED"
    docs = render(helm)
    assert variable not in _operator_env(docs)
    assert not {r for role in by_kind(docs, "ClusterRole") for r in _rules(role) if r[1] == "inferencepools"}
    docs = render(helm, "--set", "inferencePool.enabled=true")
    assert _operator_env(docs)[variable] == "true"
    granted = {r for role in by_kind(docs, "ClusterRole") for r in _rules(role) if r[1] == "inferencepools"}
    assert {verb for _, _, verb in granted} == {"create", "patch", "list", "watch", "delete"}


def test_rbac_follows_the_scope_and_peering(helm: list[str]) -> None:
    """The verbs themselves are checked against the operator's real requests (test_rbac.py, on the API
    server); here: what each switch adds or removes, and no wildcard anywhere."""
    for args, peering, namespaces in [
        ([], ("kopf.dev", "clusterkopfpeerings", "patch"), False),
        (
            ["--set", "scope.clusterWide=false", "--set", "scope.namespaces={a}"],
            ("kopf.dev", "kopfpeerings", "patch"),
            True,
        ),
    ]:
        docs = render(helm, *args, "--set", "peering.enabled=true")
        namespaced = _rules(one(docs, "ClusterRole", "mp-modelpool-operator"))
        cluster = _rules(one(docs, "ClusterRole", "mp-modelpool-operator-cluster"))
        everything = namespaced | cluster
        assert peering in everything
        assert (("", "namespaces", "watch") in cluster) == namespaces
        assert not any(verb == "*" or res == "*" for _, res, verb in everything)
        assert ("", "pods/eviction", "create") not in everything
        # The demand Leases the gateways write, read per watched namespace; Kopf's peering uses none.
        leases = {("coordination.k8s.io", "leases", "list"), ("coordination.k8s.io", "leases", "watch")}
        assert {r for r in namespaced if r[0] == "coordination.k8s.io"} == leases
        assert not [r for r in cluster if r[0] == "coordination.k8s.io"]
        unpeered = render(helm, *args, "--set", "peering.enabled=false")
        kopf = {
            r
            for name in ("mp-modelpool-operator", "mp-modelpool-operator-cluster")
            for r in _rules(one(unpeered, "ClusterRole", name))
            if r[0] == "kopf.dev"
        }
        assert not kopf, f"peering disabled, yet {kopf}"


def test_the_operator_reads_no_secret_and_mounts_its_control_seed(helm: list[str]) -> None:
    """The shared hosts' control keys are derived from a seed Secret the chart makes and mounts into the
    operator's pod only: the operator may create and patch Secrets (each ModelHost's key; the patch tests
    the ModelHost owns it, and the operator policy admits only control key Secrets) but read none."""
    for args in ([], ["--set", "scope.clusterWide=false", "--set", "scope.namespaces={a}"]):
        docs = render(helm, *args)
        everything = _rules(one(docs, "ClusterRole", OPERATOR)) | _rules(
            one(docs, "ClusterRole", f"{OPERATOR}-cluster")
        )
        assert {r for r in everything if r[1] == "secrets"} == {
            ("", "secrets", "create"),
            ("", "secrets", "patch"),
        }
        assert not [
            role
            for role in by_kind(docs, "Role")
            if role["metadata"]["name"].startswith(f"{OPERATOR}-control")
        ]
    docs = render(helm)
    seed = one(docs, "Secret", f"{OPERATOR}-control-seed")
    assert seed["metadata"]["namespace"] == "mp-system"
    assert len(base64.b64decode(seed["data"]["seed"])) == 48
    c = container(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["MODELPOOL_OPERATOR_CONTROL_SEED_FILE"] == "/etc/modelpool/control-seed/seed"
    # No pool is served from the operator's own namespace (modelpool_operator.policy).
    assert env["MODELPOOL_OPERATOR_OWN_NAMESPACE"] == "mp-system"
    assert {"name": "control-seed", "mountPath": "/etc/modelpool/control-seed", "readOnly": True} in c[
        "volumeMounts"
    ]
    pod = one(docs, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "control-seed"]
    assert volume["secret"]["secretName"] == f"{OPERATOR}-control-seed"
    mounting = [
        d["metadata"]["name"]
        for d in by_kind(docs, "Deployment")
        if f"{OPERATOR}-control-seed" in json.dumps(d["spec"]["template"]["spec"].get("volumes", []))
    ]
    assert mounting == [OPERATOR], "the seed is mounted into the operator's pod only"
    # Under GitOps a Secret of the admin's own: the chart renders no seed (a render cannot look one up, so
    # its own would change at every render and lock the operator out of the running host pods).
    gitops = render(helm, "--set", "controlSeed.existingSecret=modelpool-control-seed")
    assert not [d for d in by_kind(gitops, "Secret") if "control-seed" in d["metadata"]["name"]]
    pod = one(gitops, "Deployment", OPERATOR)["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "control-seed"]
    assert volume["secret"]["secretName"] == "modelpool-control-seed"


def test_namespace_scope(helm: list[str], tmp_path: Path) -> None:
    docs = render(helm, "--set", "scope.clusterWide=false", "--set", "scope.namespaces={team-a,team-b}")
    args = container(docs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace=")] == ["--namespace=team-a", "--namespace=team-b"]
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == OPERATOR]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert not [
        b for b in by_kind(docs, "ClusterRoleBinding") if b["roleRef"]["name"] == "mp-modelpool-operator"
    ]
    assert not by_kind(docs, "KopfPeering") and not by_kind(docs, "ClusterKopfPeering")
    peered = render(
        helm, "--set", "scope.clusterWide=false", "--set", "scope.namespaces={team-a,team-b}",
        "--set", "peering.enabled=true",
    )  # fmt: skip
    peerings = by_kind(peered, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert not by_kind(peered, "ClusterKopfPeering")
    cluster_rules = _rules(one(docs, "ClusterRole", "mp-modelpool-operator-cluster"))
    # Kopf's namespace observer resolves the watched namespaces (only outside cluster scope).
    assert ("", "namespaces", "watch") in cluster_rules

    # No namespaces listed: refused at render (it used to mean the release namespace, whose pools are now
    # refused: an install that would serve nothing). The release namespace among others: the NOTES warn.
    refused = template(helm, "--set", "scope.clusterWide=false", check=False)
    assert refused.returncode != 0
    assert "scope.namespaces" in refused.stderr and "mp-system" in refused.stderr, refused.stderr
    notes = _notes(
        helm, tmp_path, "--set", "scope.clusterWide=false", "--set", "scope.namespaces={a,mp-system}"
    )
    assert "WARNING: scope.namespaces lists mp-system" in notes


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
    # budget.create: the operator creates the budget when it is missing (never a chart resource or hook, so
    # an upgrade never deletes or recreates it: docs/install.md).
    assert not by_kind(docs, "ModelBudget")
    assert env["MODELPOOL_OPERATOR_BUDGET_CREATE"] == "true"
    assert env["MODELPOOL_OPERATOR_BUDGET_MEMORY"] == "640Gi"
    cluster_role = one(docs, "ClusterRole", f"{OPERATOR}-cluster")
    budget_verbs = {v for g, r, v in _rules(cluster_role) if r == "modelbudgets"}
    assert budget_verbs == {"list", "watch", "patch", "create"}, "create, and never update or delete"
    pod = one(docs, "Deployment", OPERATOR)["spec"]["template"]["spec"]
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


def test_metrics_endpoint_service_and_monitors(helm: list[str]) -> None:
    docs = render(helm)
    c = container(docs)
    assert "--metrics=8081" in c["args"]
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in c["ports"]
    service = one(docs, "Service", "mp-modelpool-operator-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = one(docs, "Deployment", OPERATOR)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "PodMonitor"), "off by default"

    docs = render(
        helm,
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=prometheus",
        "--set", "metrics.podMonitor.enabled=true",
        "--set", "metrics.podMonitor.interval=1m",
    )  # fmt: skip
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["endpoints"] == [
        # honorLabels: the series' own namespace label (the pool's) wins over the target's.
        {
            "port": "metrics",
            "path": "/metrics",
            "honorLabels": True,
            "interval": "30s",
            "scrapeTimeout": "10s",
        }
    ]
    workers = one(docs, "PodMonitor")
    assert workers["spec"]["selector"] == {
        "matchExpressions": [{"key": "modelpool.dev/pool", "operator": "Exists"}]
    }
    assert workers["spec"]["namespaceSelector"] == {"any": True}
    assert workers["spec"]["podMetricsEndpoints"][0]["port"] == PROBE_PORT_NAME  # no API key there
    assert workers["spec"]["podMetricsEndpoints"][0]["interval"] == "1m"
    scoped = render(
        helm, "--set", "metrics.podMonitor.enabled=true", "--set", "scope.clusterWide=false",
        "--set", "scope.namespaces={a,b}",
    )  # fmt: skip
    assert one(scoped, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}

    docs = render(helm, "--set", "metrics.enabled=false")
    assert "--metrics=0" in container(docs)["args"]
    assert not [s for s in by_kind(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]


def _network_policy_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's MODELPOOL_OPERATOR_NETWORK_POLICY_* settings, JSON ones decoded."""
    prefix = "MODELPOOL_OPERATOR_NETWORK_POLICY_"
    env = {
        e["name"].removeprefix(prefix): e["value"]
        for e in container(docs)["env"]
        if e["name"].startswith(prefix)
    }
    return {k: v if k in ("ENABLED", "NAMESPACE") else json.loads(v) for k, v in env.items()}


def test_network_policy_is_made_by_the_operator_and_names_the_operator_and_the_gateway(
    helm: list[str],
) -> None:
    """On by default, in cluster scope too: the chart renders no NetworkPolicy (the operator makes one per
    pool, test_network_policy.py) but tells the operator whom to admit, and grants it create/patch on them."""
    docs = render(helm)
    assert not by_kind(docs, "NetworkPolicy"), "made by the operator, per pool"
    operator_pod = one(docs, "Deployment", OPERATOR)["spec"]["template"]["metadata"]["labels"]
    gateway_pod = one(docs, "Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    env = _network_policy_env(docs)
    assert env.keys() == {"ENABLED", "NAMESPACE", "OPERATOR_LABELS", "GATEWAY_LABELS"}
    assert (env["ENABLED"], env["NAMESPACE"]) == ("true", "mp-system")
    # The labels select the operator's pods and the gateway's, and neither selects the other's.
    assert env["OPERATOR_LABELS"].items() <= operator_pod.items()
    assert not env["OPERATOR_LABELS"].items() <= gateway_pod.items()
    assert env["GATEWAY_LABELS"].items() <= gateway_pod.items()
    assert not env["GATEWAY_LABELS"].items() <= operator_pod.items()
    assert _rules(one(docs, "ClusterRole", OPERATOR)) >= {
        ("networking.k8s.io", "networkpolicies", verb) for verb in ("create", "patch")
    }

    apps = [{"namespaceSelector": {"matchLabels": {"team": "apps"}}}]
    prometheus = [{"podSelector": {"matchLabels": {"app": "prometheus"}}, "namespaceSelector": {}}]
    docs = render(
        helm,
        "--set-json", f"networkPolicy.from={json.dumps(apps)}",
        "--set-json", f"networkPolicy.metricsFrom={json.dumps(prometheus)}",
        "--set", "networkPolicy.admitGateway=false",
    )  # fmt: skip
    env = _network_policy_env(docs)
    assert (env["FROM"], env["METRICS_FROM"]) == (apps, prometheus)
    assert "GATEWAY_LABELS" not in env
    assert "GATEWAY_LABELS" not in _network_policy_env(render(helm, "--set", "gateway.enabled=false"))
    # Whom the policies admit is part of the operator's settings: changing it rolls the operator.
    annotations = one(docs, "Deployment", OPERATOR)["spec"]["template"]["metadata"]["annotations"]
    default = one(render(helm), "Deployment", OPERATOR)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/network-policy"] != default["checksum/network-policy"]

    docs = render(helm, "--set", "networkPolicy.enabled=false")
    assert not _network_policy_env(docs)
    assert not [r for r in _rules(one(docs, "ClusterRole", OPERATOR)) if r[1] == "networkpolicies"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicas=2"], "additional properties 'replicas' not allowed"),
        (["--set", "config.statsInterval=3"], "additional properties 'statsInterval' not allowed"),
        (["--set", "crds.enable=false"], "additional properties 'enable' not allowed"),
        (["--set", "budget.memory=lots"], "at '/budget/memory'"),
        (["--set", "config.logFormat=xml"], "at '/config/logFormat'"),
        (["--set", "replicaCount=-1"], "at '/replicaCount'"),
        (["--set", "leaderElection.leaseDurationSeconds=0"], "at '/leaderElection/leaseDurationSeconds'"),
        (["--set", "updateStrategy.type=Sometimes"], "at '/updateStrategy/type'"),
        (["--set", "liveness.port=0"], "at '/liveness/port'"),
        (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
        (["--set", "metrics.port=0"], "at '/metrics/port'"),
        (["--set", "metrics.serviceMonitor.interval=often"], "at '/metrics/serviceMonitor/interval'"),
        (["--set", "metrics.podMonitor.enable=true"], "additional properties 'enable' not allowed"),
        (["--set", "networkPolicy.allow=x"], "additional properties 'allow' not allowed"),
        (["--set", "networkPolicy.namespaces={models}"], "additional properties 'namespaces' not allowed"),
        (
            ["--set-json", 'networkPolicy.metricsFrom=[{"ipBlock": {"except": ["10.0.0.0/8"]}}]'],
            "missing property 'cidr'",
        ),
        (
            ["--set-json", 'networkPolicy.from=[{"podSelector": {"matchLabel": {"a": "b"}}}]'],
            "additional properties 'matchLabel' not allowed",
        ),
        (["--set", "config.defaultWorkerCpu=one"], "at '/config/defaultWorkerCpu'"),
        (["--set", "config.defaultWorkerCpu=-1"], "at '/config/defaultWorkerCpu'"),
        (["--set", "config.modelCacheType=nfs"], "at '/config/modelCacheType'"),
        (["--set", "config.modelCacheType=pvc"], "at '/config/modelCacheClaimName'"),
        (["--set", "config.modelCacheType=hostPath"], "at '/config/modelCacheHostPath'"),
        (
            ["--set", "config.modelCacheType=hostPath", "--set", "config.modelCacheHostPath=rel"],
            "at '/config/modelCacheHostPath'",
        ),
        (["--set", "config.allowedHostPaths={/data/}"], "at '/config/allowedHostPaths/0'"),
        (["--set", "config.allowedHostPaths={/data/../etc}"], "at '/config/allowedHostPaths/0'"),
        (["--set", "config.allowedImages={ghcr.io}"], "at '/config/allowedImages/0'"),
        (["--set", "config.allowedServiceAccounts={Admin}"], "at '/config/allowedServiceAccounts/0'"),
        (["--set", "admissionPolicy.enable=true"], "additional properties 'enable' not allowed"),
        (["--set", "gateway.replicas=2"], "additional properties 'replicas' not allowed"),
        (["--set", "gateway.hold.maxPerPool=-1"], "at '/gateway/hold/maxPerPool'"),
        (["--set", "gateway.hold.maxSeconds=7200"], "at '/gateway/hold/maxSeconds'"),
        (["--set", "gateway.maxConnections=0"], "at '/gateway/maxConnections'"),
        (["--set", "gateway.metrics.port=0"], "at '/gateway/metrics/port'"),
        (["--set", "gateway.service.type=Ingress"], "at '/gateway/service/type'"),
        (["--set", "gateway.namespaces={Team_A}"], "at '/gateway/namespaces/0'"),
        (["--set", "gateway.logLevel=loud"], "at '/gateway/logLevel'"),
        (["--set", "gateway.auth.mode=open"], "at '/gateway/auth/mode'"),
        (["--set", "gateway.auth=none"], "at '/gateway/auth'"),
        (["--set", "gateway.auth.tenantKeys=yes"], "at '/gateway/auth/tenantKeys'"),
        (["--set", "budget.missing=sometimes"], "at '/budget/missing'"),
        (["--set", "tracing.otlpEndpoint=collector:4318"], "at '/tracing/otlpEndpoint'"),
        (["--set-json", "tracing.sampleRatio=2"], "at '/tracing/sampleRatio'"),
    ],
)
def test_schema_rejects_bad_values(helm: list[str], args: list[str], message: str) -> None:
    result = template(helm, *args, check=False)
    assert result.returncode != 0, f"{args} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr.replace('"', "'"), result.stderr


POLICY = "mp-modelpool-operator-modelpools"


def test_the_admission_policy_renders_the_operators_allowlists(helm: list[str]) -> None:
    """One set of values: config.allowed* become the operator's variables and the policy's CEL lists."""
    docs = render(
        helm,
        "--set", "config.allowedHostPaths={/var/cache/modelpool,/data}",
        "--set", "config.allowedImages={ghcr.io/modelpool/}",
    )  # fmt: skip
    env = {e["name"]: e.get("value") for e in container(docs)["env"]}
    assert env["MODELPOOL_OPERATOR_ALLOWED_HOST_PATHS"] == "/var/cache/modelpool,/data"
    assert env["MODELPOOL_OPERATOR_ALLOWED_IMAGES"] == "ghcr.io/modelpool/"
    assert "MODELPOOL_OPERATOR_ALLOWED_SERVICE_ACCOUNTS" not in env, "empty list: the operator's default"
    policy = one(docs, "ValidatingAdmissionPolicy", POLICY)
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["hostPaths"] == '["/var/cache/modelpool","/data"]'
    assert variables["hostPathsText"] == '"/var/cache/modelpool, /data"'
    assert variables["images"] == '["ghcr.io/modelpool/"]'
    assert variables["serviceAccounts"] == "[]"
    assert variables["serviceAccountsText"] == '"none"'
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": ["modelpool.dev"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
         "resources": ["modelpools", "modelhosts"]}
    ]  # fmt: skip
    assert {v["reason"] for v in policy["spec"]["validations"]} == {"Forbidden"}
    binding = one(docs, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"]["policyName"] == POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"], "cluster scope: every namespace"


def test_the_admission_policy_binds_the_watched_namespaces_or_is_left_out(helm: list[str]) -> None:
    docs = render(helm, "--set", "scope.clusterWide=false", "--set", "scope.namespaces={a,b}")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", POLICY)
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}
    ]
    docs = render(helm, "--set", "admissionPolicy.enabled=false")
    assert not by_kind(docs, "ValidatingAdmissionPolicy")
    assert not by_kind(docs, "ValidatingAdmissionPolicyBinding")


def test_the_operators_writes_policy_matches_its_service_account_in_every_namespace(helm: list[str]) -> None:
    """templates/operatorpolicy.yaml: the operator's ServiceAccount alone, pods/Services/NetworkPolicies/
    PodDisruptionBudgets/Secrets/InferencePools, bound everywhere (whatever the scope), the allowed host
    paths with the operator's own cache."""
    name = f"{OPERATOR}-writes"
    for args in ([], ["--set", "scope.clusterWide=false", "--set", "scope.namespaces={a,b}"]):
        docs = render(helm, *args)
        policy = one(docs, "ValidatingAdmissionPolicy", name)
        [match] = policy["spec"]["matchConditions"]
        assert (
            match["expression"]
            == f"request.userInfo.username == 'system:serviceaccount:mp-system:{OPERATOR}'"
        )
        resources = {
            r for rule in policy["spec"]["matchConstraints"]["resourceRules"] for r in rule["resources"]
        }
        assert resources == {
            "pods", "services", "secrets", "networkpolicies", "poddisruptionbudgets", "inferencepools"
        }  # fmt: skip
        assert {v["reason"] for v in policy["spec"]["validations"]} == {"Forbidden"}
        binding = one(docs, "ValidatingAdmissionPolicyBinding", name)
        assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    docs = render(
        helm,
        "--set", "config.allowedHostPaths={/data}",
        "--set", "config.modelCacheType=hostPath",
        "--set", "config.modelCacheHostPath=/var/cache/modelpool",
    )  # fmt: skip
    variables = {
        v["name"]: v["expression"] for v in one(docs, "ValidatingAdmissionPolicy", name)["spec"]["variables"]
    }
    assert variables["hostPaths"] == '["/data","/var/cache/modelpool"]'
    assert variables["hostPathsText"] == '"/data, /var/cache/modelpool"'
    docs = render(
        helm, "--set", "config.modelCacheHostPath=/var/cache/modelpool"
    )  # type none: not a host path
    variables = {
        v["name"]: v["expression"] for v in one(docs, "ValidatingAdmissionPolicy", name)["spec"]["variables"]
    }
    assert variables["hostPaths"] == "[]" and variables["hostPathsText"] == '"none"'


# ---- the gateway ----


def test_one_log_format_for_the_operator_the_gateway_and_through_the_operator_the_workers(
    helm: list[str],
) -> None:
    for given, expected in (([], "json"), (["--set", "config.logFormat=plain"], "plain")):
        docs = render(helm, *given)
        gateway = {e["name"]: e.get("value") for e in container(docs, GATEWAY)["env"]}
        operator = {e["name"]: e.get("value") for e in container(docs, OPERATOR)["env"]}
        assert gateway["MODELPOOL_GATEWAY_LOG_FORMAT"] == expected
        assert operator["MODELPOOL_OPERATOR_LOG_FORMAT"] == expected  # passed on to its workers


def test_the_gateway_is_installed_with_its_service_and_settings(helm: list[str]) -> None:
    docs = render(helm)
    c = container(docs, GATEWAY)
    assert c["command"] == ["modelpool-gateway"]
    assert c["image"] == f"ghcr.io/modelpool/modelpool-operator:{VERSION}", (
        "the gateway runs from the operator image"
    )
    assert c["args"] == ["--port=8080", "--metrics-port=8081"], (
        "cluster scope: every namespace, no --namespace"
    )
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["MODELPOOL_GATEWAY_MAX_HELD_PER_POOL"] == "100"
    assert env["MODELPOOL_GATEWAY_DEMAND_INTERVAL_SECONDS"] == "5"
    assert env["MODELPOOL_GATEWAY_MAX_HELD_PER_KEY"] == "50"
    assert env["MODELPOOL_GATEWAY_MAX_HOLD_SECONDS"] == "300"
    assert env["MODELPOOL_GATEWAY_MAX_QUEUED_PER_KEY"] == "20"
    assert env["MODELPOOL_GATEWAY_MAX_QUEUED_PER_POOL"] == "200"
    assert env["MODELPOOL_GATEWAY_MAX_CONNECTIONS"] == "4096"
    assert env["MODELPOOL_GATEWAY_HEADER_TIMEOUT_SECONDS"] == "10"
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["securityContext"].items() >= RESTRICTED_CONTAINER.items()
    deployment = one(docs, "Deployment", GATEWAY)
    assert deployment["spec"]["replicas"] == 2
    # Each replica enforces its share of every key's limits: the replicas it is one of.
    assert env["MODELPOOL_GATEWAY_REPLICAS"] == "2"
    three = {
        e["name"]: e["value"]
        for e in container(render(helm, "--set", "gateway.replicaCount=3"), GATEWAY)["env"]
    }
    assert three["MODELPOOL_GATEWAY_REPLICAS"] == "3"
    # A read-only root: Python's tempfile writes to a /tmp emptyDir.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert deployment["spec"]["template"]["spec"]["volumes"] == [
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}
    ]
    selector = deployment["spec"]["selector"]["matchLabels"]
    operator_selector = one(docs, "Deployment", OPERATOR)["spec"]["selector"]["matchLabels"]
    assert not operator_selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items(), (
        "the operator Deployment's selector must not match gateway pods"
    )
    service = one(docs, "Service", GATEWAY)
    assert service["spec"]["selector"] == selector
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert one(docs, "ServiceAccount", GATEWAY)


def test_the_gateways_metrics_are_on_a_port_of_their_own_never_behind_its_service(helm: list[str]) -> None:
    docs = render(helm)
    c = container(docs, GATEWAY)
    assert c["ports"] == [
        {"name": "http", "containerPort": 8080, "protocol": "TCP"},  # first: what the install test calls
        {"name": "metrics", "containerPort": 8081, "protocol": "TCP"},
    ]
    assert "--metrics-port=8081" in c["args"]
    # The clients' Service exposes the clients' port only; no monitor unless asked for.
    assert [p["targetPort"] for p in one(docs, "Service", GATEWAY)["spec"]["ports"]] == ["http"]
    assert not by_kind(docs, "PodMonitor")

    docs = render(
        helm,
        "--set", "gateway.metrics.port=9300",
        "--set", "gateway.metrics.podMonitor.enabled=true",
        "--set", "gateway.metrics.podMonitor.labels.release=prometheus",
    )  # fmt: skip
    assert "--metrics-port=9300" in container(docs, GATEWAY)["args"]
    monitor = one(docs, "PodMonitor")
    assert monitor["metadata"]["name"] == GATEWAY and monitor["metadata"]["labels"]["release"] == "prometheus"
    pod_labels = one(docs, "Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["mp-system"]}
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    operator = one(docs, "Deployment", OPERATOR)["spec"]["template"]["metadata"]["labels"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= operator.items()


def test_the_gateways_rbac_is_read_pools_and_pods_and_write_demand_leases_only(helm: list[str]) -> None:
    """Nothing that writes a ModelPool (its image, its env): the demand goes to a Lease of its own."""
    docs = render(helm)
    rules = _rules(one(docs, "ClusterRole", GATEWAY))
    assert rules == {
        ("modelpool.dev", "modelpools", "list"),
        ("modelpool.dev", "modelpools", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("coordination.k8s.io", "leases", "get"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "update"),
    }
    binding = one(docs, "ClusterRoleBinding", GATEWAY)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": GATEWAY, "namespace": "mp-system"}]


def test_the_gateway_follows_the_operators_scope_or_its_own_namespaces(helm: list[str]) -> None:
    docs = render(helm, "--set", "scope.clusterWide=false", "--set", "scope.namespaces={team-a,team-b}")
    assert [a for a in container(docs, GATEWAY)["args"] if a.startswith("--namespace=")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == GATEWAY]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert not [b for b in by_kind(docs, "ClusterRoleBinding") if b["metadata"]["name"] == GATEWAY]
    # The gateway's own list may name the release namespace (the operator's may not): the gateway skips it
    # itself, and its pools, pods and Leases are bound only in the others.
    docs = render(helm, "--set", "gateway.namespaces={team-a,mp-system}")
    assert [a for a in container(docs, GATEWAY)["args"] if a.startswith("--namespace=")] == [
        "--namespace=team-a",
        "--namespace=mp-system",
    ]
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == GATEWAY]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a"]

    docs = render(helm, "--set", "gateway.namespaces={serving}")
    assert [a for a in container(docs, GATEWAY)["args"] if a.startswith("--namespace=")] == [
        "--namespace=serving"
    ]
    bindings = [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == GATEWAY]
    assert [b["metadata"]["namespace"] for b in bindings] == ["serving"]


def _key_roles(docs: list[dict[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    """Namespace -> the rules of the gateway's key-reading Role there (checked bound to the gateway)."""
    name = f"{GATEWAY}-keys"
    roles = {
        r["metadata"]["namespace"]: _rules(r) for r in by_kind(docs, "Role") if r["metadata"]["name"] == name
    }
    for binding in [b for b in by_kind(docs, "RoleBinding") if b["metadata"]["name"] == name]:
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": GATEWAY, "namespace": "mp-system"}]
    return roles


def test_the_gateway_requires_api_keys_by_default_read_in_a_keys_namespace_only(helm: list[str]) -> None:
    """Admin keys live in a namespace of their own (<release namespace>-keys), never with the release
    namespace's Secrets (the control seed, Helm's releases); the chart creates it, kept on uninstall."""
    docs = render(helm)
    env = {e["name"]: e["value"] for e in container(docs, GATEWAY)["env"]}
    assert env["MODELPOOL_GATEWAY_AUTH"] == "keys"
    # The chart's default is the contract's (the gateway's own default when run outside the chart).
    assert env["MODELPOOL_GATEWAY_KEYS_NAMESPACE"] == default_keys_namespace("mp-system") == "mp-system-keys"
    assert env["MODELPOOL_GATEWAY_OWN_NAMESPACE"] == "mp-system"
    assert env["MODELPOOL_GATEWAY_TENANT_KEYS"] == "false"
    # List and watch the Secrets of the keys namespace: no get, no write, nowhere else, nothing cluster-wide.
    assert _key_roles(docs) == {"mp-system-keys": {("", "secrets", "list"), ("", "secrets", "watch")}}
    assert not [r for r in by_kind(docs, "ClusterRole") if ("", "secrets", "list") in _rules(r)]
    made = one(docs, "Namespace", "mp-system-keys")
    assert made["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert made["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    docs = render(
        helm, "--set", "gateway.auth.keysNamespace=vault", "--set", "gateway.auth.createKeysNamespace=false"
    )
    env = {e["name"]: e["value"] for e in container(docs, GATEWAY)["env"]}
    assert env["MODELPOOL_GATEWAY_KEYS_NAMESPACE"] == "vault" and list(_key_roles(docs)) == ["vault"]
    assert not by_kind(docs, "Namespace"), "the admin creates it"
    refused = template(helm, "--set", "gateway.auth.keysNamespace=mp-system", check=False)
    assert refused.returncode != 0 and "is the release namespace" in refused.stderr, refused.stderr


def test_the_gateway_may_write_only_demand_leases(helm: list[str]) -> None:
    """Its RBAC cannot name the Leases it may write: a ValidatingAdmissionPolicy on its ServiceAccount
    does (tests/gateway/integration/test_gateway_identity.py runs it on the API server)."""
    name = f"{GATEWAY}-leases"
    policy = one(render(helm), "ValidatingAdmissionPolicy", name)
    assert policy["spec"]["matchConditions"] == [
        {
            "name": "the-gateway",
            "expression": f"request.userInfo.username == 'system:serviceaccount:mp-system:{GATEWAY}'",
        }
    ]
    expressions = [v["expression"] for v in policy["spec"]["validations"]]
    assert "request.namespace != 'mp-system'" in expressions
    assert one(render(helm), "ValidatingAdmissionPolicyBinding", name)["spec"]["policyName"] == name
    scoped = render(helm, "--set", "gateway.namespaces={a,mp-system,b}")
    expressions = [
        v["expression"] for v in one(scoped, "ValidatingAdmissionPolicy", name)["spec"]["validations"]
    ]
    assert "request.namespace in ['a','b']" in expressions
    off = render(helm, "--set", "admissionPolicy.enabled=false")
    assert not [p for p in by_kind(off, "ValidatingAdmissionPolicy") if p["metadata"]["name"] == name]


def test_tenant_keys_add_a_role_per_routed_namespace_and_are_never_cluster_wide(helm: list[str]) -> None:
    docs = render(
        helm, "--set", "gateway.namespaces={team-a,mp-system}", "--set", "gateway.auth.tenantKeys=true"
    )
    # Never the release namespace's Secrets, though it is in the list (its pools are never routed).
    assert sorted(_key_roles(docs)) == ["mp-system-keys", "team-a"]
    env = {e["name"]: e["value"] for e in container(docs, GATEWAY)["env"]}
    assert env["MODELPOOL_GATEWAY_TENANT_KEYS"] == "true"
    refused = template(helm, "--set", "gateway.auth.tenantKeys=true", check=False)
    assert refused.returncode != 0 and "never read cluster-wide" in refused.stderr


def test_auth_none_is_explicit_and_reads_no_secret(helm: list[str]) -> None:
    docs = render(helm, "--set", "gateway.auth.mode=none")
    env = {e["name"]: e["value"] for e in container(docs, GATEWAY)["env"]}
    assert env["MODELPOOL_GATEWAY_AUTH"] == "none" and "MODELPOOL_GATEWAY_KEYS_NAMESPACE" not in env
    assert _key_roles(docs) == {} and not by_kind(docs, "Namespace")


def _notes(helm: list[str], workdir: Path, *args: str) -> str:
    """NOTES.txt as the install prints it: `helm template` leaves NOTES.txt out, so a copy of the chart
    renders it through `tpl` into a ConfigMap."""
    chart = workdir / "chart"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes.txt")
        (chart / "templates" / "zz-notes.yaml").write_text(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
            'data: {notes: {{ tpl (.Files.Get "notes.txt") . | quote }}}\n'
        )
    result = run([*helm, "template", "mp", str(chart), "--namespace", "mp-system", *args,
                  "--show-only", "templates/zz-notes.yaml"])  # fmt: skip
    return str(load_all(result.stdout)[0]["data"]["notes"])


def test_the_notes_say_how_to_create_a_key_or_what_auth_none_means(helm: list[str], tmp_path: Path) -> None:
    keys = _notes(helm, tmp_path)
    # The key grants the namespace the first pool goes to (a key for another one makes the first curl 404).
    assert "kubectl apply -n default -f examples/text-embedding.yaml" in keys
    assert "kubectl -n mp-system-keys create secret generic default-key" in keys
    assert '--from-literal=key="$KEY" --from-literal=namespaces=default' in keys
    assert "label secret default-key modelpool.dev/gateway-key=true" in keys
    scoped = _notes(helm, tmp_path, "--set", "scope.clusterWide=false", "--set", "scope.namespaces={ml,b}")
    assert "kubectl apply -n ml -f examples/text-embedding.yaml" in scoped
    assert "--from-literal=namespaces=ml" in scoped
    assert 'curl -s localhost:8080/v1/models -H "Authorization: Bearer $KEY"' in keys
    assert "api_key=KEY" in keys and "Tenants may also issue keys" not in keys
    tenants = _notes(
        helm, tmp_path, "--set", "gateway.namespaces={a}", "--set", "gateway.auth.tenantKeys=true"
    )
    assert "Tenants may also issue keys" in tenants
    none = _notes(helm, tmp_path, "--set", "gateway.auth.mode=none")
    assert "checks no key" in none and "Authorization" not in none and "create secret" not in none
    # The gateway's metrics: on their own port, to be kept from clients.
    assert "curl -s localhost:8081/metrics | grep ^modelpool_gateway_requests_total" in keys
    assert "admit only Prometheus to that port" in keys


def test_the_gateway_can_be_left_out(helm: list[str]) -> None:
    docs = render(helm, "--set", "gateway.enabled=false")
    names = {d["metadata"]["name"] for d in docs}
    assert GATEWAY not in names
    assert len(by_kind(docs, "Deployment")) == 1
    notes = template(
        helm, "--set", "gateway.enabled=false", "--show-only", "templates/NOTES.txt", check=False
    )
    del notes  # NOTES.txt is not rendered by `helm template`; the install test reads the real notes


def _hooks(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]


def test_the_uninstall_hook_stops_the_operator_and_unfinalizes_its_pools_with_its_own_short_lived_rbac(
    helm: list[str],
) -> None:
    cleanup = f"{OPERATOR}-cleanup"
    # The chart's values, the hook's scope arguments, and the (kind, namespace) of its pools' bindings.
    scopes: list[tuple[list[str], list[str], list[tuple[str, str | None]]]] = [
        ([], ["--all-namespaces"], [("ClusterRoleBinding", None)]),
        (
            ["--set", "scope.clusterWide=false", "--set", "scope.namespaces={team-a,team-b}"],
            ["--namespace=team-a", "--namespace=team-b"],
            [("RoleBinding", "team-a"), ("RoleBinding", "team-b")],
        ),
    ]
    for args, scope_args, pool_bindings in scopes:
        docs = render(helm, *args, "--set", "nodeSelector.pool=ops", "--set", "config.budgetName=gpu")
        hooks = [d for d in _hooks(docs) if d["metadata"]["name"].startswith(cleanup)]
        for hook in hooks:
            notes = hook["metadata"]["annotations"]
            assert notes["helm.sh/hook"] == "pre-delete"
            assert notes["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
            # The ServiceAccount and its RBAC exist before the Job runs.
            assert notes["helm.sh/hook-weight"] == ("0" if hook["kind"] == "Job" else "-5")
        job = one(hooks, "Job", cleanup)
        pod = job["spec"]["template"]["spec"]
        operator_pod = one(docs, "Deployment", OPERATOR)["spec"]["template"]
        assert pod["serviceAccountName"] == cleanup and pod["restartPolicy"] == "Never"
        assert pod["nodeSelector"] == operator_pod["spec"]["nodeSelector"] == {"pool": "ops"}
        # Its pod is not one of the operator's (the wait for the operator's pods to go must not count it).
        assert pod.get("securityContext") == operator_pod["spec"]["securityContext"]
        assert job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "cleanup"
        [c] = pod["containers"]
        assert c["command"] == ["modelpool-operator"]
        assert c["args"] == [
            "cleanup",
            *scope_args,
            f"--deployment={OPERATOR}",
            "--deployment-namespace=mp-system",
            "--selector=app.kubernetes.io/name=modelpool-operator,app.kubernetes.io/instance=mp,"
            "app.kubernetes.io/component=operator",
            "--budget=gpu",
            "--timeout=120",
            "--log-format=json",
        ]
        assert operator_pod["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
        # Exactly the requests cleanup.py makes.
        assert _rules(one(hooks, "Role", cleanup)) == {
            ("apps", "deployments/scale", "patch"),
            ("", "pods", "list"),
        }
        assert one(hooks, "Role", cleanup)["rules"][0]["resourceNames"] == [OPERATOR]
        assert _rules(one(hooks, "ClusterRole", cleanup)) == {
            ("modelpool.dev", plural, verb)
            for plural in ("modelpools", "modelhosts")
            for verb in ("list", "get", "patch")
        }
        budget = one(hooks, "ClusterRole", f"{cleanup}-budget")
        assert _rules(budget) == {("modelpool.dev", "modelbudgets", v) for v in ("get", "patch")}
        assert budget["rules"][0]["resourceNames"] == ["gpu"]
        bound = [
            (b["kind"], b["metadata"].get("namespace"))
            for b in hooks
            if b["kind"] in ("RoleBinding", "ClusterRoleBinding")
            and b["roleRef"]
            == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cleanup}
        ]
        assert sorted(bound, key=str) == sorted(pool_bindings, key=str)
        assert not [h for h in hooks if h["kind"] in ("Role", "ClusterRole") and _wildcard(h)]

    off = render(helm, "--set", "uninstallCleanup.enabled=false")
    assert not [d for d in _hooks(off) if d["metadata"]["name"].startswith(cleanup)]


def _wildcard(role: dict[str, Any]) -> bool:
    return any(verb == "*" or res == "*" for _, res, verb in _rules(role))


# ---- the release's one version ----


def test_the_chart_version_and_app_version_are_the_release_version() -> None:
    """Helm reads only Chart.yaml: its version and appVersion (the default image tag) must be the release's,
    written once in modelpool_contract/version.py (pyproject's dynamic version reads the same constant)."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (VERSION, VERSION), (
        f"charts/modelpool-operator/Chart.yaml says version {chart['version']!r}, appVersion "
        f"{chart['appVersion']!r}; the release is {VERSION!r} (modelpool_contract/version.py)"
    )


def test_the_gateway_replicas_spread_over_nodes_and_a_drain_takes_one_at_a_time(helm: list[str]) -> None:
    docs = render(helm)
    pdb = one(docs, "PodDisruptionBudget", GATEWAY)
    pod = one(docs, "Deployment", GATEWAY)["spec"]["template"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [spread] = pod["spec"]["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # soft: a one-node cluster still runs both
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"] == pdb["spec"]["selector"]["matchLabels"]
    # One replica: a PDB would block every drain, so none; switched off: none, and no spread.
    for args in (["--set", "gateway.replicaCount=1"], ["--set", "gateway.podDisruptionBudget.enabled=false"]):
        assert not [
            d for d in by_kind(render(helm, *args), "PodDisruptionBudget") if d["metadata"]["name"] == GATEWAY
        ]
    off = render(helm, "--set", "gateway.topologySpread.enabled=false")
    assert "topologySpreadConstraints" not in one(off, "Deployment", GATEWAY)["spec"]["template"]["spec"]


def test_leader_election_two_replicas_rolling_and_a_disruption_budget(helm: list[str]) -> None:
    """Two replicas by default, one acting: the Lease's settings reach the operator, the Role grants get and
    update on that one Lease only (create cannot be limited by name), the Deployment rolls one new replica in
    before an old one goes, and a PodDisruptionBudget keeps one replica through a drain."""
    docs = render(helm)
    deployment = one(docs, "Deployment", OPERATOR)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    c = container(docs)
    env = _operator_env(docs)
    assert env["MODELPOOL_OPERATOR_LEADER_ELECTION"] == "true"
    assert env["MODELPOOL_OPERATOR_LEADER_ELECTION_LEASE_NAME"] == OPERATOR
    assert env["MODELPOOL_OPERATOR_LEADER_ELECTION_NAMESPACE"] == "mp-system"
    assert [
        env[f"MODELPOOL_OPERATOR_LEADER_ELECTION_{k}_SECONDS"]
        for k in ("LEASE_DURATION", "RENEW_DEADLINE", "RETRY_PERIOD")
    ] == ["12", "8", "2"]
    [pod_name] = [e for e in c["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # What the operator makes of the rendered settings.
    rendered = {k: v for k, v in env.items() if k.startswith("MODELPOOL_OPERATOR_LEADER_ELECTION")}
    config = OperatorConfig(**{k.removeprefix("MODELPOOL_OPERATOR_").lower(): v for k, v in rendered.items()})
    assert config.leader_election and config.lease_namespace == "mp-system"

    role = one(docs, "Role", f"{OPERATOR}-leader-election")
    assert role["metadata"]["namespace"] == "mp-system"
    assert role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [OPERATOR],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    binding = one(docs, "RoleBinding", f"{OPERATOR}-leader-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == OPERATOR

    # create cannot be narrowed by name in RBAC: the chart's policy admits only this Lease's create.
    policy = one(docs, "ValidatingAdmissionPolicy", f"{OPERATOR}-lease")
    [check] = policy["spec"]["validations"]
    assert check["expression"] == (
        f"request.namespace == 'mp-system' && object.metadata.name == '{OPERATOR}'"
    )
    assert one(docs, "ValidatingAdmissionPolicyBinding", f"{OPERATOR}-lease")["spec"]["policyName"] == (
        f"{OPERATOR}-lease"
    )

    pdb = one(docs, "PodDisruptionBudget", OPERATOR)
    assert pdb["spec"]["minAvailable"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "operator"

    named = render(helm, "--set", "leaderElection.leaseName=ops-lease")
    assert one(named, "Role", f"{OPERATOR}-leader-election")["rules"][0]["resourceNames"] == ["ops-lease"]
    single = render(helm, "--set", "replicaCount=1", "--set", "leaderElection.enabled=false")
    assert not [d for d in by_kind(single, "PodDisruptionBudget") if d["metadata"]["name"] == OPERATOR]
    assert not [r for r in by_kind(single, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert _operator_env(single)["MODELPOOL_OPERATOR_LEADER_ELECTION"] == "false"
    one_replica = by_kind(render(helm, "--set", "replicaCount=1"), "PodDisruptionBudget")
    assert not [d for d in one_replica if d["metadata"]["name"] == OPERATOR]
    # Refused at render: durations that cannot fence a leader, standbys nothing keeps from acting.
    for args, message in (
        (["leaderElection.renewDeadlineSeconds=15"], "renewDeadlineSeconds must be shorter than"),
        (["leaderElection.retryPeriodSeconds=10"], "retryPeriodSeconds must be shorter than"),
        (["leaderElection.enabled=false"], "replicaCount > 1 needs leaderElection.enabled"),
    ):
        refused = template(helm, *(x for a in args for x in ("--set", a)), check=False)
        assert refused.returncode != 0 and message in refused.stderr, (args, refused.stderr)
