"""A shared host (``modelpool-server --shared-host``) as a real process, with the real clients.

One host for the module (loading costs seconds): all-MiniLM-L6-v2 and two echo models loaded through the
control API; requests routed by name (tritonclient on the v2 path, the openai client by its ``model``);
sleep, a wake on a request, making room on the device's ledger, unload, ``--sleep-idle``; isolation: an
exception in a forward pass fails only that request, a SIGKILLed model's process fails only that model
(its slot then takes a model again), and a fatal device error fails the host (exit 4; last, since it
ends the host).
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from modelpool_contract.exits import EXIT_DEVICE_FAILED
from testkit import prom
from testkit.echo_models import ECHO
from testkit.server import SharedHost, start_host
from testkit.waiting import wait_for
from tests.server.fuzzcases import HUGE_HEADERS, raw_exchange

pytestmark = pytest.mark.slow

MI = 1 << 20
WAIT_S = 60.0
KEY = "serving-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Host(SharedHost):
    """The host process, its control API and the Triton client on its serving port."""

    def triton(self) -> triton.InferenceServerClient:
        return triton.InferenceServerClient(self.server.url.removeprefix("http://"))


def until(condition: Callable[[], bool], what: str) -> None:
    wait_for(condition, WAIT_S, 0.05, what)


def embed(host: Host, model: str, text: str) -> np.ndarray[Any, Any]:
    client = host.triton()
    data = triton.InferInput("text", [1], "BYTES")
    data.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    result = client.infer(model, [data], headers=AUTH)
    vector = result.as_numpy("embedding")
    assert vector is not None
    first: np.ndarray[Any, Any] = vector[0]
    return first


@pytest.fixture(scope="module")
def host(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    key_file = tmp_path_factory.mktemp("key") / "api-key"
    key_file.write_text(KEY)
    host = Host(
        start_host(
            "--api-key-file", str(key_file), "--sleep-idle", "--request-body-timeout-seconds", "1",
            device_memory=1040 * MI, max_models=4, model_overhead=10 * MI,
        )
    )  # fmt: skip
    echo = str(tmp_path_factory.mktemp("echo"))
    loads = {
        "minilm": {"source": str(minilm), "task": "text-embedding", "memory": f"{300 * MI}"},
        "echo": {"source": echo, "task": "text-embedding", "handler": ECHO, "memory": f"{300 * MI}"},
        "victim": {"source": echo, "task": "text-embedding", "handler": ECHO, "memory": f"{100 * MI}"},
    }
    try:
        with ThreadPoolExecutor(len(loads)) as pool:  # the loads run side by side
            answers = dict(zip(loads, pool.map(lambda n: host.call(n, "load", loads[n]), loads), strict=True))
        for name, answer in answers.items():
            assert answer.status_code == 200 and answer.json()["state"] == "Ready", (name, answer.text)
        yield host
    finally:
        host.stop()


def test_requests_reach_their_model_by_name_with_the_real_clients(host: Host) -> None:
    vector = embed(host, "minilm", "A man is eating food.")
    assert vector.shape == (384,)
    assert list(embed(host, "echo", "hello")) == [5.0, 1.0]  # the echo model's [len(text), items]
    with pytest.raises(openai.AuthenticationError):  # the serving port wants the key, before any routing
        openai.OpenAI(base_url=host.server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    client = openai.OpenAI(base_url=host.server.url + "/v1", api_key=KEY, max_retries=0)
    assert sorted(m.id for m in client.models.list().data) == ["echo", "minilm", "victim"]
    assert client.embeddings.create(model="echo", input="abc").data[0].embedding == [3.0, 1.0]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="nobody", input="abc")
    stats = host.stats()
    assert set(stats["models"]) == {"minilm", "echo", "victim"}
    device = stats["host"]["devices"][0]
    assert device["awake"] == 700 * MI  # declared, until measured on a GPU
    # Each model's process is charged --model-overhead besides its weights: 3 x 10 MiB.
    assert (device["overhead"], device["free"]) == (30 * MI, 310 * MI), device
    assert host.call("echo", "load", {"source": "/x", "task": "text-embedding"}).status_code == 409
    assert "task" in host.call("new", "load", {"source": "/x", "task": "nope"}).json()["error"]


def test_metrics_count_each_model_apart_and_show_the_device(host: Host) -> None:
    """The probe port's /metrics: every process's counters, each series labelled with its model (two
    models counted by one HTTP process never mix), each model's gauges, and the device's ledger."""

    def scrape() -> dict[str, float]:
        text = httpx.get(host.control + "/metrics", timeout=10).text
        names = ("modelpool_requests_total", "modelpool_batch_size_count")
        return {
            f"{name}/{model}": prom.total(text, name, model=model)
            for name in names
            for model in ("echo", "minilm")
        } | {
            "capacity": prom.value(text, "modelpool_host_device_memory_bytes", device="0", kind="capacity"),
            "echo serving": prom.total(
                text, "modelpool_worker_state", lambda s: s["state"] in ("Ready", "Idle"), model="echo"
            ),
        }

    before = scrape()
    for text in ("one", "two"):
        embed(host, "echo", text)
    after = scrape()
    assert after["modelpool_requests_total/echo"] - before["modelpool_requests_total/echo"] == 2
    assert after["modelpool_batch_size_count/echo"] - before["modelpool_batch_size_count/echo"] == 2
    assert after["modelpool_requests_total/minilm"] == before["modelpool_requests_total/minilm"] > 0
    assert after["modelpool_batch_size_count/minilm"] == before["modelpool_batch_size_count/minilm"] > 0
    assert after["capacity"] == 1040 * MI and after["echo serving"] == 1


def test_an_openai_body_that_never_arrives_is_408_and_the_connection_closed(host: Host) -> None:
    """The host reads an OpenAI body itself (it names the model): bounded like a worker's, never held on."""
    port = int(host.server.url.rsplit(":", 1)[1])
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY}\r\n"
        'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"model": '
    )
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        conn.sendall(head.encode())
        answer = b""
        while chunk := conn.recv(65536):  # to the end: the 408 closes the connection
            answer += chunk
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in rest.lower() and b"--request-body-timeout-seconds" in rest


