"""Prefix-aware routing against least-outstanding, over the same two generation workers, in one run
(``python -m bench.prefix_routing``).

Two real ``modelpool-server`` workers serve one random Llama-shaped model (``bench.generation.build_model``,
``--shape``/``--layers``; the transformers continuous-batching engine) on loopback. Two gateways run in
this process (the real ``Gateway`` app under uvicorn, the registry filled by hand as the watches would:
one text-generation pool, both workers serving, ``--auth none``), one with ``--generation-routing prefix``
and one with ``least-loaded``, in front of the same two workers.

The workload is chats under shared system prompts: ``--system-prompts`` prompts of ``--system-chars``
characters each (longer than ``--prefix-chars``, so each is a whole prefix key), every request one of them
(drawn at random, the same draws for both modes) with a question of its own, streamed, ``--tokens`` new
tokens, greedy. Per round, one segment of ``--requests`` requests at ``--concurrency`` through each
gateway, the order of the two alternating round by round so the machine's drift hits both alike.
Reported per mode, over all rounds: time to first token (the first content chunk) p50 and p95, total
time p50, how the requests split over the two workers, and *locality*: the share of requests that
reached the worker their system prompt reached last time in that segment (what a prefix cache would
need), and the *prefix hit rate*: the share of prompt tokens the workers' engines took from their prefix
cache instead of computing them (``modelpool_prefix_cache_hit_tokens_total`` over
``modelpool_prompt_tokens_total``, read from both workers around each segment). The engines share
prefixes (``--prefix-sharing``, the server's default); ``--no-prefix-sharing`` turns it off in both
workers, so the TTFT difference is what placement alone does.
Results go to ``.bench/prefix_routing.json`` and docs/benchmarks.md between
``<!-- bench:prefix-routing:start -->`` and ``<!-- bench:prefix-routing:end -->`` (``--no-docs``: not).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from bench.generation import SHAPES, build_model
from bench.report import publish
from modelpool_gateway.app import Gateway
from modelpool_gateway.assembly import assemble
from modelpool_gateway.cache import Registry
from modelpool_gateway.config import GatewaySettings
from modelpool_gateway.demand import LeaseClient
from modelpool_gateway.proxy import WORKER_HEADER, Upstream
from modelpool_gateway.state import Pool, Worker
from testkit.environment import ROOT, free_port
from testkit.server import ServerProcess, launch

START_MARK = "<!-- bench:prefix-routing:start -->"
END_MARK = "<!-- bench:prefix-routing:end -->"
MODES = ("prefix", "least-loaded")
NS, POOL = "bench", "gen"


def system_prompt(index: int, chars: int) -> str:
    """A system prompt of ``chars`` characters, distinct from its first words on."""
    words = f"System prompt {index}: you are assistant number {index} of the platform team. "
    return (words * (chars // len(words) + 1))[:chars]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Segment:
    """One mode's requests in one round."""

    ttft: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    workers: Counter[str] = field(default_factory=Counter)
    local: int = 0
    repeats: int = 0  # requests whose system prompt was sent before in the segment
    errors: int = 0
    prompt_tokens: float = 0.0  # the workers' engines' counts over the segment
    hit_tokens: float = 0.0  # of those, taken from their prefix caches


# ---- the gateways -----------------------------------------------------------------------------------


def gateway_app(mode: str, workers: list[ServerProcess], prefix_chars: int) -> tuple[Gateway, Upstream]:
    """The real ``Gateway`` app for one text-generation pool served by ``workers``, routing by ``mode``."""
    settings = GatewaySettings.model_validate(
        {"auth": "none", "generation_routing": mode, "prefix_chars": prefix_chars, "metrics_port": 0}
    )
    # The demand writer never writes: the pool always has serving workers, nothing is held.
    parts = assemble(settings, registry=Registry(), leases=LeaseClient(None), holder="bench")
    parts.registry.set_pool(Pool(NS, POOL, task="text-generation"))
    for i, w in enumerate(workers):
        parts.registry.set_worker(Worker(NS, f"{POOL}-{i}", POOL, "127.0.0.1", w.port, True, True, False))
    return parts.app, parts.upstream


@contextlib.asynccontextmanager
async def serving(app: Gateway, port: int) -> AsyncIterator[str]:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


# ---- the load ---------------------------------------------------------------------------------------


async def one_chat(client: httpx.AsyncClient, url: str, system: str, question: str, tokens: int) -> Any:
    """(ttft, total, worker) of one streamed chat; None on an error."""
    body = {
        "model": POOL,
        "stream": True,
        "max_tokens": tokens,
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }
    start = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return None
        worker = response.headers[WORKER_HEADER.decode()]
        async for line in response.aiter_lines():
            if first is None and _has_content(line):
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    return (first if first is not None else total, total, worker)


