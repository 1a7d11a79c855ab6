"""What a pool's author may ask for, on the real API server: the chart's ValidatingAdmissionPolicy refuses
at ``kubectl create`` a pool beyond the allowlists, naming the field, for a user who may do nothing but
create, get and list ModelPools in one namespace; and the operator itself refuses such a pool where no
policy applies (condition PolicyViolation, a Warning Event, never a pod), and takes it up once allowed.

The policy objects are the chart's own (``helm template --show-only templates/admissionpolicy.yaml``), bound
to the test's namespace and a release namespace of their own (namespace scope; no pool is served from the
release namespace); its refusals carry the very messages of ``modelpool_operator.policy``, which the unit
tests check rule by rule (tests/operator/unit/test_policy.py, test_pod_shape_policy.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml

from modelpool_contract.api import MSG_AFFINITY_NAMESPACES, parse_pool_spec
from modelpool_contract.flags import DEFAULT_SERVER_IMAGE
from modelpool_contract.reserved import (
    DEFAULT_NODE_SELECTOR_KEYS,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    RESERVED_KEY_DOMAINS,
)
from modelpool_operator.policy import (
    FIELD_HOST_NODE_AFFINITY,
    FIELD_HOST_NODE_SELECTOR,
    FIELD_HOST_TOLERATIONS,
    FIELD_LABELS,
    FIELD_NODE_AFFINITY,
    FIELD_NODE_SELECTOR,
    FIELD_TOLERATIONS,
    Policy,
    image_repository,
    msg_cache_namespace,
    msg_env,
    msg_host_path,
    msg_image,
    msg_metadata_key,
    msg_node_selector,
    msg_operator_namespace,
    msg_priority_class,
    msg_served_name,
    msg_service_account,
    msg_toleration,
    msg_unclean_path,
    violations,
)
from modelpool_operator.refusals import POLICY_VIOLATION
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import apply, wait_for
from testkit.services import host_manifest
from tests.operator.integration.opharness import (
    POOLS,
    BudgetedOperator,
    condition,
    pool_manifest,
    reasons,
    wait_status,
    worker_pods,
)

pytestmark = pytest.mark.cluster

CHART = ROOT / "charts" / "modelpool-operator"


def _split(camel: str) -> list[str]:
    """``allowedHostPaths`` -> ``["allowed", "Host", "Paths"]`` (the chart's config.<camelCase> to
    MODELPOOL_OPERATOR_<SNAKE_CASE>)."""
    words, word = [], ""
    for char in camel:
        if char.isupper() and word:
            words.append(word)
            word = ""
        word += char
    return [*words, word]


USER = "alice"
HOST_PATHS = ("/var/cache/modelpool",)
IMAGES = ("ghcr.io/modelpool/",)
ACCOUNTS = ("model-runner",)
PRIORITIES = ("batch-low",)
# The test pools' own (testkit.services.pool_manifest: KWOK nodes, the process node's taint) and the GPUs'.
TOLERATION_KEYS = ("nvidia.com/gpu", "kwok.x-k8s.io/node", "modelpool.dev/process-node")
NODE_KEYS = (*DEFAULT_NODE_SELECTOR_KEYS, "type")
LABEL_DOMAINS = ("example.com",)
ANNOTATION_DOMAINS = ("prometheus.io",)
ENV_NAMES = ("MODELPOOL_HANDLER",)
# The same lists as the chart's config values (helm --set-json) and as the operator's environment.
VALUES = {
    "allowedHostPaths": HOST_PATHS,
    "allowedImages": IMAGES,
    "allowedServiceAccounts": ACCOUNTS,
    "allowedPriorityClasses": PRIORITIES,
    "allowedTolerationKeys": TOLERATION_KEYS,
    "allowedNodeSelectorKeys": NODE_KEYS,
    "allowedLabelDomains": LABEL_DOMAINS,
    "allowedAnnotationDomains": ANNOTATION_DOMAINS,
    "allowedEnvNames": ENV_NAMES,
}
# The same lists as the operator's policy.
POLICY = Policy(
    host_paths=HOST_PATHS,
    images=IMAGES,
    service_accounts=ACCOUNTS,
    priority_classes=PRIORITIES,
    toleration_keys=TOLERATION_KEYS,
    node_selector_keys=NODE_KEYS,
    label_domains=LABEL_DOMAINS,
    annotation_domains=ANNOTATION_DOMAINS,
    env_names=ENV_NAMES,
)
OPERATOR_ENV = {
    "MODELPOOL_OPERATOR_" + "_".join(_w.upper() for _w in _split(key)): ",".join(value)
    for key, value in VALUES.items()
}


# Fields of spec.podTemplate a test names (the rest are spec fields).
_TEMPLATE = {
    "service_account": "serviceAccountName",
    "priority": "priorityClassName",
    "tolerations": "tolerations",
    "node_selector": "nodeSelector",
    "labels": "labels",
    "annotations": "annotations",
    "env": "env",
    "affinity": "affinity",
    "spread": "topologySpreadConstraints",
}


def _nodes(required: list[list[str]], preferred: list[list[str]] | None = None) -> dict[str, Any]:
    """A node affinity over the keys given: one term per list, required then preferred."""

    def term(keys: list[str]) -> dict[str, Any]:
        return {"matchExpressions": [{"key": k, "operator": "Exists"} for k in keys]}

    node: dict[str, Any] = {}
    if required:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            "nodeSelectorTerms": [term(t) for t in required]
        }
    if preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 1, "preference": term(t)} for t in preferred
        ]
    return {"nodeAffinity": node}


def _pool(name: str, *, cache_path: str | None = None, **spec: Any) -> dict[str, Any]:
    manifest = pool_manifest(name, source="hf://org/model")
    if cache_path is not None:
        manifest["spec"]["model"]["cache"] = {"type": "hostPath", "path": cache_path}
    template = manifest["spec"]["podTemplate"]
    for key, value in spec.items():
        if key == "tolerations":
            template["tolerations"] = [*template["tolerations"], *value]
        elif key == "node_selector":
            template["nodeSelector"] = {**template["nodeSelector"], **value}
        elif key in _TEMPLATE:
            template[_TEMPLATE[key]] = value
        else:
            manifest["spec"][key] = value
    return manifest


def _host(name: str, **spec: Any) -> dict[str, Any]:
    """A ModelHost with no host pod (``spec`` added to its own)."""
    return host_manifest(name, **{"replicas": 0, "deviceMemory": "1Gi", **spec})


def _render(cluster: Cluster, release_namespace: str, *args: str) -> str:
    """The chart's admission policy for a release in ``release_namespace``."""
    return cluster.helm(
        "template", "pol", str(CHART), "--namespace", release_namespace,
        "--show-only", "templates/admissionpolicy.yaml", *args,
    ).stdout  # fmt: skip


