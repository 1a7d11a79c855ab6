"""What a pool's author may ask for (modelpool_operator.policy): the path, image and service-account rules,
the operator's allowlist settings, and the reconciliation pass refusing a forbidden pool (no worker, the
PolicyViolation condition, one Warning Event) and taking it up again once allowed.

The chart's ValidatingAdmissionPolicy applies the same rules on the real API server:
tests/operator/integration/test_admission_policy.py."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from modelpool_contract.api import parse_pool_spec
from modelpool_contract.flags import DEFAULT_SERVER_IMAGE
from modelpool_operator.bookkeeping import PoolRun
from modelpool_operator.policy import (
    FIELD_HOST_PATH,
    FIELD_IMAGE,
    FIELD_SERVED_NAME,
    FIELD_SERVICE_ACCOUNT,
    Policy,
    Violation,
    host_path_allowed,
    image_allowed,
    image_repository,
    is_clean_path,
    msg_host_path,
    msg_image,
    msg_served_name,
    msg_service_account,
    msg_unclean_path,
    violations,
)
from modelpool_operator.reconcile import reconcile_pool
from modelpool_operator.refusals import POLICY_VIOLATION
from modelpool_operator.settings import OperatorConfig
from tests.operator.unit.test_reconcile_wiring import Operator, recording_operator

# ---- the path rule ------------------------------------------------------------------------------------

# Segments drawn from a small alphabet with the characters that matter: "/", "." and a comma.
_segment = st.text(alphabet="ab.,", min_size=0, max_size=4)
_paths = st.one_of(
    st.lists(_segment, min_size=0, max_size=5).map(lambda parts: "/" + "/".join(parts)),
    st.text(alphabet="ab./", max_size=12),
)


def _segments(path: str) -> list[str] | None:
    """The reference model: a clean path's segments, or None (not absolute; an empty, '.' or '..' one)."""
    if path == "/":
        return []
    if not path.startswith("/"):
        return None
    parts = path[1:].split("/")
    return None if any(p in ("", ".", "..") for p in parts) else parts


@given(_paths)
def test_a_clean_path_is_absolute_without_empty_dot_or_dotdot_segments(path: str) -> None:
    assert is_clean_path(path) == (_segments(path) is not None)


@given(_paths, st.lists(_paths.filter(lambda p: _segments(p) is not None), max_size=3))
def test_a_path_is_allowed_exactly_when_a_prefix_is_its_leading_whole_segments(
    path: str, prefixes: list[str]
) -> None:
    parts = _segments(path)
    expected = parts is not None and any(parts[: len(_segments(p) or [])] == _segments(p) for p in prefixes)
    assert host_path_allowed(path, prefixes) == expected


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/data", True),
        ("/data/x", True),
        ("/data/x/y", True),
        ("/database", False),
        ("/dat", False),
        ("/", False),
        ("/data/", False),
        ("/data//x", False),
        ("//data/x", False),
        ("/data/../etc", False),
        ("/data/./x", False),
        ("/data/x/..", False),
        ("/data/..x", True),
        ("/data/...", True),
        ("data/x", False),
        ("/srv/models", True),
        ("/srv/models-evil", False),
    ],
)
def test_host_path_examples(path: str, allowed: bool) -> None:
    assert host_path_allowed(path, ["/data", "/srv/models"]) == allowed


def test_the_root_prefix_allows_every_clean_path_and_no_prefix_allows_none() -> None:
    assert host_path_allowed("/anything/at/all", ["/"])
    assert not host_path_allowed("/a/../b", ["/"])
    assert not host_path_allowed("/data", [])


