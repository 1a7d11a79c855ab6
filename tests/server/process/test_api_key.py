"""``--api-key-file``: the real openai client and tritonclient with and without the key; only health
stays open on the serving port (/stats and /metrics need the key there, and answer without it on the
probe port); a missing or empty key file is a configuration error (exit 2)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as triton

from model_server.frontend.endpoints.auth import authorized
from modelpool_contract.exits import EXIT_CONFIG
from testkit.echo_models import ECHO as ECHO_MODEL
from testkit.environment import free_port
from testkit.server import ServerFactory, ServerProcess, start_server

KEY = "mp-test-7f3c9a"
ECHO = ["--model", "/", "--task", "text-embedding", "--handler", ECHO_MODEL]


PROBE_PORT = free_port()


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    key_file = tmp_path_factory.mktemp("key") / "api-key"
    key_file.write_text(
        KEY + "\n"
    )  # as a Secret mounted from `kubectl create secret --from-file` may hold it
    proc = start_server(
        *ECHO,
        "--name",
        "echo",
        "--api-key-file",
        str(key_file),
        "--probe-port",
        str(PROBE_PORT),
        wait="ready",
    )
    yield proc
    proc.stop()


def test_openai_client_needs_the_key(locked: ServerProcess) -> None:
    good = openai.OpenAI(base_url=locked.url + "/v1", api_key=KEY, max_retries=0)
    result = good.embeddings.create(model="echo", input=["abc", "hello"])
    assert [d.embedding[0] for d in result.data] == [3.0, 5.0]
    assert [m.id for m in good.models.list()] == ["echo"]
    wrong = openai.OpenAI(base_url=locked.url + "/v1", api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.embeddings.create(model="echo", input=["abc"])
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "message": "invalid API key: send the header 'Authorization: Bearer <key>'",
        "type": "unauthorized",
        "code": 401,
    }


def test_tritonclient_sends_the_key_as_a_header(locked: ServerProcess) -> None:
    client = triton.InferenceServerClient(locked.url.removeprefix("http://"))
    auth = {"Authorization": f"Bearer {KEY}"}
    # The probes' routes are open; the model's routes are not.
    assert client.is_server_live() and client.is_server_ready()
    assert not client.is_model_ready("echo")
    assert client.is_model_ready("echo", headers=auth)
    text = triton.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"abc", b"hello"], dtype=object), binary_data=True)
    result = client.infer("echo", [text], headers=auth)
    embedding = result.as_numpy("embedding")
    assert embedding is not None and embedding[:, 0].tolist() == [3.0, 5.0]
    with pytest.raises(triton.InferenceServerException) as refused:
        client.infer("echo", [text])
    assert refused.value.status() == "401"
    assert "missing API key" in refused.value.message()
    client.close()


def test_only_health_stays_open_and_refusals_are_counted(locked: ServerProcess) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert httpx.get(locked.url + path, timeout=10).status_code == 200, path
    # /stats names the model's source and any load error: a client of the serving port needs the key.
    for path in ("/stats", "/metrics", "/v2", "/v2/models/echo", "/v1/models", "/openapi.json"):
        response = httpx.get(locked.url + path, timeout=10)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"
    # KServe's error shape outside /v1 (what tritonclient reads).
    bare = httpx.post(locked.url + "/v2/models/echo/infer", content=b"{}", timeout=10)
    assert bare.json() == {"error": "missing API key: send the header 'Authorization: Bearer <key>'"}
    basic = httpx.get(locked.url + "/v1/models", auth=("user", KEY), timeout=10)
    assert basic.status_code == 401  # only the Bearer scheme carries the key
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(locked.url + "/stats", headers=auth, timeout=10).json()["model"]["name"] == "echo"
    served = httpx.get(locked.url + "/metrics", headers=auth, timeout=10).text
    assert 'modelpool_rejected_total{reason="unauthorized"}' in served
    # The probe port (the kubelet's, the operator's and Prometheus's) answers both without a key.
    probes = f"http://127.0.0.1:{PROBE_PORT}"
    assert httpx.get(probes + "/stats", timeout=10).json()["model"]["name"] == "echo"
    metrics = httpx.get(probes + "/metrics", timeout=10)
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert 'modelpool_rejected_total{reason="unauthorized"}' in metrics.text
    assert "modelpool_queue_depth 0.0" in metrics.text


def test_authorized_is_bearer_with_the_exact_key() -> None:
    key = KEY.encode()
    assert authorized(b"Bearer " + key, key) and authorized(b"bearer " + key, key)
    for header in (None, b"", b"Bearer", b"Bearer " + key + b"x", b"Basic " + key, key, b"Bearer  x"):
        assert not authorized(header, key), header


@pytest.mark.parametrize("content", [None, "", " \n"])
def test_a_missing_or_empty_key_file_exits_2(
    server: ServerFactory, tmp_path: Path, content: str | None
) -> None:
    key_file = tmp_path / "api-key"
    if content is not None:
        key_file.write_text(content)
    proc = server(*ECHO, "--api-key-file", str(key_file), wait="none")
    assert proc.wait_exit() == EXIT_CONFIG
    assert "--api-key-file" in proc.log()