def _variables(rendered: str) -> dict[str, str]:
    policy = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ValidatingAdmissionPolicy")
    return {v["name"]: v["expression"] for v in policy["spec"]["variables"]}


def _create(cluster: Cluster, namespace: str, manifest: dict[str, Any], *args: str) -> tuple[int, str]:
    done = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", *args, input=json.dumps(manifest), check=False
    )
    return done.returncode, done.stderr + done.stdout


@dataclass(frozen=True)
class Bound:
    """The test's namespace, and the release namespace of the chart's policy (both bound, alice may
    create pools in both)."""

    namespace: str
    release_namespace: str
    rendered: str


def _set_json() -> list[str]:
    return [
        arg for key, value in VALUES.items() for arg in ("--set-json", f"config.{key}={json.dumps(value)}")
    ]


@pytest.fixture
def bound(crds: Cluster, namespace: str) -> Iterator[Bound]:
    """The chart's policy and binding for ``namespace`` and a release namespace (namespace scope), with the
    test's allowlists; a Role letting ``alice`` create, get and list ModelPools and ModelHosts in each and
    nothing else. Yields once the API server enforces the policy."""
    release_namespace = f"mp-sys-{uuid.uuid4().hex[:6]}"
    crds.kubectl("create", "namespace", release_namespace)
    rendered = _render(
        crds, release_namespace,
        "--set", "scope.clusterWide=false",
        "--set", f"scope.namespaces={{{namespace},{release_namespace}}}",
        *_set_json(),
    )  # fmt: skip
    apply(crds, rendered)
    # The allowed service account exists (the ServiceAccount admission plugin refuses pods naming a missing
    # one).
    crds.kubectl("create", "serviceaccount", ACCOUNTS[0], "-n", namespace)
    for ns in (namespace, release_namespace):
        crds.kubectl(
            "create", "role", "pool-author", "-n", ns,
            "--verb=create,get,list", f"--resource={POOLS},modelhosts",
        )  # fmt: skip
        crds.kubectl(
            "create", "rolebinding", "pool-author", "-n", ns, "--role=pool-author", f"--user={USER}"
        )  # fmt: skip
    # The API server's policy informer takes a moment: wait until a forbidden pool is refused (dry run).
    probe = _pool("probe", image="docker.io/evil:1")
    wait_for(
        lambda: _create(crds, namespace, probe, "--dry-run=server", f"--as={USER}")[0] != 0,
        timeout=60,
        interval=0.5,
        message="the admission policy is enforced",
    )
    try:
        yield Bound(namespace, release_namespace, rendered)
    finally:
        crds.kubectl("delete", "-f", "-", "--ignore-not-found", input=rendered, check=False)
        crds.kubectl("delete", "namespace", release_namespace, "--wait=false", check=False)


