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
import json
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.gateway import pool
from bench.kwok import kwok_pool, wait
from modelpool_contract.labels import LABEL_POOL
from testkit.cluster import reused_cluster
from testkit.corpus import corpus
from testkit.echo_models import ECHO
from testkit.environment import ROOT
from testkit.kubectl import kubectl
from testkit.load import Connection, raw_request, v2_body
from testkit.services import GatewayProcess, bearer, create_key

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
    echo = pool("echo", "/", {"MODELPOOL_HANDLER": ECHO, "PYTHONPATH": str(ROOT)}, "1Gi", 32)
    echo["metadata"]["namespace"] = namespace
    kwok = [kwok_pool(f"small-{i}", namespace, 1) for i in range(SMALL_POOLS - 1)]
    return [echo, *kwok]


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


def _serving(gateway: GatewayProcess) -> bool:
    try:
        models = gateway.models(timeout=30)
    except (httpx.HTTPError, ValueError):
        return False
    return int(models.get("echo", {}).get("modelpool", {}).get("servingWorkers", 0)) >= 1


async def _round(urls: dict[str, str], key: str, pairs: int, first: int) -> dict[str, float]:
    """``pairs`` requests to each target, rotating; the p50 (ms) of each."""
    texts = corpus(64, seed=1)
    conns, requests = {}, {}
    for name, url in urls.items():
        parsed = httpx.URL(url)
        host, port = parsed.host, parsed.port or 80
        conns[name] = Connection(host, port)
        await conns[name].open()
        auth = {} if name == "direct" else bearer(key)
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


def _rss(gateway: GatewayProcess) -> tuple[float, float]:
    """(RSS, peak RSS) in MiB."""
    return gateway.rss_bytes() / 2**20, gateway.peak_rss_bytes() / 2**20


def measure(
    kubeconfig: Path, workdir: Path, worker_port: int, rounds: int = 5, pairs: int = 300
) -> GatewayScale:
    """Add the small namespace, start both gateways, measure, stop them and delete what was added."""
    small_ns, keys_ns = f"bench-small-{uuid.uuid4().hex[:6]}", f"bench-keys-{uuid.uuid4().hex[:6]}"
    cluster = reused_cluster(kubeconfig)
    cluster.kubectl("create", "namespace", small_ns)
    cluster.kubectl("create", "namespace", keys_ns)
    # One key Secret granting every namespace, as an administrator makes one; both gateways read it.
    key = create_key(cluster, keys_ns, "bench-all-pools", namespaces="*")
    kubectl(
        kubeconfig,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": small_pools(small_ns)}),
    )
    flags = ("--keys-namespace", keys_ns, "--log-level", "warning")
    gateways: list[GatewayProcess] = []
    try:
        wait(
            lambda: _echo_url(kubeconfig, small_ns, worker_port) is not None, 600, "the echo worker Ready", 2
        )
        direct = str(_echo_url(kubeconfig, small_ns, worker_port))
        small = GatewayProcess(cluster, [small_ns], workdir / "gateway-small.log", *flags, key=key)
        gateways.append(small)
        big = GatewayProcess(cluster, [], workdir / "gateway-big.log", *flags, key=key)  # every namespace
        gateways.append(big)
        wait(
            lambda: _serving(small) and _serving(big),
            600,
            "echo serving through both gateways",
            interval=2,
        )
        urls = {"direct": direct, "small": small.url, "big": big.url}
        asyncio.run(_round(urls, key, 50, 0))  # warm-up: connections, caches
        results = []
        for r in range(rounds):
            p50 = asyncio.run(_round(urls, key, pairs, r))
            results.append(p50)
            print(f"  gateway round {r}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in p50.items()), flush=True)
        (small_rss, small_peak), (big_rss, big_peak) = _rss(small), _rss(big)
        big_pools = len(json.loads(kubectl(kubeconfig, "get", "modelpools", "-A", "-o", "json"))["items"])
    finally:
        for gateway in gateways:
            gateway.stop(timeout=30)
        cluster.kubectl(
            "delete", "modelpools.modelpool.dev", "--all", "-n", small_ns, "--timeout=120s",
            check=False, timeout=180,
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
