"""The documents agree with the code: flags, chart values, metric names and CRD fields.

``python -m testkit.docs`` checks README.md, docs/, the chart's values.yaml and NOTES.txt and examples/
against the code and prints every stale line (``path:line: what``), exit 1 when there is one;
``--write`` first regenerates the generated reference of the chart's values (``docs/values.md``, from
values.yaml and its ``# --`` comments).  ``tests/test_docs_drift.py`` runs each check.

What is checked, each against its one definition in the code:

* **Flags** (``flag_problems``): the flag tables of docs/operator.md, docs/gateway.md and docs/server.md
  (its dedicated worker and its shared host) name exactly the flags the programs' parsers have
  (``modelpool_contract.settings.build_parser`` over each settings class and command line); the operator's
  settings table names exactly its settings' variables; where a table's default cell is a plain number or
  word it is the field's default, and where it names a variable, the field's variable.
* **Chart values** (``value_problems``): every value in values.yaml has its comment and a row in
  docs/values.md (generated: ``render_values``); every value path the install docs, the README, the NOTES
  and the comments name (``gateway.hold.maxPerPool``, ``--set budget.memory=...``, a ``config.*`` table's
  names) exists in values.yaml; install.md's value tables give values.yaml's default where they give a
  plain one, and the operator's variable for each ``config.*`` value.
* **Metrics** (``metric_problems``): every ``modelpool_*`` metric a document names is one a component
  exports (their registries and the server's gauge rows), and each component's document names every
  metric it exports.
* **CRD fields** (``crd_problems``): every ``spec.*`` / ``status.*`` path the documents name exists in a
  CRD of crds/ (or is a Kubernetes object's, listed in ``NOT_CRD_PATHS``), and the YAML example of each
  kind in docs/operator-api.md has every field of that kind's spec and no other.

* **API versions** (``version_problems``): docs/versioning.md's table gives each CRD's served and storage
  versions and scope as crds/ has them.
* **/stats** (``stats_problems``): docs/server.md's example of the document parses as the contract's
  ``WorkerStats``, names none of its fields that it lacks, and the section names every field.
* **References** (``reference_problems``): every repository path the documents name exists, and every
  dotted name of a project module resolves.
* **Links** (``link_problems``): every relative link of README.md and docs/ reaches a file, and a heading
  of it where it names one.

Not a document's prose: docs/benchmarks.md is a record of runs (its commands are those of their day) and
is not checked (but for its links).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any, TypeGuard, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings

from modelpool_contract.settings import CommandLine, build_parser, env_name, flag_name
from testkit.environment import ROOT

DOCS = ROOT / "docs"
CHART = ROOT / "charts" / "modelpool-operator"
VALUES_YAML = CHART / "values.yaml"
NOTES = CHART / "templates" / "NOTES.txt"
VALUES_DOC = DOCS / "values.md"
#: The documents written by hand (the benchmarks' record and the generated values page are not).
HAND_WRITTEN = (
    ROOT / "README.md",
    *sorted(p for p in DOCS.glob("*.md") if p.name not in {"benchmarks.md", "values.md"}),
)
#: Everything a user reads besides the documents: the chart's comments and NOTES, the examples.
CHART_TEXT = (VALUES_YAML, NOTES)
EXAMPLES = tuple(sorted((ROOT / "examples").glob("*.yaml")))

#: Values whose content is a Kubernetes object or a free map, documented as a whole by their comment.
FREE_FORM = frozenset({"resources", "podSecurityContext", "securityContext", "probe"})


@dataclass(frozen=True)
class Stale:
    """One line of a document that no longer matches the code."""

    path: Path
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.what}"


# ---------------------------------------------------------------------------------------------------------
# Markdown: sections and tables


def numbered(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` with their 1-based numbers."""
    return list(enumerate(path.read_text().splitlines(), start=1))


def section(lines: list[tuple[int, str]], heading: str) -> list[tuple[int, str]]:
    """The lines under the first heading that starts with ``heading`` (``### Name``), up to the next
    heading of the same level or above; empty when there is no such heading."""
    level = len(heading) - len(heading.lstrip("#"))
    out: list[tuple[int, str]] = []
    inside = fenced = False
    for number, line in lines:
        if line.startswith("```"):
            fenced = not fenced
        if inside:
            match = None if fenced else re.match(r"^(#+) ", line)
            if match and len(match.group(1)) <= level:
                break
            out.append((number, line))
        elif line.startswith(heading):
            inside = True
    return out


