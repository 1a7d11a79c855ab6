"""The real ``modelpool-gateway`` process and its bounds: 16 MiB of ``[{},{},...]`` (5.6 million dicts,
about 380 MiB of Python objects if parsed) is answered 413 while the process's peak memory grows by a
fraction of that, and the gateway answers the next request; its metrics are served on their own port,
and the clients' port answers 404 for them.  No API server is needed for this: the gateway runs with
``--auth none`` and a kubeconfig naming a closed loopback port (its watches fail and retry; the request
path answers on), and what is tested happens before any pool is looked up."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

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


def peak_rss(pid: int) -> int:
    """The process's highest RSS so far (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG % free_port())
    port, metrics_port = free_port(), free_port()
    log = (tmp_path / "gateway.log").open("wb")
    command = [str(ROOT / ".venv" / "bin" / "modelpool-gateway"), "--kubeconfig", str(kubeconfig)]
    command += ["--auth", "none", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--metrics-port", str(metrics_port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def live() -> bool:
        assert proc.poll() is None, (tmp_path / "gateway.log").read_text()
        return httpx.get(url + "/healthz", timeout=2).status_code == 200

    try:
        wait_for(live, timeout=60, message="the gateway answering /healthz")
        yield Gateway(url, f"http://127.0.0.1:{metrics_port}/metrics", psutil.Process(proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


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
