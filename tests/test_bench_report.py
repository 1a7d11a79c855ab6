"""Every benchmark writes its table into docs/benchmarks.md between its own markers (``bench.report``), and
the front page carries none: each block a benchmark names is there exactly once, so a run replaces it
instead of appending a second one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.report import BENCHMARKS, publish, replace_block, server_markers
from testkit.environment import ROOT


def _markers() -> set[tuple[str, str]]:
    """The (start, end) markers the benchmark modules write between."""
    names = {
        name
        for path in (ROOT / "bench").rglob("*.py")
        for name in re.findall(r"<!-- bench:([a-z-]+):start -->", path.read_text())
    }
    found = {(f"<!-- bench:{n}:start -->", f"<!-- bench:{n}:end -->") for n in names}
    return found | {server_markers("cpu"), server_markers("cuda")}


def test_every_benchmark_block_is_in_docs_benchmarks_once_and_none_in_the_readme() -> None:
    page = BENCHMARKS.read_text()
    readme = (ROOT / "README.md").read_text()
    markers = _markers()
    assert len(markers) >= 9  # server, server-gpu, cpu-quota, limits, density, gateway, controlplane, ...
    for start, end in sorted(markers):
        assert page.count(start) == 1 and page.count(end) == 1, start
        assert page.index(start) < page.index(end), start
        assert start not in readme and end not in readme, start


def test_replace_block_replaces_between_the_markers_and_appends_when_missing(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\nbefore\n<!-- b:start -->\nold\n<!-- b:end -->\nafter\n")
    replace_block("new", "<!-- b:start -->", "<!-- b:end -->", doc)
    assert doc.read_text() == "# B\n\nbefore\n<!-- b:start -->\nnew\n<!-- b:end -->\nafter\n"
    replace_block("other", "<!-- c:start -->", "<!-- c:end -->", doc)
    assert doc.read_text().endswith("after\n\n<!-- c:start -->\nother\n<!-- c:end -->\n")


def test_publish_saves_the_results_prints_the_table_and_fills_its_block(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc, saved, markers = (
        tmp_path / "benchmarks.md",
        tmp_path / "out" / "b.json",
        ("<!-- b:start -->", "<!-- b:end -->"),
    )
    publish({"rate": 1.5}, "| table |", saved, markers, docs=False, doc=doc)
    assert json.loads(saved.read_text()) == {"rate": 1.5} and "| table |" in capsys.readouterr().out
    assert not doc.exists()  # --no-docs
    publish({"rate": 2.0}, "| new |", saved, markers, doc=doc)
    assert doc.read_text().endswith("<!-- b:start -->\n| new |\n<!-- b:end -->\n")
