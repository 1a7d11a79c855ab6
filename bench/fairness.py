"""Fair shares under overload (issue 34 item 3): a steady key's goodput through the gateway alone and
under another key's flood, in one run (``python -m bench.fairness``).

Starts the local control plane, the real operator, one echo pool of one worker (``HANDLER_RUN_SECONDS``
per request, one request at a time, ``spec.queue.capacity`` small, so the pool is full at once) and the
gateway with two API keys. Then, in alternating rounds, key B two ways, each alone and beside key A's
``--flood`` clients, which resend the moment they are answered (429s included, as a client ignoring
Retry-After):

* **within its share**: B sends ``--steady-rate`` requests a second whatever the answers (an open loop;
  by default 0.3 of what the worker can do, under the half that is B's fair share beside A): its goodput
  (200s a second) and its median latency. The issue's figure is this goodput flooded over alone (target
  >= 0.9);
* **saturating**: B's ``--steady`` closed-loop clients, which alone keep the worker busy: beside A, B can
  keep at most its fair share of the worker (0.5 with equal weights), so its ratio says how close it
  comes to that.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import standalone
from bench.gateway import pool
from bench.kwok import wait
from bench.report import load_average, publish
from modelpool_contract.gateway_keys import NAMESPACES_FIELD, REQUESTS_PER_MINUTE_FIELD
from testkit.cluster import guarded_cluster
from testkit.echo_models import ECHO
from testkit.environment import ROOT, free_port
from testkit.kubectl import kubectl

MARKERS = ("<!-- bench:fairness:start -->", "<!-- bench:fairness:end -->")
NAMESPACE = f"bench-fair-{uuid.uuid4().hex[:6]}"
KEYS_NAMESPACE = NAMESPACE + "-keys"
POOL = "fair"


def key_secret(name: str, key: str, **fields: str) -> dict[str, Any]:
    return standalone.key_secret(name, KEYS_NAMESPACE, key, **{NAMESPACES_FIELD: NAMESPACE, **fields})


def start(
    kubeconfig: Path, logs: Path, args: argparse.Namespace, procs: list[subprocess.Popen[bytes]]
) -> str:
    """The operator, the pool and the gateway (``procs``: stopped by the caller); the gateway's URL."""
    standalone.start_operator(kubeconfig, NAMESPACE, logs / "operator.log", procs)
    kubectl(kubeconfig, "create", "namespace", KEYS_NAMESPACE)
    echo_env = {"MODELPOOL_HANDLER": ECHO, "PYTHONPATH": str(ROOT), "HANDLER_RUN_SECONDS": str(args.run_s)}
    manifest = pool(POOL, "/", echo_env, "1Gi", 1)
    manifest["metadata"]["namespace"] = NAMESPACE  # bench.gateway's pools live in its own namespace
    manifest["spec"]["queue"]["capacity"] = args.capacity
    manifest["spec"]["autoscaling"] = {"enabled": False, "targetPerWorker": 1}
    limited = key_secret("limited", LIMITED_KEY, **{REQUESTS_PER_MINUTE_FIELD: str(args.limit_rpm)})
    items = [manifest, key_secret("flood", FLOOD_KEY), key_secret("steady", STEADY_KEY), limited]
    kubectl(
        kubeconfig, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    port = free_port()
    procs.append(
        subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "modelpool-gateway"), "--kubeconfig", str(kubeconfig),
             "--namespace", NAMESPACE, "--keys-namespace", KEYS_NAMESPACE, "--host", "127.0.0.1",
             "--port", str(port), "--metrics-port", "0", "--log-level", "warning"],
            stdout=(logs / "gateway.log").open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    gateway = procs[-1]

    def serving() -> bool:
        if gateway.poll() is not None:
            raise RuntimeError(f"the gateway exited {gateway.returncode}: see {logs / 'gateway.log'}")
        try:
            response = httpx.get(
                url + "/v1/models", headers={"Authorization": "Bearer " + STEADY_KEY}, timeout=5
            )
            return any(m["modelpool"]["servingWorkers"] == 1 for m in response.json()["data"])
        except (httpx.HTTPError, KeyError, ValueError):
            return False

    wait(serving, 600, "the pool serving through the gateway", interval=1)
    return url


async def clients(
    url: str, key: str, n: int, until: float, answered: Callable[[httpx.Response], None]
) -> None:
    """``n`` closed-loop clients of ``key`` until ``until`` (loop time); each answer goes to ``answered``."""
    headers = {"Authorization": "Bearer " + key}
    body = {"model": POOL, "input": ["x"]}
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def loop() -> None:
            while asyncio.get_running_loop().time() < until:
                answered(await client.post(url + "/v1/embeddings", json=body, headers=headers))

        await asyncio.gather(*(loop() for _ in range(n)))