def cells(line: str) -> list[str]:
    """A table row's cells (``|`` inside backticks, escaped as ``\\|``, stays in its cell)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def tables(lines: Iterable[tuple[int, str]]) -> Iterator[tuple[list[str], list[tuple[int, list[str]]]]]:
    """Every table of ``lines``: its header's cells and its rows (number, cells)."""
    header: list[str] | None = None
    rows: list[tuple[int, list[str]]] = []
    for number, line in [*lines, (0, "")]:
        if line.lstrip().startswith("|"):
            if header is None:
                header = [c.lower() for c in cells(line)]
            elif not re.fullmatch(r"[\s|:-]+", line):
                rows.append((number, cells(line)))
            continue
        if header is not None:
            yield header, rows
        header, rows = None, []


FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


# ---------------------------------------------------------------------------------------------------------
# Flags


@dataclass(frozen=True)
class Program:
    """A program's command line and the section of its document whose tables describe it."""

    model: type[BaseSettings]
    cli: CommandLine
    doc: Path
    heading: str


def parser_flags(model: type[BaseSettings], cli: CommandLine) -> dict[str, str]:
    """Every long flag of the program's parser, with the setting (field) it sets."""
    parser = build_parser(model, cli)
    return {
        name: action.dest
        for action in parser._actions
        for name in action.option_strings
        if name.startswith("--") and name != "--help"
    }


def documented_flags(lines: list[tuple[int, str]]) -> dict[str, int]:
    """The flags the first cell of each ``flag`` table names, with the line that names each."""
    found: dict[str, int] = {}
    for header, rows in tables(lines):
        if header and header[0] == "flag":
            for number, row in rows:
                for flag in FLAG.findall(row[0]):
                    found.setdefault(flag, number)
    return found


def _literal(cell: str) -> object | None:
    """A table cell's plain value (a number, on/off, true/false or one backticked word), else None."""
    text = cell.strip()
    quoted = re.fullmatch(r"`[^`\s]+`", text) is not None
    text = text.strip("`")
    if re.fullmatch(r"-?\d+(\.\d+)?", text):
        return float(text)
    words: dict[str, object] = {"off": False, "false": False, "on": True, "true": True}
    if text.lower() in words:
        return words[text.lower()]
    # Any other word is a value only in backticks (`auto`, `/models`): prose such as "unbounded" is not.
    return text if quoted and re.fullmatch(r"[A-Za-z0-9_.:/-]+", text) else None


def _same(documented: object, default: object) -> bool:
    if isinstance(documented, bool) or isinstance(default, bool):
        return documented == default
    if isinstance(documented, float):
        if isinstance(default, str):  # a quantity setting written as a number ("1" CPU is documented 1)
            return re.fullmatch(r"-?\d+(\.\d+)?", default) is not None and float(default) == documented
        return isinstance(default, int | float) and float(default) == documented
    return isinstance(default, str | PurePath) and str(default) == documented


def default_problems(
    path: Path,
    lines: list[tuple[int, str]],
    model: type[BaseSettings],
    row_field: Callable[[str], str | None],
) -> list[Stale]:
    """Rows whose ``default`` cell is a plain value other than the field's default, or whose
    ``environment`` cell names another variable than the field's."""
    problems: list[Stale] = []
    fields = model.model_fields
    for header, rows in tables(lines):
        if not header or "default" not in header:
            continue
        at = header.index("default")
        env_at = next((header.index(h) for h in ("environment", "env") if h in header), None)
        for number, row in rows:
            name = row_field(row[0])
            if name is None or name not in fields or len(row) <= at:
                continue
            value = _literal(row[at])
            default = fields[name].default
            if value is not None and not _same(value, default):
                problems.append(
                    Stale(path, number, f"{row[0]}: documented default {row[at]}, code {default!r}")
                )
            if env_at is not None and (want := env_name(model, name)) not in row[env_at]:
                problems.append(
                    Stale(path, number, f"{row[0]}: documented variable {row[env_at]}, code {want}")
                )
    return problems


