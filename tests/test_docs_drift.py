"""The documents stay in step with the code (``testkit.docs``): the programs' flags, the chart's values
(docs/values.md generated from values.yaml), the Prometheus metric names and the CRD fields they name, the
/stats document's fields, and their links.
A failure lists each stale line as ``path:line: what``; ``python -m testkit.docs`` prints the same and
``python -m testkit.docs --write`` regenerates docs/values.md."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from testkit import docs
from testkit.docs import CHECKS, Stale
from testkit.environment import ROOT


@pytest.mark.parametrize("check", sorted(CHECKS))
def test_the_documents_match_the_code(check: str) -> None:
    stale = CHECKS[check]()
    assert not stale, "stale documentation:\n" + "\n".join(map(str, stale))


# The checker's own parts, on small documents: a checker that found nothing because it read nothing
# would pass the test above too.


def _doc(tmp_path: Path, text: str) -> list[tuple[int, str]]:
    path = tmp_path / "doc.md"
    path.write_text(text)
    return docs.numbered(path)


def test_flag_tables_are_read_from_their_section_only(tmp_path: Path) -> None:
    lines = _doc(
        tmp_path,
        "## Running it\n\n```console\n# a shell comment, not a heading\n```\n\n"
        "| flag | meaning |\n|---|---|\n| `-n/--namespace NS` | a |\n| `--host` / `--port` | b |\n\n"
        "## Settings\n\n| flag | meaning |\n|---|---|\n| `--elsewhere` | c |\n",
    )
    found = docs.documented_flags(docs.section(lines, "## Running it"))
    assert found == {"--namespace": 9, "--host": 10, "--port": 10}


def test_a_plain_default_cell_is_compared_and_prose_is_not() -> None:
    assert docs._literal("`8080`") == 8080.0
    assert docs._literal("30") == 30.0
    assert docs._literal("off") is False
    assert docs._literal("`auto`") == "auto"
    assert docs._literal("unbounded") is None
    assert docs._literal("half the CPUs, 1 to 4") is None
    assert docs._same(30.0, 30) and not docs._same(35.0, 30)
    assert docs._same("/models", Path("/models"))


def test_value_paths_resolve_through_the_values_and_into_free_form_maps() -> None:
    data = yaml.safe_load(
        "gateway:\n  hold:\n    maxPerPool: 1\n  resources: {requests: {cpu: 1}}\n  podLabels: {}\n"
    )
    assert docs.value_exists("gateway.hold.maxPerPool", data)
    assert docs.value_exists("gateway.resources.limits.memory", data)
    assert docs.value_exists("gateway.podLabels.team", data)
    assert docs.value_exists("gateway.*", data)
    assert not docs.value_exists("gateway.hold.maxHeld", data)
    assert docs._expand("metrics.{a,b}.c") == ["metrics.a.c", "metrics.b.c"]


def test_the_values_page_carries_each_value_with_its_comment_and_default() -> None:
    text = (
        '# -- The image.\nimage:\n  # -- Its tag.\n  # Empty: the appVersion.\n  tag: ""\n'
        "resources:\n  limits: {memory: 1Gi}\n"
    )
    values = docs.chart_values(text)
    assert [(v.path, v.comment, v.leaf) for v in values] == [
        ("image", "The image.", False),
        ("image.tag", "Its tag. Empty: the appVersion.", True),
        ("resources", "", True),
    ]
    page = docs.render_values(values)
    assert '| `image.tag` | `""` | Its tag. Empty: the appVersion. |' in page
    assert "| `resources` | `{limits: {memory: 1Gi}}` |  |" in page


def test_crd_paths_are_looked_up_in_the_schemas() -> None:
    pool = docs.crd_schemas()["ModelPool"]
    assert docs.schema_has(pool, "spec.queue.capacity")
    assert docs.schema_has(pool, "status.workers[].queueDepth")
    assert not docs.schema_has(pool, "spec.queue.size")
    assert "queue.maxBatchSize" in docs.spec_fields(pool["properties"]["spec"])


def test_anchors_are_githubs_and_skip_code_blocks(tmp_path: Path) -> None:
    path = tmp_path / "doc.md"
    path.write_text(
        "# The gateway (`gateway.*`)\n\n```sh\n# not a heading\n```\n## Metrics (`GET /metrics`)\n"
    )
    assert docs.anchors(path) == {"the-gateway-gateway", "metrics-get-metrics"}


def test_references_resolve_to_files_globs_and_names() -> None:
    assert docs.resolves("modelpool_contract.exits.worst_case_shutdown_s")
    assert not docs.resolves("modelpool_contract.exits.worst_case_shutdown")
    assert docs._matches(ROOT, "tests/server/unit/test_task_*.py")
    assert docs._matches(ROOT / "operator", "modelpool_operator/settings.py")
    assert not docs._matches(ROOT, "tests/server/unit/test_nothing_*.py")


def test_a_stale_line_names_its_file_and_line() -> None:
    assert str(Stale(ROOT / "docs" / "x.md", 7, "flag --y does not exist")) == (
        "docs/x.md:7: flag --y does not exist"
    )
