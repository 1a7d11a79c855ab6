"""A real Prometheus server (Debian's ``prometheus``, installed by ``hack/tools.sh``) for tests: it scrapes
the given loopback targets every second and evaluates the given rule files, listening on a free loopback
port, its data in a temporary folder. What tests ask of it goes through its HTTP API (``/api/v1/...``), as
Grafana and Alertmanager would."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from testkit.cluster import missing
from testkit.environment import ROOT
from testkit.loopback import is_loopback
from testkit.waiting import wait_for

START_TIMEOUT_S = 30
#: The chart's alerts, a Prometheus rule file (the PrometheusRule's one definition).
CHART_ALERTS = ROOT / "charts" / "modelpool-operator" / "files" / "alerts.yaml"
_SERIES = re.compile(r"\bmodelpool_[a-z_]+")


def rules_in(path: Path) -> list[dict[str, Any]]:
    """Every rule of a Prometheus rule file, its groups flattened."""
    return [rule for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]


def series_read(expr: str) -> set[str]:
    """The modelpool series a PromQL expression reads."""
    return set(_SERIES.findall(expr))


@dataclass(frozen=True)
class Prometheus:
    """A running Prometheus and its API."""

    url: str
    log: Path

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``'s ``data``; a failed query raises with Prometheus's own error."""
        answer = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10).json()
        if answer["status"] != "success":
            raise AssertionError(f"{path} {params}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector (every series and its value)."""
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def targets_up(self) -> dict[str, str]:
        """Each target's scrape URL and its health (up, down, unknown)."""
        active = self.api("targets")["activeTargets"]
        return {t["scrapeUrl"]: t["health"] for t in active}

    def rules(self) -> list[dict[str, Any]]:
        """Every rule as last evaluated (its health, lastError, state)."""
        groups = self.api("rules")["groups"]
        return [rule for group in groups for rule in group["rules"]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(targets: Sequence[str], rule_files: Sequence[Path]) -> dict[str, Any]:
    """The configuration: one job per target (its address as the job's name, so a series says whose it
    is), scraped and evaluated every second."""
    hosts = [t.rsplit(":", 1)[0] for t in targets]
    assert all(is_loopback(h) for h in hosts), f"tests scrape loopback addresses only: {targets}"
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(f.resolve()) for f in rule_files],  # relative: to the config file's folder
        "scrape_configs": [
            {"job_name": target, "static_configs": [{"targets": [target]}]} for target in targets
        ],
    }


@contextmanager
def prometheus(targets: Sequence[str], rule_files: Sequence[Path], folder: Path) -> Iterator[Prometheus]:
    """A Prometheus scraping ``targets`` (``host:port``), evaluating ``rule_files``, while the block runs."""
    binary = shutil.which("prometheus")
    if binary is None:
        missing("prometheus is missing: `bash hack/tools.sh` installs Debian's prometheus package")
        raise AssertionError("unreachable")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config(targets, rule_files)))
    port = _free_port()
    log = folder / "prometheus.log"
    argv = [
        binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    running = Prometheus(f"http://127.0.0.1:{port}", log)
    try:
        wait_for(lambda: _ready(running, proc), timeout=START_TIMEOUT_S, message=f"Prometheus ready ({log})")
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ready(running: Prometheus, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"Prometheus exited ({proc.returncode}): {running.log.read_text()[-2000:]}")
    try:
        return httpx.get(f"{running.url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