def _programs() -> tuple[Program, Program, Program]:
    from model_server.config import COMMAND_LINE as SERVER_CLI
    from model_server.config import ServerConfig
    from modelpool_gateway.config import COMMAND_LINE as GATEWAY_CLI
    from modelpool_gateway.config import GatewaySettings
    from modelpool_operator.main import COMMAND_LINE as OPERATOR_CLI
    from modelpool_operator.settings import OperatorConfig

    return (
        Program(OperatorConfig, OPERATOR_CLI, DOCS / "operator.md", "## Running it"),
        Program(GatewaySettings, GATEWAY_CLI, DOCS / "gateway.md", "## Configuration"),
        Program(ServerConfig, SERVER_CLI, DOCS / "server.md", "### Command line and environment"),
    )


def _flag_field(parser: Mapping[str, str]) -> Callable[[str], str | None]:
    def field(first_cell: str) -> str | None:
        flags = FLAG.findall(first_cell)
        return parser.get(flags[0]) if len(flags) == 1 else None

    return field


def _set_problems(path: Path, documented: Mapping[str, int], real: Iterable[str], what: str) -> list[Stale]:
    real = set(real)
    heading_line = min(documented.values(), default=1)
    return [
        *(Stale(path, heading_line, f"{what} {x} is not documented") for x in sorted(real - set(documented))),
        *(Stale(path, documented[x], f"{what} {x} does not exist") for x in sorted(set(documented) - real)),
    ]


def flag_problems() -> list[Stale]:
    """The flag tables of the three programs (and the shared host's) against their parsers."""
    from model_server.host_config import HOST_COMMAND_LINE, HostConfig

    operator, gateway, server = _programs()
    problems: list[Stale] = []
    # The gateway and the dedicated server: one table each, every flag.
    for program in (gateway, server):
        lines = section(numbered(program.doc), program.heading)
        real = parser_flags(program.model, program.cli)
        problems += _set_problems(program.doc, documented_flags(lines), real, "flag")
        problems += default_problems(program.doc, lines, program.model, _flag_field(real))
    # The shared host: its own table, beside the dedicated server's for the flags both have.
    server_lines = section(numbered(server.doc), server.heading)
    host_lines = section(numbered(server.doc), "### Shared host")
    host_documented = documented_flags(host_lines)
    host_real = parser_flags(HostConfig, HOST_COMMAND_LINE)
    everywhere = {**documented_flags(server_lines), **host_documented}
    problems += [
        Stale(server.doc, host_lines[0][0], f"shared-host flag {x} is not documented")
        for x in sorted(set(host_real) - set(everywhere))
    ]
    problems += [
        Stale(server.doc, n, f"shared-host flag {x} does not exist")
        for x, n in sorted(host_documented.items())
        if x not in host_real
    ]
    problems += default_problems(server.doc, host_lines, HostConfig, _flag_field(host_real))
    problems += _operator_flag_problems(operator)
    return problems


def _operator_flag_problems(operator: Program) -> list[Stale]:
    """The operator documents its renamed flags (scope, peering, ...) in one table and every setting
    (``MODELPOOL_OPERATOR_<NAME>``, and with it the flag ``--<name>``) in the settings table."""
    lines = numbered(operator.doc)
    real = parser_flags(operator.model, operator.cli)
    fields = operator.model.model_fields
    flags_table = documented_flags(section(lines, operator.heading))
    settings = section(lines, "## Settings")
    variables: dict[str, int] = {}
    for header, rows in tables(settings):
        if header and header[0] == "variable":
            for number, row in rows:
                variables.setdefault(row[0].strip("`"), number)
    problems = _set_problems(
        operator.doc,
        variables,
        (env_name(operator.model, f).removeprefix("MODELPOOL_OPERATOR_") for f in fields),
        "setting",
    )
    renamed = {flag for flag, dest in real.items() if flag != flag_name(dest)}
    problems += _set_problems(operator.doc, flags_table, renamed | (set(flags_table) & set(real)), "flag")

    def field(first_cell: str) -> str | None:
        name = first_cell.strip("`").lower()
        return name if name in fields else None

    problems += default_problems(operator.doc, settings, operator.model, field)
    return problems


