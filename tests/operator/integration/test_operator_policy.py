"""The chart's fence around the operator's own writes (issue 30, "every identity down to its job"), on the
real API server: ``templates/operatorpolicy.yaml``, rendered with ``helm template``, admits the operator's
ServiceAccount's pod, Service, NetworkPolicy, PodDisruptionBudget and Secret writes only in the shape the
operator builds.

The ServiceAccount (impersonated with ``kubectl --as``) is given the operator's rights on those kinds in
the test's namespace, and ``create`` on pods in ``kube-system``; so every refusal below is the policy's. The
objects it is allowed are built by the operator's own builders (``effects.resources``,
``effects.network_policy``, ``effects.disruption_budget``) for a real ModelPool and ModelHost: what the
operator makes passes.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from modelpool_contract.api import InferencePoolSpec
from modelpool_operator.effects.disruption_budget import build_host_budget, build_pool_budget
from modelpool_operator.effects.inference_pool import build_inference_pool
from modelpool_operator.effects.network_policy import (
    PolicySettings,
    build_host_network_policy,
    build_network_policy,
)
from modelpool_operator.effects.resources import (
    PodSettings,
    build_control_key_secret,
    build_host_pod,
    build_service,
    build_worker_pod,
)
from modelpool_operator.host import HostView
from modelpool_operator.pool import PoolView, worker_name
from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import apply, get_json, wait_for
from tests.operator.integration.opharness import (
    INFERENCE_POOL_CRD_NAME,
    install_inference_pool_crd,
    pool_manifest,
    remove_inference_pool_crd,
)

pytestmark = pytest.mark.cluster

CHART = ROOT / "charts" / "modelpool-operator"
OPERATOR_SA = "modelpool-op"
USER = "alice"
ALLOWED_HOST_PATH = "/data/models"
POLICY_SETTINGS = PolicySettings(namespace="mp-system", operator_labels={"app": "modelpool-operator"})

HOST = {
    "apiVersion": "modelpool.dev/v1alpha1",
    "kind": "ModelHost",
    "metadata": {"name": "gpus"},
    "spec": {"replicas": 1, "gpusPerHost": 1, "deviceMemory": "8Gi"},
}


@dataclass
class Fence:
    """The policy enforced for ``operator`` (a user name) in ``namespace``, with a real pool and host."""

    cluster: Cluster
    namespace: str
    operator: str
    pool_body: dict[str, Any]
    host: HostView

    @property
    def pool(self) -> PoolView:
        return PoolView.from_body(self.pool_body)

    def run(self, who: str, *args: str, manifest: dict[str, Any] | None = None) -> tuple[int, str]:
        done = self.cluster.kubectl(
            *args, f"--as={who}", input=json.dumps(manifest) if manifest is not None else None, check=False
        )
        return done.returncode, done.stderr + done.stdout

    def create(
        self, manifest: dict[str, Any], namespace: str | None = None, dry: bool = True
    ) -> tuple[int, str]:
        """Create ``manifest`` as the operator (server-side dry run unless ``dry`` is False)."""
        dry_run = ["--dry-run=server"] if dry else []
        return self.run(
            self.operator, "create", "-n", namespace or self.namespace, "-f", "-", *dry_run, manifest=manifest
        )


def _render(cluster: Cluster, release: str, namespace: str) -> str:
    return cluster.helm(
        "template", release, str(CHART), "--namespace", namespace,
        "--show-only", "templates/operatorpolicy.yaml",
        "--set", f"serviceAccount.name={OPERATOR_SA}",
        "--set", f"config.allowedHostPaths={{{ALLOWED_HOST_PATH}}}",
    ).stdout  # fmt: skip


def _rights(cluster: Cluster, namespace: str) -> None:
    """The operator's rights on the kinds the policy fences (and a few to set up and read), for the
    ServiceAccount and for alice, in ``namespace``."""
    rules = [
        ("pods", "create,get,list,patch,delete"),
        ("services", "create,patch,get,delete"),
        ("networkpolicies.networking.k8s.io", "create,patch,delete"),
        ("poddisruptionbudgets.policy", "create,patch,delete"),
        ("secrets", "create,patch,get"),
        # blockOwnerDeletion on an owner reference: admission asks for update on the owner's finalizers.
        ("modelpools.modelpool.dev/finalizers", "update"),
        ("modelhosts.modelpool.dev/finalizers", "update"),
    ]
    for index, (resource, verbs) in enumerate(rules):
        cluster.kubectl(
            "create", "role", f"op-{index}", "-n", namespace, f"--verb={verbs}", f"--resource={resource}"
        )
        cluster.kubectl(
            "create", "rolebinding", f"op-{index}", "-n", namespace, f"--role=op-{index}", f"--user={USER}",
            f"--serviceaccount={namespace}:{OPERATOR_SA}",
        )  # fmt: skip


@pytest.fixture
def fence(crds: Cluster, namespace: str) -> Iterator[Fence]:
    cluster = crds
    release = f"ow-{uuid.uuid4().hex[:6]}"
    rendered = _render(cluster, release, namespace)
    cluster.kubectl("create", "serviceaccount", OPERATOR_SA, "-n", namespace)
    _rights(cluster, namespace)
    system = f"{release}-op-pods"
    cluster.kubectl("create", "role", system, "-n", "kube-system", "--verb=create", "--resource=pods")
    cluster.kubectl(
        "create", "rolebinding", system, "-n", "kube-system", f"--role={system}",
        f"--serviceaccount={namespace}:{OPERATOR_SA}",
    )  # fmt: skip
    apply(cluster, pool_manifest("emb", source="hf://org/model"), namespace)
    apply(cluster, HOST, namespace)
    pool = get_json(cluster, "modelpool", "emb", "-n", namespace)
    host = HostView.from_body(get_json(cluster, "modelhost", "gpus", "-n", namespace))
    apply(cluster, rendered)
    made = Fence(cluster, namespace, f"system:serviceaccount:{namespace}:{OPERATOR_SA}", pool, host)
    bad = _worker(made)
    bad["spec"]["hostNetwork"] = True
    wait_for(lambda: made.create(bad)[0] != 0, timeout=60, interval=0.5, message="the policy is enforced")
    try:
        yield made
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=rendered, check=False)
        for kind in ("rolebinding", "role"):
            cluster.kubectl("delete", kind, system, "-n", "kube-system", "--ignore-not-found", check=False)


def _worker(fence: Fence, cache_path: str | None = None) -> dict[str, Any]:
    """The worker pod the operator builds for the pool (with a hostPath model cache at ``cache_path``)."""
    body = copy.deepcopy(fence.pool_body)
    if cache_path is not None:
        body["spec"]["model"]["cache"] = {"type": "hostPath", "path": cache_path}
    pool = PoolView.from_body(body)
    return build_worker_pod(pool, worker_name(pool.name, pool.template_hash, 0), PodSettings())


GONE = object()  # ``_set``'s value for a key to remove


def _set(manifest: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``manifest`` with the dotted ``path`` set to ``value`` (a number: a list index)."""
    changed = copy.deepcopy(manifest)
    *parents, last = path.split(".")
    node: Any = changed
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    if value is GONE:
        node.pop(last)
    else:
        node[int(last) if last.isdigit() else last] = value
    return changed


