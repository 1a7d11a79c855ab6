"""The real ``modelpool-gateway`` process and its bounds: 16 MiB of ``[{},{},...]`` (5.6 million dicts,
about 380 MiB of Python objects if parsed) is answered 413 while the process's peak memory grows by a
fraction of that, and the gateway answers the next request; its metrics are served on their own port,
and the clients' port answers 404 for them; its log is one JSON object a line by default, plain text lines
with ``--log-format plain``, the access lines with the request's id either way.  No API server is needed
for this: the gateway runs with ``--auth none`` and a kubeconfig naming a closed loopback port (its
watches fail and retry; the request path answers on), and what is tested happens before any pool is
looked up."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import psutil
import pytest

from testkit.environment import ROOT, free_port
from testkit.kubectl import wait_for

pytestmark = pytest.mark.slow
MIB = 2**20

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:%d"}}]
users: [{name: nobody, user: {token: none}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: nobody}}]
current-context: nowhere
"""


@dataclass(frozen=True)
class Gateway:
    url: str
    metrics_url: str
    proc: psutil.Process
    port: int
    log: Path


def peak_rss(pid: int) -> int:
    """The process's highest RSS so far (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


StartGateway = Callable[..., Gateway]


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator[StartGateway]:
    """Starts the real gateway with the given extra flags; stopped at the end of the test."""
    started: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []

    def start(*flags: str) -> Gateway:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(KUBECONFIG % free_port())
        port, metrics_port = free_port(), free_port()
        log_path = tmp_path / f"gateway-{len(started)}.log"
        log = log_path.open("wb")
        command = [str(ROOT / ".venv" / "bin" / "modelpool-gateway"), "--kubeconfig", str(kubeconfig)]
        command += ["--auth", "none", "--host", "127.0.0.1", "--port", str(port)]
        proc = subprocess.Popen(
            [*command, "--metrics-port", str(metrics_port), *flags], stdout=log, stderr=subprocess.STDOUT
        )
        started.append((proc, log))
        url = f"http://127.0.0.1:{port}"

        def live() -> bool:
            assert proc.poll() is None, log_path.read_text()
            return httpx.get(url + "/healthz", timeout=2).status_code == 200

        wait_for(live, timeout=60, message="the gateway answering /healthz")
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        return Gateway(url, metrics_url, psutil.Process(proc.pid), port, log_path)

    yield start
    for proc, log in started:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture
def gateway(start_gateway: StartGateway) -> Gateway:
    return start_gateway()


def test_16_mib_of_empty_dicts_is_refused_with_413_and_bounded_memory(
    gateway: Gateway,
) -> None:
    url, proc = gateway.url, gateway.proc
    body = b"[" + b"{}," * (16 * MIB // 3 - 1) + b"{}]"
    assert len(body) <= 16 * MIB  # within --max-request-bytes: only the item bound refuses it
    # A small request first, so the peak below is the big one's (buffers, imports, the first parse).
    with httpx.Client(timeout=60) as client:
        warm = client.post(url + "/v1/embeddings", json={"model": "none", "input": ["x"]})
        assert warm.status_code == 404, warm.text
        before = peak_rss(proc.pid)
        response = client.post(url + "/v1/embeddings", content=body)
        grown = peak_rss(proc.pid) - before
        assert response.status_code == 413, response.text
        assert "JSON items" in response.json()["error"]["message"]
        # The body itself is held while it is read and scanned (16 MiB, and once more joined): nothing
        # near the 380 MiB of its parse.
        assert grown < 80 * MIB, f"the peak RSS grew by {grown / MIB:.0f} MiB"
        again = client.post(url + "/v1/embeddings", json={"model": "none", "input": ["x"]})
        assert again.status_code == 404, again.text
        metrics = httpx.get(gateway.metrics_url, timeout=5).text
        assert 'modelpool_gateway_refused_total{pool="",reason="too_many_items"} 1.0' in metrics


def test_the_metrics_are_on_their_own_port_and_the_clients_port_answers_404(gateway: Gateway) -> None:
    metrics = httpx.get(gateway.metrics_url, timeout=5)
    assert metrics.status_code == 200 and "modelpool_gateway_requests_total" in metrics.text
    for path in ("/metrics", "/metrics/"):
        response = httpx.get(gateway.url + path, timeout=5)
        assert response.status_code == 404, response.text
        assert "modelpool_gateway" not in response.text


def connect(gateway: Gateway) -> socket.socket:
    return socket.create_connection(("127.0.0.1", gateway.port), timeout=5)


def closed(sock: socket.socket) -> bool:
    """Whether the gateway has closed ``sock`` (what it wrote first is read and dropped)."""
    sock.settimeout(0.05)
    try:
        while data := sock.recv(65536):
            del data
        return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_a_client_trickling_its_headers_is_cut_off_within_the_header_deadline(
    start_gateway: StartGateway,
) -> None:
    gateway = start_gateway("--header-timeout-seconds", "1")
    idle = connect(gateway)  # a connection that never sends a byte is closed too
    with connect(gateway) as trickler:
        trickler.sendall(b"POST /v1/embeddings HTTP/1.1\r\nhost: gw\r\nx-slow: ")
        started = time.monotonic()
        answer = b""
        trickler.settimeout(0.1)
        while time.monotonic() - started < 10:
            try:
                chunk = trickler.recv(4096)
            except TimeoutError:
                try:
                    trickler.send(b"x")  # one more header byte, never the end of the line
                except OSError:
                    break
                continue
            except ConnectionError:
                break
            if not chunk:
                break
            answer += chunk
        took = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert took < 2.5, f"cut off after {took:.1f} s (deadline 1 s)"
    assert wait_for(lambda: closed(idle), timeout=3, message="the idle connection closed")
    idle.close()
    # An honest request is not affected.
    assert httpx.get(gateway.url + "/healthz", timeout=5).status_code == 200


def test_connections_past_the_cap_are_refused_503_and_honest_ones_served_again(
    start_gateway: StartGateway,
) -> None:
    gateway = start_gateway("--max-connections", "3", "--header-timeout-seconds", "2")
    hogs = [connect(gateway) for _ in range(3)]  # connections that send nothing fill the cap
    try:
        # Wait until the gateway has taken them all (its accept queue is served in turn).
        refused = wait_for(
            lambda: (r := httpx.get(gateway.url + "/healthz", timeout=5)).status_code == 503 and r,
            timeout=5,
            message="a connection past the cap refused",
        )
        assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
        # The hogs are cut off by the header deadline: honest requests are served again, no one's help
        # needed.
        assert wait_for(lambda: all(closed(h) for h in hogs), timeout=5, message="the hogs closed")
        served = wait_for(
            lambda: httpx.get(gateway.url + "/healthz", timeout=5).status_code == 200,
            timeout=5,
            message="an honest request served",
        )
        assert served
    finally:
        for hog in hogs:
            hog.close()


def access_lines(gateway: Gateway, request_id: str) -> list[str]:
    return [line for line in gateway.log.read_text().splitlines() if request_id in line]


def test_the_log_is_json_and_the_access_line_carries_the_request_id(gateway: Gateway) -> None:
    response = httpx.get(gateway.url + "/v1/models", headers={"x-request-id": "json-1"}, timeout=5)
    assert response.status_code == 200 and response.headers["x-request-id"] == "json-1"
    wait_for(lambda: access_lines(gateway, "json-1"), timeout=10, interval=0.05, message="the access line")
    [line] = access_lines(gateway, "json-1")
    access = json.loads(line)
    assert (access["logger"], access["status"], access["path"]) == (
        "modelpool.gateway.access",
        200,
        "/v1/models",
    )
    assert access["key"] == ""  # --auth none: no key
    assert all(json.loads(line) for line in gateway.log.read_text().splitlines())


def test_the_plain_setting_gives_plain_lines(start_gateway: StartGateway) -> None:
    gateway = start_gateway("--log-format", "plain")
    response = httpx.get(gateway.url + "/v1/models", headers={"x-request-id": "plain-1"}, timeout=5)
    assert response.headers["x-request-id"] == "plain-1"
    wait_for(lambda: access_lines(gateway, "plain-1"), timeout=10, interval=0.05, message="the access line")
    [line] = access_lines(gateway, "plain-1")
    assert " INFO [gateway] modelpool.gateway.access GET /v1/models 200 " in line
    assert "request_id=plain-1" in line and "status=200" in line
    assert not any(line.startswith("{") for line in gateway.log.read_text().splitlines())
