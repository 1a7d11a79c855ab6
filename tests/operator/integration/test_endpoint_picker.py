"""The real endpoint picker in front of a pool's workers (issue 33, item 2): the Gateway API Inference
Extension's EPP (v1.5.0, built from its Go module by hack/epp.sh) watches the InferencePool the operator made
for the pool, scrapes the workers' probe ports for the vLLM names they export, and, asked through its
ext_proc API as Envoy asks it (hack/extproc-client, ours: no Envoy here), sends each request to the least
loaded worker: the idle one while the other has a queue, the other way round once the queues turn.

The workers are real ``modelpool-server`` processes on the process node (their pod IPs are loopback
addresses the EPP reaches), with the streaming echo generation handler
(``testkit.echo_models:EchoGeneration``, named as the server imports it), whose streams wait after their
first piece until the test's gate file exists: a worker holds one running and the rest queued.
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit import prom
from testkit.cluster import Cluster
from testkit.echo_models import GENERATION
from testkit.environment import ROOT, free_port
from testkit.kubectl import apply, get_json, wait_for
from testkit.services import echo_pool
from tests.operator.integration.opharness import (
    INFERENCE_POOL_CRD_NAME,
    StartOperator,
    install_inference_pool_crd,
    remove_inference_pool_crd,
    states,
    wait_status,
    worker_pods,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@dataclass(frozen=True)
class Tools:
    epp: Path
    client: Path


@pytest.fixture(scope="module")
def tools() -> Tools:
    """The EPP and our ext_proc client, built once (hack/epp.sh keeps what it built)."""
    done = subprocess.run(
        ["bash", str(ROOT / "hack" / "epp.sh")], check=False, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-4000:]
    epp, client = done.stdout.split()[-2:]
    return Tools(Path(epp), Path(client))


@dataclass
class Picker:
    """A running EPP for one InferencePool; ``ask`` is one request's pick."""

    process: subprocess.Popen[bytes]
    client: Path
    address: str
    log: Path

    def ask(self, model: str) -> str:
        """Where the picker sends a completion for ``model`` (a prompt of its own each time, so the
        prefix-cache scorer has nothing to prefer)."""
        body = json.dumps({"model": model, "prompt": f"{uuid.uuid4().hex} hi", "max_tokens": 4})
        args = [str(self.client), "-addr", self.address, "-body", body]
        done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr + self.log.read_text()[-4000:]
        return done.stdout.strip()


