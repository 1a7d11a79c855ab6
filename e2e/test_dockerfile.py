"""The Dockerfile has the two targets the chart and the operator rely on, each running the right console
script as uid 10001 with the layout the pods mount (HF_HOME, HOME, the writable directories), installed from
uv.lock with hashes, torch only in the server and the gateway (which the chart runs from the operator
image) in the operator image; its base is a build argument (python:3.11-slim unless `make images` passes
its debootstrap base).

The check parses the instructions (continuation lines joined), so it follows what `docker build` and
`buildah bud` read; `make images` builds them for real (hack/images.sh).  The CPU variant's filter of the
locked requirements runs here on the real export of uv.lock."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

from modelpool_contract.mounts import CACHE_MOUNT_PATH, HF_HOME_PATH, HOME_PATH, PVC_MOUNT_ROOT
from testkit.environment import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()
#: The uid and gid of the pods' securityContext (the operator's worker pods and the chart).
UID = "10001"
VENV = "/opt/modelpool"


def _instructions(text: str) -> list[tuple[str, str]]:
    # Comment lines inside a continued instruction are dropped first, as Docker's parser does.
    lines = [line for line in text.splitlines() if not line.strip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line:
            continue
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def _stages(text: str) -> tuple[dict[str, str], dict[str, list[tuple[str, str]]]]:
    """The global ARGs (before the first FROM) and each stage's instructions, the FROM's image first."""
    global_args: dict[str, str] = {}
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for keyword, rest in _instructions(text):
        if keyword == "FROM":
            match = re.match(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$", rest, re.IGNORECASE)
            assert match, f"unparsable FROM {rest}"
            current = stages.setdefault(match.group(2) or match.group(1), [])
            current.append(("FROM", match.group(1)))
        elif current is not None:
            current.append((keyword, rest))
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            global_args[name] = default
    return global_args, stages


GLOBAL_ARGS, STAGES = _stages(DOCKERFILE)
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SCRIPTS = PYPROJECT["scripts"]


def _all(stage: str, keyword: str) -> list[str]:
    return [rest for kw, rest in STAGES[stage] if kw == keyword]


def _last(stage: str, keyword: str) -> str:
    values = _all(stage, keyword)
    assert values, f"stage {stage} has no {keyword}"
    return values[-1]


def _env(stage: str = "base") -> dict[str, str]:
    env: dict[str, str] = {}
    for rest in _all(stage, "ENV"):
        env.update(dict(pair.split("=", 1) for pair in rest.split()))
    return env


def test_both_targets_exist_on_the_shared_base() -> None:
    assert {"base", "build", "operator", "server"} <= set(STAGES)
    for target in ("build", "operator", "server"):
        assert _all(target, "FROM") == ["base"]


def test_the_base_is_a_build_argument_defaulting_to_the_official_python() -> None:
    # `docker build` elsewhere starts from python:3.11-slim; `make images` passes its debootstrap base.
    assert GLOBAL_ARGS["BASE_IMAGE"] == "python:3.11-slim"
    assert _all("base", "FROM") == ["${BASE_IMAGE}"]
    images_sh = (ROOT / "hack" / "images.sh").read_text()
    assert "BASE_IMAGE=$BASE_IMAGE" in images_sh


def test_entrypoints_are_the_console_scripts() -> None:
    for target, script in (("operator", "modelpool-operator"), ("server", "modelpool-server")):
        assert script in SCRIPTS
        assert json.loads(_last(target, "ENTRYPOINT")) == [script]
    # The chart runs the gateway from the operator image by its console script.
    assert "modelpool-gateway" in SCRIPTS


def test_targets_run_as_the_pods_uid() -> None:
    runs = " ".join(_all("base", "RUN"))
    assert f"--uid {UID}" in runs and f"--gid {UID}" in runs
    for target in ("operator", "server"):
        # Numeric, so runAsNonRoot can verify it without /etc/passwd.
        assert _last(target, "USER") == f"{UID}:{UID}"


def test_the_virtualenv_is_first_on_path() -> None:
    env = _env()
    assert env["VIRTUAL_ENV"] == VENV
    assert env["PATH"].split(":")[0] == f"{VENV}/bin"


def test_the_layout_matches_what_the_pods_mount() -> None:
    # Worker pods mount the cache on CACHE_MOUNT_PATH (HF_HOME inside), emptyDirs on /tmp and HOME, claims
    # under PVC_MOUNT_ROOT; the directories exist in the image, writable by the uid without the volumes.
    env = _env()
    assert env["HF_HOME"] == HF_HOME_PATH
    assert env["HOME"] == HOME_PATH
    runs = " ".join(_all("base", "RUN"))
    assert f"--home-dir {HOME_PATH}" in runs
    assert HF_HOME_PATH in runs and PVC_MOUNT_ROOT in runs
    assert f"chown -R {UID}:{UID} {CACHE_MOUNT_PATH} {HOME_PATH}" in runs
    for target in ("operator", "server"):
        assert _last(target, "WORKDIR") == HOME_PATH


def test_both_images_install_from_the_lock_with_hashes() -> None:
    build_runs = " ".join(_all("build", "RUN"))
    assert "export --frozen" in build_runs
    copies = " ".join(_all("build", "COPY"))
    for needed in ("uv.lock", "pyproject.toml", "operator", "model_server", "modelpool_gateway"):
        assert needed in copies
    for target, listed in (("operator", "/dist/operator.txt"), ("server", "/dist/server.txt")):
        run = " ".join(_all(target, "RUN"))
        assert f"--require-hashes -r {listed}" in run
        # Every package is in the list; nothing is resolved at build time.
        assert "--no-deps" in run
        assert "--compile-bytecode" in run
        assert f"--python {VENV}/bin/python" in run


def test_extras_per_image_and_no_torch_in_the_operator() -> None:
    build_runs = " ".join(_all("build", "RUN"))
    extras = set(PYPROJECT["optional-dependencies"])
    operator_export = re.search(r"--extra operator --extra gateway -o /dist/operator\.txt", build_runs)
    # The worker image carries the onnx extra: a pool's spec.model.runtime onnxruntime works in it.
    server_export = re.search(r"--extra server --extra onnx -o /dist/server\.txt", build_runs)
    assert operator_export and server_export and {"operator", "gateway", "server", "onnx"} <= extras
    assert not any(req.startswith("torch") for req in PYPROJECT["optional-dependencies"]["operator"])
    assert not any(req.startswith("torch") for req in PYPROJECT["optional-dependencies"]["gateway"])
    assert "torch" not in " ".join(_all("operator", "RUN"))
    assert "TORCH_INDEX_URL" in " ".join(_all("server", "RUN"))


def test_the_cpu_variant_list_drops_only_the_cuda_torch() -> None:
    """The awk filter the build stage applies, run on the real export of uv.lock's server extra: torch and
    the wheels only its CUDA build needs go (the CPU variant takes torch from TORCH_INDEX_URL); torch's
    other dependencies stay locked."""
    uv = shutil.which("uv") or str(Path.home() / ".local" / "bin" / "uv")
    program = re.search(r"awk '([^']+)' /dist/server\.txt", " ".join(_all("build", "RUN")))
    assert program, "the build stage filters /dist/server.txt with awk"
    exported = subprocess.run(
        [uv, "export", "--frozen", "--no-emit-project", "--no-header", "--no-annotate", "--extra", "server"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    filtered = subprocess.run(
        ["awk", program.group(1)], input=exported, capture_output=True, text=True, check=True
    ).stdout

    def names(text: str) -> set[str]:
        return {line.split("==")[0] for line in text.splitlines() if re.match(r"^[a-z0-9]", line)}

    dropped = names(exported) - names(filtered)
    assert "torch" in dropped and any(name.startswith("nvidia-") for name in dropped)
    assert all(n in {"torch", "triton"} or n.startswith(("nvidia-", "cuda-")) for n in dropped)
    assert {"sympy", "networkx", "transformers", "numpy"} <= names(filtered)
    # Each kept requirement keeps its hashes (the install runs with --require-hashes).
    assert filtered.count("--hash=sha256:") > 0 and "torch==" not in filtered


def test_the_default_target_is_the_operator() -> None:
    # A plain `docker build .` builds the last stage.
    assert list(STAGES)[-1] == "operator"


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignore = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "everything is excluded unless named"
    for needed in ("!pyproject.toml", "!uv.lock", "!operator/", "!model_server/", "!modelpool_gateway/"):
        assert needed in ignore