# ---- the image rule -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("ghcr.io/modelpool/modelpool-server:0.1.0", True),
        ("ghcr.io/modelpool/anything/deeper@sha256:abc", True),
        ("ghcr.io/modelpoolx/modelpool-server:1", False),
        ("ghcr.io/modelpool", False),
        ("evil.io/ghcr.io/modelpool/x", False),
        ("ghcr.io/modelpool/../evil/x", False),
        ("ghcr.io/modelpool//x", False),
        ("registry.local/team/server", True),
        ("registry.local/team/server:2", True),
        ("registry.local/team/server@sha256:abc", True),
        ("registry.local/team/server-x:2", False),
        ("registry.local/team/server/sub:2", False),
        ("registry.local/team", False),
        ("docker.io/library/nginx", False),
    ],
)
def test_image_examples(image: str, allowed: bool) -> None:
    entries = ["ghcr.io/modelpool/", "registry.local/team/server"]
    assert image_allowed(image, entries) == allowed


@given(st.text(alphabet=string.ascii_lowercase + "./:@", max_size=20))
def test_no_image_entry_means_no_image(image: str) -> None:
    assert not image_allowed(image, [])


@pytest.mark.parametrize(
    ("image", "repository"),
    [
        ("ghcr.io/modelpool/modelpool-server:0.1.0", "ghcr.io/modelpool/modelpool-server"),
        ("ghcr.io/modelpool/modelpool-server", "ghcr.io/modelpool/modelpool-server"),
        ("ghcr.io/modelpool/modelpool-server@sha256:ab", "ghcr.io/modelpool/modelpool-server"),
        ("ghcr.io/modelpool/modelpool-server:1@sha256:ab", "ghcr.io/modelpool/modelpool-server"),
        ("registry.local:5000/server", "registry.local:5000/server"),
        ("registry.local:5000/server:2", "registry.local:5000/server"),
    ],
)
def test_the_repository_of_an_image_drops_its_tag_and_digest(image: str, repository: str) -> None:
    assert image_repository(image) == repository


@given(st.text(alphabet="ab./:@", max_size=16), st.text(alphabet="ab.:@", min_size=1, max_size=6))
def test_a_prefix_entry_never_allows_an_image_outside_it(image: str, head: str) -> None:
    entry = f"reg/{head}/"
    if image_allowed(image, [entry]):
        assert image.startswith(entry)


# ---- violations ---------------------------------------------------------------------------------------


def _spec(**spec: Any) -> Any:
    return parse_pool_spec(
        {"model": {"source": "hf://org/m", "task": "text-embedding"}, "resources": {"memory": "1Gi"}, **spec}
    )


def _host_cache(path: str) -> dict[str, Any]:
    return {"source": "hf://org/m", "task": "text-embedding", "cache": {"type": "hostPath", "path": path}}


NS = "team-a"
OPEN = Policy()
STRICT = Policy(
    host_paths=("/var/cache/modelpool",), images=("ghcr.io/modelpool/",), service_accounts=("model-runner",)
)


def test_a_plain_pool_is_allowed_by_every_policy() -> None:
    assert violations(_spec(), OPEN, NS) == []
    assert violations(_spec(), STRICT, NS) == []


@pytest.mark.parametrize(
    ("alias", "refused"),
    [
        ("team-b/llama", True),  # another namespace's pool name: refused under every policy
        ("kube-system/x.y", True),
        ("team-a/llama", False),  # its own namespace
        ("meta-llama/Llama-3.1-8B", False),  # not an object name (uppercase): an alias, not a namespace/name
        ("sentence-transformers/all-MiniLM-L6-v2", False),
        ("llama", False),
        ("a" * 64 + "/x", False),  # no namespace is 64 characters long
    ],
)
def test_an_alias_may_read_as_namespace_name_only_in_its_own_namespace(alias: str, refused: bool) -> None:
    expected = [Violation(FIELD_SERVED_NAME, msg_served_name(alias, NS))] if refused else []
    assert violations(_spec(servedModelName=alias), OPEN, NS) == expected
    assert violations(_spec(servedModelName=alias), STRICT, NS) == expected