# ---------------------------------------------------------------------------------------------------------
# Chart values


@dataclass(frozen=True)
class Value:
    """One key of values.yaml: its dotted path, its comment (the ``# --`` text above it) and its
    default (None for a map of further values)."""

    path: str
    comment: str
    default: object
    leaf: bool
    line: int


def chart_values(text: str | None = None) -> list[Value]:
    """Every key of values.yaml in file order, with the comment above it; the keys inside a free-form
    value (``resources``, ...) are part of it."""
    text = VALUES_YAML.read_text() if text is None else text
    data: dict[str, Any] = yaml.safe_load(text)
    lines = text.splitlines()
    parents: list[tuple[int, str]] = []
    out: list[Value] = []
    for index, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z][A-Za-z0-9]*):", line)
        if not match:
            continue
        indent, key = len(match.group(1)), match.group(2)
        parents = [(i, k) for i, k in parents if i < indent]
        if any(k in FREE_FORM for _, k in parents):
            continue
        path = [k for _, k in parents] + [key]
        value: Any = data
        for part in path:
            value = value[part]
        leaf = not isinstance(value, dict) or not value or key in FREE_FORM
        out.append(
            Value(".".join(path), _comment_above(lines, index), value if leaf else None, leaf, index + 1)
        )
        parents.append((indent, key))
    return out


def _comment_above(lines: list[str], index: int) -> str:
    """The comment block right above line ``index``, from its last ``# --`` line on."""
    block: list[str] = []
    for line in reversed(lines[:index]):
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        block.insert(0, stripped.lstrip("#").strip())
        if stripped.startswith("# --"):
            block[0] = block[0].removeprefix("--").strip()
            break
    return " ".join(part for part in block if part)


def _render_default(value: object) -> str:
    if value == "":
        return '`""`'
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    text = text.removesuffix("\n...").removesuffix("...").strip()
    return f"`{text}`".replace("|", "\\|")


def render_values(values: list[Value] | None = None) -> str:
    """docs/values.md: every chart value, its default and its comment, in values.yaml's order."""
    values = chart_values() if values is None else values
    lines = [
        "# Chart values (generated)",
        "",
        "Every value of the `modelpool-operator` chart, in the order of",
        "`charts/modelpool-operator/values.yaml`, with its default and its comment there. Generated by",
        "`python -m testkit.docs --write`; `tests/test_docs_drift.py` fails when this page and values.yaml",
        "differ. `values.schema.json` rejects any other key. What to set and why: [install.md](install.md).",
        "",
        "| value | default | meaning |",
        "|---|---|---|",
    ]
    for value in values:
        default = _render_default(value.default) if value.leaf else ""
        # "<release>" would be an HTML tag to a Markdown renderer.
        comment = value.comment.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")
        lines.append(f"| `{value.path}` | {default} | {comment} |")
    return "\n".join(lines) + "\n"


#: Where value paths are named (a document about the chart, the chart's own text).
VALUE_DOCS = (ROOT / "README.md", DOCS / "install.md", DOCS / "security.md", DOCS / "gateway.md", *CHART_TEXT)
VALUE_TOKEN = re.compile(
    r"(?<![\w.\-/$])([a-z][A-Za-z0-9]*(?:\.(?:[A-Za-z0-9*]+|\{[A-Za-z0-9,]+\}))+)(?![\w/])"
)
_FILE_SUFFIXES = (".md", ".py", ".yaml", ".tpl", ".txt", ".json", ".sh")


def _expand(token: str) -> list[str]:
    """``a.{b,c}`` -> ``a.b``, ``a.c``."""
    match = re.search(r"\{([^}]*)\}", token)
    if not match:
        return [token]
    return [
        path
        for choice in match.group(1).split(",")
        for path in _expand(token[: match.start()] + choice + token[match.end() :])
    ]


def value_exists(path: str, data: Mapping[str, Any]) -> bool:
    """Whether ``path`` (``*`` at the end: any key below) names a key of the values, or a key inside a
    free-form one."""
    node: Any = data
    for part in path.split("."):
        if part in {"*", "**"}:
            return isinstance(node, dict)
        if not isinstance(node, dict) or part not in node:
            return False
        if part in FREE_FORM or node[part] == {}:
            return True
        node = node[part]
    return True


