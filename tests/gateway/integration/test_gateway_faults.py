"""The gateway when the API server goes away: it turns unready, naming the stale watches, once they have
been failing longer than ``--watch-stale-seconds``, and ready again when they list again.

The outage is a TCP proxy of the test's own between the gateway and the shared test cluster's API server
(the gateway's kubeconfig names the proxy): stopping the proxy cuts the gateway off without touching the
API server that other tests use."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from testkit.cluster import Cluster
from testkit.kubectl import apply, wait_for
from tests.gateway.integration.conftest import StartGateway
from tests.gateway.integration.gwharness import echo_pool

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


class TcpProxy:
    """Forwards connections from a loopback port to ``target``; ``stop()`` closes the port and every
    connection, ``start()`` listens again on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        # Bumped by stop(): a connection accepted by an earlier start is closed, never served.
        self._generation = 0

    def start(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener, self._generation), daemon=True).start()

    def stop(self) -> None:
        assert self._listener is not None
        with self._lock:
            self._generation += 1
            conns, self._conns = self._conns, []
        with contextlib.suppress(OSError):  # wakes the accepting thread (close alone does not, on Linux)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket, generation: int) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # stopped
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                stopped = generation != self._generation
                if not stopped:
                    self._conns += [client, upstream]
            if stopped:
                client.close()
                upstream.close()
                return
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for conn in (source, sink):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxied(crds: Cluster, tmp_path: Path) -> Iterator[tuple[TcpProxy, Path]]:
    """A proxy to the API server and a kubeconfig that reaches the API server through it."""
    config = yaml.safe_load(crds.kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    scheme, _, hostport = cluster["server"].partition("://")
    host, _, port = hostport.rstrip("/").rpartition(":")
    proxy = TcpProxy((host, int(port)))
    proxy.start()
    cluster["server"] = f"{scheme}://127.0.0.1:{proxy.port}"
    path = tmp_path / "kubeconfig-proxied"
    path.write_text(yaml.safe_dump(config))
    yield proxy, path
    with contextlib.suppress(OSError):
        proxy.stop()


def test_readiness_follows_the_watches_through_an_api_server_outage(
    crds: Cluster, namespace: str, start_gateway: StartGateway, proxied: tuple[TcpProxy, Path]
) -> None:
    proxy, kubeconfig = proxied
    apply(crds, echo_pool("pool", replicas=0), namespace)
    gateway = start_gateway(
        [namespace],
        "--kubeconfig", str(kubeconfig),
        "--watch-stale-seconds", "2",
        "--watch-backoff-max-seconds", "0.5",
    )  # fmt: skip
    assert httpx.get(gateway.url + "/readyz", timeout=5).json()["stale"] == []

    proxy.stop()
    stale: list[str] = []

    def unready() -> bool:
        response = httpx.get(gateway.url + "/readyz", timeout=5)
        stale[:] = response.json()["stale"]
        # Each of the four (pools, pods, host pods, the key Secrets) named with how long it failed, its error.
        return response.status_code == 503 and len(stale) == 4

    wait_for(unready, timeout=30, interval=0.2, message="/readyz 503 naming the stale watches")
    assert any(s.startswith(f"pods@{namespace}: no successful list or watch for ") for s in stale), stale
    assert any(s.startswith(f"modelpools@{namespace}: ") for s in stale), stale
    assert httpx.get(gateway.url + "/v2/health/ready", timeout=5).status_code == 503
    # Routing goes on from what it last saw: the pool is still listed.
    assert "pool" in gateway.models()

    proxy.start()  # the same port: the API server is reachable again
    wait_for(
        lambda: httpx.get(gateway.url + "/readyz", timeout=5).status_code == 200,
        timeout=30,
        interval=0.2,
        message="/readyz 200 again",
    )
    assert httpx.get(gateway.url + "/readyz", timeout=5).json() == {
        "ready": True,
        "waitingFor": [],
        "stale": [],
    }
