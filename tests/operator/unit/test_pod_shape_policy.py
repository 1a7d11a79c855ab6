"""The pod-shaping rules of ``modelpool_operator.policy`` (issue 30, item 4): label and annotation keys,
priority classes, toleration and nodeSelector keys, the env names the server reads, a hostPath cache per
namespace, and no pool in the operator's own namespace. Each refusal here was allowed before.

The chart's ValidatingAdmissionPolicy applies the same rules with the same messages on the real API
server: tests/operator/integration/test_admission_policy.py."""

from __future__ import annotations

from typing import Any

import pytest

from modelpool_contract.api import parse_pool_spec
from modelpool_contract.reserved import RESERVED_ENV_NAMES, env_name_reserved, key_reserved
from modelpool_operator.policy import (
    FIELD_ANNOTATIONS,
    FIELD_ENV,
    FIELD_HOST_PATH,
    FIELD_LABELS,
    FIELD_NAMESPACE,
    FIELD_NODE_SELECTOR,
    FIELD_PRIORITY_CLASS,
    FIELD_TOLERATIONS,
    Policy,
    Violation,
    key_allowed,
    msg_cache_namespace,
    msg_env,
    msg_metadata_key,
    msg_node_selector,
    msg_operator_namespace,
    msg_priority_class,
    msg_toleration,
    violations,
)

NS = "team-a"
DEFAULT = Policy()


def _spec(**template: Any) -> Any:
    return parse_pool_spec(
        {
            "model": {"source": "hf://org/m", "task": "text-embedding"},
            "resources": {"memory": "1Gi"},
            "podTemplate": template,
        }
    )


# ---- labels and annotations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "modelpool.dev/pool",  # the ledger's and the Service's own label
        "modelpool.dev/memory-bytes",
        "x.modelpool.dev/anything",  # a subdomain of the project's
        "Modelpool.DEV/pool",  # domains compare in lower case
        "app.kubernetes.io/name",  # the operator's and the gateway's pod labels
        "container.apparmor.security.beta.kubernetes.io/server",  # AppArmor unconfined
        "seccomp.security.alpha.kubernetes.io/pod",
        "cluster-autoscaler.kubernetes.io/safe-to-evict",
        "k8s.io/x",
        "k8s.v1.cni.cncf.io/networks",  # Multus: a second network interface
        "sidecar.istio.io/inject",  # mesh opt-out
        "linkerd.io/inject",
        "vault.hashicorp.com/agent-inject",
        "/no-domain",
    ],
)
def test_a_reserved_or_unlisted_key_is_refused_on_labels_and_annotations(key: str) -> None:
    spec = _spec(labels={key: "x", "team": "a"}, annotations={key: "x"})
    assert violations(spec, DEFAULT, NS) == [
        Violation(FIELD_LABELS, msg_metadata_key(FIELD_LABELS, key, ())),
        Violation(FIELD_ANNOTATIONS, msg_metadata_key(FIELD_ANNOTATIONS, key, ())),
    ]


def test_keys_without_a_prefix_and_of_allowed_domains_pass() -> None:
    policy = Policy(label_domains=("example.com",), annotation_domains=("prometheus.io", "sidecar.istio.io"))
    spec = _spec(
        labels={"team": "a", "app": "llama", "example.com/cost-center": "7", "a.example.com/x": "y"},
        annotations={"prometheus.io/scrape": "true", "sidecar.istio.io/inject": "false", "note": "x"},
    )
    assert violations(spec, policy, NS) == []
    # An allowed domain is not an allowed label for annotations, nor the other way round.
    swapped = _spec(labels={"prometheus.io/scrape": "true"}, annotations={"example.com/cost-center": "7"})
    assert [v.field for v in violations(swapped, policy, NS)] == [FIELD_LABELS, FIELD_ANNOTATIONS]


def test_a_reserved_domain_is_refused_even_under_an_allowed_parent() -> None:
    # "io" would cover kubernetes.io: the reserved domains win.
    policy = Policy(label_domains=("io",))
    assert not key_allowed("app.kubernetes.io/name", policy.label_domains)
    assert key_allowed("example.io/x", policy.label_domains)
    assert not key_allowed("xmodelpool.dev/x", ()) and not key_reserved("xmodelpool.dev/x")


def test_the_smallest_refused_key_is_named() -> None:
    spec = _spec(labels={"zz.io/a": "1", "modelpool.dev/pool": "ghost", "team": "a"})
    [violation] = violations(spec, DEFAULT, NS)
    assert violation.message == msg_metadata_key(FIELD_LABELS, "modelpool.dev/pool", ())
    assert "never of modelpool.dev, kubernetes.io, k8s.io or their subdomains" in violation.message


# ---- priority, tolerations, nodeSelector ---------------------------------------------------------------


def test_a_priority_class_must_be_allowed_and_none_is_by_default() -> None:
    spec = _spec(priorityClassName="system-node-critical")
    assert violations(spec, DEFAULT, NS) == [
        Violation(FIELD_PRIORITY_CLASS, msg_priority_class("system-node-critical", ()))
    ]
    assert violations(_spec(priorityClassName="batch"), Policy(priority_classes=("batch",)), NS) == []