def _has_content(line: str) -> bool:
    """Whether a server-sent event line carries generated text (not the opening role-only chunk)."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line[len("data: ") :]).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


async def segment(
    url: str, prompts: list[str], requests: int, concurrency: int, tokens: int, *, seed: int = 0
) -> Segment:
    """``requests`` chats at ``concurrency``, each under a system prompt drawn from ``prompts`` (the same
    draws for the same ``seed``, so both modes get the same sequence)."""
    out = Segment()
    draws = random.Random(seed).choices(range(len(prompts)), k=requests)
    last: dict[int, str] = {}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            which = draws[i]
            got = await one_chat(client, url, prompts[which], f"Question {i}: what is a pod?", tokens)
            if got is None:
                out.errors += 1
                continue
            ttft, total, worker = got
            out.ttft.append(ttft)
            out.total.append(total)
            out.workers[worker] += 1
            if which in last:
                out.repeats += 1
                out.local += last[which] == worker
            last[which] = worker

    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
    return out


def prefix_counts(workers: list[ServerProcess]) -> tuple[float, float]:
    """(prompt tokens, of those from the prefix cache) the workers' engines have counted so far."""
    prompt = sum(w.metric("modelpool_prompt_tokens_total") for w in workers)
    return prompt, sum(w.metric("modelpool_prefix_cache_hit_tokens_total") for w in workers)


# ---- the run ----------------------------------------------------------------------------------------


def summary(segments: list[Segment]) -> dict[str, Any]:
    ttft = [t for s in segments for t in s.ttft]
    total = [t for s in segments for t in s.total]
    workers: Counter[str] = Counter()
    for s in segments:
        workers.update(s.workers)
    done = len(ttft)
    repeats = sum(s.repeats for s in segments)
    return {
        "requests": done,
        "errors": sum(s.errors for s in segments),
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1),
        "ttft_p95_ms": round(1000 * percentile(ttft, 0.95), 1),
        "total_p50_ms": round(1000 * statistics.median(total), 1),
        "split": dict(sorted(workers.items())),
        "locality": round(sum(s.local for s in segments) / max(1, repeats), 3),
        "prefix_hit_rate": round(
            sum(s.hit_tokens for s in segments) / max(1.0, sum(s.prompt_tokens for s in segments)), 3
        ),
    }


async def run(args: argparse.Namespace, workers: list[ServerProcess]) -> dict[str, Any]:
    prompts = [system_prompt(i, args.system_chars) for i in range(args.system_prompts)]
    apps = {mode: gateway_app(mode, workers, args.prefix_chars) for mode in MODES}
    results: dict[str, list[Segment]] = {mode: [] for mode in MODES}
    async with contextlib.AsyncExitStack() as stack:
        urls = {mode: await stack.enter_async_context(serving(apps[mode][0], free_port())) for mode in MODES}
        # Warm both workers (first compile, first allocation) through each gateway, not counted.
        for mode in MODES:
            await segment(urls[mode], prompts, 2 * len(workers), len(workers), args.tokens)
        for r in range(args.rounds):
            order = MODES if r % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                before = prefix_counts(workers)
                seg = await segment(urls[mode], prompts, args.requests, args.concurrency, args.tokens, seed=r)
                after = prefix_counts(workers)
                seg.prompt_tokens, seg.hit_tokens = after[0] - before[0], after[1] - before[1]
                results[mode].append(seg)
                hits = seg.hit_tokens / max(1.0, seg.prompt_tokens)
                print(f"round {r + 1} {mode}: ttft p50 {1000 * statistics.median(seg.ttft):.0f} ms, "
                      f"split {dict(seg.workers)}, prefix hits {hits:.0%}, "
                      f"errors {seg.errors}", flush=True)  # fmt: skip
    for _, upstream in apps.values():
        upstream.close()
    return {mode: summary(segs) for mode, segs in results.items()}


def table(doc: dict[str, Any]) -> str:
    a = doc["args"]
    lines = [
        f"{a['rounds']} rounds x {a['requests']} streamed chats per mode at concurrency {a['concurrency']}, "
        f"{a['system_prompts']} system prompts of {a['system_chars']} characters, {a['tokens']} tokens each, "
        f"2 workers (`{a['shape']}`, {a['layers'] or 'default'} layers, CPU, engine prefix sharing "
        f"{'off' if a.get('no_prefix_sharing') else 'on'}), load average {doc['load_average']}, "
        f"{doc['date']}:",
        "",
        "| routing | TTFT p50 (ms) | TTFT p95 (ms) | total p50 (ms) | split over the workers | locality "
        "| prefix hit rate | errors |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for mode in MODES:
        r = doc["results"][mode]
        split = " / ".join(str(v) for v in r["split"].values())
        lines.append(
            f"| {mode} | {r['ttft_p50_ms']} | {r['ttft_p95_ms']} | {r['total_p50_ms']} | {split} | "
            f"{r['locality']:.0%} | {r.get('prefix_hit_rate', 0.0):.0%} | {r['errors']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--system-prompts", type=int, default=4)
    parser.add_argument("--system-chars", type=int, default=1200)
    parser.add_argument("--prefix-chars", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--no-prefix-sharing", action="store_true", help="the engines reuse no prefix")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-prefix-"))
    model = build_model(workdir / "model", args.shape, args.layers)
    env = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    flags = ["--model", str(model), "--task", "text-generation", "--name", POOL]
    flags += ["--no-prefix-sharing"] if args.no_prefix_sharing else []
    workers = [launch(flags, env=env) for _ in range(2)]
    try:
        for w in workers:
            w.wait("/v2/health/ready", timeout=300, interval=0.1)
        results = asyncio.run(run(args, workers))
    finally:
        for w in workers:
            w.stop()
    doc = {
        "args": vars(args),
        "results": results,
        "load_average": round(os.getloadavg()[0], 1),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
    }
    saved = ROOT / ".bench" / "prefix_routing.json"
    publish(doc, table(doc), saved, (START_MARK, END_MARK), docs=not args.no_docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