def named_value_paths(path: Path, data: Mapping[str, Any]) -> list[tuple[int, str]]:
    """The value paths a document names: dotted names under a top-level value in its text (``--set``
    arguments included), and the first cells of its ``config.*`` settings table."""
    tops = set(data)
    found: list[tuple[int, str]] = []
    lines = numbered(path)
    for number, line in lines:
        for token in VALUE_TOKEN.findall(line):
            if token.split(".")[0] in tops and "_" not in token and not token.endswith(_FILE_SUFFIXES):
                found += [(number, p) for p in _expand(token)]
    for header, rows in tables(section(lines, "### Operator settings (`config.*`)")):
        if header and header[0] == "value":
            for number, row in rows:
                found += [(number, "config." + name) for name in re.findall(r"`([A-Za-z0-9]+)`", row[0])]
    return found


def _value_at(path: str, data: Mapping[str, Any]) -> object:
    node: Any = data
    for part in path.split("."):
        node = node[part]
    return node


def value_default_problems(data: Mapping[str, Any]) -> list[Stale]:
    """install.md's value tables: a row naming one value whose ``default`` cell is a plain value must have
    values.yaml's default; the ``config.*`` table's ``env`` cell must name the operator's variable."""
    from modelpool_operator.settings import OperatorConfig

    install = DOCS / "install.md"
    lines = numbered(install)
    config_lines = {n for n, _ in section(lines, "### Operator settings (`config.*`)")}
    problems: list[Stale] = []
    for header, rows in tables(lines):
        if not header or header[0] != "value" or "default" not in header:
            continue
        at = header.index("default")
        for number, row in rows:
            names = re.findall(r"`([A-Za-z0-9.]+)`", row[0])
            if len(names) != 1 or len(row) <= at:
                continue
            path = f"config.{names[0]}" if number in config_lines else names[0]
            documented = _literal(row[at])
            if documented is None or not value_exists(path, data):
                continue
            actual = _value_at(path, data)
            if not isinstance(actual, dict | list) and not _same(documented, actual):
                problems.append(
                    Stale(install, number, f"{path}: documented default {row[at]}, values.yaml {actual!r}")
                )

    def field(first_cell: str) -> str | None:
        names = re.findall(r"`([A-Za-z0-9]+)`", first_cell)
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", names[0]).lower() if len(names) == 1 else None
        return snake if snake in OperatorConfig.model_fields else None

    settings = section(lines, "### Operator settings (`config.*`)")
    problems += [
        p for p in default_problems(install, settings, OperatorConfig, field) if "variable" in p.what
    ]
    return problems


def value_problems() -> list[Stale]:
    """values.yaml against docs/values.md and against the value paths the documents name."""
    values = chart_values()
    data: dict[str, Any] = yaml.safe_load(VALUES_YAML.read_text())
    problems = [Stale(VALUES_YAML, v.line, f"{v.path} has no comment") for v in values if not v.comment]
    problems += value_default_problems(data)
    if not VALUES_DOC.exists() or VALUES_DOC.read_text() != render_values(values):
        problems.append(Stale(VALUES_DOC, 1, "out of date with values.yaml: python -m testkit.docs --write"))
    for path in VALUE_DOCS:
        problems += [
            Stale(path, number, f"chart value {name} does not exist in values.yaml")
            for number, name in named_value_paths(path, data)
            if not value_exists(name, data)
        ]
    return problems


# ---------------------------------------------------------------------------------------------------------
# Metrics


def exported_metrics() -> dict[str, set[str]]:
    """The metric names each component exports, by the document that describes it: counters with their
    ``_total``, histograms and gauges by their own name."""
    from prometheus_client import CollectorRegistry

    from model_server import metrics as server_metrics
    from modelpool_gateway.metrics import Metrics as GatewayMetrics
    from modelpool_operator.metrics import OperatorMetrics

    def names(registry: CollectorRegistry) -> set[str]:
        out = set()
        for family in registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            if not name.startswith("process_"):
                out.add(name)
        return out

    # The server's gauges are read at scrape time from its shared view: their names are the rows'.
    source = Path(server_metrics.__file__).read_text()
    counted = names(server_metrics.Metrics().registry)
    gauges = {
        name
        for name in re.findall(r'"(modelpool_[a-z_]+)"', source)
        if name + "_total" not in counted and name not in counted
    }
    return {
        "operator.md": names(OperatorMetrics().registry),
        "gateway.md": names(GatewayMetrics().registry),
        "server.md": counted | gauges,
    }