def test_what_the_operator_builds_is_admitted(fence: Fence) -> None:
    settings = PodSettings()
    made = {
        "worker": _worker(fence),
        "worker with a hostPath cache under the allowed path": _worker(fence, f"{ALLOWED_HOST_PATH}/hf"),
        "host pod": build_host_pod(fence.host, 0, settings),
        "Service": build_service(fence.pool, settings),
        "pool NetworkPolicy": build_network_policy(fence.pool, POLICY_SETTINGS),
        "host NetworkPolicy": build_host_network_policy(fence.host, POLICY_SETTINGS),
        "control key Secret": build_control_key_secret(fence.host, "k" * 64),
        "pool PodDisruptionBudget": build_pool_budget(fence.pool, 2),
        "host PodDisruptionBudget": build_host_budget(fence.host),
    }
    for what, manifest in made.items():
        code, out = fence.create(manifest)
        assert code == 0, (what, out)


def test_a_pod_not_of_the_operators_shape_is_refused(fence: Fence) -> None:
    worker = _worker(fence)
    server = "spec.containers.0"
    root_volume = [*worker["spec"]["volumes"], {"name": "root", "hostPath": {"path": "/"}}]
    owner = "metadata.ownerReferences.0"
    refused = [
        (f"{server}.securityContext", {"privileged": True, "runAsNonRoot": True}, "never privileged"),
        (f"{server}.securityContext.allowPrivilegeEscalation", True, "allowPrivilegeEscalation false"),
        (f"{server}.securityContext.capabilities", {"add": ["SYS_ADMIN"]}, "add no capabilities"),
        ("spec.securityContext.runAsUser", 0, "run as non-root"),
        ("spec.securityContext.runAsNonRoot", False, "run as non-root"),
        ("spec.volumes", root_volume, f"host directories only under {ALLOWED_HOST_PATH}"),
        ("spec.hostNetwork", True, "hostNetwork"),
        ("spec.hostPID", True, "hostPID"),
        (f"{server}.ports.0.hostPort", 80, "no hostPort"),
        ("spec.nodeName", "kwok-gpu-0", "nodeName"),
        (f"{owner}.kind", "ReplicaSet", "only objects a ModelPool or ModelHost controls"),
        (f"{owner}.apiVersion", "example.com/v1", "only objects a ModelPool or ModelHost controls"),
    ]
    for path, value, message in refused:
        # (No blockOwnerDeletion: a reference to a kind of no resource is refused before the policy.)
        code, out = fence.create(_set(_set(worker, path, value), f"{owner}.blockOwnerDeletion", False))
        assert code != 0 and message in out, (path, out)
    code, out = fence.create(_set(worker, "metadata.ownerReferences", GONE))
    assert code != 0 and "only objects a ModelPool or ModelHost controls" in out, out
    # Labelled as another pool's worker.
    code, out = fence.create(_relabel(worker, "other"))
    assert code != 0 and "modelpool.dev/pool=emb" in out, out
    # A hostPath cache beside the allowed path (not under it: whole segments).
    code, out = fence.create(_worker(fence, "/data/modelsx"))
    assert code != 0 and f"host directories only under {ALLOWED_HOST_PATH}" in out, out
    # A worker-shaped pod in kube-system: refused whatever the RBAC there grants. (No blockOwnerDeletion:
    # the ServiceAccount has no right on the pool's finalizers there.)
    system = _set(_set(worker, "metadata.namespace", "kube-system"), f"{owner}.blockOwnerDeletion", False)
    code, out = fence.create(system, "kube-system")
    assert code != 0 and "writes nothing in kube-system" in out, out
    # Nobody else is matched: alice's own pod needs no owner.
    mine = _set(worker, "metadata.ownerReferences", GONE)
    code, out = fence.run(USER, "create", "-n", fence.namespace, "-f", "-", "--dry-run=server", manifest=mine)
    assert code == 0, out


