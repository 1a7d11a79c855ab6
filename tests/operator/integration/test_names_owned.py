"""A name collision is a condition on the pool, never a takeover (issue 30, "names cannot be squatted").

Someone made a Service named like the pool before the pool existed (another team's, with its own selector).
On the real API server the operator's patch of it carries an ownership test (``effects.kube.owned_patch``)
that fails: the Service keeps its selector and ports, the pool reports ApiError/NameTaken with a message the
user can act on, and its workers still start. Once the other Service is gone, the operator makes its own and
the condition clears; a restarted operator then patches its own Service (the test passes) without a word.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from modelpool_operator.effects.apply import API_ERROR, NAME_TAKEN
from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from tests.operator.integration.opharness import (
    StartOperator,
    condition,
    pool_manifest,
    reasons,
    states,
    wait_status,
)

pytestmark = pytest.mark.cluster

OTHER_SELECTOR = {"app": "billing"}


def _squatter(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": {"team": "billing"}},
        "spec": {"selector": OTHER_SELECTOR, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def test_a_service_of_the_pools_name_made_by_someone_else_is_left_alone_and_reported(
    crds: Cluster, namespace: str, start_operator: StartOperator
) -> None:
    cluster = crds
    apply(cluster, _squatter("taken"), namespace)
    operator = start_operator(namespace)
    apply(cluster, pool_manifest("taken"), namespace)

    status = wait_status(
        cluster,
        namespace,
        "taken",
        lambda s: condition(s, API_ERROR).get("reason") == NAME_TAKEN and states(s) == ["Ready"],
        timeout=90,
        message="the NameTaken condition, with the worker serving beside it",
    )
    message = condition(status, API_ERROR)["message"]
    assert f"Service {namespace}/taken exists and is not controlled by this resource" in message, message
    service = get_json(cluster, "service", "taken", "-n", namespace)
    assert service["spec"]["selector"] == OTHER_SELECTOR, "the other team's Service was rewritten"
    assert [p["port"] for p in service["spec"]["ports"]] == [80]
    assert service["metadata"]["labels"] == {"team": "billing"}
    assert not service["metadata"].get("ownerReferences")
    wait_for(
        lambda: any(reason == NAME_TAKEN for reason, _ in reasons(cluster, namespace, "taken")),
        timeout=30,
        message="the NameTaken Warning Event",
    )

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
    wait_status(
        cluster,
        namespace,
        "taken",
        lambda s: condition(s, API_ERROR).get("status") == "False",
        timeout=60,
        message="ApiError False once the name is free",
    )

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
    status = wait_status(
        cluster,
        namespace,
        "taken",
        lambda s: condition(s, API_ERROR).get("status") == "False",
        timeout=30,
        message="no API error after the patch",
    )
