"""The overhead row of ``bench.gateway --overhead-only`` (issue 34): what it sends, how it reduces its
rounds to the on/off ratios, the table it writes, and that "on" traces at the chart's default ratio."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from bench.gateway import (
    OVERHEAD_KEY,
    chart_sample_ratio,
    echo_embeddings,
    on_flags,
    overhead_summary,
    overhead_table,
)
from testkit.environment import ROOT

ARGS = argparse.Namespace(rounds=2, pairs=100, window=4.0)


def _c1(direct: float, gateway: float) -> dict[str, Any]:
    return {"direct_p50_ms": direct, "gateway_p50_ms": gateway, "added_p50_ms": gateway - direct}


def _c64(direct: float, off: float, on: float) -> dict[str, Any]:
    return {name: {"p50_ms": p50, "per_s": 1000.0, "other": {}} for name, p50 in
            (("direct", direct), ("off", off), ("on", on))}  # fmt: skip


def test_the_requests_are_openai_embeddings_with_the_key_only_where_given() -> None:
    with_key = echo_embeddings("http://127.0.0.1:8080", OVERHEAD_KEY)
    without = echo_embeddings("http://127.0.0.1:9000", None)
    assert len(with_key) == len(without) == 64
    head, body = with_key[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert f"authorization: Bearer {OVERHEAD_KEY}".encode() in head
    assert json.loads(body)["model"] == "echo" and isinstance(json.loads(body)["input"], str)
    assert b"authorization" not in without[0]


def test_the_summary_takes_medians_and_divides_on_by_off() -> None:
    c1 = {"off": [_c1(1.0, 1.5), _c1(1.0, 1.3)], "on": [_c1(1.0, 1.6), _c1(1.0, 1.8)]}
    c64 = [_c64(10.0, 14.0, 15.0), _c64(12.0, 16.0, 18.0)]
    res = overhead_summary(c1, c64, ARGS)
    assert (
        round(res["c1"]["added_p50_ms"]["off"], 6) == 0.4 and round(res["c1"]["added_p50_ms"]["on"], 6) == 0.7
    )
    assert round(res["c1"]["ratio"], 6) == 1.75
    assert res["c64"]["added_p50_ms"] == {"off": 4.0, "on": 5.5}
    assert res["c64"]["ratio"] == 5.5 / 4.0
    assert res["c64"]["p50_ms"] == {"direct": 11.0, "off": 15.0, "on": 16.5}


def test_the_table_marks_each_ratio_against_ten_percent() -> None:
    c1 = {"off": [_c1(1.0, 1.5)], "on": [_c1(1.0, 1.54)]}
    res = overhead_summary(c1, [_c64(10.0, 14.0, 16.0)], ARGS)
    res |= {"load_average": ["2.5", "2.7"], "sample_ratio": 1.0, "spans_received": 40, "access_lines": 10}
    text = overhead_table(res)
    rows = [line for line in text.splitlines() if line.startswith("| concurrency")]
    assert "| 1.08 | <= 1.10 (met) |" in rows[0]
    assert "| 1.50 | <= 1.10 (missed) |" in rows[1]
    assert "load average 2.5, 2.7" in text and "sampleRatio 1" in text


def test_on_traces_at_the_charts_default_sample_ratio() -> None:
    values = yaml.safe_load((ROOT / "charts" / "modelpool-operator" / "values.yaml").read_text())
    assert chart_sample_ratio() == float(values["tracing"]["sampleRatio"])
    flags = on_flags("http://127.0.0.1:4318", chart_sample_ratio())
    given = dict(zip(flags[::2], flags[1::2], strict=True))
    assert given["--trace-sample-ratio"] == f"{chart_sample_ratio():g}"
    assert given["--auth"] == "keys" and given["--log-level"] == "info" and given["--log-format"] == "json"


def test_a_baselines_gateways_give_the_before_rows() -> None:
    """``--baseline``: the baseline tree's off and on gateways, in the same rounds, as "before" rows."""
    c1 = {"off": [_c1(1.0, 1.5)], "on": [_c1(1.0, 1.52)], "before:off": [_c1(1.0, 1.5)],
          "before:on": [_c1(1.0, 1.7)]}  # fmt: skip
    c64 = [_c64(10.0, 14.0, 14.2) | {"before:off": {"p50_ms": 14.0}, "before:on": {"p50_ms": 16.0}}]
    res = overhead_summary(c1, c64, argparse.Namespace(**vars(ARGS), baseline="main"))
    assert res["before"] == {"rev": "main", "c1_ratio": 0.7 / 0.5, "c64_ratio": 1.5}
    assert round(res["c1"]["ratio"], 6) == 1.04
    res |= {"load_average": ["2.5"], "sample_ratio": 0.1, "spans_received": 4, "access_lines": 10}
    rows = [line for line in overhead_table(res).splitlines() if line.startswith("| before")]
    assert rows == [
        "| before (main), concurrency 1 | +0.500 ms | +0.700 ms | 1.40 | |",
        "| before (main), concurrency 64 | +4.00 ms | +6.00 ms | 1.50 | |",
    ]
