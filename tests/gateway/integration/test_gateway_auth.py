"""API keys at the gateway, on the real control plane with the real clients: no key is a 401 each client
knows; a key for namespace A cannot list, wake or call a pool of namespace B (the same 404 as a pool that
does not exist, no demand recorded, no worker started) while it does wake its own; a tenant's Secret cannot
grant another namespace; keys added, changed and revoked take effect within 10 s, without a restart.

Namespace A is the test's own, B a second one; the gateway routes to both and reads key Secrets in its own
admin namespace and (``--tenant-keys``) in A and B.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from modelpool_contract.gateway_keys import LABEL_GATEWAY_KEY
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, get_json, wait_for
from tests.gateway.integration.conftest import StartGateway
from tests.gateway.integration.gwharness import GatewayProcess, bearer, create_key, echo_pool
from tests.operator.integration.opharness import POOLS, StartOperator, worker_pods

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# The bound on a key change taking effect (the Secret watch's event, not a poll).
KEY_CHANGE_S = 10
DEMANDED_AT = "modelpool.dev/demanded-at"


@pytest.fixture
def other_namespace(crds: Cluster) -> Iterator[str]:
    name = f"gwb-{uuid.uuid4().hex[:8]}"
    crds.kubectl("create", "namespace", name)
    yield name
    crds.kubectl("delete", POOLS, "--all", "-n", name, "--timeout=60s", check=False)
    crds.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _wakes(name: str) -> dict[str, object]:
    return echo_pool(name, replicas=0, max_replicas=1, autoscaling={}, activation_timeout_seconds=90)


def _models(gateway: GatewayProcess, key: str | None) -> httpx.Response:
    return httpx.get(gateway.url + "/v1/models", headers=bearer(key), timeout=5)


def _listed(gateway: GatewayProcess, key: str | None) -> set[str] | None:
    """The pools ``key`` sees listed, or None while it is refused."""
    response = _models(gateway, key)
    return {m["modelpool"]["pool"] for m in response.json()["data"]} if response.status_code == 200 else None


def test_without_a_key_every_client_gets_its_usual_401(
    crds: Cluster, namespace: str, start_gateway: StartGateway
) -> None:
    apply(crds, echo_pool("pool", replicas=0), namespace)
    gateway = start_gateway([namespace])
    wait_for(lambda: "pool" in gateway.models(), timeout=30, message="the gateway knows the pool")
    # The openai client sends no request without a key at all: a wrong one.
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="a-wrong-key-of-some-length", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as err:
        client.embeddings.create(model="pool", input=["x"])
    assert err.value.status_code == 401 and "Authorization: Bearer" in err.value.message
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    for key in (None, "a-wrong-key-of-some-length"):
        triton_client = triton.InferenceServerClient(gateway.url.removeprefix("http://"))
        assert triton_client.is_server_live() and triton_client.is_server_ready()  # health stays open
        with pytest.raises(InferenceServerException) as triton_err:
            triton_client.get_model_metadata("pool", headers=bearer(key))
        assert triton_err.value.status() == "401", triton_err.value

        response = httpx.post(
            gateway.url + "/v2/models/pool/infer", json={"inputs": []}, headers=bearer(key), timeout=5
        )
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert isinstance(response.json()["error"], str)
    for path in ("/healthz", "/readyz"):
        assert httpx.get(gateway.url + path, timeout=5).status_code == 200, path
    assert httpx.get(gateway.url + "/metrics", timeout=5).status_code == 404  # on its own port only
    # Counted by reason, never by key.
    assert gateway.metric("modelpool_gateway_refused_total", reason="missing_key") == 2
    assert gateway.metric("modelpool_gateway_refused_total", reason="invalid_key") == 4
    assert not [line for line in httpx.get(gateway.metrics_url).text.splitlines() if "wrong-key" in line]


def test_a_key_for_one_namespace_cannot_list_wake_or_call_another_namespaces_pool(
    crds: Cluster,
    namespace: str,
    other_namespace: str,
    start_operator: StartOperator,
    start_gateway: StartGateway,
) -> None:
    a, b = namespace, other_namespace
    start_operator(a, b, MODELPOOL_OPERATOR_SERVER_PORT=str(free_port()))
    apply(crds, _wakes("mine"), a)
    apply(crds, _wakes("theirs"), b)
    gateway = start_gateway([a, b], "--tenant-keys", "--demand-interval-seconds", "1")
    wait_for(lambda: {"mine", "theirs"} <= set(gateway.models()), timeout=30, message="both pools known")
    # A tenant's own key: a Secret in its namespace, granting that namespace.
    key = create_key(crds, a, "team-a")
    wait_for(lambda: _listed(gateway, key) is not None, timeout=KEY_CHANGE_S, message="the key works")
    assert _listed(gateway, key) == {"mine"}

    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=120)
    for model in ("theirs", f"{b}/theirs"):
        with pytest.raises(openai.NotFoundError) as hidden:
            client.embeddings.create(model=model, input=["x"])
        with pytest.raises(openai.NotFoundError) as missing:
            client.embeddings.create(model=model + "-none", input=["x"])
        assert hidden.value.body == json.loads(
            json.dumps(missing.value.body).replace(f"{model}-none", model)
        ), (hidden.value.body, missing.value.body)
    triton_client = triton.InferenceServerClient(gateway.url.removeprefix("http://"))
    for model in ("theirs", f"{b}/theirs"):
        with pytest.raises(InferenceServerException) as triton_err:
            triton_client.get_model_metadata(model, headers=bearer(key))
        assert triton_err.value.status() == "404"
        assert not triton_client.is_model_ready(model, headers=bearer(key))
    for path in (f"/v1/models/{b}/theirs", "/v2/models/theirs/ready"):
        assert httpx.get(gateway.url + path, headers=bearer(key), timeout=5).status_code == 404, path
    infer = httpx.post(
        gateway.url + "/v2/models/theirs/infer", json={"inputs": []}, headers=bearer(key), timeout=10
    )
    assert infer.status_code == 404, infer.text
    assert gateway.metric("modelpool_gateway_refused_total", reason="not_found") >= 9

    # Its own pool it wakes: held, demand recorded, a worker started, answered.
    woke = client.embeddings.create(model="mine", input=["x"])
    assert len(woke.data) == 1
    # Meanwhile the other namespace's pool got no demand of any kind, and no worker.
    theirs = get_json(crds, POOLS, "theirs", "-n", b)
    assert DEMANDED_AT not in (theirs["metadata"].get("annotations") or {})
    assert get_json(crds, "leases.coordination.k8s.io", "-n", b)["items"] == []
    assert not worker_pods(crds, b, "theirs")
    assert gateway.metric("modelpool_gateway_held_requests", pool=f"{b}/theirs") == 0


def test_a_tenants_secret_cannot_grant_another_namespace(
    crds: Cluster, namespace: str, other_namespace: str, start_gateway: StartGateway
) -> None:
    a, b = namespace, other_namespace
    apply(crds, echo_pool("theirs", replicas=0), b)
    gateway = start_gateway([a, b], "--tenant-keys")
    wait_for(lambda: "theirs" in gateway.models(), timeout=30, message="the pool known")
    greedy = create_key(crds, a, "greedy", namespaces=f"{a},{b}")
    sneaky = create_key(crds, a, "sneaky", pools=f"{b}/theirs")
    # A later Secret of the same namespace: once its key works, the two before it have been seen too.
    later = create_key(crds, a, "later")
    wait_for(lambda: _listed(gateway, later) is not None, timeout=KEY_CHANGE_S, message="the later key")
    for key in (greedy, sneaky):
        assert _models(gateway, key).status_code == 401
    log = gateway.log_tail(10**6)
    assert f"key Secret {a}/greedy refused" in log and f"key Secret {a}/sneaky refused" in log
    assert greedy not in log and sneaky not in log and later not in log, "a key was logged"


def test_keys_added_changed_and_revoked_take_effect_within_seconds(
    crds: Cluster, namespace: str, other_namespace: str, start_gateway: StartGateway
) -> None:
    a, b = namespace, other_namespace
    apply(crds, echo_pool("mine", replicas=0), a)
    apply(crds, echo_pool("theirs", replicas=0), b)
    gateway = start_gateway([a, b])
    assert gateway.keys_namespace is not None
    admin = gateway.keys_namespace
    wait_for(lambda: {"mine", "theirs"} <= set(gateway.models()), timeout=30, message="both pools known")

    def becomes(key: str, expected: set[str] | None, what: str) -> None:
        wait_for(lambda: _listed(gateway, key) == expected, timeout=KEY_CHANGE_S, interval=0.1, message=what)

    key = create_key(crds, admin, "team", namespaces=a)
    becomes(key, {"mine"}, "a new key grants its namespace")
    create_key(crds, admin, "team", key=key, namespaces=b)
    becomes(key, {"theirs"}, "the changed grant")
    create_key(crds, admin, "team", key=key, pools=f"{a}/mine,{b}/theirs")
    becomes(key, {"mine", "theirs"}, "a grant of two pools")
    rotated = create_key(crds, admin, "team", namespaces=a)
    becomes(key, None, "the replaced key refused")
    becomes(rotated, {"mine"}, "the new key")
    crds.kubectl("label", "secret", "team", "-n", admin, f"{LABEL_GATEWAY_KEY}-")
    becomes(rotated, None, "a key whose label was taken off refused")
    create_key(crds, admin, "team", key=rotated, namespaces=a)
    becomes(rotated, {"mine"}, "labelled again")
    crds.kubectl("delete", "secret", "team", "-n", admin)
    becomes(rotated, None, "a deleted key refused")
    assert gateway.alive()