def _relabel(pod: dict[str, Any], pool: str) -> dict[str, Any]:
    changed = copy.deepcopy(pod)
    changed["metadata"]["labels"]["modelpool.dev/pool"] = pool
    return changed


def test_services_policies_and_secrets_not_of_the_operators_shape_are_refused(fence: Fence) -> None:
    service = build_service(fence.pool, PodSettings())
    budget = build_pool_budget(fence.pool, 2)
    host_budget = build_host_budget(fence.host)
    policy = build_network_policy(fence.pool, POLICY_SETTINGS)
    secret = build_control_key_secret(fence.host, "k" * 64)
    pools_owner = service["metadata"]["ownerReferences"]
    refused = [
        (_set(_set(service, "spec.type", "LoadBalancer"), "spec.clusterIP", GONE), "of type ClusterIP"),
        (_set(service, "spec.externalIPs", ["10.0.0.1"]), "no externalIPs"),
        (_set(service, "metadata.name", "kubernetes-api"), "named as the pool"),
        (_set(service, "spec.selector", {"app": "billing"}), "selecting modelpool.dev/pool=emb"),
        (_set(policy, "spec.podSelector", {}), "selects modelpool.dev/pool=emb"),
        (_set(_set(policy, "spec.policyTypes", ["Egress"]), "spec.egress", []), "ingress only"),
        (_set(secret, "metadata.name", "gateway-keys"), "control key"),
        (_set(secret, "metadata.ownerReferences", GONE), "only objects a ModelPool or ModelHost controls"),
        (_set(secret, "metadata.ownerReferences", pools_owner), "control key"),
        # A PodDisruptionBudget over someone else's pods, or one that would hold up pods that are not ready.
        (
            _set(budget, "spec.selector", {"matchLabels": {"app": "billing"}}),
            "selects modelpool.dev/pool=emb",
        ),
        (_set(budget, "metadata.name", "billing"), "is modelpool-emb"),
        (_set(budget, "spec.unhealthyPodEvictionPolicy", "IfHealthyBudget"), "unhealthyPodEvictionPolicy"),
        (_set(host_budget, "spec.selector.matchLabels", {"modelpool.dev/pool": "emb"}), "host_gpus"),
        (_set(budget, "metadata.ownerReferences", GONE), "only objects a ModelPool or ModelHost controls"),
    ]
    for manifest, message in refused:
        code, out = fence.create(manifest)
        assert code != 0 and message in out, (manifest, out)