@pytest.fixture
def admission_policy(bound: Bound) -> str:
    """The test's namespace, once the chart's policy is enforced there."""
    return bound.namespace


def test_the_api_server_refuses_a_pool_beyond_the_allowlists_naming_the_field(
    admission_policy: str, crds: Cluster, budgeted_operator: BudgetedOperator
) -> None:
    namespace = admission_policy
    watcher, _ = budgeted_operator("8Gi", **OPERATOR_ENV)
    refused = {
        "outside-path": (_pool("outside-path", cache_path="/etc"), msg_host_path("/etc", HOST_PATHS)),
        "sibling-path": (
            _pool("sibling-path", cache_path="/var/cache/modelpool-x"),
            msg_host_path("/var/cache/modelpool-x", HOST_PATHS),
        ),
        "dotdot-path": (
            _pool("dotdot-path", cache_path="/var/cache/modelpool/../../.."),
            msg_unclean_path("/var/cache/modelpool/../../.."),
        ),
        "image": (
            _pool("image", image="docker.io/evil/miner:1"),
            msg_image("docker.io/evil/miner:1", IMAGES),
        ),
        "account": (
            _pool("account", service_account="cluster-admin"),
            msg_service_account("cluster-admin", ACCOUNTS),
        ),
        # An alias that reads as another namespace's pool (namespace/name): always refused.
        "squat": (_pool("squat", servedModelName="team-b/llama"), msg_served_name("team-b/llama", namespace)),
        # A ModelHost's image obeys the same rule (its host pods run it).
        "host-image": (
            _host("host-image", image="docker.io/evil/miner:1"),
            msg_image("docker.io/evil/miner:1", IMAGES),
        ),
        # Issue 30, item 4: the pod-shaping fields.
        "shared-cache": (
            _pool("shared-cache", cache_path="/var/cache/modelpool"),
            msg_cache_namespace("/var/cache/modelpool", namespace),
        ),
        "other-cache": (
            _pool("other-cache", cache_path="/var/cache/modelpool/team-b"),
            msg_cache_namespace("/var/cache/modelpool/team-b", namespace),
        ),
        "priority": (
            _pool("priority", priority="system-node-critical"),
            msg_priority_class("system-node-critical", PRIORITIES),
        ),
        "control-plane": (
            _pool(
                "control-plane",
                tolerations=[{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}],
            ),
            msg_toleration(FIELD_TOLERATIONS, "node-role.kubernetes.io/control-plane", TOLERATION_KEYS),
        ),
        "every-taint": (
            _pool("every-taint", tolerations=[{"operator": "Exists"}]),
            msg_toleration(FIELD_TOLERATIONS, "*", TOLERATION_KEYS),
        ),
        "node-role": (
            _pool("node-role", node_selector={"node-role.kubernetes.io/control-plane": "", "zz": "1"}),
            msg_node_selector(FIELD_NODE_SELECTOR, "node-role.kubernetes.io/control-plane", NODE_KEYS),
        ),
        "ledger-label": (
            _pool("ledger-label", labels={"modelpool.dev/pool": "ghost"}),
            msg_metadata_key(FIELD_LABELS, "modelpool.dev/pool", LABEL_DOMAINS),
        ),
        "operator-label": (
            _pool("operator-label", labels={"app.kubernetes.io/name": "modelpool-operator"}),
            msg_metadata_key(FIELD_LABELS, "app.kubernetes.io/name", LABEL_DOMAINS),
        ),
        "apparmor": (
            _pool(
                "apparmor",
                annotations={"container.apparmor.security.beta.kubernetes.io/server": "unconfined"},
            ),
            msg_metadata_key(
                "spec.podTemplate.annotations",
                "container.apparmor.security.beta.kubernetes.io/server",
                ANNOTATION_DOMAINS,
            ),
        ),
        "multus": (
            _pool("multus", annotations={"k8s.v1.cni.cncf.io/networks": "host-net"}),
            msg_metadata_key(
                "spec.podTemplate.annotations", "k8s.v1.cni.cncf.io/networks", ANNOTATION_DOMAINS
            ),
        ),
        "mesh": (
            _pool("mesh", annotations={"sidecar.istio.io/inject": "false"}),
            msg_metadata_key("spec.podTemplate.annotations", "sidecar.istio.io/inject", ANNOTATION_DOMAINS),
        ),
        "remote-code": (
            _pool(
                "remote-code",
                env=[
                    {"name": "HF_TOKEN", "value": "t"},
                    {"name": "MODELPOOL_TRUST_REMOTE_CODE", "value": "true"},
                ],
            ),
            msg_env("MODELPOOL_TRUST_REMOTE_CODE", ENV_NAMES),
        ),
        "handler": (
            _pool("handler", env=[{"name": "modelpool_handler", "value": "x:Y"}]),
            msg_env("modelpool_handler", ENV_NAMES),
        ),
        "preload": (
            _pool("preload", env=[{"name": "LD_PRELOAD", "value": "/cache/x.so"}]),
            msg_env("LD_PRELOAD", ENV_NAMES),
        ),
        "host-taints": (
            _host("host-taints", tolerations=[{"operator": "Exists"}]),
            msg_toleration(FIELD_HOST_TOLERATIONS, "*", TOLERATION_KEYS),
        ),
        "host-nodes": (
            _host("host-nodes", nodeSelector={"kubernetes.io/hostname": "node-1"}),
            msg_node_selector(FIELD_HOST_NODE_SELECTOR, "kubernetes.io/hostname", NODE_KEYS),
        ),
        # Issue 31: node affinity places pods as a nodeSelector does; a preference as surely.
        "node-affinity": (
            _pool("node-affinity", affinity=_nodes([], [["kubernetes.io/hostname"]])),
            msg_node_selector(FIELD_NODE_AFFINITY, "kubernetes.io/hostname", NODE_KEYS),
        ),
        "host-affinity": (
            _host("host-affinity", affinity=_nodes([["node-role.kubernetes.io/control-plane"]])),
            msg_node_selector(FIELD_HOST_NODE_AFFINITY, "node-role.kubernetes.io/control-plane", NODE_KEYS),
        ),
    }
    for name, (manifest, message) in refused.items():
        code, output = _create(crds, namespace, manifest, f"--as={USER}")
        assert code != 0, f"{name}: created\n{output}"
        assert "ValidatingAdmissionPolicy" in output and message in output, f"{name}: {output}"
    # Pod affinity beyond the pool's namespace: the CRD itself refuses it, to anyone.
    elsewhere = {"topologyKey": "kubernetes.io/hostname", "namespaceSelector": {}}
    for kind in ("podAffinity", "podAntiAffinity"):
        manifest = _pool(
            "elsewhere", affinity={kind: {"requiredDuringSchedulingIgnoredDuringExecution": [elsewhere]}}
        )
        code, output = _create(crds, namespace, manifest)
        assert code != 0 and MSG_AFFINITY_NAMESPACES in output, output

    allowed = _pool(
        "allowed",
        cache_path=f"/var/cache/modelpool/{namespace}",
        image="ghcr.io/modelpool/modelpool-server:0.1.0",
        service_account="model-runner",
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        node_selector={"kubernetes.io/arch": "amd64"},
        labels={"team": "a", "example.com/cost-center": "7"},
        annotations={"prometheus.io/scrape": "true", "note": "x"},
        env=[{"name": "HF_TOKEN", "value": "t"}, {"name": "HF_HUB_OFFLINE", "value": "1"}],
    )
    code, output = _create(crds, namespace, allowed, f"--as={USER}")
    assert code == 0, output
    # The operator (same allowlists) runs the allowed pool: a worker appears; the refused ones never existed.
    wait_for(lambda: worker_pods(crds, namespace, "allowed"), timeout=60, message="the allowed pool's worker")
    # The watcher saw every pod change in the namespace: only the allowed pool's workers.
    assert {name for _, _, name, _ in watcher.history} and all(
        name.startswith("allowed-") for _, _, name, _ in watcher.history
    ), watcher.history
    assert condition(_status(crds, namespace, "allowed"), POLICY_VIOLATION) == {}

    # An update that brings in a forbidden value is refused too (for the cluster admin as well); one that
    # leaves those fields alone is not.
    patch = json.dumps({"spec": {"image": "docker.io/evil/miner:2"}})
    done = crds.kubectl("patch", POOLS, "allowed", "-n", namespace, "--type=merge", "-p", patch, check=False)
    assert done.returncode != 0 and msg_image("docker.io/evil/miner:2", IMAGES) in done.stderr, done.stderr
    crds.kubectl("label", POOLS, "allowed", "-n", namespace, "team=a")