def test_an_exception_in_a_forward_pass_fails_only_that_request(host: Host) -> None:
    with pytest.raises(InferenceServerException, match="forward pass exploded"):
        embed(host, "echo", "boom")
    assert list(embed(host, "echo", "hello")) == [5.0, 1.0]
    assert host.index()["echo"]["state"] in ("Ready", "Processing")


def test_a_sleeping_model_is_woken_by_a_request_and_answers_the_same(host: Host) -> None:
    before = embed(host, "minilm", "A man is riding a horse.")
    slept = host.call("minilm", "sleep")
    assert slept.status_code == 200 and slept.json()["state"] == "Sleeping", slept.text
    stats = host.stats()
    assert stats["models"]["minilm"]["state"] == "Sleeping"
    device = stats["host"]["devices"][0]
    assert device["awake"] == 400 * MI  # a sleeping model is charged host memory
    assert device["overhead"] == 30 * MI  # and still its process on the device
    after = embed(host, "minilm", "A man is riding a horse.")  # waits for the wake, then is answered
    assert np.array_equal(before, after)
    assert host.state("minilm") in ("Ready", "Processing")
    assert host.call("minilm", "sleep").status_code == 200
    assert host.call("minilm", "wake").json()["state"] == "Ready"
    # Both sleeps and both wakes counted on the probe port (the dashboards' sleeps and wakes panel).
    text = httpx.get(host.control + "/metrics", timeout=10).text
    for counter in ("modelpool_sleeps_total", "modelpool_wakes_total"):
        assert prom.value(text, counter, model="minilm") >= 2, text  # --sleep-idle may have added one