def counting(codes: Counter[int]) -> Callable[[httpx.Response], None]:
    """An ``answered`` that counts the answers by status."""
    return lambda response: codes.update((response.status_code,))


# Key B's requests outstanding at most in its open loop (beyond it a send waits: B is not a flood).
MAX_OUTSTANDING = 64
STEADY_KEY, FLOOD_KEY, LIMITED_KEY = "s" * 32, "f" * 32, "l" * 32
# The limited key's clients, and how long they send: past one 60 s window, so the window is seen to roll.
LIMITED_CLIENTS, LIMITED_SECONDS, WINDOW_S = 4, 70.0, 60.0


async def over_limit(url: str) -> dict[str, Any]:
    """Key C (``requestsPerMinute``) sending as fast as it is answered for ``LIMITED_SECONDS``: when its
    requests were admitted, and every 429's ``Retry-After``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    admitted: list[float] = []
    retry_after: list[int] = []
    other: Counter[int] = Counter()

    def record(response: httpx.Response) -> None:
        if response.status_code == 200:
            admitted.append(loop.time() - start)
        elif response.status_code == 429:
            retry_after.append(int(response.headers.get("retry-after", "-1")))
        else:
            other[response.status_code] += 1

    await clients(url, LIMITED_KEY, LIMITED_CLIENTS, start + LIMITED_SECONDS, record)
    return {"admitted_at": sorted(admitted), "retry_after": retry_after, "other": dict(other)}


def limit_figures(run: dict[str, Any], limit: int) -> dict[str, Any]:
    """Pure: the most requests admitted within any 60 s, the first window's count, the 429s' Retry-After
    range (``None`` where a 429 came without one)."""
    times = run["admitted_at"]
    most, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - WINDOW_S:
            j += 1
        most = max(most, i - j + 1)
    waits = run["retry_after"]
    return {
        "limit": limit,
        "admitted": len(times),
        "first_window": sum(1 for t in times if t < WINDOW_S),
        "most_in_any_window": most,
        "refused": len(waits),
        "retry_after_range": (min(waits), max(waits)) if waits and min(waits) >= 1 else None,
        "other": run["other"],
    }


async def paced(  # noqa: PLR0917 - a bench helper, called positionally
    url: str, key: str, rate: float, until: float, codes: Counter[int], took: list[float]
) -> None:
    """``key`` sending ``rate`` requests a second until ``until`` (loop time) whatever the answers (an
    open loop); every answer is awaited, counted by status, and a 200's seconds kept in ``took``."""
    loop = asyncio.get_running_loop()
    headers = {"Authorization": "Bearer " + key}
    body = {"model": POOL, "input": ["x"]}
    limits = httpx.Limits(max_connections=MAX_OUTSTANDING, max_keepalive_connections=MAX_OUTSTANDING)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def one() -> None:
            started = loop.time()
            response = await client.post(url + "/v1/embeddings", json=body, headers=headers)
            codes[response.status_code] += 1
            if response.status_code == 200:
                took.append(loop.time() - started)

        sent: list[asyncio.Task[None]] = []
        due = loop.time()
        while due < until:
            sent.append(asyncio.create_task(one()))
            due += 1 / rate
            await asyncio.sleep(max(0.0, due - loop.time()))  # the schedule of an open loop, not a wait
        await asyncio.gather(*sent)


async def segment(url: str, args: argparse.Namespace, flooded: bool, within_share: bool) -> dict[str, float]:
    """One window of key B (paced ``within_share``, else its closed loop), with A's flood if ``flooded``."""
    loop = asyncio.get_running_loop()
    until = loop.time() + args.window
    steady: Counter[int] = Counter()
    flood: Counter[int] = Counter()
    took: list[float] = []
    work = [
        paced(url, STEADY_KEY, args.steady_rate, until, steady, took)
        if within_share
        else clients(url, STEADY_KEY, args.steady, until, counting(steady))
    ]
    if flooded:
        work.append(clients(url, FLOOD_KEY, args.flood, until, counting(flood)))
    started = loop.time()
    await asyncio.gather(*work)
    window = args.window if within_share else loop.time() - started
    return {
        "steady_per_s": steady[200] / window,
        "steady_p50_ms": statistics.median(took) * 1000 if took else 0.0,
        "steady_errors": sum(v for k, v in steady.items() if k != 200),
        "flood_per_s": flood[200] / window,
        "flood_429": flood[429],
    }