# Edge cases on which the API server's CEL and the operator's Python must agree.
EDGE_CASES: list[dict[str, Any]] = [
    {"cache_path": "/var/cache/modelpool"},
    {"cache_path": "/var/cache/modelpool/a/b"},
    {"cache_path": "/var/cache/modelpool/..."},
    {"cache_path": "/var/cache/modelpool/..a"},
    {"cache_path": "/var/cache/modelpool/"},
    {"cache_path": "/var/cache/modelpool//a"},
    {"cache_path": "/var/cache/modelpool/./a"},
    {"cache_path": "/var/cache/modelpool/a/.."},
    {"cache_path": "/var/cache"},
    {"cache_path": "/"},
    {"image": "ghcr.io/modelpool/x:1"},
    {"image": "ghcr.io/modelpool/a/b@sha256:ab"},
    {"image": "ghcr.io/modelpool/"},
    {"image": "ghcr.io/modelpool/../x"},
    {"image": "ghcr.io/modelpoolx/y"},
    {"image": "ghcr.io/modelpool"},
    {"service_account": "model-runner"},
    {"service_account": "default"},
    {"service_account": "model-runner-2"},
    {"servedModelName": "team-b/llama"},
    {"servedModelName": "llama"},
    {"servedModelName": "meta-llama/Llama-3.1-8B"},
    {"servedModelName": "a.b/c"},
    {"servedModelName": "x/y.z"},
    {"priority": "batch-low"},
    {"priority": "batch-low-2"},
    {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]},
    {"tolerations": [{"key": "", "operator": "Exists"}]},
    {"tolerations": [{"key": "b.io/x", "operator": "Exists"}, {"key": "a.io/x", "operator": "Exists"}]},
    {"node_selector": {"nvidia.com/gpu.product": "H100"}},
    {"node_selector": {"zz": "1", "kubernetes.io/hostname": "n", "aa": "1"}},
    {"labels": {"team": "a", "app": "b"}},
    {"labels": {"example.com/x": "1", "a.b.example.com/y": "1"}},
    {"labels": {"example.com.evil/x": "1"}},
    {"labels": {"xexample.com/x": "1"}},
    {"labels": {"Modelpool.Dev/pool": "x"}},
    {"labels": {"x.modelpool.dev/y": "1"}},
    {"labels": {"k8s.io/x": "1", "a.k8s.io/y": "1"}},
    {"labels": {"z": "1", "b.io/x": "1", "a.io/x": "1"}},
    {"annotations": {"prometheus.io/scrape": "true", "note": "x"}},
    {"annotations": {"seccomp.security.alpha.kubernetes.io/pod": "unconfined"}},
    {"annotations": {"linkerd.io/inject": "disabled"}},
    {"env": [{"name": "HF_ENDPOINT", "value": "x"}, {"name": "MY_MODELPOOL_X", "value": "1"}]},
    {"env": [{"name": "Modelpool_Handler", "value": "x"}]},
    {"env": [{"name": "pythonpath", "value": "/cache"}, {"name": "HF_HOME", "value": "/tmp"}]},
    {"env": [{"name": "LD_LIBRARY_PATH", "value": "/cache"}]},
    {"env": [{"name": "MODELPOOL_HANDLER", "value": "x:Y"}]},
    {
        "env": [
            {"name": "MODELPOOL_HANDLER", "value": "x:Y"},
            {"name": "MODELPOOL_TRUST_REMOTE_CODE", "value": "1"},
        ]
    },
    {"cache_path": "/var/cache/modelpool/NS"},
    {"cache_path": "/var/cache/modelpool/x/NS"},
    {"cache_path": "/var/cache/modelpool/NS-x"},
    # Issue 31: node affinity keys, the first refused one in term order (required, then preferred).
    {"affinity": _nodes([["kubernetes.io/arch"]], [["topology.kubernetes.io/zone"]])},
    {"affinity": _nodes([["kubernetes.io/arch", "zz"], ["aa"]])},
    {"affinity": _nodes([["kubernetes.io/arch"]], [["kubernetes.io/hostname"], ["aa"]])},
    {"affinity": _nodes([], [["kubernetes.io/os"], ["node-role.kubernetes.io/control-plane"]])},
    {
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}
        }
    },
    {
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"team": "a"}}}
                ]
            }
        }
    },
    {
        "spread": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule"}
        ]
    },
    {"spread": []},
]