#: Names that look like metrics but are packages, modules or labels.
NOT_METRICS = frozenset(
    {"modelpool_operator", "modelpool_gateway", "modelpool_contract", "modelpool_dev_pool"}
)
METRIC_TOKEN = re.compile(r"\bmodelpool_[a-z0-9_]+\b(?![*./])")
_SERIES_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


def metric_problems() -> list[Stale]:
    """Metric names in the documents against those the code exports, both ways."""
    exported = exported_metrics()
    every = set().union(*exported.values())
    problems: list[Stale] = []
    for path in (*HAND_WRITTEN, *CHART_TEXT, *EXAMPLES):
        for number, line in numbered(path):
            for token in METRIC_TOKEN.findall(line):
                base = next((token.removesuffix(s) for s in _SERIES_SUFFIXES if token.endswith(s)), token)
                if token not in NOT_METRICS and token.endswith("_") is False and base not in every:
                    problems.append(Stale(path, number, f"metric {token} is exported by no component"))
    for doc, names in exported.items():
        text = (DOCS / doc).read_text()
        problems += [
            Stale(DOCS / doc, 1, f"metric {name} is exported but not documented here")
            for name in sorted(names)
            if not re.search(rf"\b{name}\b", text)
        ]
    return problems


# ---------------------------------------------------------------------------------------------------------
# CRD fields


#: Paths the documents name on Kubernetes' own objects (a Pod, a Service, a Lease, a PersistentVolume),
#: not on a CRD of the project, and the placeholder of an error message (``spec.field: why``).
NOT_CRD_PATHS = frozenset(
    {
        "spec.field",
        "spec.nodeName",
        "spec.clusterIP",
        "spec.hostPath.path",
        "spec.local.path",
        "spec.renewTime",
        "status.hostIP",
        "status.podIP",
        "status.storedVersions",
    }
)
CRD_PATH = re.compile(r"(?<![\w.])((?:spec|status)(?:\.[A-Za-z][A-Za-z0-9]*(?:\[\])?)+)")


def crd_schemas() -> dict[str, dict[str, Any]]:
    """Each kind's openAPIV3Schema, from crds/*.yaml."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[crd["spec"]["names"]["kind"]] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return out


def schema_has(schema: Mapping[str, Any], path: str) -> bool:
    """Whether ``path`` (``a.b[].c``) is a field of ``schema``; anything below a field the schema leaves
    open (preserve-unknown-fields, or an object without properties) counts."""
    node: Mapping[str, Any] = schema
    for part in path.split("."):
        many = part.endswith("[]")
        name = part.removesuffix("[]")
        if node.get("x-kubernetes-preserve-unknown-fields") or (
            node.get("type") == "object" and "properties" not in node
        ):
            return True
        properties = node.get("properties", {})
        if name not in properties:
            return False
        node = properties[name]
        if many:
            node = node.get("items", {})
    return True


def spec_fields(schema: Mapping[str, Any], prefix: str = "", depth: int = 3) -> set[str]:
    """The dotted names of a schema's fields, ``depth`` levels deep (a list's item fields are not
    descended into: they are Kubernetes' own types or documented with their list)."""
    out: set[str] = set()
    for name, sub in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        out.add(path)
        if depth > 1 and sub.get("type") == "object":
            out |= spec_fields(sub, path + ".", depth - 1)
    return out


def _yaml_keys(node: object, prefix: str = "") -> set[str]:
    if not isinstance(node, dict):
        return set()
    out: set[str] = set()
    for key, value in node.items():
        out.add(f"{prefix}{key}")
        out |= _yaml_keys(value, f"{prefix}{key}.")
    return out


