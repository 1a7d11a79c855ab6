"""The real ``modelpool-gateway`` routing shared pools (``spec.host``) to the host pods that hold their model,
as the operator records it on them (``modelpool_contract.placements``), on the real API server.

The host pods are plain pods that no scheduler takes (``schedulerName`` of none), their status written by
the test as a kubelet would (Ready, a loopback pod IP), their ``http`` port one of the test's own loopback
HTTP servers standing in for a host: it answers with its name and the model it was asked for, and holds
each request while its gate is closed.  No operator runs: the test writes the placement annotation and a
pool's status conditions itself, in the operator's shapes.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from modelpool_contract.labels import HTTP_PORT_NAME, SERVER_CONTAINER
from modelpool_contract.placements import ANNOTATION_MODELS, LABEL_HOST, models_annotation
from testkit.cluster import Cluster
from testkit.kubectl import apply, get_json, wait_for
from testkit.services import GROUP_VERSION, POOLS
from tests.gateway.integration.gwharness import GatewayProcess

pytestmark = pytest.mark.cluster

HOST = "gpu"
SERVED = "Team/minilm"
# The hold bound of the test's pools: a held request is answered within it.
ACTIVATION_S = 2
WAIT_S = 20


@dataclass
class FakeHost:
    """A loopback HTTP server standing in for one host pod: records (model) per request, answers
    ``{"host": name, "model": ...}``, and holds requests while ``gate`` is clear."""

    name: str
    gate: threading.Event = field(default_factory=threading.Event)
    arrived: list[str] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    def start(self) -> int:
        host = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                host.arrived.append(str(body.get("model")))
                host.gate.wait(WAIT_S)
                answer = json.dumps({"host": host.name, "model": body.get("model")}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.gate.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def host_pod(name: str, port: int) -> dict[str, Any]:
    """A host pod no scheduler takes: the test plays its kubelet."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_HOST: HOST}},
        "spec": {
            "schedulerName": "no-scheduler",
            "containers": [
                {
                    "name": SERVER_CONTAINER,
                    "image": "modelpool-server",
                    "ports": [{"name": HTTP_PORT_NAME, "containerPort": port}],
                }
            ],
        },
    }


def shared_pool(name: str, served: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"source": "/models/tiny", "task": "text-embedding"},
        "resources": {"memory": "1Gi"},
        "host": HOST,
        "activationTimeoutSeconds": ACTIVATION_S,
    }
    if served:
        spec["servedModelName"] = served
    return {"apiVersion": GROUP_VERSION, "kind": "ModelPool", "metadata": {"name": name}, "spec": spec}