def test_the_admission_policy_and_the_operator_agree_on_edge_cases(
    admission_policy: str, crds: Cluster
) -> None:
    policy = POLICY
    for index, written in enumerate(EDGE_CASES):
        # "NS" in a cache path: the test's namespace.
        case = {k: v.replace("NS", admission_policy) if k == "cache_path" else v for k, v in written.items()}
        manifest = _pool(f"edge-{index}", **case)
        expected = violations(parse_pool_spec(manifest["spec"]), policy, admission_policy)
        code, output = _create(crds, admission_policy, manifest, "--dry-run=server", f"--as={USER}")
        if expected:
            assert code != 0 and expected[0].message in output, f"{case}: {output}"
        else:
            assert code == 0, f"{case}: {output}"


def _status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    out = cluster.kubectl("get", POOLS, name, "-n", namespace, "-o", "json").stdout
    status: dict[str, Any] = json.loads(out).get("status") or {}
    return status


def test_the_operator_refuses_a_forbidden_pool_where_no_admission_policy_applies(
    crds: Cluster, namespace: str, budgeted_operator: BudgetedOperator
) -> None:
    watcher, _ = budgeted_operator("8Gi", **OPERATOR_ENV)
    apply(crds, _pool("forbidden", image="docker.io/evil/miner:1"), namespace)
    apply(crds, _pool("control"), namespace)  # an allowed pool beside it, as the positive control
    # The pod-shaping fields (issue 30, item 4): the ledger's label, every taint, the server's own env.
    shaped = _pool(
        "shaped",
        labels={"modelpool.dev/pool": "ghost"},
        tolerations=[{"operator": "Exists"}],
        env=[{"name": "MODELPOOL_TRUST_REMOTE_CODE", "value": "true"}],
    )
    apply(crds, shaped, namespace)

    status = wait_status(
        crds,
        namespace,
        "forbidden",
        lambda s: condition(s, POLICY_VIOLATION).get("status") == "True",
        timeout=60,
        message="the PolicyViolation condition",
    )
    violation = condition(status, POLICY_VIOLATION)
    assert violation["reason"] == "Forbidden"
    assert violation["message"].startswith(msg_image("docker.io/evil/miner:1", IMAGES))
    assert status["phase"] == "Failed"
    wait_for(
        lambda: (POLICY_VIOLATION, violation["message"]) in reasons(crds, namespace, "forbidden"),
        timeout=30,
        message="the PolicyViolation Event",
    )
    wait_for(lambda: worker_pods(crds, namespace, "control"), timeout=60, message="the control pool's worker")
    assert worker_pods(crds, namespace, "forbidden") == []
    shaped_status = wait_status(
        crds,
        namespace,
        "shaped",
        lambda s: condition(s, POLICY_VIOLATION).get("status") == "True",
        timeout=60,
        message="the shaped pool's PolicyViolation condition",
    )
    text = condition(shaped_status, POLICY_VIOLATION)["message"]
    for message in (
        msg_toleration(FIELD_TOLERATIONS, "*", TOLERATION_KEYS),
        msg_metadata_key(FIELD_LABELS, "modelpool.dev/pool", LABEL_DOMAINS),
        msg_env("MODELPOOL_TRUST_REMOTE_CODE", ENV_NAMES),
    ):
        assert message in text, text
    assert worker_pods(crds, namespace, "shaped") == []

    # Allowed again: the operator takes the pool up and the condition goes.
    allowed_at = time.monotonic()
    patch = json.dumps({"spec": {"image": "ghcr.io/modelpool/modelpool-server:0.1.0"}})
    crds.kubectl("patch", POOLS, "forbidden", "-n", namespace, "--type=merge", "-p", patch)
    wait_for(lambda: worker_pods(crds, namespace, "forbidden"), timeout=60, message="the worker once allowed")
    wait_status(
        crds,
        namespace,
        "forbidden",
        lambda s: condition(s, POLICY_VIOLATION) == {},
        timeout=30,
        message="the PolicyViolation condition removed",
    )
    # The watcher saw every pod change: none of the forbidden pool's before the patch allowed it.
    before = [name for at, _, name, _ in watcher.history if name.startswith("forbidden-") and at < allowed_at]
    assert before == [], before
    assert not [name for _, _, name, _ in watcher.history if name.startswith("shaped-")]


