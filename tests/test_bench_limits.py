"""bench.limits' pure parts: the wrk script and the parsing of its counts, the docs/benchmarks.md table of the
measures run, the before/after lines of ``--baseline``."""

from __future__ import annotations

import json

import pytest

from bench.limits import WRK_MARK, comparison, table, wrk_counts, wrk_script
from testkit.load import v2_body

TAIL = {"p50_ms": 20.0, "p99_ms": 28.0, "requests": 400, "generator": "wrk", "load": "9.1"}
REFUSALS = {
    "generator": "wrk", "refused_per_s": 16737.0, "cpu_us_per_refusal": 26.0,
    "refusals_per_cpu_second": 38439.0, "errors": {}, "load": "12.0",
}  # fmt: skip


def test_the_script_posts_the_real_infer_request_and_counts_answers_by_status() -> None:
    body, _ = v2_body(["one sentence"], binary=False)
    script = wrk_script(body)
    assert 'wrk.method = "POST"' in script
    assert f"wrk.body = [[{body.decode()}]]" in script  # the v2 request itself, so the 429 path is real
    assert 'wrk.headers["Content-Type"] = "application/json"' in script
    assert "if status == 429 then refused = refused + 1" in script
    assert WRK_MARK.strip() in script


def test_a_body_that_would_end_the_lua_long_string_is_refused() -> None:
    with pytest.raises(ValueError, match="Lua long string"):
        wrk_script(b'{"data": [["x"]]}')


def test_counts_are_read_from_the_line_the_script_prints_among_wrks_own() -> None:
    counts = {
        "refused": 120000,
        "ok": 0,
        "other": 2,
        "errors": 1,
        "seconds": 8.0,
        "p50_ms": 1.5,
        "p99_ms": 9.0,
    }
    output = "Running 8s test @ http://127.0.0.1:1/v2/models/minilm/infer\n  1 threads and 64 connections\n"
    output += WRK_MARK + json.dumps(counts) + "\nRequests/sec:  15000.00\n"
    assert wrk_counts(output) == counts


def test_the_table_has_rows_for_the_measures_run_and_says_where_they_ran() -> None:
    text = table({"tail": TAIL, "refusals": {**REFUSALS, "favoured": True}})
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| tail, 1 connection", "| refusals, model idle"]
    assert "p99 = 1.40x p50" in rows[0] and "favoured" not in rows[0]
    assert "(wrk, in a favoured cgroup)" in rows[1] and "38,439 per CPU second" in rows[1]
    assert "co-location" not in text and "flood" not in text


def test_the_comparison_gives_medians_before_and_after() -> None:
    res = {
        "rev": "main",
        "favoured": True,
        "tail": {"before": [TAIL, {**TAIL, "p99_ms": 40.0}], "after": [{**TAIL, "p99_ms": 24.0}]},
    }
    lines = comparison(res).splitlines()
    assert lines[0] == "tail before (main): p50_ms 20.0, p99_ms 34.0 (load 9.1, 9.1)"
    assert lines[1] == "tail after (this tree): p50_ms 20.0, p99_ms 24.0 (load 9.1)"
    assert lines[-1] == "(in a favoured cgroup)"
