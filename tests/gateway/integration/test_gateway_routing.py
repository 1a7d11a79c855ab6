"""The gateway in front of real workers: routing by model name, the unknown model, load sharing, the real
``openai`` and ``tritonclient`` clients unmodified, and a draining worker's 503 retried elsewhere.

One namespace, one operator and one gateway serve the whole module: pools ``alpha`` (two echo workers,
alias ``Org/alpha-model``), ``beta`` (one echo worker) and ``gen`` (two streaming echo generators).  The
workers are real ``modelpool-server`` processes on the process node.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from testkit import prom
from testkit.cluster import Cluster
from testkit.environment import free_port
from testkit.kubectl import apply, wait_for
from tests.gateway.integration.gwharness import (
    GENERATION,
    GatewayProcess,
    echo_pool,
    serving_stack,
    worker_pids,
)
from tests.operator.integration.opharness import worker_pods

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    gateway: GatewayProcess
    worker_port: int

    def pods(self, pool: str) -> list[str]:
        return sorted(p["metadata"]["name"] for p in worker_pods(self.cluster, self.namespace, pool))

    def pod_ip(self, pool: str, name: str) -> str:
        pods = {p["metadata"]["name"]: p for p in worker_pods(self.cluster, self.namespace, pool)}
        return str(pods[name]["status"]["podIP"])

    def worker_served(self, pool: str) -> dict[str, float]:
        """What each worker of ``pool`` counted itself: its 200 answers to /v1/embeddings."""
        out = {}
        for pod in worker_pods(self.cluster, self.namespace, pool):
            text = httpx.get(f"http://{pod['status']['podIP']}:{self.worker_port}/metrics", timeout=5).text
            out[pod["metadata"]["name"]] = prom.value(
                text, "modelpool_requests_total", code="200", route="embeddings"
            )
        return out


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    logs = tmp_path_factory.mktemp("gateway-routing")
    worker_port = free_port()
    generation = {"HANDLER_RUN_SECONDS": "0.05"}
    pools = [
        (echo_pool("alpha", replicas=2, served_model_name="Org/alpha-model"), 2),
        (echo_pool("beta"), 1),
        (echo_pool("gen", replicas=2, handler=GENERATION, task="text-generation", env=generation), 2),
    ]
    with serving_stack(crds, "gw", logs, pools, worker_port=worker_port) as stack:
        yield Setup(crds, stack.namespace, stack.gateway, worker_port)


def _embed(setup: Setup, model: str) -> httpx.Response:
    return httpx.post(
        setup.gateway.url + "/v1/embeddings",
        json={"model": model, "input": ["hello"]},
        headers=setup.gateway.headers,
        timeout=30,
    )


def test_routes_by_model_name_alias_and_namespace_and_lists_every_pool(setup: Setup) -> None:
    models = setup.gateway.models()
    assert set(models) == {"alpha", "beta", "gen"}
    assert models["alpha"]["id"] == "Org/alpha-model" and models["beta"]["id"] == "beta"
    assert models["alpha"]["object"] == "model" and models["alpha"]["modelpool"]["servingWorkers"] == 2
    assert models["gen"]["modelpool"]["task"] == "text-generation"

    alpha, beta = setup.pods("alpha"), setup.pods("beta")
    for name in ("alpha", "Org/alpha-model", f"{setup.namespace}/alpha"):
        response = _embed(setup, name)
        assert response.status_code == 200, response.text
        assert response.headers["x-modelpool-worker"] in alpha, name
        assert response.json()["data"][0]["embedding"] == [5.0, 1.0]
    response = _embed(setup, "beta")
    assert response.status_code == 200 and response.headers["x-modelpool-worker"] in beta

    # KServe v2, by name, alias and namespace/name in the URL.
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hey"]}]}
    for name in ("alpha", "Org/alpha-model", f"{setup.namespace}/alpha"):
        response = httpx.post(
            f"{setup.gateway.url}/v2/models/{name}/infer",
            json=body,
            headers=setup.gateway.headers,
            timeout=30,
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-modelpool-worker"] in alpha
        assert response.json()["outputs"][0]["data"] == [3.0, 1.0]
    meta = httpx.get(
        f"{setup.gateway.url}/v2/models/Org/alpha-model", headers=setup.gateway.headers, timeout=10
    ).json()
    assert meta["name"] == "alpha" and meta["inputs"][0]["name"] == "text"


def test_an_unknown_model_is_a_404_in_each_protocols_shape(setup: Setup) -> None:
    client = openai.OpenAI(base_url=setup.gateway.url + "/v1", api_key=setup.gateway.key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="gpt-4", input=["x"])
    assert "'gpt-4' is not served here" in str(err.value)
    response = _embed(setup, "gpt-4")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "model_not_found"

    response = httpx.post(
        f"{setup.gateway.url}/v2/models/gpt-4/infer",
        json={"inputs": []},
        headers=setup.gateway.headers,
        timeout=10,
    )
    assert response.status_code == 404
    assert set(response.json()) == {"error"} and "gpt-4" in response.json()["error"]
    with pytest.raises(InferenceServerException) as triton_err:
        triton.InferenceServerClient(setup.gateway.url.removeprefix("http://")).get_model_metadata(
            "gpt-4", headers=setup.gateway.headers
        )
    assert "gpt-4" in str(triton_err.value)
    assert (
        httpx.get(
            f"{setup.gateway.url}/v1/models/gpt-4", headers=setup.gateway.headers, timeout=10
        ).status_code
        == 404
    )


def test_two_workers_share_200_concurrent_requests(setup: Setup) -> None:
    before = setup.worker_served("alpha")

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(limits=limits, timeout=60, headers=setup.gateway.headers) as client:
            body = {"model": "alpha", "input": ["hello"]}
            return await asyncio.gather(
                *(client.post(setup.gateway.url + "/v1/embeddings", json=body) for _ in range(200))
            )

    responses = asyncio.run(burst())
    assert Counter(r.status_code for r in responses) == {200: 200}
    by_header = Counter(r.headers["x-modelpool-worker"] for r in responses)
    after = setup.worker_served("alpha")
    by_worker = {name: after[name] - before.get(name, 0) for name in after}
    assert by_worker == dict(by_header), (by_worker, by_header)
    assert len(by_worker) == 2
    for name, served in by_worker.items():
        assert 70 <= served <= 130, f"{name} served {served} of 200: {by_worker}"


def test_the_openai_client_unmodified_embeddings_and_streaming_chat(setup: Setup) -> None:
    client = openai.OpenAI(base_url=setup.gateway.url + "/v1", api_key=setup.gateway.key, max_retries=0)
    embeddings = client.embeddings.create(model="Org/alpha-model", input=["a kubernetes operator", "serves"])
    assert [d.embedding for d in embeddings.data] == [[21.0, 2.0], [6.0, 2.0]]

    # Sixteen words, one every 50 ms: about 0.8 s of pieces, so a stall of the machine cannot squeeze them
    # under the 0.25 s asked below (eight words, 0.4 s, once could at a load average of 7).
    words = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
    stream = client.chat.completions.create(
        model="gen", messages=[{"role": "user", "content": words}], max_tokens=40, stream=True
    )
    arrivals = [(time.monotonic(), chunk) for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for _, c in arrivals if c.choices)
    assert words in " ".join(text.split()), text  # the chat template's "user: ..." echoed word by word
    # The generator emits a word every 50 ms: the chunks came as they were made, not all at the end.
    content_times = [t for t, c in arrivals if c.choices and c.choices[0].delta.content]
    assert len(content_times) >= 12
    assert content_times[-1] - content_times[0] >= 0.25, content_times

    completion = client.completions.create(model="gen", prompt="alpha beta gamma", max_tokens=2)
    assert completion.choices[0].text == "alpha beta"


def test_each_keys_usage_is_counted_from_what_the_answers_report(setup: Setup) -> None:
    """Per key (its Secret's name, never the key), per pool: requests by status, embeddings inputs, and the
    prompt and completion tokens the answers' usage reports, streamed or not."""
    gateway = setup.gateway
    assert gateway.key is not None and gateway.keys_namespace is not None
    key = {"key": f"{gateway.keys_namespace}/all-pools"}
    alpha, gen = f"{setup.namespace}/alpha", f"{setup.namespace}/gen"

    def counted() -> dict[str, float]:
        def m(name: str, **labels: str) -> float:
            return gateway.metric(f"modelpool_gateway_key_{name}_total", **key, **labels)

        return {
            "alpha 200": m("requests", pool=alpha, code="200"),
            "alpha 404": m("requests", code="404"),
            "inputs": m("items", pool=alpha, kind="embeddings"),
            "prompt": m("tokens", pool=gen, kind="prompt"),
            "completion": m("tokens", pool=gen, kind="completion"),
        }

    before = counted()
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=gateway.key, max_retries=0, timeout=60)
    client.embeddings.create(model="alpha", input=["one", "two", "three"])
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-pool", input=["x"])
    chat = client.chat.completions.create(model="gen", messages=[{"role": "user", "content": "a b c d"}])
    assert chat.usage is not None
    stream = client.chat.completions.create(
        model="gen", messages=[{"role": "user", "content": "e f"}], stream=True
    )
    streamed = [c.usage for c in stream if c.usage is not None]
    assert len(streamed) == 1
    want_prompt = chat.usage.prompt_tokens + streamed[0].prompt_tokens
    want_completion = chat.usage.completion_tokens + streamed[0].completion_tokens
    assert want_prompt > 0 and want_completion > 0
    want = {
        "alpha 200": 1, "alpha 404": 1, "inputs": 3, "prompt": want_prompt, "completion": want_completion,
    }  # fmt: skip

    def deltas() -> dict[str, float]:
        after = counted()
        return {k: after[k] - before[k] for k in after}

    # A stream's usage is counted once the gateway has relayed its last chunk, which the client may read
    # first: the counters catch up within moments, never past what the answers reported.
    wait_for(lambda: deltas() == want, timeout=10, interval=0.1, message=f"usage counted as {want}")
    assert deltas() == want
    # The key itself is nowhere in the metrics.
    assert gateway.key not in httpx.get(gateway.metrics_url, timeout=5).text