def test_a_load_makes_room_by_sleeping_the_least_recently_used_idle_models(
    host: Host, tmp_path: Path
) -> None:
    embed(host, "echo", "recent")  # victim was never asked: it is the least recently used
    big = {"source": str(tmp_path), "task": "text-embedding", "handler": ECHO, "memory": f"{350 * MI}"}
    # 700 MiB awake + 30 MiB of processes + 350 + its own 10 > 1040: one model must sleep.
    loaded = host.call("big", "load", big)
    assert loaded.status_code == 200 and loaded.json()["state"] == "Ready", loaded.text
    states = {name: entry["state"] for name, entry in host.index().items()}
    assert states["victim"] == "Sleeping" and states["minilm"] != "Sleeping", states
    assert host.call("big", "unload").status_code == 200
    assert "big" not in host.index()
    too_big = {"source": str(tmp_path), "task": "text-embedding", "handler": ECHO, "memory": f"{2000 * MI}"}
    assert host.call("huge", "load", too_big).status_code == 507
    assert host.call("victim", "wake").json()["state"] == "Ready"


def test_a_header_block_over_the_bound_is_refused_431_on_the_hosts_serving_port(host: Host) -> None:
    """The header bound of a dedicated worker's HTTP processes (``test_fuzz.py``), on a host's too."""
    for request in HUGE_HEADERS:
        status, body = raw_exchange(host.server.port, request)
        assert status == 431 and b"too large" in body, (request[:100], status, body)
    assert embed(host, "minilm", "still serving").shape == (384,)


def test_a_models_queue_is_its_pools_own(host: Host, tmp_path: Path) -> None:
    """A load's ``queue_capacity`` and ``request_timeout`` (a shared pool's ``spec.queue``) are its model's:
    its door, ``/stats`` and ``/metrics`` say 3 while the other models keep the host's 100."""
    own = {"source": str(tmp_path), "task": "text-embedding", "handler": ECHO, "memory": f"{50 * MI}",
           "queue_capacity": 3, "request_timeout": 9}  # fmt: skip
    assert host.call("queued", "load", own).status_code == 200
    try:
        models = host.stats()["models"]
        assert models["queued"]["queue_capacity"] == 3 and models["echo"]["queue_capacity"] == 100
        metrics = httpx.get(f"{host.control}/metrics", timeout=30).text
        assert prom.value(metrics, "modelpool_queue_capacity", model="queued") == 3.0
        assert list(embed(host, "queued", "hello")) == [5.0, 1.0]
    finally:
        assert host.call("queued", "unload").status_code == 200


def test_a_crashed_model_fails_alone_and_the_others_serve_on(host: Host, tmp_path: Path) -> None:
    os.kill(host.index()["victim"]["pid"], signal.SIGKILL)
    until(lambda: host.state("victim") == "Failed", "victim Failed")
    assert "killed by SIGKILL" in host.index()["victim"]["reason"]
    with pytest.raises(InferenceServerException):
        embed(host, "victim", "hello")
    assert list(embed(host, "echo", "hello")) == [5.0, 1.0]
    assert embed(host, "minilm", "still here").shape == (384,)
    # Unloaded, its place takes a model again (every slot of this host has held one: --max-models 4);
    # this one turns Idle after half a second, and --sleep-idle puts it to sleep then.
    assert host.call("victim", "unload").status_code == 200
    again = {"source": str(tmp_path), "task": "text-embedding", "handler": ECHO, "memory": f"{100 * MI}"}
    assert host.call("victim", "load", {**again, "idle_after": 0.5}).status_code == 200
    until(lambda: host.state("victim") == "Sleeping", "victim asleep once Idle")
    assert list(embed(host, "victim", "hello")) == [5.0, 1.0]  # woken by the request
    until(lambda: host.state("victim") == "Sleeping", "victim asleep again")


def test_a_fatal_device_error_fails_the_whole_host(host: Host) -> None:
    with pytest.raises(InferenceServerException):
        embed(host, "echo", "fatal")
    assert host.server.wait_exit(WAIT_S) == EXIT_DEVICE_FAILED
    assert "illegal memory access" in host.server.termination_log.read_text()
