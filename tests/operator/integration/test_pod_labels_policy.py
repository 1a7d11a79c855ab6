"""The chart's fence around the operator's pod labels and annotations (issue 30), on the real API server:
``modelpool.dev/*`` labels and annotations on a Pod are refused, at create and at any change, to everyone
but the operator's ServiceAccount (``templates/podlabelspolicy.yaml``, rendered with ``helm template``).

``alice`` may create, get, list and patch pods in the namespace (and nothing else); the operator is its
ServiceAccount, impersonated with ``kubectl --as`` with the same rights, so each answer is the policy's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.environment import ROOT
from testkit.kubectl import apply, wait_for

pytestmark = pytest.mark.cluster

CHART = ROOT / "charts" / "modelpool-operator"
USER = "alice"
OPERATOR_SA = "modelpool-op"
REFUSED_LABELS = "metadata.labels: modelpool.dev/ labels on a pod are set by the modelpool operator only"
REFUSED_ANNOTATIONS = (
    "metadata.annotations: modelpool.dev/ annotations on a pod are set by the modelpool operator only"
)


def _pod(
    name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """A restricted-level pod kept Pending (no node has its label)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "nodeSelector": {"modelpool.test/no-such-node": "true"},
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 10001,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "server",
                    "image": "registry.invalid/pod:1",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


def _as(cluster: Cluster, who: str, *args: str, manifest: dict[str, Any] | None = None) -> tuple[int, str]:
    done = cluster.kubectl(
        *args, f"--as={who}", input=json.dumps(manifest) if manifest is not None else None, check=False
    )
    return done.returncode, done.stderr + done.stdout


@pytest.fixture
def pod_labels_policy(cluster: Cluster, namespace: str) -> Iterator[tuple[str, str]]:
    """The chart's pod-label policy bound to ``namespace`` (namespace scope), the operator's ServiceAccount
    named ``OPERATOR_SA`` there, and a Role on pods for ``alice`` and that ServiceAccount. Yields (namespace,
    the ServiceAccount's user name) once the API server enforces the policy."""
    release = f"pl-{uuid.uuid4().hex[:6]}"
    rendered = cluster.helm(
        "template", release, str(CHART), "--namespace", namespace,
        "--show-only", "templates/podlabelspolicy.yaml",
        "--set", "scope.clusterWide=false",
        "--set", f"scope.namespaces={{{namespace}}}",
        "--set", f"serviceAccount.name={OPERATOR_SA}",
    ).stdout  # fmt: skip
    apply(cluster, rendered)
    operator = f"system:serviceaccount:{namespace}:{OPERATOR_SA}"
    cluster.kubectl("create", "serviceaccount", OPERATOR_SA, "-n", namespace)
    cluster.kubectl(
        "create", "role", "pods", "-n", namespace, "--verb=create,get,list,patch", "--resource=pods"
    )
    cluster.kubectl(
        "create", "rolebinding", "pods", "-n", namespace, "--role=pods", f"--user={USER}",
        f"--serviceaccount={namespace}:{OPERATOR_SA}",
    )  # fmt: skip
    probe = _pod("probe", labels={"modelpool.dev/pool": "probe"})
    wait_for(
        lambda: (
            _as(cluster, USER, "create", "-n", namespace, "-f", "-", "--dry-run=server", manifest=probe)[0]
            != 0
        ),
        timeout=60,
        interval=0.5,
        message="the pod-label policy is enforced",
    )
    try:
        yield namespace, operator
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=rendered, check=False)


def test_only_the_operator_may_set_or_change_modelpool_labels_and_annotations_on_pods(
    cluster: Cluster, pod_labels_policy: tuple[str, str]
) -> None:
    namespace, operator = pod_labels_policy

    def create(who: str, manifest: dict[str, Any]) -> tuple[int, str]:
        return _as(cluster, who, "create", "-n", namespace, "-f", "-", manifest=manifest)

    # CREATE: a ghost worker, or a note on the memory, refused to anyone but the operator.
    code, out = create(USER, _pod("ghost", labels={"modelpool.dev/pool": "ghost"}))
    assert code != 0 and REFUSED_LABELS in out, out
    code, out = create(USER, _pod("note", annotations={"modelpool.dev/memory-bytes": str(2**60)}))
    assert code != 0 and REFUSED_ANNOTATIONS in out, out
    code, out = create(USER, _pod("plain", labels={"app": "mine"}))
    assert code == 0, out
    worker = _pod(
        "worker", labels={"modelpool.dev/pool": "emb"}, annotations={"modelpool.dev/memory-bytes": "1"}
    )
    code, out = create(operator, worker)
    assert code == 0, out

    # UPDATE: a modelpool.dev/ key changed, added or removed is refused; every other field stays the user's.
    for args, refusal in (
        (("annotate", "pod", "worker", "--overwrite", "modelpool.dev/memory-bytes=0"), REFUSED_ANNOTATIONS),
        (("annotate", "pod", "worker", "modelpool.dev/memory-bytes-"), REFUSED_ANNOTATIONS),
        (("label", "pod", "worker", "modelpool.dev/pool-"), REFUSED_LABELS),
        (("label", "pod", "plain", "modelpool.dev/pool=emb"), REFUSED_LABELS),
    ):
        code, out = _as(cluster, USER, *args, "-n", namespace)
        assert code != 0 and refusal in out, (args, out)
    code, out = _as(cluster, USER, "label", "pod", "worker", "team=a", "-n", namespace)
    assert code == 0, out
    # The operator itself may change them.
    code, out = _as(
        cluster,
        operator,
        "annotate",
        "pod",
        "worker",
        "--overwrite",
        "modelpool.dev/memory-bytes=2",
        "-n",
        namespace,
    )
    assert code == 0, out
    got = json.loads(cluster.kubectl("get", "pod", "worker", "-n", namespace, "-o", "json").stdout)
    assert got["metadata"]["annotations"]["modelpool.dev/memory-bytes"] == "2"
    assert got["metadata"]["labels"] == {"modelpool.dev/pool": "emb", "team": "a"}
