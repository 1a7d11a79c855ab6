"""The operator process's own pieces: configuration, command line, merge patches, and /stats scraping.

The scraper is tested against a real HTTP server on 127.0.0.1 (aiohttp, which Kopf already depends on)
and a real closed port, not a mocked transport.
"""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from aiohttp import web

from modelpool_contract.flags import DEFAULT_WORKER_CPU
from modelpool_operator.effects.kube import merge_patch
from modelpool_operator.main import build_parser, config_from_args
from modelpool_operator.observe.stats import StatsScraper, stats_url
from modelpool_operator.services import pod_settings
from modelpool_operator.settings import OperatorConfig, apply_to_kopf, peering_priority

# ---- configuration ------------------------------------------------------------------------------------


def test_config_reads_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPOOL_OPERATOR_NAMESPACES", "a, b,,c")
    monkeypatch.setenv("MODELPOOL_OPERATOR_STATS_INTERVAL_SECONDS", "0.5")
    monkeypatch.setenv("MODELPOOL_OPERATOR_POSTING_LEVEL", "info")
    config = OperatorConfig()
    assert config.namespaces == ("a", "b", "c")
    assert not config.clusterwide
    assert config.stats_interval_seconds == 0.5
    assert config.posting_level == "INFO"
    assert config.finalizer == "modelpool.dev/finalizer"


def test_config_defaults_are_cluster_wide_with_liveness() -> None:
    config = OperatorConfig()
    assert config.clusterwide
    assert config.budget_name == "default"
    assert config.liveness_endpoint == "http://0.0.0.0:8080/healthz"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("MODELPOOL_OPERATOR_STATS_TIMEOUT_SECONDS", "-1"),
        ("MODELPOOL_OPERATOR_POSTING_LEVEL", "LOUD"),
        ("MODELPOOL_OPERATOR_LOG_FORMAT", "xml"),
        ("MODELPOOL_OPERATOR_LIVENESS_PORT", "70000"),
        ("MODELPOOL_OPERATOR_METRICS_PORT", "-1"),
    ],
)
def test_config_refuses_bad_values_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    field = variable.removeprefix("MODELPOOL_OPERATOR_").lower()
    with pytest.raises(ValueError, match=field):
        OperatorConfig()


def test_the_default_model_cache_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OperatorConfig().model_cache is None  # an emptyDir per worker
    monkeypatch.setenv("MODELPOOL_OPERATOR_MODEL_CACHE_TYPE", "hostPath")
    monkeypatch.setenv("MODELPOOL_OPERATOR_MODEL_CACHE_HOST_PATH", "/var/cache/models")
    cache = OperatorConfig().model_cache
    assert cache is not None and (cache.type, cache.path) == ("hostPath", "/var/cache/models")
    assert pod_settings(OperatorConfig()).model_cache == cache
    monkeypatch.setenv("MODELPOOL_OPERATOR_MODEL_CACHE_TYPE", "pvc")
    with pytest.raises(ValueError, match="model_cache_claim_name is required when type is pvc"):
        OperatorConfig()
    monkeypatch.setenv("MODELPOOL_OPERATOR_MODEL_CACHE_CLAIM_NAME", "Not A Name")
    with pytest.raises(ValueError, match="model_cache_claim_name: String should match pattern"):
        OperatorConfig()


def test_the_default_worker_cpu_is_a_setting_a_flag_and_off_at_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OperatorConfig().default_worker_cpu == DEFAULT_WORKER_CPU
    assert pod_settings(OperatorConfig()).default_cpu == DEFAULT_WORKER_CPU
    monkeypatch.setenv("MODELPOOL_OPERATOR_DEFAULT_WORKER_CPU", "500m")
    assert pod_settings(OperatorConfig()).default_cpu == "500m"
    flag = config_from_args(build_parser().parse_args(["--default-worker-cpu", "2"]))
    assert pod_settings(flag).default_cpu == "2"  # the flag wins over the variable
    for off in ("0", "0m", "", " "):
        monkeypatch.setenv("MODELPOOL_OPERATOR_DEFAULT_WORKER_CPU", off)
        assert pod_settings(OperatorConfig()).default_cpu is None, off
    monkeypatch.setenv("MODELPOOL_OPERATOR_DEFAULT_WORKER_CPU", "one")
    with pytest.raises(ValueError, match=r"(?s)default_worker_cpu.*invalid quantity 'one'"):
        OperatorConfig()


def test_command_line_overrides_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPOOL_OPERATOR_NAMESPACES", "env-ns")
    args = build_parser().parse_args(["-n", "x", "-n", "y", "--liveness", "0", "--peering", "p1"])
    config = config_from_args(args)
    assert config.namespaces == ("x", "y")
    assert config.liveness_endpoint is None
    assert config.peering_name == "p1"
    assert config.metrics_port == 8081
    assert config_from_args(build_parser().parse_args(["--metrics", "0"])).metrics_port == 0
    everywhere = config_from_args(build_parser().parse_args(["--all-namespaces"]))
    assert everywhere.clusterwide


def test_namespace_and_all_namespaces_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["-n", "a", "--all-namespaces"])


