"""Fair shares under overload (issue 34 item 3): a steady key's goodput through the gateway alone and
under another key's flood, in one run (``python -m bench.fairness``).

Starts the local control plane, the real operator, one echo pool of one worker (``HANDLER_RUN_SECONDS``
per request, one request at a time, ``spec.queue.capacity`` small, so the pool is full at once) and the
gateway with two API keys. Then, in alternating rounds:

* **alone**: key B's ``--steady`` closed-loop clients for ``--window`` seconds: its goodput (200s/s);
* **flooded**: the same B clients beside key A's ``--flood`` clients, which resend the moment they are
  answered (429s included, as a client ignoring Retry-After): B's goodput, A's goodput and A's 429s.

The figure is B's flooded goodput over its alone goodput, per round and the median (target >= 0.9).
Writes ``.bench/fairness.json`` and the table into docs/benchmarks.md between
``<!-- bench:fairness:start -->`` and ``<!-- bench:fairness:end -->`` (``--no-docs`` to skip).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bench import standalone
from bench.gateway import pool
from bench.kwok import wait
from bench.report import load_average, publish
from modelpool_contract.gateway_keys import NAMESPACES_FIELD
from testkit.cluster import guarded_cluster
from testkit.echo_models import ECHO
from testkit.environment import ROOT, free_port
from testkit.kubectl import kubectl

MARKERS = ("<!-- bench:fairness:start -->", "<!-- bench:fairness:end -->")
NAMESPACE = f"bench-fair-{uuid.uuid4().hex[:6]}"
KEYS_NAMESPACE = NAMESPACE + "-keys"
POOL = "fair"


def key_secret(name: str, key: str) -> dict[str, Any]:
    return standalone.key_secret(name, KEYS_NAMESPACE, key, **{NAMESPACES_FIELD: NAMESPACE})


def start(
    kubeconfig: Path, logs: Path, args: argparse.Namespace, procs: list[subprocess.Popen[bytes]]
) -> str:
    """The operator, the pool and the gateway (``procs``: stopped by the caller); the gateway's URL."""
    standalone.start_operator(kubeconfig, NAMESPACE, logs / "operator.log", procs)
    kubectl(kubeconfig, "create", "namespace", KEYS_NAMESPACE)
    echo_env = {"MODELPOOL_HANDLER": ECHO, "PYTHONPATH": str(ROOT), "HANDLER_RUN_SECONDS": str(args.run_s)}
    manifest = pool(POOL, "/", echo_env, "1Gi", 1)
    manifest["spec"]["queue"]["capacity"] = args.capacity
    manifest["spec"]["autoscaling"] = {"enabled": False, "targetPerWorker": 1}
    items = [manifest, key_secret("flood", "f" * 32), key_secret("steady", "s" * 32)]
    kubectl(
        kubeconfig, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    port = free_port()
    procs.append(
        subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "modelpool-gateway"), "--kubeconfig", str(kubeconfig),
             "--namespace", NAMESPACE, "--keys-namespace", KEYS_NAMESPACE, "--host", "127.0.0.1",
             "--port", str(port), "--log-level", "warning"],
            stdout=(logs / "gateway.log").open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        try:
            response = httpx.get(
                url + "/v1/models", headers={"Authorization": "Bearer " + "s" * 32}, timeout=5
            )
            return any(m["modelpool"]["servingWorkers"] == 1 for m in response.json()["data"])
        except (httpx.HTTPError, KeyError, ValueError):
            return False

    wait(serving, 600, "the pool serving through the gateway", interval=1)
    return url


async def clients(url: str, key: str, n: int, until: float, codes: Counter[int]) -> None:
    """``n`` closed-loop clients of ``key`` until ``until`` (loop time); answers counted by status."""
    headers = {"Authorization": "Bearer " + key}
    body = {"model": POOL, "input": ["x"]}
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def loop() -> None:
            while asyncio.get_running_loop().time() < until:
                codes[
                    (await client.post(url + "/v1/embeddings", json=body, headers=headers)).status_code
                ] += 1

        await asyncio.gather(*(loop() for _ in range(n)))


async def segment(url: str, args: argparse.Namespace, flooded: bool) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    until = loop.time() + args.window
    steady: Counter[int] = Counter()
    flood: Counter[int] = Counter()
    work = [clients(url, "s" * 32, args.steady, until, steady)]
    if flooded:
        work.append(clients(url, "f" * 32, args.flood, until, flood))
    started = loop.time()
    await asyncio.gather(*work)
    took = loop.time() - started
    return {
        "steady_per_s": steady[200] / took,
        "steady_errors": sum(v for k, v in steady.items() if k != 200),
        "flood_per_s": flood[200] / took,
        "flood_429": flood[429],
    }


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        alone = asyncio.run(segment(url, args, flooded=False))
        flooded = asyncio.run(segment(url, args, flooded=True))
        ratio = flooded["steady_per_s"] / alone["steady_per_s"] if alone["steady_per_s"] else 0.0
        rounds.append({"alone": alone, "flooded": flooded, "ratio": ratio, "load": load_average()})
        b, a = f"B alone {alone['steady_per_s']:.1f}/s, flooded {flooded['steady_per_s']:.1f}/s", flooded
        print(
            f"round {i + 1}: {b} ({ratio:.2f}); A {a['flood_per_s']:.1f}/s, {a['flood_429']} 429s", flush=True
        )
    return {
        "date": time.strftime("%Y-%m-%d"),
        "settings": vars(args),
        "rounds": rounds,
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
    }


def table(res: dict[str, Any]) -> str:
    s = res["settings"]
    head = (
        f"{s['rounds']} rounds of {s['window']:g} s, one echo worker ({s['run_s'] * 1000:g} ms a request, "
        f"one at a time, queue capacity {s['capacity']}); key B {s['steady']} clients, key A {s['flood']} "
        f"resending at once; {res['date']}. B's goodput under A's flood over alone, median: "
        f"**{res['median_ratio']:.2f}**\n\n"
    )
    rows = [
        "| round | B alone (/s) | B flooded (/s) | ratio | A flooded (/s) | A's 429s | load |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(res["rounds"], 1):
        rows.append(
            f"| {i} | {r['alone']['steady_per_s']:.1f} | {r['flooded']['steady_per_s']:.1f} "
            f"| {r['ratio']:.2f} | {r['flooded']['flood_per_s']:.1f} | {r['flooded']['flood_429']} "
            f"| {r['load']} |"
        )
    return head + "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per segment")
    parser.add_argument("--steady", type=int, default=2, help="key B's closed-loop clients")
    parser.add_argument("--flood", type=int, default=64, help="key A's clients, resending at once")
    parser.add_argument("--capacity", type=int, default=4, help="the worker's spec.queue.capacity")
    parser.add_argument("--run-s", type=float, default=0.02, help="seconds per request in the worker")
    parser.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    args = parser.parse_args(argv)
    procs: list[subprocess.Popen[bytes]] = []
    with guarded_cluster("bench-fair", "gateway, operator and cluster logs") as cluster:
        try:
            url = start(cluster.kubeconfig, cluster.workdir, args, procs)
            results = measure(url, args)
        finally:
            kubectl(
                cluster.kubeconfig,
                "delete",
                "modelpools.modelpool.dev",
                "--all",
                "-n",
                NAMESPACE,
                "--timeout=120s",
            )
            standalone.stop(procs)
    publish(results, table(results), ROOT / ".bench" / "fairness.json", MARKERS, docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