def api_examples() -> dict[str, tuple[int, dict[str, Any]]]:
    """The first YAML example of each kind in docs/operator-api.md: its line and its body."""
    text = (DOCS / "operator-api.md").read_text()
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    for match in re.finditer(r"```yaml\n(.*?)```", text, flags=re.S):
        # A commented-out field (an alternative: ``# targetKvCache: 0.7``) is shown too.
        body = re.sub(r"^(\s*)# (?=[A-Za-z]+:)", r"\1", match.group(1), flags=re.M)
        for document in yaml.safe_load_all(body):
            if isinstance(document, dict) and "kind" in document and document["kind"] not in out:
                out[document["kind"]] = (text[: match.start()].count("\n") + 2, document)
    return out


def crd_problems() -> list[Stale]:
    """``spec.*`` / ``status.*`` paths in the documents against the CRDs; operator-api.md's example of
    each kind against its spec's fields."""
    schemas = crd_schemas()
    problems: list[Stale] = []
    for path in (*HAND_WRITTEN, *CHART_TEXT, *EXAMPLES):
        for number, line in numbered(path):
            for token in CRD_PATH.findall(line):
                if token in NOT_CRD_PATHS:
                    continue
                if not any(schema_has(s, token) for s in schemas.values()):
                    problems.append(Stale(path, number, f"{token} is a field of no CRD in crds/"))
    examples = api_examples()
    doc = DOCS / "operator-api.md"
    for kind, schema in schemas.items():
        if kind not in examples:
            problems.append(Stale(doc, 1, f"no YAML example of {kind}"))
            continue
        at, example = examples[kind]
        spec = schema["properties"]["spec"]
        fields = spec_fields(spec)
        shown = _yaml_keys(example.get("spec", {}))
        problems += [Stale(doc, at, f"{kind} example lacks spec.{f}") for f in sorted(fields - shown)]
        problems += [
            Stale(doc, at, f"{kind} example has spec.{f}, a field of no {kind}")
            for f in sorted(shown)
            if not schema_has(spec, f)
        ]
    return problems


def version_problems() -> list[Stale]:
    """docs/versioning.md's table (kind | served | storage | scope) against each CRD of crds/."""
    doc = DOCS / "versioning.md"
    real: dict[str, tuple[str, str, str]] = {}
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        versions = crd["spec"]["versions"]
        served = ", ".join(v["name"] for v in versions if v.get("served"))
        storage = ", ".join(v["name"] for v in versions if v.get("storage"))
        real[crd["spec"]["names"]["kind"]] = (served, storage, crd["spec"]["scope"])
    documented: dict[str, tuple[int, tuple[str, ...]]] = {}
    for header, rows in tables(numbered(doc)):
        if header[:2] == ["kind", "served"]:
            for number, row in rows:
                documented[row[0].strip("`")] = (number, tuple(row[1:4]))
    problems = [
        Stale(doc, 1, f"{kind} is not in the versions table")
        for kind in sorted(real.keys() - documented.keys())
    ]
    for kind, (number, cells) in sorted(documented.items()):
        if kind not in real:
            problems.append(Stale(doc, number, f"{kind} is the kind of no CRD in crds/"))
        elif cells != real[kind]:
            problems.append(
                Stale(doc, number, f"{kind}: served, storage, scope are {real[kind]}, not {cells}")
            )
    return problems


# ---------------------------------------------------------------------------------------------------------
# The /stats document


def _is_model(annotation: object) -> TypeGuard[type[BaseModel]]:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def stats_problems() -> list[Stale]:
    """docs/server.md's ``/stats`` example parses as the contract's ``WorkerStats`` and names no field it
    lacks, and the section names every field of it."""
    from modelpool_contract.stats import WorkerStats

    doc = DOCS / "server.md"
    lines = section(numbered(doc), "### `/stats`")
    if not lines:
        return [Stale(doc, 1, "no `/stats` section")]
    text = "\n".join(line for _, line in lines)
    match = re.search(r"```json\n(.*?)```", text, flags=re.S)
    if match is None:
        return [Stale(doc, lines[0][0], "the `/stats` section has no JSON example")]
    at = lines[0][0] + text[: match.start()].count("\n") + 1
    example = json.loads(match.group(1))
    problems: list[Stale] = []
    try:
        WorkerStats.model_validate(example)
    except ValidationError as exc:
        problems.append(Stale(doc, at, f"the /stats example is not a WorkerStats: {exc.errors()[0]['msg']}"))

    def unknown(document: dict[str, Any], model: type[BaseModel], prefix: str) -> Iterator[str]:
        for key, value in document.items():
            info = model.model_fields.get(key)
            if info is None:
                yield prefix + key
                continue
            # ``StatsMemory | None``: the model among the annotation's arguments.
            nested = [a for a in (info.annotation, *get_args(info.annotation)) if _is_model(a)]
            if isinstance(value, dict) and nested:
                yield from unknown(value, nested[0], f"{prefix}{key}.")

    problems += [Stale(doc, at, f"/stats has no field {k}") for k in unknown(example, WorkerStats, "")]
    problems += [
        Stale(doc, at, f"/stats field {name} is not documented")
        for name in WorkerStats.model_fields
        if not re.search(rf'"{name}"|`{name}`', text)
    ]
    return problems


