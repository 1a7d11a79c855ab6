"""What a pool's author may ask for, on the real API server: the chart's ValidatingAdmissionPolicy refuses
at ``kubectl create`` a pool beyond the allowlists, naming the field, for a user who may do nothing but
create, get and list ModelPools in one namespace; and the operator itself refuses such a pool where no
policy applies (condition PolicyViolation, a Warning Event, never a pod), and takes it up once allowed.

The policy objects are the chart's own (``helm template --show-only templates/admissionpolicy.yaml``), bound
to the test's namespace only (namespace scope); its refusals carry the very messages of
``modelpool_operator.policy``, which the unit tests check rule by rule (tests/operator/unit/test_policy.py).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from modelpool_contract.api import parse_pool_spec
from modelpool_operator.policy import (
    Policy,
    msg_host_path,
    msg_image,
    msg_served_name,
    msg_service_account,
    msg_unclean_path,
    violations,
)
from modelpool_operator.reconcile import POLICY_VIOLATION
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import apply, wait_for
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
USER = "alice"
HOST_PATHS = ("/var/cache/modelpool",)
IMAGES = ("ghcr.io/modelpool/",)
ACCOUNTS = ("model-runner",)
# The same lists for the operator, as the chart's config values render them.
OPERATOR_ENV = {
    "MODELPOOL_OPERATOR_ALLOWED_HOST_PATHS": ",".join(HOST_PATHS),
    "MODELPOOL_OPERATOR_ALLOWED_IMAGES": ",".join(IMAGES),
    "MODELPOOL_OPERATOR_ALLOWED_SERVICE_ACCOUNTS": ",".join(ACCOUNTS),
}


def _pool(name: str, *, cache_path: str | None = None, **spec: Any) -> dict[str, Any]:
    manifest = pool_manifest(name, source="hf://org/model")
    if cache_path is not None:
        manifest["spec"]["model"]["cache"] = {"type": "hostPath", "path": cache_path}
    for key, value in spec.items():
        if key == "service_account":
            manifest["spec"]["podTemplate"]["serviceAccountName"] = value
        else:
            manifest["spec"][key] = value
    return manifest


def _create(cluster: Cluster, namespace: str, manifest: dict[str, Any], *args: str) -> tuple[int, str]:
    done = cluster.kubectl(
        "create", "-n", namespace, "-f", "-", *args, input=json.dumps(manifest), check=False
    )
    return done.returncode, done.stderr + done.stdout


@pytest.fixture
def admission_policy(crds: Cluster, namespace: str) -> Iterator[str]:
    """The chart's policy and binding for ``namespace`` (the release namespace, namespace scope), with the
    test's allowlists; a Role letting ``alice`` create, get and list ModelPools and ModelHosts there and
    nothing else.
    Yields the namespace once the API server enforces the policy."""
    release = f"pol-{uuid.uuid4().hex[:6]}"
    rendered = crds.helm(
        "template", release, str(CHART), "--namespace", namespace,
        "--show-only", "templates/admissionpolicy.yaml",
        "--set", "scope.clusterWide=false",
        "--set", f"config.allowedHostPaths={{{','.join(HOST_PATHS)}}}",
        "--set", f"config.allowedImages={{{','.join(IMAGES)}}}",
        "--set", f"config.allowedServiceAccounts={{{','.join(ACCOUNTS)}}}",
    ).stdout  # fmt: skip
    apply(crds, rendered)
    # The allowed service account exists (the ServiceAccount admission plugin refuses pods naming a missing
    # one).
    crds.kubectl("create", "serviceaccount", ACCOUNTS[0], "-n", namespace)
    crds.kubectl(
        "create",
        "role",
        "pool-author",
        "-n",
        namespace,
        "--verb=create,get,list",
        f"--resource={POOLS},modelhosts",
    )
    crds.kubectl(
        "create", "rolebinding", "pool-author", "-n", namespace, "--role=pool-author", f"--user={USER}"
    )
    # The API server's policy informer takes a moment: wait until a forbidden pool is refused (dry run).
    probe = _pool("probe", image="docker.io/evil:1")
    wait_for(
        lambda: _create(crds, namespace, probe, "--dry-run=server", f"--as={USER}")[0] != 0,
        timeout=60,
        interval=0.5,
        message="the admission policy is enforced",
    )
    try:
        yield namespace
    finally:
        crds.kubectl("delete", "-f", "-", "--ignore-not-found", input=rendered, check=False)


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
            {
                "apiVersion": "modelpool.dev/v1alpha1",
                "kind": "ModelHost",
                "metadata": {"name": "host-image"},
                "spec": {"replicas": 0, "deviceMemory": "1Gi", "image": "docker.io/evil/miner:1"},
            },
            msg_image("docker.io/evil/miner:1", IMAGES),
        ),
    }
    for name, (manifest, message) in refused.items():
        code, output = _create(crds, namespace, manifest, f"--as={USER}")
        assert code != 0, f"{name}: created\n{output}"
        assert "ValidatingAdmissionPolicy" in output and message in output, f"{name}: {output}"

    allowed = _pool(
        "allowed",
        cache_path="/var/cache/modelpool/team-a",
        image="ghcr.io/modelpool/modelpool-server:0.1.0",
        service_account="model-runner",
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
EDGE_CASES = [
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
]


def test_the_admission_policy_and_the_operator_agree_on_edge_cases(
    admission_policy: str, crds: Cluster
) -> None:
    policy = Policy(host_paths=HOST_PATHS, images=IMAGES, service_accounts=ACCOUNTS)
    for index, case in enumerate(EDGE_CASES):
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