def test_chats_under_one_system_prompt_reach_one_generation_worker_and_distinct_ones_spread(
    setup: Setup,
) -> None:
    """Prefix-aware routing (the gateway's default for text-generation pools): one after another, chats
    under one long system prompt all reach one of the two workers (least-loaded would alternate them);
    chats under distinct system prompts reach both."""
    system = "You are the platform team's assistant; answer in one short sentence. " * 5

    def worker(system_prompt: str, question: str) -> str:
        answer = httpx.post(
            setup.gateway.url + "/v1/chat/completions",
            json={
                "model": "gen",
                "max_tokens": 1,
                "messages": [
                    {"role": "system", "content": system_prompt},
                    {"role": "user", "content": question},
                ],
            },
            headers=setup.gateway.headers,
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        return answer.headers["x-modelpool-worker"]

    shared = [worker(system, f"question {i}") for i in range(8)]
    assert len(set(shared)) == 1, shared
    distinct = {worker(f"system prompt number {i}", "hi") for i in range(16)}
    assert distinct == set(setup.pods("gen")), distinct


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_unmodified_binary_on_and_off(setup: Setup, binary: bool) -> None:
    client = triton.InferenceServerClient(setup.gateway.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    # tritonclient sends the key as a header of each call.
    headers = setup.gateway.headers
    assert client.is_model_ready("Org/alpha-model", headers=headers)
    text = triton.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(np.array([b"a", b"bb", "caf\u00e9".encode()], dtype=object), binary_data=binary)
    out = client.infer(
        "Org/alpha-model",
        [text],
        outputs=[triton.InferRequestedOutput("embedding", binary_data=binary)],
        headers=headers,
    )
    embedding = out.as_numpy("embedding")
    assert embedding is not None
    assert embedding.tolist() == [[1.0, 3.0], [2.0, 3.0], [4.0, 3.0]]


def test_a_draining_workers_503_is_retried_on_the_other_worker(setup: Setup) -> None:
    """A worker told to stop (SIGTERM) answers 503 until its in-flight work is done; the gateway sends
    those requests to the other worker, and nothing reaches the client but 200s."""
    apply(setup.cluster, echo_pool("drain", replicas=2, env={"HANDLER_RUN_SECONDS": "2"}), setup.namespace)
    setup.gateway.wait_serving("drain", 2)
    pids = worker_pids(setup.cluster, setup.namespace, "drain")
    victim, other = sorted(pids)
    victim_url = f"http://{setup.pod_ip('drain', victim)}:{setup.worker_port}"

    # A request in flight at the victim keeps it draining (and answering 503) for about 2 s.
    body = {"model": "drain", "input": ["slow"]}
    slow = threading.Thread(target=lambda: httpx.post(victim_url + "/v1/embeddings", json=body, timeout=30))
    slow.start()
    wait_for(
        lambda: json.loads(httpx.get(victim_url + "/stats", timeout=5).text).get("in_flight"),
        timeout=10,
        message="the slow request is being computed",
    )
    os.kill(pids[victim], signal.SIGTERM)
    wait_for(
        lambda: httpx.get(victim_url + "/v2/health/ready", timeout=5).status_code == 503,
        timeout=10,
        message="the victim drains",
    )

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60, headers=setup.gateway.headers) as client:
            return await asyncio.gather(
                *(client.post(setup.gateway.url + "/v1/embeddings", json=body) for _ in range(6))
            )

    responses = asyncio.run(burst())
    slow.join(30)
    assert [r.status_code for r in responses] == [200] * 6, [r.text for r in responses]
    assert {r.headers["x-modelpool-worker"] for r in responses} == {other}
    retried = setup.gateway.metric(
        "modelpool_gateway_upstream_attempts_total", pool=f"{setup.namespace}/drain", outcome="draining_503"
    ) + setup.gateway.metric(
        "modelpool_gateway_upstream_attempts_total", pool=f"{setup.namespace}/drain", outcome="unreachable"
    )
    assert retried >= 1, "some requests went to the draining worker first"


def test_a_gateway_told_to_stop_keeps_serving_its_delay_not_ready_and_closing_connections(
    setup: Setup, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``--shutdown-delay-seconds`` (the chart's 5): after SIGTERM the replica still answers, its
    readiness fails (its endpoints go) and each answer closes its connection (kept-alive clients move to
    another replica); once the delay has passed it exits 0."""
    logs = tmp_path_factory.mktemp("gateway-delay")
    gateway = GatewayProcess(
        setup.cluster, [setup.namespace], logs / "gateway.log", "--shutdown-delay-seconds", "3"
    )
    try:
        gateway.wait_ready()
        gateway.wait_serving("beta", 1)
        body = {"model": "beta", "input": ["hi"]}
        with httpx.Client(base_url=gateway.url, headers=gateway.headers, timeout=10) as client:
            assert client.post("/v1/embeddings", json=body).headers.get("connection") != "close"
            gateway.proc.send_signal(signal.SIGTERM)
            wait_for(
                lambda: httpx.get(gateway.url + "/readyz", timeout=2).status_code == 503,
                timeout=5,
                interval=0.1,
                message="readiness fails at the SIGTERM",
            )
            assert httpx.get(gateway.url + "/readyz", timeout=2).json()["reason"] == "shutting down"
            answer = client.post("/v1/embeddings", json=body)  # still served, on a kept-alive connection
            assert answer.status_code == 200 and answer.headers["connection"] == "close"
            assert gateway.alive()
        assert gateway.proc.wait(timeout=30) == 0
    finally:
        if gateway.alive():
            gateway.kill()
