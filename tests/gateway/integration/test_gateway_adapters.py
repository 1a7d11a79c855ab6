"""LoRA adapters through the gateway (issue 33, item 3): a request whose model is an adapter's name reaches
a worker of the pool that declares it, which applies it, through the real ``openai`` client; the base
model's name still serves the base; ``/v1/models`` lists the adapters with their parent.

One namespace, one operator and one gateway: pool ``llm`` (two streaming echo generators, adapters ``sql``
and ``poem``) and pool ``other`` (one, adapter ``chat``).  The echo generator answers ``[<adapter>]`` before
the prompt's words when a request names one (``testkit.echo_models.EchoGeneration``): what the worker
received and applied.  The real model applying adapters: tests/server/process/test_lora.py; the routing
preference for workers holding an adapter: tests/gateway/unit/test_gateway_adapter_choice.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from testkit.cluster import Cluster
from tests.gateway.integration.gwharness import GENERATION, GatewayProcess, echo_pool, serving_stack
from tests.operator.integration.opharness import worker_pods

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    gateway: GatewayProcess

    def pods(self, pool: str) -> set[str]:
        return {p["metadata"]["name"] for p in worker_pods(self.cluster, self.namespace, pool)}

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.url + "/v1", api_key=self.gateway.key, max_retries=0)


def _pool(name: str, replicas: int, adapters: list[str]) -> dict[str, Any]:
    manifest = echo_pool(name, replicas=replicas, handler=GENERATION, task="text-generation")
    manifest["spec"]["adapters"] = [{"name": a, "source": f"hf://loras/{a}"} for a in adapters]
    return manifest


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    logs = tmp_path_factory.mktemp("gateway-adapters")
    pools = [(_pool("llm", 2, ["sql", "poem"]), 2), (_pool("other", 1, ["chat"]), 1)]
    with serving_stack(crds, "gw-lora", logs, pools) as stack:
        yield Setup(crds, stack.namespace, stack.gateway)


def test_an_adapters_request_reaches_its_pool_and_the_worker_applies_it(setup: Setup) -> None:
    client = setup.client()
    for model, pool, want in (
        ("sql", "llm", "[sql] list the users"),
        ("poem", "llm", "[poem] list the users"),
        ("chat", "other", "[chat] list the users"),
        ("llm", "llm", "list the users"),  # the base model's name: no adapter
    ):
        raw = client.completions.with_raw_response.create(model=model, prompt="list the users", max_tokens=8)
        reply = raw.parse()
        assert raw.headers["x-modelpool-worker"] in setup.pods(pool), model
        assert (reply.model, reply.choices[0].text.strip()) == (model, want)
    chat = client.chat.completions.create(model="poem", messages=[{"role": "user", "content": "hi"}])
    assert chat.model == "poem" and (chat.choices[0].message.content or "").startswith("[poem]")


def test_v1_models_lists_each_adapter_with_its_parent(setup: Setup) -> None:
    data = setup.client().models.list().data
    listed = {m.id: getattr(m, "parent", None) for m in data}
    assert listed == {"llm": None, "sql": "llm", "poem": "llm", "other": None, "chat": "other"}


def test_an_adapter_no_pool_declares_is_404_and_v2_serves_no_adapter(setup: Setup) -> None:
    with pytest.raises(openai.NotFoundError):
        setup.client().completions.create(model="sql-v2", prompt="x", max_tokens=2)
    body = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    url = f"{setup.gateway.url}/v2/models/sql/infer"
    response = httpx.post(url, json=body, headers=setup.gateway.headers, timeout=30)
    assert response.status_code == 404 and "LoRA adapter" in response.json()["error"]
