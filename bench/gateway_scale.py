"""The gateway at scale (``python -m bench.controlplane --gateway``): what a gateway watching every pool of
the big cluster adds to a request, beside one watching 10 pools, in the same run.

After the control-plane measurement, with the operator still running, a namespace of 10 pools is added (an
echo pool of one worker on the process node, ``bench.gateway``'s, and 9 one-worker KWOK pools), and two
gateways are started with API keys on (the default; a key Secret granting every namespace in a keys
namespace of the bench's own): *small* watches that namespace only (10 pools), *big* every namespace (the
bench's pools too). One client then sends sequential echo requests, rotating direct -> small -> big (each
round starts at a different one), so the machine's drift hits all three alike; each gateway's added
latency is its p50 minus the direct p50 of the same round, the reported figure the median over rounds.
Each gateway's RSS is read after the requests, with its peak (``VmHWM``: the initial list of every pod).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import statistics
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.controlplane import wait
from bench.gateway import ECHO_HANDLER, pool
from modelpool_contract.gateway_keys import KEY_FIELD, KEY_LABEL_VALUE, LABEL_GATEWAY_KEY, NAMESPACES_FIELD
from modelpool_contract.labels import LABEL_POOL
from testkit.corpus import corpus
from testkit.environment import BIN, ROOT
from testkit.kubectl import kubectl
from testkit.load import Connection, raw_request, v2_body

SMALL_POOLS = 10
TARGETS = ("direct", "small", "big")


@dataclass
class GatewayScale:
    """The two gateways side by side: pools each watches, added p50 latency (ms) and RSS (MiB)."""

    small_pools: int
    big_pools: int
    direct_p50_ms: float
    small_added_p50_ms: float
    big_added_p50_ms: float
    big_over_small: float
    small_rss_mib: float
    big_rss_mib: float
    small_peak_rss_mib: float
    big_peak_rss_mib: float
    rounds: list[dict[str, float]]


def small_pools(namespace: str) -> list[dict[str, Any]]:
    """The echo pool on the process node and ``SMALL_POOLS - 1`` one-worker KWOK pools."""
    echo = pool("echo", "/", {"MODELPOOL_HANDLER": ECHO_HANDLER, "PYTHONPATH": str(ROOT)}, "1Gi", 32)
    echo["metadata"]["namespace"] = namespace
    kwok = [
        {
            "apiVersion": "modelpool.dev/v1alpha1",
            "kind": "ModelPool",
            "metadata": {"name": f"small-{i}", "namespace": namespace},
            "spec": {
                "model": {"source": "/models/bench", "task": "text-embedding"},
                "replicas": 1,
                "resources": {"memory": "1Gi", "gpus": 0},
                "podTemplate": {
                    "nodeSelector": {"type": "kwok"},
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                },
            },
        }
        for i in range(SMALL_POOLS - 1)
    ]
    return [echo, *kwok]


def key_secret(namespace: str, key: str) -> dict[str, Any]:
    """A gateway key Secret granting every namespace (as an administrator makes one)."""
    data = {KEY_FIELD: key, NAMESPACES_FIELD: "*"}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "bench-all-pools",
            "namespace": namespace,
            "labels": {LABEL_GATEWAY_KEY: KEY_LABEL_VALUE},
        },
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
    }


def _free_port() -> int:
    from testkit.environment import free_port

    return free_port()


def _start_gateway(
    kubeconfig: Path, keys_namespace: str, namespace: str | None, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    flags = ["--namespace", namespace] if namespace else []
    proc = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "modelpool-gateway"), "--kubeconfig", str(kubeconfig), *flags,
         "--keys-namespace", keys_namespace, "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def _echo_url(kubeconfig: Path, namespace: str, port: int) -> str | None:
    pods = json.loads(
        kubectl(kubeconfig, "get", "pods", "-n", namespace, "-l", f"{LABEL_POOL}=echo", "-o", "json")
    )
    for pod in pods["items"]:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in pod["status"].get("conditions") or []
        )
        if ready and pod["status"].get("podIP"):
            return f"http://{pod['status']['podIP']}:{port}"
    return None


def _serving(url: str, key: str) -> bool:
    try:
        models = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
    except (httpx.HTTPError, ValueError):
        return False
    return any(
        m["modelpool"]["pool"] == "echo" and m["modelpool"]["servingWorkers"] >= 1 for m in models["data"]
    )


async def _round(urls: dict[str, str], key: str, pairs: int, first: int) -> dict[str, float]:
    """``pairs`` requests to each target, rotating; the p50 (ms) of each."""
    texts = corpus(64, seed=1)
    conns, requests = {}, {}
    for name, url in urls.items():
        parsed = httpx.URL(url)
        host, port = parsed.host, parsed.port or 80
        conns[name] = Connection(host, port)
        await conns[name].open()
        auth = {} if name == "direct" else {"Authorization": f"Bearer {key}"}
        bodies = [v2_body(texts[i : i + 1], binary=False) for i in range(64)]
        requests[name] = [
            raw_request(host, port, "/v2/models/echo/infer", b, {**h, **auth}) for b, h in bodies
        ]
    times: dict[str, list[float]] = {name: [] for name in urls}
    for i in range(pairs):
        shift = (first + i) % len(TARGETS)
        for name in TARGETS[shift:] + TARGETS[:shift]:
            started = time.perf_counter()
            code, _ = await conns[name].request(requests[name][i % 64])
            if code != 200:
                raise RuntimeError(f"{name}: HTTP {code}")
            times[name].append(time.perf_counter() - started)
    for conn in conns.values():
        await conn.close()
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def _rss(proc: subprocess.Popen[bytes]) -> tuple[float, float]:
    """(RSS, peak RSS) in MiB."""
    rss = psutil.Process(proc.pid).memory_info().rss / 2**20
    peak = rss
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return rss, peak


def measure(
    kubeconfig: Path, workdir: Path, worker_port: int, rounds: int = 5, pairs: int = 300
) -> GatewayScale:
    """Add the small namespace, start both gateways, measure, stop them and delete what was added."""
    small_ns, keys_ns = f"bench-small-{uuid.uuid4().hex[:6]}", f"bench-keys-{uuid.uuid4().hex[:6]}"
    key = secrets.token_urlsafe(24)
    kubectl(kubeconfig, "create", "namespace", small_ns)
    kubectl(kubeconfig, "create", "namespace", keys_ns)
    kubectl(kubeconfig, "apply", "-f", "-", stdin=json.dumps(key_secret(keys_ns, key)))
    kubectl(
        kubeconfig,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": small_pools(small_ns)}),
    )
    procs: list[subprocess.Popen[bytes]] = []
    try:
        wait(
            lambda: _echo_url(kubeconfig, small_ns, worker_port) is not None, 600, "the echo worker Ready", 2
        )
        direct = str(_echo_url(kubeconfig, small_ns, worker_port))
        small, small_url = _start_gateway(kubeconfig, keys_ns, small_ns, workdir / "gateway-small.log")
        procs.append(small)
        big, big_url = _start_gateway(kubeconfig, keys_ns, None, workdir / "gateway-big.log")
        procs.append(big)
        wait(
            lambda: _serving(small_url, key) and _serving(big_url, key),
            600,
            "echo serving through both gateways",
            interval=2,
        )
        urls = {"direct": direct, "small": small_url, "big": big_url}
        asyncio.run(_round(urls, key, 50, 0))  # warm-up: connections, caches
        results = []
        for r in range(rounds):
            p50 = asyncio.run(_round(urls, key, pairs, r))
            results.append(p50)
            print(f"  gateway round {r}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in p50.items()), flush=True)
        (small_rss, small_peak), (big_rss, big_peak) = _rss(small), _rss(big)
        big_pools = len(json.loads(kubectl(kubeconfig, "get", "modelpools", "-A", "-o", "json"))["items"])
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        subprocess.run(
            [str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), "delete", "modelpools.modelpool.dev",
             "--all", "-n", small_ns, "--timeout=120s"],
            capture_output=True, timeout=180, check=False,
        )  # fmt: skip
    small_added = statistics.median(r["small"] - r["direct"] for r in results)
    big_added = statistics.median(r["big"] - r["direct"] for r in results)
    return GatewayScale(
        small_pools=SMALL_POOLS,
        big_pools=big_pools,
        direct_p50_ms=statistics.median(r["direct"] for r in results),
        small_added_p50_ms=small_added,
        big_added_p50_ms=big_added,
        big_over_small=big_added / small_added if small_added > 0 else float("nan"),
        small_rss_mib=small_rss,
        big_rss_mib=big_rss,
        small_peak_rss_mib=small_peak,
        big_peak_rss_mib=big_peak,
        rounds=results,
    )