def test_tolerations_name_allowed_keys_and_a_keyless_one_is_star() -> None:
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert violations(_spec(tolerations=[gpu]), DEFAULT, NS) == []
    control_plane = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
    everything = {"operator": "Exists"}
    spec = _spec(tolerations=[gpu, control_plane, everything])
    assert violations(spec, DEFAULT, NS) == [
        Violation(
            FIELD_TOLERATIONS,
            msg_toleration(
                FIELD_TOLERATIONS, "node-role.kubernetes.io/control-plane", DEFAULT.toleration_keys
            ),
        )
    ]
    [keyless] = violations(_spec(tolerations=[everything]), DEFAULT, NS)
    assert keyless.message.startswith(f"{FIELD_TOLERATIONS}: * is not a toleration key")
    assert violations(_spec(tolerations=[everything]), Policy(toleration_keys=("*",)), NS) == []


def test_node_selector_keys_of_hardware_and_place_pass_and_roles_and_names_do_not() -> None:
    fine = {"kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert violations(_spec(nodeSelector=fine), DEFAULT, NS) == []
    bad = {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/hostname": "node-7", **fine}
    assert violations(_spec(nodeSelector=bad), DEFAULT, NS) == [
        Violation(
            FIELD_NODE_SELECTOR,
            msg_node_selector(FIELD_NODE_SELECTOR, "kubernetes.io/hostname", DEFAULT.node_selector_keys),
        )
    ]


# ---- env ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "MODELPOOL_TRUST_REMOTE_CODE",
        "MODELPOOL_HANDLER",
        "modelpool_handler",  # the server's settings read their variables in any case
        "MODELPOOL_HF_HOME",
        "MODELPOOL_CPU_SHARE_MILLICORES",
        "LD_PRELOAD",
        "HF_HOME",
        "HF_MODULES_CACHE",
        "TRANSFORMERS_CACHE",
        "PYTHONPATH",
        *RESERVED_ENV_NAMES,
    ],
)
def test_an_env_name_the_server_reads_is_refused(name: str) -> None:
    spec = _spec(env=[{"name": "HF_TOKEN", "value": "x"}, {"name": name, "value": "1"}])
    assert violations(spec, DEFAULT, NS) == [Violation(FIELD_ENV, msg_env(name, ()))]


def test_an_administrator_may_allow_a_reserved_env_name_exactly() -> None:
    policy = Policy(env_names=("MODELPOOL_HANDLER", "PYTHONPATH"))
    allowed = [
        {"name": "MODELPOOL_HANDLER", "value": "tests.h:Echo"},
        {"name": "PYTHONPATH", "value": "/src"},
    ]
    assert violations(_spec(env=allowed), policy, NS) == []
    # Another spelling, or another reserved name, is still refused.
    spec = _spec(env=[*allowed, {"name": "modelpool_handler", "value": "x"}])
    assert violations(spec, policy, NS) == [
        Violation(FIELD_ENV, msg_env("modelpool_handler", policy.env_names))
    ]
    assert "(allowed anyway: MODELPOOL_HANDLER, PYTHONPATH)" in msg_env("x", policy.env_names)


@pytest.mark.parametrize(
    "name", ["HF_TOKEN", "HF_HUB_OFFLINE", "HF_ENDPOINT", "OMP_NUM_THREADS", "MY_MODELPOOL_X"]
)
def test_other_env_names_pass(name: str) -> None:
    assert not env_name_reserved(name)
    assert violations(_spec(env=[{"name": name, "value": "1"}]), DEFAULT, NS) == []


def test_the_server_reads_every_flag_under_the_reserved_prefix() -> None:
    from model_server.config import ServerConfig

    prefix = str(ServerConfig.model_config.get("env_prefix"))
    assert env_name_reserved(prefix + "TRUST_REMOTE_CODE") and env_name_reserved(prefix + "HANDLER")
    assert all(env_name_reserved(f"{prefix}{name}".upper()) for name in ServerConfig.model_fields)


# ---- the hostPath cache and the namespace -----------------------------------------------------------------


def _cache(path: str) -> Any:
    return parse_pool_spec(
        {
            "model": {
                "source": "hf://o/m",
                "task": "text-embedding",
                "cache": {"type": "hostPath", "path": path},
            },
            "resources": {"memory": "1Gi"},
        }
    )


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/var/cache/modelpool/team-a", True),
        ("/var/cache/modelpool/x/team-a", True),
        ("/var/cache/modelpool", False),  # every namespace's workers would share it
        ("/var/cache/modelpool/team-b", False),
        ("/var/cache/modelpool/team-a-x", False),
        ("/var/cache/modelpool/team-a/sub", False),
    ],
)
def test_a_host_path_cache_is_the_directory_of_the_pools_namespace(path: str, allowed: bool) -> None:
    policy = Policy(host_paths=("/var/cache/modelpool",))
    expected = [] if allowed else [Violation(FIELD_HOST_PATH, msg_cache_namespace(path, NS))]
    assert violations(_cache(path), policy, NS) == expected


def test_no_pool_is_served_from_the_operators_namespace() -> None:
    policy = Policy(operator_namespace="mp-system")
    assert violations(_spec(), policy, "mp-system") == [
        Violation(FIELD_NAMESPACE, msg_operator_namespace("mp-system"))
    ]
    assert violations(_spec(), policy, NS) == []
    assert violations(_spec(), Policy(), "mp-system") == []  # unknown: not checked