def test_the_empty_policy_allows_no_host_path_image_or_service_account() -> None:
    spec = _spec(
        model=_host_cache("/var/cache/modelpool"),
        image="anything.io/x:1",
        podTemplate={"serviceAccountName": "whoever"},
    )
    assert violations(spec, OPEN, NS) == [
        Violation(FIELD_HOST_PATH, msg_host_path("/var/cache/modelpool", ())),
        Violation(FIELD_IMAGE, msg_image("anything.io/x:1", ())),
        Violation(FIELD_SERVICE_ACCOUNT, msg_service_account("whoever", ())),
    ]
    assert all("(allowed: none)" in v.message for v in violations(spec, OPEN, NS))


def test_each_forbidden_field_is_named() -> None:
    spec = _spec(
        model=_host_cache("/"), image="docker.io/evil:1", podTemplate={"serviceAccountName": "cluster-admin"}
    )
    assert violations(spec, STRICT, NS) == [
        Violation(FIELD_HOST_PATH, msg_host_path("/", STRICT.host_paths)),
        Violation(FIELD_IMAGE, msg_image("docker.io/evil:1", STRICT.images)),
        Violation(FIELD_SERVICE_ACCOUNT, msg_service_account("cluster-admin", STRICT.service_accounts)),
    ]
    assert all(v.message.startswith(v.field + ": ") for v in violations(spec, STRICT, NS))


def test_an_unclean_path_says_so_even_under_an_allowed_prefix() -> None:
    spec = _spec(model=_host_cache("/var/cache/modelpool/../../../etc"))
    assert violations(spec, STRICT, NS) == [
        Violation(FIELD_HOST_PATH, msg_unclean_path("/var/cache/modelpool/../../../etc"))
    ]


def test_allowed_values_pass() -> None:
    spec = _spec(
        model=_host_cache("/var/cache/modelpool/team-a"),
        image="ghcr.io/modelpool/modelpool-server:0.2",
        podTemplate={"serviceAccountName": "model-runner"},
    )
    assert violations(spec, STRICT, NS) == []


def test_a_pvc_cache_and_an_unset_image_or_account_are_not_checked() -> None:
    spec = _spec(
        model={"source": "hf://org/m", "task": "text-embedding", "cache": {"type": "pvc", "claimName": "c"}}
    )
    assert violations(spec, STRICT, NS) == []
    assert violations(_spec(image=""), STRICT, NS) == []


# ---- the settings -------------------------------------------------------------------------------------


def test_the_allowlists_come_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_HOST_PATHS", "/data, /srv/models")
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_IMAGES", "ghcr.io/modelpool/,registry.local/team/server")
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_SERVICE_ACCOUNTS", "a,b")
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_PRIORITY_CLASSES", "batch-low")
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_TOLERATION_KEYS", "nvidia.com/gpu,*")
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_NODE_SELECTOR_KEYS", "kubernetes.io/arch,pool")
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_LABEL_DOMAINS", "example.com")
    monkeypatch.setenv("MODELPOOL_OPERATOR_ALLOWED_ANNOTATION_DOMAINS", "prometheus.io,sidecar.istio.io")
    monkeypatch.setenv("MODELPOOL_OPERATOR_OWN_NAMESPACE", "mp-system")
    assert OperatorConfig().policy == Policy(
        host_paths=("/data", "/srv/models"),
        images=("ghcr.io/modelpool/", "registry.local/team/server"),
        service_accounts=("a", "b"),
        priority_classes=("batch-low",),
        toleration_keys=("nvidia.com/gpu", "*"),
        node_selector_keys=("kubernetes.io/arch", "pool"),
        label_domains=("example.com",),
        annotation_domains=("prometheus.io", "sidecar.istio.io"),
        operator_namespace="mp-system",
    )