@dataclass
class Setup:
    cluster: Cluster
    namespace: str
    gateway: GatewayProcess
    hosts: dict[str, FakeHost]

    def place(self, pod: str, models: dict[str, Any]) -> None:
        """The operator's record of what ``pod`` holds."""
        annotation = json.dumps({ANNOTATION_MODELS: models_annotation(models)})
        patch = f'{{"metadata": {{"annotations": {annotation}}}}}'
        self.cluster.kubectl("patch", "pod", pod, "-n", self.namespace, "--type=merge", "-p", patch)

    def embed(self, model: str, timeout: float = WAIT_S) -> httpx.Response:
        return httpx.post(
            self.gateway.url + "/v1/embeddings",
            json={"model": model, "input": ["a"]},
            headers=self.gateway.headers,
            timeout=timeout,
        )

    def serving(self, pool: str) -> int:
        entry = self.gateway.models().get(pool, {})
        return int(entry.get("modelpool", {}).get("servingWorkers", -1))


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    namespace = f"gwshared-{uuid.uuid4().hex[:8]}"
    crds.kubectl("create", "namespace", namespace)
    hosts = {name: FakeHost(name) for name in ("gpu-0", "gpu-1", "gpu-2")}
    gateway: GatewayProcess | None = None
    try:
        for host in hosts.values():
            apply(crds, host_pod(host.name, host.start()), namespace)
            ready = {
                "status": {
                    "phase": "Running",
                    "podIP": "127.0.0.1",
                    "podIPs": [{"ip": "127.0.0.1"}],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            }
            crds.kubectl(
                "patch", "pod", host.name, "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps(ready),
            )  # fmt: skip
        apply(crds, shared_pool("minilm", SERVED), namespace)
        apply(crds, shared_pool("lonely"), namespace)
        gateway = GatewayProcess(crds, [namespace], tmp_path_factory.mktemp("gw-shared") / "gateway.log")
        gateway.wait_ready()
        yield Setup(crds, namespace, gateway, hosts)
    finally:
        for host in hosts.values():
            host.stop()
        code = gateway.stop() if gateway is not None else 0
        crds.kubectl("delete", POOLS, "--all", "-n", namespace, "--wait=false", check=False)
        crds.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        assert code == 0, gateway.log_tail() if gateway else ""


def test_awake_hosts_first_the_least_loaded_of_them_then_sleeping_then_held(setup: Setup) -> None:
    hosts = setup.hosts
    setup.place("gpu-0", {"minilm": "Ready", "other": "Sleeping"})
    setup.place("gpu-1", {"minilm": "Idle"})
    setup.place("gpu-2", {"minilm": "Sleeping"})
    wait_for(lambda: setup.serving("minilm") == 2, timeout=WAIT_S, interval=0.2, message="two awake hosts")

    with ThreadPoolExecutor(4) as pool:
        # One request held at whichever awake host gets it first; that host is then the more loaded one.
        first: Future[httpx.Response] = pool.submit(setup.embed, "minilm")
        wait_for(lambda: any(h.arrived for h in hosts.values()), timeout=WAIT_S, message="the first request")
        busy = next(h for h in hosts.values() if h.arrived)
        assert busy.name in ("gpu-0", "gpu-1")
        other = hosts["gpu-1" if busy.name == "gpu-0" else "gpu-0"]
        other.gate.set()
        hosts["gpu-2"].gate.set()
        # Every next request goes to the less loaded awake host: never the busy one, never the sleeping one.
        for _ in range(4):
            answer = setup.embed(SERVED)  # the alias: the host gets the pool's name
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"host": other.name, "model": "minilm"}
            assert answer.headers["x-modelpool-worker"] == other.name
        busy.gate.set()
        assert first.result(WAIT_S).json() == {"host": busy.name, "model": "minilm"}
    assert hosts["gpu-2"].arrived == []

    # Awake nowhere: the sleeping one (the host wakes it on the request).
    setup.place("gpu-0", {"minilm": "Waking", "other": "Sleeping"})
    setup.place("gpu-1", {})
    wait_for(lambda: setup.serving("minilm") == 1, timeout=WAIT_S, interval=0.2, message="the sleeping host")
    answer = setup.embed("minilm")
    assert answer.status_code == 200 and answer.json()["host"] == "gpu-2", answer.text

    # Loading or waking only: held, and answered with why when the hold ends ...
    setup.place("gpu-2", {"minilm": "Loading"})
    wait_for(lambda: setup.serving("minilm") == 0, timeout=WAIT_S, interval=0.2, message="no host ready")
    held = setup.embed("minilm")
    assert held.status_code == 503, held.text
    error = held.json()["error"]
    # gpu-0 wakes it, gpu-2 loads it: the one closest to serving is named.
    assert error["type"] == "waking" and "host pod gpu-0 has it Waking (and 1 more)" in error["message"], (
        error
    )
    # ... or released to the host where it wakes, once it is awake there.
    with ThreadPoolExecutor(1) as pool:
        released = pool.submit(setup.embed, "minilm")
        wait_for(lambda: setup.gateway.metric("modelpool_gateway_held_requests") == 1, timeout=WAIT_S,
                 interval=0.05, message="the request held")  # fmt: skip
        setup.place("gpu-0", {"minilm": "Ready"})
        answer = released.result(WAIT_S)
    assert answer.status_code == 200 and answer.json()["host"] == "gpu-0", answer.text


def test_a_pool_on_no_host_is_held_for_the_operator_and_gets_its_reason(setup: Setup) -> None:
    why = "no host of ModelHost gpu has room for 1Gi: every device is full of awake models"
    status = {
        "status": {
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "Unplaceable",
                    "message": why,
                    "lastTransitionTime": "2026-11-27T14:00:00Z",
                }
            ]
        }
    }
    setup.cluster.kubectl(
        "patch", POOLS, "lonely", "-n", setup.namespace, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    wait_for(
        lambda: "lonely" in setup.gateway.models(), timeout=WAIT_S, interval=0.2, message="the pool listed"
    )

    def degraded_seen() -> bool:
        answer = setup.embed("lonely")
        assert answer.status_code == 503, answer.text
        return bool(answer.json()["error"]["type"] == "failed")

    wait_for(degraded_seen, timeout=WAIT_S, interval=0.2, message="the operator's reason")
    answer = setup.embed("lonely")
    assert answer.status_code == 503 and why in answer.json()["error"]["message"], answer.text
    # Held, not refused: the demand is recorded for the operator, which may place the pool meanwhile.
    lease = get_json(setup.cluster, "lease", "lonely-demand", "-n", setup.namespace)
    assert lease["spec"]["renewTime"], lease
    assert all("lonely" not in h.arrived for h in setup.hosts.values())
