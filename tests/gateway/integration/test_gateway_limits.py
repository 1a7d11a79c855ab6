"""Limits per API key (issue 34 item 1) on the real control plane, with real workers and the real clients: a
key with ``requestsPerMinute=N`` gets N answers, then 429 with a Retry-After within 60 s in each protocol's
error shape, while another key goes on; a ``tokensPerMinute`` key is refused once its answers' usage used
its tokens; two replicas started with ``--replicas 2`` each admit their half of a key's limit.

Nothing waits for a window to pass: the Retry-After is asserted, not waited for.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from testkit.cluster import Cluster
from testkit.kubectl import wait_for
from tests.gateway.integration.gwharness import GatewayProcess, bearer, create_key, echo_pool, serving_stack

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

# The bound on a key Secret reaching the gateway (its watch's event).
KEY_CHANGE_S = 10


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    gateway: GatewayProcess
    logs: Path

    @property
    def admin(self) -> str:
        assert self.gateway.keys_namespace is not None
        return self.gateway.keys_namespace

    def key(self, name: str, *, rpm: int | None = None, tpm: int | None = None) -> str:
        """A key Secret in the admin namespace granting the test's namespace, with these limits."""
        return create_key(
            self.cluster,
            self.admin,
            name,
            namespaces=self.namespace,
            requests_per_minute=rpm,
            tokens_per_minute=tpm,
        )


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    logs = tmp_path_factory.mktemp("gateway-limits")
    with serving_stack(crds, "gwl", logs, [(echo_pool("emb"), 1)]) as stack:
        yield Setup(crds, stack.namespace, stack.gateway, logs)


def _known(gateway: GatewayProcess, key: str) -> None:
    """Until ``gateway`` accepts ``key`` (listing models is not limited: only inference routes are)."""
    wait_for(
        lambda: httpx.get(gateway.url + "/v1/models", headers=bearer(key), timeout=5).status_code == 200,
        timeout=KEY_CHANGE_S,
        interval=0.1,
        message="the gateway knows the key",
    )


def _client(gateway: GatewayProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key=key, max_retries=0, timeout=60)


def _retry_after(error: openai.APIStatusError) -> int:
    return int(error.response.headers["retry-after"])


def test_n_answers_then_429_with_the_keys_own_retry_after_and_another_key_goes_on(setup: Setup) -> None:
    gateway, n = setup.gateway, 3
    limited, other = setup.key("limited", rpm=n), setup.key("other", rpm=n)
    _known(gateway, limited)
    _known(gateway, other)
    client = _client(gateway, limited)
    for i in range(n):
        assert len(client.embeddings.create(model="emb", input=[f"text {i}"]).data) == 1
    with pytest.raises(openai.RateLimitError) as over:
        client.embeddings.create(model="emb", input=["one too many"])
    assert over.value.status_code == 429 and 1 <= _retry_after(over.value) <= 60
    assert f"limit of {n} requests per minute" in over.value.message
    # The KServe client gets its own shape: {"error": message}.
    triton_client = triton.InferenceServerClient(gateway.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException) as v2_over:
        triton_client.get_model_metadata("emb", headers=bearer(limited))
    assert v2_over.value.status() == "429" and "requests per minute" in str(v2_over.value.message())

    # Another key of the same pool has its own window.
    others = _client(gateway, other)
    for i in range(n):
        assert len(others.embeddings.create(model="emb", input=[f"other {i}"]).data) == 1

    pool, key = f"{setup.namespace}/emb", f"{setup.admin}/limited"
    assert gateway.metric("modelpool_gateway_refused_total", pool=pool, reason="key_rate_limited") == 2
    assert gateway.metric("modelpool_gateway_key_requests_total", key=key, pool=pool, code="429") == 2
    assert gateway.metric("modelpool_gateway_key_requests_total", key=key, pool=pool, code="200") == n


def test_a_tokens_per_minute_key_is_refused_once_its_answers_used_its_tokens(setup: Setup) -> None:
    """The echo worker's usage reports each text's length as its prompt tokens: 8 + 8 pass a limit of 10
    with the second answer (admitted while under the limit, then charged), so the third is refused."""
    gateway = setup.gateway
    key = setup.key("tokens", tpm=10)
    _known(gateway, key)
    client = _client(gateway, key)
    for _ in range(2):
        assert client.embeddings.create(model="emb", input=["8 tokens"]).usage.prompt_tokens == 8
    with pytest.raises(openai.RateLimitError) as over:
        client.embeddings.create(model="emb", input=["x"])
    assert 1 <= _retry_after(over.value) <= 60 and "limit of 10 tokens per minute" in over.value.message
    pool, name = f"{setup.namespace}/emb", f"{setup.admin}/tokens"
    assert gateway.metric("modelpool_gateway_refused_total", pool=pool, reason="key_token_limited") == 1
    assert gateway.metric("modelpool_gateway_key_tokens_total", key=name, pool=pool, kind="prompt") == 16


def test_two_replicas_each_admit_their_share_of_a_keys_limit(setup: Setup) -> None:
    """``--replicas 2``: each replica enforces limit // 2 of its own windows; together the key's limit."""
    replicas = [
        GatewayProcess(
            setup.cluster,
            [setup.namespace],
            setup.logs / f"replica-{i}.log",
            "--replicas",
            "2",
            "--keys-namespace",
            setup.admin,
            key=setup.gateway.key,  # the admin key the first gateway's keys namespace holds
        )
        for i in range(2)
    ]
    try:
        key = setup.key("split", rpm=4)
        answered = []
        for replica in replicas:
            replica.wait_ready()
            replica.wait_serving("emb", 1)
            _known(replica, key)
            client = _client(replica, key)
            answered += [client.embeddings.create(model="emb", input=["x"]) for _ in range(2)]
            with pytest.raises(openai.RateLimitError) as over:
                client.embeddings.create(model="emb", input=["x"])
            assert "(2 on each of 2 gateway replicas)" in over.value.message
            assert 1 <= _retry_after(over.value) <= 60
        assert len(answered) == 4  # the key's limit, in total
    finally:
        codes = [replica.stop() for replica in replicas]
        assert codes == [0, 0], codes