def test_no_pool_or_host_is_served_from_the_release_namespace(bound: Bound, crds: Cluster) -> None:
    """The operator's own namespace (the chart's release namespace) holds its Secrets and the pods every
    pool's NetworkPolicy admits: the API server refuses a pool or a ModelHost there, as the operator does."""
    message = msg_operator_namespace(bound.release_namespace)
    for manifest in (_pool("in-release"), _host("in-release")):
        code, output = _create(crds, bound.release_namespace, manifest, f"--as={USER}")
        assert code != 0 and message in output, output
    policy = replace(POLICY, operator_namespace=bound.release_namespace)
    assert [
        v.message for v in violations(parse_pool_spec(_pool("p")["spec"]), policy, bound.release_namespace)
    ] == [message]
    code, output = _create(crds, bound.namespace, _pool("elsewhere"), "--dry-run=server", f"--as={USER}")
    assert code == 0, output


def test_an_update_is_refused_only_for_what_it_brings(bound: Bound, crds: Cluster) -> None:
    """A pool that already holds a forbidden label, toleration, env name or priority (made before the
    policy) keeps its other updates, such as the operator's finalizer; what an update adds is checked."""
    namespace = bound.namespace
    binding = next(
        d for d in yaml.safe_load_all(bound.rendered) if d and d["kind"] == "ValidatingAdmissionPolicyBinding"
    )
    old = _pool(
        "old",
        labels={"modelpool.dev/pool": "ghost"},
        annotations={"sidecar.istio.io/inject": "false"},
        tolerations=[{"operator": "Exists"}],
        node_selector={"kubernetes.io/hostname": "n"},
        env=[{"name": "MODELPOOL_TRUST_REMOTE_CODE", "value": "true"}],
        priority="system-node-critical",
        affinity=_nodes([["kubernetes.io/hostname"]]),
    )
    # The policy's binding out of the way while the old pool is made, then back.
    crds.kubectl("delete", "validatingadmissionpolicybinding", binding["metadata"]["name"])
    wait_for(
        lambda: _create(crds, namespace, old, "--dry-run=server")[0] == 0,
        timeout=60,
        interval=0.5,
        message="the binding gone",
    )
    assert _create(crds, namespace, old)[0] == 0
    apply(crds, bound.rendered)
    probe = _pool("probe", image="docker.io/evil:1")
    wait_for(
        lambda: _create(crds, namespace, probe, "--dry-run=server")[0] != 0,
        timeout=60,
        interval=0.5,
        message="the admission policy enforced again",
    )

    def patch(body: dict[str, Any]) -> tuple[int, str]:
        done = crds.kubectl(
            "patch", POOLS, "old", "-n", namespace, "--type=merge", "-p", json.dumps(body), check=False
        )
        return done.returncode, done.stderr + done.stdout

    # Unchanged forbidden fields: a finalizer, a replica count, a harmless label are allowed.
    assert patch({"metadata": {"finalizers": ["modelpool.dev/test"]}})[0] == 0
    assert patch({"spec": {"replicas": 2, "podTemplate": {"labels": {"team": "a"}}}})[0] == 0
    # Each new forbidden value is refused, beside the old ones.
    news = [
        ({"labels": {"k8s.io/x": "1"}}, msg_metadata_key(FIELD_LABELS, "k8s.io/x", LABEL_DOMAINS)),
        (
            {"tolerations": [{"operator": "Exists"}, {"key": "node-role.kubernetes.io/control-plane"}]},
            msg_toleration(FIELD_TOLERATIONS, "node-role.kubernetes.io/control-plane", TOLERATION_KEYS),
        ),
        (
            {
                "env": [
                    {"name": "MODELPOOL_TRUST_REMOTE_CODE", "value": "true"},
                    {"name": "LD_AUDIT", "value": "x"},
                ]
            },
            msg_env("LD_AUDIT", ENV_NAMES),
        ),
        (
            {"priorityClassName": "system-cluster-critical"},
            msg_priority_class("system-cluster-critical", PRIORITIES),
        ),
        (
            {"affinity": _nodes([["kubernetes.io/hostname"]], [["zz"]])},
            msg_node_selector(FIELD_NODE_AFFINITY, "zz", NODE_KEYS),
        ),
    ]
    for template, message in news:
        code, output = patch({"spec": {"podTemplate": template}})
        assert code != 0 and message in output, output
    patch({"metadata": {"finalizers": None}})


def test_the_chart_writes_out_the_contracts_reserved_names_and_its_default_image(crds: Cluster) -> None:
    """The CEL's reserved lists are modelpool_contract.reserved's, and an empty config.allowedImages means
    the repository of the chart's own server image (config.serverImage, else the operator's default), as
    the operator's settings say."""
    variables = _variables(_render(crds, "mp-system"))

    def cel_list(name: str) -> list[str]:
        return list(yaml.safe_load(variables[name].replace("'", '"')))

    assert cel_list("reservedDomains") == list(RESERVED_KEY_DOMAINS)
    assert cel_list("reservedEnvPrefixes") == list(RESERVED_ENV_PREFIXES)
    assert cel_list("reservedEnvNames") == list(RESERVED_ENV_NAMES)
    assert json.loads(variables["images"]) == [image_repository(DEFAULT_SERVER_IMAGE)]
    assert json.loads(variables["releaseNamespace"]) == "mp-system"
    own = _variables(
        _render(crds, "mp-system", "--set", "config.serverImage=registry.local:5000/t/server:2@sha256:ab")
    )
    assert json.loads(own["images"]) == ["registry.local:5000/t/server"]