def _pair(url: str, args: argparse.Namespace, within_share: bool) -> dict[str, Any]:
    alone = asyncio.run(segment(url, args, flooded=False, within_share=within_share))
    flooded = asyncio.run(segment(url, args, flooded=True, within_share=within_share))
    ratio = flooded["steady_per_s"] / alone["steady_per_s"] if alone["steady_per_s"] else 0.0
    return {"alone": alone, "flooded": flooded, "ratio": ratio}


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        share, saturating = _pair(url, args, True), _pair(url, args, False)
        rounds.append({"share": share, "saturating": saturating, "load": load_average()})
        a = share["flooded"]
        print(
            f"round {i + 1}: B within its share {share['alone']['steady_per_s']:.1f}/s alone, "
            f"{a['steady_per_s']:.1f}/s flooded ({share['ratio']:.2f}); saturating "
            f"{saturating['alone']['steady_per_s']:.1f} -> {saturating['flooded']['steady_per_s']:.1f}/s "
            f"({saturating['ratio']:.2f}); A {a['flood_per_s']:.1f}/s, {a['flood_429']} 429s", flush=True,
        )  # fmt: skip
    limits = limit_figures(asyncio.run(over_limit(url)), args.limit_rpm)
    print(f"limited key: {json.dumps(limits)}", flush=True)
    return {
        "date": time.strftime("%Y-%m-%d"),
        "settings": vars(args),
        "limits": limits,
        "rounds": rounds,
        "median_ratio": statistics.median(r["share"]["ratio"] for r in rounds),
        "median_saturating_ratio": statistics.median(r["saturating"]["ratio"] for r in rounds),
    }


def table(res: dict[str, Any]) -> str:
    s = res["settings"]
    head = (
        f"{s['rounds']} rounds of {s['window']:g} s, one echo worker ({s['run_s'] * 1000:g} ms a request, "
        f"one at a time, queue capacity {s['capacity']}); key A {s['flood']} clients resending at once; "
        f"{res['date']}. Key B within its share ({s['steady_rate']:g} requests a second, an open loop): "
        f"goodput under A's flood over alone, median **{res['median_ratio']:.2f}**; key B saturating the "
        f"worker alone ({s['steady']} closed-loop clients): **{res['median_saturating_ratio']:.2f}** "
        "(its fair share beside A is 0.5)\n\n"
    )
    rows = [
        "| round | B within share: alone / flooded (/s) | ratio | B's p50 alone / flooded (ms) "
        "| B saturating: alone / flooded (/s) | ratio | A flooded (/s) | A's 429s | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(res["rounds"], 1):
        share, sat = r["share"], r["saturating"]
        rows.append(
            f"| {i} | {share['alone']['steady_per_s']:.1f} / {share['flooded']['steady_per_s']:.1f} "
            f"| {share['ratio']:.2f} | {share['alone']['steady_p50_ms']:.0f} / "
            f"{share['flooded']['steady_p50_ms']:.0f} | {sat['alone']['steady_per_s']:.1f} / "
            f"{sat['flooded']['steady_per_s']:.1f} | {sat['ratio']:.2f} "
            f"| {share['flooded']['flood_per_s']:.1f} | {share['flooded']['flood_429']} | {r['load']} |"
        )
    lim = res["limits"]
    waits = lim["retry_after_range"]
    limits = (
        f"\n\nA key limited to {lim['limit']} requests a minute, {LIMITED_CLIENTS} clients resending at once "
        f"for {LIMITED_SECONDS:g} s: {lim['first_window']} admitted in the first {WINDOW_S:g} s, "
        f"{lim['most_in_any_window']} at most within any {WINDOW_S:g} s, {lim['admitted']} in all; "
        f"{lim['refused']} refused with 429, Retry-After "
        + (f"{waits[0]}-{waits[1]} s" if waits else "missing or under 1 s on some")
        + (f"; other answers {lim['other']}" if lim["other"] else "")
        + "."
    )
    return head + "\n".join(rows) + limits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=10.0, help="seconds per segment")
    parser.add_argument("--steady", type=int, default=2, help="key B's closed-loop clients")
    parser.add_argument("--flood", type=int, default=64, help="key A's clients, resending at once")
    parser.add_argument("--capacity", type=int, default=4, help="the worker's spec.queue.capacity")
    parser.add_argument("--run-s", type=float, default=0.02, help="seconds per request in the worker")
    parser.add_argument(
        "--steady-rate", type=float, default=None,
        help="key B's requests a second within its share (default: 0.3 of the worker's 1 / --run-s)",
    )  # fmt: skip
    parser.add_argument(
        "--limit-rpm", type=int, default=300, help="key C's requestsPerMinute (the limits figure)"
    )
    parser.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.steady_rate = args.steady_rate or 0.3 / args.run_s
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