def test_an_inference_pool_is_admitted_only_in_the_operators_shape(fence: Fence) -> None:
    """The pool's InferencePool (issue 33) as the operator builds it passes; one over other pods, one that
    would route to draining workers (no serving label) or one under another name is refused."""
    cluster, namespace = fence.cluster, fence.namespace
    install_inference_pool_crd(cluster)
    try:
        cluster.kubectl("create", "role", "op-ip", "-n", namespace, "--verb=create",
                        f"--resource={INFERENCE_POOL_CRD_NAME}")  # fmt: skip
        cluster.kubectl("create", "rolebinding", "op-ip", "-n", namespace, "--role=op-ip",
                        f"--serviceaccount={namespace}:{OPERATOR_SA}")  # fmt: skip
        spec = InferencePoolSpec.model_validate({"endpointPicker": "epp", "pickerPodLabels": {"app": "epp"}})
        made = build_inference_pool(fence.pool, spec, PodSettings().port)
        wait_for(
            lambda: fence.create(made)[0] == 0, timeout=30, interval=0.5, message="the InferencePool admitted"
        )
        draining = {"matchLabels": {"modelpool.dev/pool": "emb"}}
        refused = [
            _set(made, "spec.selector", draining),
            _set(made, "spec.selector", {"matchLabels": {"app": "billing", "modelpool.dev/serving": "true"}}),
            _set(made, "metadata.name", "billing"),
        ]
        for manifest in refused:
            code, out = fence.create(manifest)
            assert code != 0 and "an InferencePool of the modelpool operator" in out, (manifest, out)
    finally:
        remove_inference_pool_crd(cluster)


def test_the_operator_changes_and_deletes_only_what_it_owns(fence: Fence) -> None:
    namespace = fence.namespace
    # Someone else's Secret of the control key's name: the operator's patch is refused (not the ModelHost's).
    squatter = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gpus-control-key"},
                "stringData": {"key": "known-to-alice"}}  # fmt: skip
    code, out = fence.run(USER, "create", "-n", namespace, "-f", "-", manifest=squatter)
    assert code == 0, out
    patch = json.dumps([{"op": "replace", "path": "/data", "value": {"key": "b3Vycw=="}}])
    code, out = fence.run(fence.operator, "patch", "secret", "gpus-control-key", "-n", namespace,
                          "--type=json", "-p", patch)  # fmt: skip
    assert code != 0 and "only objects a ModelPool or ModelHost controls" in out, out
    # Its own worker: an eviction's patch is admitted, a change of its owner references is not, and it may
    # delete it; alice's pod it may not delete.
    worker = _worker(fence)
    name = worker["metadata"]["name"]
    code, out = fence.create(worker, dry=False)
    assert code == 0, out
    evict = json.dumps({"metadata": {"labels": {"modelpool.dev/serving": None},
                                     "annotations": {"modelpool.dev/evicting": "ScaleDown"}}})  # fmt: skip
    code, out = fence.run(fence.operator, "patch", "pod", name, "-n", namespace, "--type=merge", "-p", evict)
    assert code == 0, out
    disown = json.dumps(
        [{"op": "replace", "path": "/metadata/ownerReferences/0/uid", "value": str(uuid.uuid4())}]
    )
    code, out = fence.run(fence.operator, "patch", "pod", name, "-n", namespace, "--type=json", "-p", disown)
    assert code != 0 and "never changes owner references" in out, out
    plain = _set(
        _set(_set(worker, "metadata.name", "alices"), "metadata.ownerReferences", GONE), "metadata.labels", {}
    )
    code, out = fence.run(USER, "create", "-n", namespace, "-f", "-", manifest=plain)
    assert code == 0, out
    code, out = fence.run(fence.operator, "delete", "pod", "alices", "-n", namespace, "--wait=false")
    assert code != 0 and "only objects a ModelPool or ModelHost controls" in out, out
    code, out = fence.run(fence.operator, "delete", "pod", name, "-n", namespace, "--wait=false")
    assert code == 0, out


def test_the_operator_deletes_only_its_own_service_policy_and_budget(fence: Fence) -> None:
    """A pool turned shared loses its Service, NetworkPolicy and PodDisruptionBudget: the policy admits the
    operator's delete of each its pool controls, and refuses it on the same object made by someone else."""
    made = {
        "service": build_service(fence.pool, PodSettings()),
        "networkpolicy": build_network_policy(fence.pool, POLICY_SETTINGS),
        "poddisruptionbudget": build_pool_budget(fence.pool, 2),
    }
    for kind, manifest in made.items():
        name = manifest["metadata"]["name"]
        theirs = _set(_set(manifest, "metadata.name", f"alices-{kind}"), "metadata.ownerReferences", GONE)
        code, out = fence.run(USER, "create", "-n", fence.namespace, "-f", "-", manifest=theirs)
        assert code == 0, (kind, out)
        code, out = fence.run(fence.operator, "delete", kind, f"alices-{kind}", "-n", fence.namespace)
        assert code != 0 and "only objects a ModelPool or ModelHost controls" in out, (kind, out)
        code, out = fence.create(manifest, dry=False)
        assert code == 0, (kind, out)
        code, out = fence.run(fence.operator, "delete", kind, name, "-n", fence.namespace)
        assert code == 0, (kind, out)