@pytest.fixture
def start_picker(tools: Tools, crds: Cluster, tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(namespace: str, pool: str, metrics_port: int) -> Picker:
        grpc = free_port()
        log = tmp_path / "epp.log"
        args = [
            str(tools.epp), f"--pool-name={pool}", f"--pool-namespace={namespace}", f"--grpc-port={grpc}",
            f"--grpc-health-port={free_port()}", f"--metrics-port={free_port()}", "--secure-serving=false",
            "--metrics-endpoint-auth=false", "--tracing=false", "--enable-pprof=false",
            # The workers' metrics are on their probe port, not the pool's target port.
            f"--model-server-metrics-port={metrics_port}",
        ]  # fmt: skip
        env = {"KUBECONFIG": str(crds.kubeconfig), "PATH": "/usr/bin:/bin"}
        with log.open("wb") as out:
            process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        started.append(process)
        return Picker(process, tools.client, f"127.0.0.1:{grpc}", log)

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


def _stream(url: str, prompt: str, codes: list[int]) -> None:
    body = {"model": "llm", "prompt": prompt, "max_tokens": 10, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        codes.append(response.status_code)
        for _ in response.iter_lines():
            pass


def _waiting(ip: str, probe_port: int) -> float | None:
    text = httpx.get(f"http://{ip}:{probe_port}/metrics", timeout=5).text
    return prom.sample(prom.samples(text), "vllm:num_requests_waiting")


def test_the_real_picker_sends_each_request_to_the_least_loaded_worker(
    crds: Cluster, namespace: str, start_operator: StartOperator, start_picker: Any, tmp_path: Path
) -> None:
    cluster = crds
    install_inference_pool_crd(cluster)
    try:
        _drive(cluster, namespace, start_operator, start_picker, tmp_path)
    finally:
        cluster.kubectl(
            "delete", INFERENCE_POOL_CRD_NAME, "--all", "-n", namespace, "--wait=false", check=False
        )
        remove_inference_pool_crd(cluster)


def _picks(picker: Any) -> set[str]:
    """Where the picker sends six requests in a row."""
    return {picker.ask("llm") for _ in range(6)}


def _drive(
    cluster: Cluster, namespace: str, start_operator: StartOperator, start_picker: Any, tmp: Path
) -> None:
    port, probe_port, gate = free_port(), free_port(), tmp / "emit-gate"
    start_operator(
        namespace,
        MODELPOOL_OPERATOR_SERVER_PORT=str(port),
        MODELPOOL_OPERATOR_SERVER_PROBE_PORT=str(probe_port),
        MODELPOOL_OPERATOR_INFERENCE_POOLS_ENABLED="true",
        MODELPOOL_OPERATOR_ALLOWED_ENV_NAMES="MODELPOOL_HANDLER,PYTHONPATH,HANDLER_EMIT_GATE",
    )
    pool = echo_pool("llm", replicas=2, handler=GENERATION, task="text-generation",
                     env={"HANDLER_EMIT_GATE": str(gate)})  # fmt: skip
    pool["spec"]["inferencePool"] = {"endpointPicker": "epp", "pickerPodLabels": {"app": "epp"}}
    apply(cluster, pool, namespace)
    wait_status(cluster, namespace, "llm", lambda s: states(s) == ["Ready", "Ready"], timeout=240,
                message="two workers Ready")  # fmt: skip
    made = get_json(cluster, INFERENCE_POOL_CRD_NAME, "llm", "-n", namespace)
    assert made["spec"]["targetPorts"] == [{"number": port}]
    a, b = sorted(p["status"]["podIP"] for p in worker_pods(cluster, namespace, "llm"))
    picker = start_picker(namespace, "llm", probe_port)
    # The picker knows both workers once it has scraped them: with nothing queued, either may be picked.
    wait_for(lambda: {picker.ask("llm") for _ in range(8)} == {f"{a}:{port}", f"{b}:{port}"}, timeout=120,
             interval=0.5, message="the picker sends to both idle workers")  # fmt: skip

    codes: list[int] = []
    streams: list[threading.Thread] = []

    def load(ip: str, count: int) -> None:
        for i in range(count):
            thread = threading.Thread(
                target=_stream, args=(f"http://{ip}:{port}", f"{ip} {i} two three", codes)
            )
            thread.start()
            streams.append(thread)

    try:
        # a: one stream running, two queued. The picker sends every request to b.
        load(a, 3)
        wait_for(lambda: _waiting(a, probe_port) == 2, timeout=60, message="two queued on a")
        # The picker reads each worker's metrics on its own refresh: within it, every pick is b's.
        wait_for(lambda: _picks(picker) == {f"{b}:{port}"}, timeout=10, interval=0.2, message="only b picked")
        # b: one running, three queued, more than a: now every request goes to a.
        load(b, 4)
        wait_for(lambda: _waiting(b, probe_port) == 3, timeout=60, message="three queued on b")
        wait_for(lambda: _picks(picker) == {f"{a}:{port}"}, timeout=10, interval=0.2, message="only a picked")
    finally:
        gate.touch()
        for thread in streams:
            thread.join(timeout=120)
    # Every stream was answered: the queued ones that outwaited the pool's request timeout with 504, as the
    # worker's queue answers a request past its deadline (what was sent to the picker was never run).
    assert len(codes) == 7 and set(codes) <= {200, 504}, codes
