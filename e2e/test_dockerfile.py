"""The Dockerfile (which cannot be built here: no Docker engine) has the two targets the chart and the
operator rely on, each running the right console script as a non-root user, with torch only in the server
and the gateway (which the chart runs from the operator image) in the operator image.

The check parses the instructions (continuation lines joined), so it follows what `docker build` reads."""

from __future__ import annotations

import json
import re
import tomllib

from e2e.helpers import ROOT
from modelpool_contract.mounts import HF_HOME_PATH

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def _stages(text: str) -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, rest in _instructions(text):
        if keyword == "FROM":
            match = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            assert match, f"unparsable FROM {rest}"
            current = stages.setdefault(match.group(2) or match.group(1), [])
        elif current is not None:
            current.append((keyword, rest))
    return stages


STAGES = _stages(DOCKERFILE)
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def _last(stage: str, keyword: str) -> str:
    values = [rest for kw, rest in STAGES[stage] if kw == keyword]
    assert values, f"stage {stage} has no {keyword}"
    return values[-1]


def test_both_targets_exist() -> None:
    assert {"operator", "server"} <= set(STAGES)


def test_entrypoints_are_the_console_scripts() -> None:
    for target, script in (("operator", "modelpool-operator"), ("server", "modelpool-server")):
        assert script in SCRIPTS
        assert json.loads(_last(target, "ENTRYPOINT")) == [script]


def test_targets_run_as_non_root() -> None:
    for target in ("operator", "server"):
        user = _last(target, "USER").split(":")[0]
        assert user not in ("root", "0"), f"{target} runs as {user}"
        assert user.isdigit(), "a numeric USER lets runAsNonRoot verify it without /etc/passwd"


def test_extras_per_target_and_no_torch_in_the_operator() -> None:
    operator_runs = " ".join(rest for kw, rest in STAGES["operator"] if kw == "RUN")
    server_runs = " ".join(rest for kw, rest in STAGES["server"] if kw == "RUN")
    assert "[operator,gateway]" in operator_runs and "[server]" not in operator_runs
    assert "torch" not in operator_runs
    assert "modelpool-gateway" in SCRIPTS
    assert any(kw == "COPY" and "modelpool_gateway" in rest for kw, rest in STAGES["build"])
    assert "[server]" in server_runs and "torch" in server_runs


def test_the_default_target_is_the_operator() -> None:
    # A plain `docker build .` builds the last stage.
    assert list(STAGES)[-1] == "operator"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignore = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "everything is excluded unless named"
    for needed in ("!pyproject.toml", "!operator/", "!model_server/", "!modelpool_gateway/"):
        assert needed in ignore


def test_server_hf_home_matches_the_worker_pods() -> None:
    env = " ".join(rest for kw, rest in STAGES["server"] if kw == "ENV")
    assert f"HF_HOME={HF_HOME_PATH}" in env