def test_kopf_settings_get_the_project_prefix_and_timeouts() -> None:
    settings = kopf.OperatorSettings()
    apply_to_kopf(OperatorConfig(watch_server_timeout_seconds=123, peering_name="pp"), settings)
    assert settings.persistence.finalizer == "modelpool.dev/finalizer"
    assert settings.watching.server_timeout == 123
    assert settings.peering.name == "pp" and settings.peering.mandatory
    assert settings.posting.level == 30  # WARNING: only warnings of the log become Events
    assert 1 <= settings.peering.priority < 2**31  # unset: drawn at random (replicas share settings)
    apply_to_kopf(OperatorConfig(peering_priority=7, peering_lifetime_seconds=9), settings)
    assert settings.peering.priority == 7 and settings.peering.lifetime == 9


def test_peering_priority_is_the_configured_one_or_random_per_replica() -> None:
    assert peering_priority(0, random.Random(1)) == 0
    drawn = {peering_priority(None, random.Random(seed)) for seed in range(50)}
    assert len(drawn) == 50 and all(1 <= p < 2**31 for p in drawn)


# ---- merge patches ---------------------------------------------------------------------------------------


def test_merge_patch_removes_vanished_keys_and_replaces_lists() -> None:
    old = {"phase": "Ready", "backoff": {"failures": 2, "nextAttemptAfter": "t"}, "workers": [{"n": 1}]}
    new = {"phase": "Ready", "backoff": {"failures": 0}, "workers": []}
    assert merge_patch(old, new) == {"backoff": {"failures": 0, "nextAttemptAfter": None}, "workers": []}
    assert merge_patch(new, new) == {}
    assert merge_patch(None, {"a": None}) == {"a": None}


# ---- /stats scraping -------------------------------------------------------------------------------------


def _pod(name: str, ip: str | None, port: int, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "server", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": phase, "podIP": ip},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def stats_server() -> AsyncIterator[tuple[int, list[str]]]:
    hits: list[str] = []

    async def stats(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response({"state": "Idle", "queue_depth": 0})

    app = web.Application()
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield port, hits
    finally:
        await runner.cleanup()


def test_stats_url_uses_the_named_port_and_needs_a_running_pod() -> None:
    assert stats_url(_pod("a", "10.0.0.7", 9000), 8000) == "http://10.0.0.7:9000/stats"
    assert stats_url(_pod("a", None, 9000), 8000) is None
    assert stats_url(_pod("a", "10.0.0.7", 9000, phase="Pending"), 8000) is None
    assert stats_url(_pod("a", "fd00::1", 9000), 8000) == "http://[fd00::1]:9000/stats"
    # The probe port, when the pod declares one (every worker the operator makes now), wins over http.
    pod = _pod("a", "10.0.0.7", 9000)
    pod["spec"]["containers"][0]["ports"].append({"name": "probes", "containerPort": 9001})
    assert stats_url(pod, 8000) == "http://10.0.0.7:9001/stats"
    assert (
        stats_url({**pod, "spec": {"containers": [{"name": "server"}]}}, 8000) == "http://10.0.0.7:8000/stats"
    )


def test_probe_port_must_differ_from_the_server_port() -> None:
    from modelpool_operator.settings import OperatorConfig

    assert OperatorConfig(server_port=8000).server_probe_port == 8001
    with pytest.raises(ValueError, match="server_probe_port must differ from server_port"):
        OperatorConfig(server_port=8001)


async def test_scraper_fetches_caches_and_backs_off(stats_server: tuple[int, list[str]]) -> None:
    port, hits = stats_server
    dead_port = _free_port()  # nothing listens here: connection refused
    scraper = StatsScraper(interval=30, timeout=1, concurrency=4, backoff_cap=60, default_port=8000)
    try:
        pods = [_pod("up", "127.0.0.1", port), _pod("down", "127.0.0.1", dead_port), _pod("new", None, 1)]
        first = await scraper.scrape(pods)
        assert first == {"up": {"state": "Idle", "queue_depth": 0}, "down": None, "new": None}
        # Within the interval: served from the cache (no second request), the dead one is in backoff.
        second = await scraper.scrape(pods)
        assert second == first
        assert hits == ["/stats"]
        assert scraper.cached(pods)["up"] == {"state": "Idle", "queue_depth": 0}
    finally:
        await scraper.aclose()


async def test_scraper_timeout_means_unknown_not_an_error() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.json_response({"state": "Ready"})

    app = web.Application()
    app.router.add_get("/stats", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    scraper = StatsScraper(interval=1, timeout=0.3, concurrency=2, backoff_cap=5, default_port=8000)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await scraper.scrape([_pod(f"p{i}", "127.0.0.1", port) for i in range(4)])
        assert result == {f"p{i}": None for i in range(4)}
        # Bounded: 4 requests, 2 at a time, 0.3 s each -> well under the server's 1.5 s per answer.
        assert loop.time() - started < 1.4
    finally:
        await scraper.aclose()
        await runner.cleanup()


async def test_refresh_never_waits_and_reports_news(stats_server: tuple[int, list[str]]) -> None:
    port, _ = stats_server
    scraper = StatsScraper(interval=30, timeout=1, concurrency=4, backoff_cap=60, default_port=8000)
    news = asyncio.Event()
    try:
        pods = [_pod("up", "127.0.0.1", port)]
        assert scraper.refresh(pods, on_change=news.set) == {"up": None}  # fetch started, not awaited
        await asyncio.wait_for(news.wait(), 5)
        assert scraper.refresh(pods, on_change=news.set) == {"up": {"state": "Idle", "queue_depth": 0}}
    finally:
        await scraper.aclose()
