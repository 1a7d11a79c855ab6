"""A name collision is a condition on the pool, never a takeover (issue 30, "names cannot be squatted").

Someone made a Service (or a PodDisruptionBudget) named like the pool before the pool existed (another
team's, with its own selector). On the real API server the operator's patch of it carries an ownership
test (``effects.kube.owned_patch``) that fails: the Service keeps its selector and ports, the pool reports
ApiError/NameTaken with a message the user can act on, and its workers still start. Once the other Service
is gone, the operator makes its own and the condition clears; a restarted operator then patches its own
Service (the test passes) without a word.

A 409 is "made" only for an object its owner controls:

* a pod holding a worker's name (someone else's, owned by nothing): the pool reports NameTaken and makes
  its worker under the next name, leaving the pod alone; two pools whose long names begin alike name their
  workers apart (they once shared every worker name and the second never got a worker);
* a ``<host>-control-key`` Secret someone else made, with a key they know: the ModelHost reports
  ApiError/NameTaken and a Warning Event, no host pod is made (it would mount that key), and once the
  Secret is gone the operator's own comes, then the host pod; one carrying a copy of the ModelHost's owner
  reference ends up holding the operator's derived key, not the planted one.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest

from modelpool_operator.control_keys import derive_control_key
from modelpool_operator.effects.apply import API_ERROR
from modelpool_operator.effects.attempts import NAME_TAKEN
from modelpool_operator.effects.resources import worker_template_hash
from modelpool_operator.pool import PoolView, worker_name
from modelpool_operator.services import pod_settings
from modelpool_operator.settings import OperatorConfig
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, get_json, wait_established, wait_for
from testkit.services import KWOK_GPU_PLACEMENT, control_seed_file, host_manifest
from tests.operator.integration.opharness import (
    StartOperator,
    condition,
    pool_manifest,
    reasons,
    states,
    wait_status,
    worker_pods,
)

pytestmark = pytest.mark.cluster

OTHER_SELECTOR = {"app": "billing"}
THEIRS = {"team": "billing"}  # the label on the other team's objects


def _theirs(api_version: str, kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Another team's object (labelled theirs, owned by nothing) that takes a name the operator would use."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "labels": THEIRS},
        "spec": spec,
    }


def _squatter(name: str) -> dict[str, Any]:
    ports = [{"name": "http", "port": 80, "targetPort": 8080}]
    return _theirs("v1", "Service", name, {"selector": OTHER_SELECTOR, "ports": ports})


def _name_taken_beside_a_serving_worker(cluster: Cluster, namespace: str, pool: str, taken: str) -> None:
    """Wait until the pool reports ApiError/NameTaken with its worker Ready beside it; its message names
    ``taken`` (``Kind namespace/name``) as the object it does not control."""
    status = wait_status(
        cluster,
        namespace,
        pool,
        lambda s: condition(s, API_ERROR).get("reason") == NAME_TAKEN and states(s) == ["Ready"],
        timeout=90,
        message="the NameTaken condition, with the worker serving beside it",
    )
    message = condition(status, API_ERROR)["message"]
    assert f"{taken} exists and is not controlled by this resource" in message, message


def _no_api_error(cluster: Cluster, namespace: str, pool: str, timeout: float, message: str) -> None:
    wait_status(
        cluster,
        namespace,
        pool,
        lambda s: condition(s, API_ERROR).get("status") == "False",
        timeout=timeout,
        message=message,
    )


def _name_taken_event(cluster: Cluster, namespace: str, name: str, mentions: str = "") -> None:
    """Wait for a NameTaken Warning Event about ``name`` (whose message has ``mentions`` in it)."""
    wait_for(
        lambda: any(
            reason == NAME_TAKEN and mentions in message
            for reason, message in reasons(cluster, namespace, name)
        ),
        timeout=30,
        message=f"the NameTaken Warning Event about {name}",
    )


def test_a_service_of_the_pools_name_made_by_someone_else_is_left_alone_and_reported(
    crds: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    cluster = crds
    apply(cluster, _squatter("taken"), namespace)
    operator = start_operator(namespace)
    apply(cluster, pool_manifest("taken"), namespace)

    _name_taken_beside_a_serving_worker(cluster, namespace, "taken", f"Service {namespace}/taken")
    service = get_json(cluster, "service", "taken", "-n", namespace)
    assert service["spec"]["selector"] == OTHER_SELECTOR, "the other team's Service was rewritten"
    assert [p["port"] for p in service["spec"]["ports"]] == [80]
    assert service["metadata"]["labels"] == THEIRS
    assert not service["metadata"].get("ownerReferences")
    _name_taken_event(cluster, namespace, "taken")

    # The other Service goes: the pool's own is made at a later pass, and the condition clears.
    cluster.kubectl("delete", "service", "taken", "-n", namespace)
    wait_for(
        lambda: (
            get_json(cluster, "service", "taken", "-n", namespace)["spec"].get("selector")
            == {"modelpool.dev/pool": "taken", "modelpool.dev/serving": "true"}
        ),
        timeout=60,
        message="the pool's own Service",
    )
    _no_api_error(cluster, namespace, "taken", 60, "ApiError False once the name is free")

    # A new operator process patches the Service it owns: the ownership test passes.
    assert operator.stop() == 0
    cluster.kubectl(
        "patch",
        "service",
        "taken",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"labels": {"x": "y"}}}),
    )
    start_operator(namespace)
    wait_for(
        lambda: (
            "x"
            not in (get_json(cluster, "service", "taken", "-n", namespace)["metadata"].get("labels") or {})
        ),
        timeout=60,
        message="the operator's patch of its own Service (labels brought back)",
    )
    _no_api_error(cluster, namespace, "taken", 30, "no API error after the patch")


def _pending_pod(name: str) -> dict[str, Any]:
    """Someone else's pod (no owner, no label), kept Pending: no node has its label."""
    containers = [{"name": "c", "image": "registry.invalid/billing:1"}]
    return _theirs(
        "v1", "Pod", name, {"nodeSelector": {"modelpool.test/no-such-node": "true"}, "containers": containers}
    )