# ---------------------------------------------------------------------------------------------------------
# References to the code


PATH_TOKEN = re.compile(
    r"(?<![\w./-])((?:tests|e2e|bench|hack|testkit|model_server|modelpool_gateway|modelpool_contract|operator"
    r"|charts|crds|examples|docs)/[\w./*-]*\w)"
)
DOTTED_TOKEN = re.compile(
    r"\b((?:modelpool_contract|modelpool_operator|model_server|modelpool_gateway|testkit)(?:\.[A-Za-z_]\w*)+)"
)


def resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` is a module, or an attribute of the longest module it starts with."""
    import importlib

    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ImportError:
            continue
        for name in parts[end:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


def _matches(base: Path, pattern: str) -> bool:
    """Whether ``pattern`` (a path, or a glob such as ``tests/server/unit/test_task_*.py``) names a file."""
    return any(base.glob(pattern)) if "*" in pattern else (base / pattern).exists()


def reference_problems() -> list[Stale]:
    """Every repository path the documents name exists (operator/ paths may leave out ``operator/``), and
    every dotted name of a project module (``modelpool_contract.exits.worst_case_shutdown_s``) resolves."""
    problems: list[Stale] = []
    checked: dict[str, bool] = {}
    for path in (*HAND_WRITTEN, *CHART_TEXT, *EXAMPLES):
        for number, line in numbered(path):
            for token in PATH_TOKEN.findall(line):
                if not any(_matches(base, token) for base in (ROOT, ROOT / "operator")):
                    problems.append(Stale(path, number, f"{token}: no such file or folder"))
            for token in DOTTED_TOKEN.findall(line):
                if token.endswith((".py", ".md")):
                    continue
                if token not in checked:
                    checked[token] = resolves(token)
                if not checked[token]:
                    problems.append(Stale(path, number, f"{token}: no such module or name"))
    return problems


# ---------------------------------------------------------------------------------------------------------
# Links


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (not of ``#`` lines inside code blocks)."""
    out: set[str] = set()
    fenced = False
    for _, line in numbered(path):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^#+ (.*)", line)):
            out.add(slug(match.group(1)))
    return out


def link_problems() -> list[Stale]:
    """Relative links of README.md and docs/ (docs/benchmarks.md and values.md included) to a file that
    does not exist, or to a heading the file does not have."""
    problems: list[Stale] = []
    for path in (ROOT / "README.md", *sorted(DOCS.glob("*.md"))):
        for number, line in numbered(path):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                linked = path.parent / file if file else path
                if not linked.exists():
                    problems.append(Stale(path, number, f"link to {target}: no such file"))
                elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                    problems.append(Stale(path, number, f"link to {target}: no such heading"))
    return problems


# ---------------------------------------------------------------------------------------------------------

CHECKS: dict[str, Callable[[], list[Stale]]] = {
    "flags": flag_problems,
    "values": value_problems,
    "metrics": metric_problems,
    "crd fields": crd_problems,
    "api versions": version_problems,
    "/stats": stats_problems,
    "references": reference_problems,
    "links": link_problems,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.docs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate docs/values.md first")
    args = parser.parse_args(argv)
    if args.write:
        VALUES_DOC.write_text(render_values())
    stale = [problem for check in CHECKS.values() for problem in check()]
    for problem in stale:
        print(problem)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
