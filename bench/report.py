"""The benchmarks' reports: the server tables, and the README block between a benchmark's markers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.environment import REPO
from bench.references import DIRECT_BATCHES

README = REPO / "README.md"


def server_markers(device: str) -> tuple[str, str]:
    """The README markers of the server table: one CPU table, one GPU table."""
    name = "server" if device == "cpu" else "server-gpu"
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def replace_block(text: str, start: str, end: str, readme: Path = README) -> None:
    """Put ``text`` between the ``start`` and ``end`` markers of ``readme`` (appended when missing)."""
    content = readme.read_text() if readme.exists() else ""
    block = f"{start}\n{text}\n{end}"
    if start in content and end in content:
        head, rest = content.split(start, 1)
        _, tail = rest.split(end, 1)
        content = head + block + tail
    else:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(content)


def server_table(results: dict[str, Any]) -> str:
    """Markdown: the throughput table (direct path, sentence-transformers, server rows with their
    ratios), then the checks against their targets."""
    return "\n".join([*_throughput_rows(results), "", *_check_rows(results)])


def _throughput_rows(results: dict[str, Any]) -> list[str]:
    d, s = results["direct"], results["server"]
    env = results["environment"]
    lines = [
        f"Server benchmark (`make bench`, `python -m bench.server`): {env['device_name']}, {env['dtype']}, "
        f"{'random weights' if env['random_weights'] else 'all-MiniLM-L6-v2'}, server max batch "
        f"{s['max_batch_size']}, queue {s['queue_capacity']}, {env['when']}. Each server row is compared "
        "with the direct path at the batch it formed, measured right after it, and with "
        "sentence-transformers measured just before and just after it.",
        "",
        "| path | sentences/s | p50 ms | formed batch | vs direct at that batch | vs ST encode@32, "
        "512 a call | vs ST encode, one request a call |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for bs in DIRECT_BATCHES:
        r = d[f"batch_{bs}"]
        lines.append(
            f"| direct, batch {bs} | {r['sentences_per_s']:.0f} | {r['p50_ms']:.2f} | {bs} | 1.00 | | |"
        )
    for key in ("sentence_transformers_32", "sentence_transformers_512"):
        if key in d:
            lines.append(f"| sentence-transformers encode, batch {key.rsplit('_', 1)[1]} | "
                         f"{d[key]['sentences_per_s']:.0f} | | | | | |")  # fmt: skip
    for key, r in s["runs"].items():
        ratios = r["ratios"]
        vs_st = " | ".join(f"{ratios[k]:.2f}" if k in ratios else "" for k in ("st", "st_per_request"))
        errors = f" (errors {r['errors']})" if r["errors"] else ""
        lines.append(
            f"| server {key.replace('_', ' ')}{errors} | {r['sentences_per_s']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['mean_batch'] or 0:.1f} | {ratios['direct']:.2f} "
            f"(direct@{r['reference']['direct_batch']}) | {vs_st} |"
        )
    return lines


def _check_rows(results: dict[str, Any]) -> list[str]:
    c, o, e = results["added_latency"], results["server"]["overload"], results["load_probe"]
    peak_mib = (o["rss_max"] - o["rss_before"]) / 2**20
    return [
        "| check | measured | target |",
        "|---|---:|---:|",
        f"| added latency p50, c=1, 1 sentence, JSON | {c['json_ms']:.2f} ms | ≤ 5 ms |",
        f"| added latency p50, c=1, 1 sentence, binary | {c['binary_ms']:.2f} ms | ≤ 5 ms |",
        f"| overload {o['concurrency']} clients for {results['environment']['overload_seconds']:.0f} s: "
        f"RSS growth over it (last 5 s vs first 5 s, medians) | {o['rss_growth_mib']:.1f} MiB | ≤ 50 MiB |",
        f"| RSS left behind (idle after vs idle before) | {o['rss_idle_growth_mib']:.1f} MiB | ≤ 50 MiB |",
        f"| RSS under the overload vs idle before (last 5 s median; peak +{peak_mib:.0f} MiB) | "
        f"{o['rss_working_mib']:.1f} MiB | |",
        f"| overload: 429 p99 ({o['rejected']} rejected, {o['ok']} served) | "
        f"{o['rejected_p99_ms'] or 0:.2f} ms | ≤ 20 ms |",
        f"| /v2/health/live during load: p50 / p99 / max | {e['live_p50_ms']:.1f} / {e['live_p99_ms']:.1f} / "
        f"{e['live_max_ms']:.1f} ms | < 50 ms |",
        f"| /stats during load: p50 / p99 / max | {e['stats_p50_ms']:.1f} / {e['stats_p99_ms']:.1f} / "
        f"{e['stats_max_ms']:.1f} ms | < 50 ms |",
        f"| model load (incl. torch import) | {e['load_seconds'] or 0:.1f} s | |",
    ]