def _worker(manifest: dict[str, Any], namespace: str, probe_port: int, index: int = 0) -> str:
    """The name the operator gives the pool's ``index``-th worker (its hash covers the operator's settings:
    the test names those that differ between operators, the workers' probe port and the test operator's
    log format, which its workers are passed)."""
    pool = PoolView.from_body({**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}})
    settings = pod_settings(OperatorConfig(server_probe_port=probe_port, log_format="plain"))
    return worker_name(pool.name, worker_template_hash(pool, settings), index)


def test_a_pod_holding_a_workers_name_is_reported_and_the_worker_made_under_another(
    crds: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    cluster = crds
    manifest = pool_manifest("squat")
    port = free_port()
    taken = _worker(manifest, namespace, port)
    apply(cluster, _pending_pod(taken), namespace)
    start_operator(namespace, MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(port))
    apply(cluster, manifest, namespace)

    status = wait_status(
        cluster, namespace, "squat", lambda s: states(s) == ["Ready"], timeout=90, message="one worker Ready"
    )
    assert [w["name"] for w in status["workers"]] == [_worker(manifest, namespace, port, 1)]
    _name_taken_event(cluster, namespace, "squat", mentions=f"pod {namespace}/{taken} exists")
    other = get_json(cluster, "pod", taken, "-n", namespace)
    assert not other["metadata"].get("ownerReferences") and other["metadata"]["labels"] == THEIRS


def test_pools_whose_long_names_begin_alike_each_get_their_workers(
    crds: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    cluster = crds
    first, second = "a" * 45 + "-first", "a" * 45 + "-second"
    start_operator(namespace)
    for name in (first, second):
        apply(cluster, pool_manifest(name), namespace)
    for name in (first, second):
        wait_status(
            cluster, namespace, name, lambda s: states(s) == ["Ready"], timeout=90, message=f"{name} Ready"
        )
    pods = {
        p["metadata"]["name"]: p for name in (first, second) for p in worker_pods(cluster, namespace, name)
    }
    owners = {p["metadata"]["ownerReferences"][0]["name"] for p in pods.values()}
    assert len(pods) == 2 and owners == {first, second}


GPU_HOST = host_manifest("gpus", replicas=1, gpusPerHost=1, deviceMemory="8Gi", **KWOK_GPU_PLACEMENT)
PLANTED = "a-key-the-squatter-knows"


@pytest.fixture
def hosts_deleted(crds: Cluster, namespace: str, start_operator: StartOperator) -> Iterator[None]:
    """The ModelHost CRD established; at teardown the ModelHosts are deleted while the test's operator
    still runs (set up after ``start_operator``, torn down before it), so it removes its finalizers."""
    wait_established(crds, "modelhosts.modelpool.dev")
    yield
    crds.kubectl("delete", "modelhosts", "--all", "-n", namespace, "--timeout=30s", check=False)


def _secret_key(cluster: Cluster, namespace: str) -> str:
    secret = get_json(cluster, "secret", "gpus-control-key", "-n", namespace)
    return base64.b64decode(secret["data"]["key"]).decode()


def _host_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(cluster, "pods", "-n", namespace, "-l", "modelpool.dev/host=gpus")[
        "items"
    ]
    return items


def _host_condition(cluster: Cluster, namespace: str) -> dict[str, Any]:
    return condition(get_json(cluster, "modelhost", "gpus", "-n", namespace).get("status") or {}, API_ERROR)


@pytest.mark.usefixtures("hosts_deleted")
def test_a_control_key_secret_someone_else_made_never_reaches_a_host_pod(
    crds: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    cluster = crds
    squatter = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "gpus-control-key"},
        "stringData": {"key": PLANTED},
    }
    apply(cluster, squatter, namespace)
    start_operator(namespace)
    apply(cluster, GPU_HOST, namespace)

    wait_for(
        lambda: _host_condition(cluster, namespace).get("reason") == NAME_TAKEN,
        timeout=60,
        message="ApiError/NameTaken on the ModelHost",
    )
    message = _host_condition(cluster, namespace)["message"]
    assert f"Secret {namespace}/gpus-control-key exists and is not controlled by this resource" in message
    assert _host_pods(cluster, namespace) == [], "a host pod mounts the planted key"
    assert _secret_key(cluster, namespace) == PLANTED, "the other Secret was rewritten"
    _name_taken_event(cluster, namespace, "gpus")
    # Tried again with backoff: still no host pod while the Secret is someone else's.
    assert _host_pods(cluster, namespace) == []

    # The other Secret goes: the operator's own comes (owned, the derived key), then the host pod.
    cluster.kubectl("delete", "secret", "gpus-control-key", "-n", namespace)
    wait_for(lambda: len(_host_pods(cluster, namespace)) == 1, timeout=90, message="the host pod")
    secret = get_json(cluster, "secret", "gpus-control-key", "-n", namespace)
    uid = get_json(cluster, "modelhost", "gpus", "-n", namespace)["metadata"]["uid"]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid
    seed = control_seed_file(cluster).read_bytes().strip()
    assert _secret_key(cluster, namespace) == derive_control_key(seed, namespace, "gpus", uid)
    wait_for(
        lambda: _host_condition(cluster, namespace).get("status") == "False",
        timeout=60,
        message="ApiError False once the name is the ModelHost's",
    )


@pytest.mark.usefixtures("hosts_deleted")
def test_a_planted_control_key_with_a_copied_owner_reference_is_replaced_by_the_derived_key(
    crds: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    """Anyone who may read the ModelHost (its uid) and create Secrets can claim it as the owner: the
    operator's patch passes its ownership test and writes the derived key over the planted one."""
    cluster = crds
    apply(cluster, GPU_HOST, namespace)  # no operator yet: nothing makes the Secret
    uid = get_json(cluster, "modelhost", "gpus", "-n", namespace)["metadata"]["uid"]
    owner = {"apiVersion": "modelpool.dev/v1alpha1", "kind": "ModelHost", "name": "gpus", "uid": uid,
             "controller": True}  # fmt: skip
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "gpus-control-key", "ownerReferences": [owner]},
        "stringData": {"key": PLANTED, "other": "x"},
    }
    apply(cluster, planted, namespace)
    start_operator(namespace)
    seed = control_seed_file(cluster).read_bytes().strip()
    derived = derive_control_key(seed, namespace, "gpus", uid)
    wait_for(lambda: _secret_key(cluster, namespace) == derived, timeout=60, message="the derived key")
    assert set(get_json(cluster, "secret", "gpus-control-key", "-n", namespace)["data"]) == {"key"}
    wait_for(lambda: len(_host_pods(cluster, namespace)) == 1, timeout=90, message="the host pod")


def test_a_disruption_budget_of_the_pools_name_made_by_someone_else_is_left_alone(
    crds: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    """Another team's PodDisruptionBudget named ``modelpool-<pool>``: never rewritten to the pool's selector
    (that would take over, or release, the other team's pods); the pool says so and its workers serve."""
    spec = {"minAvailable": 5, "selector": {"matchLabels": OTHER_SELECTOR}}
    apply(crds, _theirs("policy/v1", "PodDisruptionBudget", "modelpool-squat", spec), namespace)
    start_operator(namespace)
    apply(crds, pool_manifest("squat"), namespace)
    _name_taken_beside_a_serving_worker(
        crds, namespace, "squat", f"PodDisruptionBudget {namespace}/modelpool-squat"
    )
    budget = get_json(crds, "pdb", "modelpool-squat", "-n", namespace)
    assert (
        budget["spec"]["selector"] == {"matchLabels": OTHER_SELECTOR} and budget["spec"]["minAvailable"] == 5
    )
    assert not budget["metadata"].get("ownerReferences")