def test_the_default_allowlists_allow_the_operators_own_image_and_gpu_placement_only() -> None:
    policy = OperatorConfig().policy
    assert policy == Policy(images=("ghcr.io/modelpool/modelpool-server",))
    assert image_allowed(DEFAULT_SERVER_IMAGE, policy.images)
    assert image_allowed("ghcr.io/modelpool/modelpool-server@sha256:ab", policy.images)
    assert not image_allowed("docker.io/evil/miner:1", policy.images)
    assert policy.toleration_keys == ("nvidia.com/gpu",)
    assert "node-role.kubernetes.io/control-plane" not in policy.node_selector_keys
    assert "kubernetes.io/hostname" not in policy.node_selector_keys
    # A server image of the administrator's own: its repository is the one allowed.
    config = OperatorConfig(server_image="registry.local:5000/team/server:2")
    assert config.policy.images == ("registry.local:5000/team/server",)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ALLOWED_HOST_PATHS", "/data/"),
        ("ALLOWED_HOST_PATHS", "/data/../etc"),
        ("ALLOWED_HOST_PATHS", "data"),
        ("ALLOWED_HOST_PATHS", "/a//b"),
        ("ALLOWED_IMAGES", "ghcr.io"),
        ("ALLOWED_IMAGES", "/ghcr.io/x"),
        ("ALLOWED_LABEL_DOMAINS", "modelpool.dev"),
        ("ALLOWED_LABEL_DOMAINS", "x.kubernetes.io"),
        ("ALLOWED_ANNOTATION_DOMAINS", "k8s.io"),
        ("ALLOWED_ANNOTATION_DOMAINS", "Example.com"),
        ("ALLOWED_ANNOTATION_DOMAINS", "example.com/"),
    ],
)
def test_a_malformed_allowlist_entry_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(f"MODELPOOL_OPERATOR_{variable}", value)
    with pytest.raises(ValidationError, match=variable.lower()):
        OperatorConfig()


# ---- the reconciliation pass --------------------------------------------------------------------------


def _body(generation: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-p", "generation": generation},
        "spec": {
            "model": {"source": "hf://org/m", "task": "text-embedding"},
            "replicas": 1,
            "resources": {"memory": "1Gi"},
            **spec,
        },
    }


@pytest.fixture
async def strict_state() -> Any:
    config = OperatorConfig(allowed_images=("ghcr.io/modelpool/",))
    operator = recording_operator(config)
    yield operator
    await operator.services.scraper.aclose()


async def test_a_forbidden_pool_gets_no_worker_a_condition_and_one_event(strict_state: Operator) -> None:
    kube, events = strict_state.kube, strict_state.events
    run = PoolRun(key=("ns", "p"))
    body = _body(1, image="docker.io/evil:1")
    budgets = {"default": [{"memory": "8Gi"}]}
    for _ in range(3):  # once per generation, however many passes
        plan = await reconcile_pool(
            strict_state.services,
            strict_state.book,
            run=run,
            body=body,
            pods_by_pool={},
            pools_by_key={},
            budgets=budgets,
        )
        assert plan is None
    assert kube.created == []
    assert len(kube.status_patches) == 1
    patch = kube.status_patches[0]
    assert patch["phase"] == "Failed" and patch["observedGeneration"] == 1
    (violation,) = [c for c in patch["conditions"] if c["type"] == POLICY_VIOLATION]
    assert violation["status"] == "True" and violation["reason"] == "Forbidden"
    assert violation["message"].startswith(msg_image("docker.io/evil:1", ("ghcr.io/modelpool/",)))
    assert "no worker is created or changed" in violation["message"]
    assert [(e.type, e.reason) for _, e in events.posted] == [("Warning", POLICY_VIOLATION)]
    assert events.posted[0][1].message == violation["message"]

    # The spec allowed again: a worker is created and the condition goes.
    allowed = {**_body(2, image="ghcr.io/modelpool/modelpool-server:1"), "status": {**patch}}
    plan = await reconcile_pool(
        strict_state.services,
        strict_state.book,
        run=run,
        body=allowed,
        pods_by_pool={},
        pools_by_key={},
        budgets=budgets,
    )
    assert plan is not None and len(kube.created) == 1
    last = kube.status_patches[-1]
    assert all(c["type"] != POLICY_VIOLATION for c in last["conditions"])
