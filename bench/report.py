"""The benchmarks' reports: the server tables, and the block of docs/benchmarks.md between a benchmark's
markers (the front page, README.md, carries no measurements)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.references import DIRECT_BATCHES
from testkit.environment import ROOT

#: Where every benchmark writes its table, between its markers.
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def load_average() -> str:
    """The 1-minute load average, beside each figure of a table (the machine may be shared)."""
    return f"{os.getloadavg()[0]:.1f}"


def server_markers(device: str) -> tuple[str, str]:
    """The markers of the server table: one CPU table, one GPU table."""
    name = "server" if device == "cpu" else "server-gpu"
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def publish(
    results: Mapping[str, Any],
    text: str,
    saved: Path,
    markers: tuple[str, str],
    *,
    docs: bool = True,
    doc: Path = BENCHMARKS,
) -> None:
    """A benchmark's end: its ``results`` saved as JSON at ``saved``, its table (``text``) printed and, unless
    not ``docs`` (``--no-docs``), put in ``doc`` between its ``markers``."""
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(results, indent=2) + "\n")
    print("\n" + text)
    if docs:
        replace_block(text, *markers, doc)


def replace_block(text: str, start: str, end: str, doc: Path = BENCHMARKS) -> None:
    """Put ``text`` between the ``start`` and ``end`` markers of ``doc`` (appended when missing)."""
    content = doc.read_text() if doc.exists() else ""
    block = f"{start}\n{text}\n{end}"
    if start in content and end in content:
        head, rest = content.split(start, 1)
        _, tail = rest.split(end, 1)
        content = head + block + tail
    else:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(content)


def server_table(results: dict[str, Any]) -> str:
    """Markdown: the throughput table (direct path, sentence-transformers, server rows with their
    ratios), the ``--http-workers`` comparison, then the checks against their targets."""
    return "\n".join([*_throughput_rows(results), "", *_workers_rows(results), "", *_check_rows(results)])


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


def _workers_rows(results: dict[str, Any]) -> list[str]:
    w = results["http_workers"]
    one, many = (str(n) for n in w["counts"])
    lines = [
        f"1-sentence requests at concurrency 64 (v2 JSON), `--http-workers 1` against {many} (the default "
        f"here is {w['default']}), back to back:",
        "",
        f"| model | requests/s, 1 HTTP process | requests/s, {many} | ratio | p50 ms, 1 / {many} |",
        "|---|---:|---:|---:|---:|",
    ]
    for kind, label in (("echo", "echo handler (no model)"), ("minilm", "MiniLM")):
        a, b = w[kind][one], w[kind][many]
        ratio = b["requests_per_s"] / a["requests_per_s"] if a["requests_per_s"] else 0.0
        lines.append(
            f"| {label} | {a['requests_per_s']:.0f} | {b['requests_per_s']:.0f} | {ratio:.2f} | "
            f"{a['p50_ms'] or 0:.1f} / {b['p50_ms'] or 0:.1f} |"
        )
    return lines


def _ratio(run: dict[str, Any] | None, kind: str) -> str:
    return f"{run['ratios'][kind]:.2f}" if run and kind in run["ratios"] else "n/a"


def _health(h: dict[str, Any] | None) -> str:
    if not h or not h.get("samples"):
        return "n/a"
    p99 = f"{h['live_p99_ms'] or 0:.1f} / {h['stats_p99_ms'] or 0:.1f} ms"
    failed = h.get("failures", 0) + h.get("not_ok", 0)
    not_200 = f", {failed} not 200" if failed else ""
    return f"{p99} (max {h['live_max_ms']:.0f} / {h['stats_max_ms']:.0f}){not_200}"


def _health_rows(during: str, run: dict[str, Any]) -> list[str]:
    """Health and /stats p99 during a load: on the probe port (the target) and on the serving port."""
    return [
        f"| health / stats p99 during {during}, probe port (the kubelet's probes, the operator's scrape) | "
        f"{_health(run.get('health'))} | ≤ 20 ms |",
        f"| health / stats p99 during {during}, serving port | {_health(run.get('served_health'))} | |",
    ]


def _check_rows(results: dict[str, Any]) -> list[str]:
    c, f, e = results["added_latency"], results["server"]["flood"], results["load_probe"]
    runs = results["server"]["runs"]
    peak_mib = (f["rss_max"] - f["rss_before"]) / 2**20
    warm, cold = e["first_request"], e["cold_first_request"]
    polite = f["polite"]
    gpu = results["environment"]["device"] != "cpu"
    seconds = results["environment"]["flood_seconds"]
    answered = f["requests_per_s"] + f["rejected"] / seconds
    rows = [
        "| check | measured | target |",
        "|---|---:|---:|",
        f"| added latency p50, c=1, 1 sentence, JSON | {c['json_ms']:.2f} ms | ≤ 5 ms |",
        f"| added latency p50, c=1, 1 sentence, binary | {c['binary_ms']:.2f} ms | ≤ 5 ms |",
        f"| flood of {f['concurrency']} clients resending at once for {seconds:.0f} s: "
        f"2xx/s vs the normal 64-client rate ({f['requests_per_s']:.0f} vs "
        f"{f['normal']['requests_per_s']:.0f}) | "
        f"{f['ok_ratio'] or 0:.2f}x | ≥ 0.8x |",
        f"| flood: 429 p50 / p99 ({f['rejected']} refused) | {f['rejected_p50_ms'] or 0:.2f} / "
        f"{f['rejected_p99_ms'] or 0:.2f} ms | p99 ≤ 20 ms |",
        f"| flood: answers per second (2xx and 429), and the mean wait it implies for {f['concurrency']} "
        f"clients that each resend at once ({f['concurrency']} / that rate, Little's law) | "
        f"{answered:.0f}/s, {f['concurrency'] / answered * 1000 if answered else 0:.0f} ms | |",
        f"| flood: one polite client (a request a second, honouring Retry-After) | {polite['ok']} answered, "
        f"{polite['rejected']} refused | |",
        f"| flood: RSS growth over it (last 5 s vs first 5 s, medians) | {f['rss_growth_mib']:.1f} MiB "
        "| ≤ 50 MiB |",
        f"| flood: RSS left behind (idle after vs idle before) | {f['rss_idle_growth_mib']:.1f} MiB "
        "| ≤ 50 MiB |",
        f"| flood: RSS vs idle before (last 5 s median; peak +{peak_mib:.0f} MiB) | "
        f"{f['rss_working_mib']:.1f} MiB | |",
        *_health_rows("the flood", f),
        *_health_rows("32-sentence requests at c=64", runs.get("json_32x_c64", {})),
        *_health_rows("1-sentence requests at c=64", runs.get("json_1x_c64", {})),
        f"| 32-sentence requests at c=64 vs ST encode, 512 a call (JSON / binary) | "
        f"{_ratio(runs.get('json_32x_c64'), 'st')} / {_ratio(runs.get('binary_32x_c64'), 'st')} | ≥ 1.0 |",
        f"| 1-sentence requests at c=64 vs direct at the batch formed (JSON / binary) | "
        f"{_ratio(runs.get('json_1x_c64'), 'direct')} / {_ratio(runs.get('binary_1x_c64'), 'direct')} | "
        f"{'≥ 0.9' if gpu else ''} |",
        f"| first request after Ready: with the warm-up ({warm['warmup_seconds'] or 0:.3f} s before Ready) "
        f"/ without / steady state | {warm['first_ms']:.1f} / {cold['first_ms']:.1f} / "
        f"{warm['steady_ms']:.1f} ms | |",
        f"| /v2/health/live during the model load: p50 / p99 / max | {e['live_p50_ms']:.1f} / "
        f"{e['live_p99_ms']:.1f} / {e['live_max_ms']:.1f} ms | ≤ 20 ms (p99) |",
        f"| /stats during the model load: p50 / p99 / max | {e['stats_p50_ms']:.1f} / "
        f"{e['stats_p99_ms']:.1f} / {e['stats_max_ms']:.1f} ms | ≤ 20 ms (p99) |",
        f"| model load (incl. torch import) | {e['load_seconds'] or 0:.1f} s | |",
    ]
    return rows
