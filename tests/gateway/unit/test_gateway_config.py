"""Configuration: flags over MODELPOOL_GATEWAY_* variables over defaults; one-line errors."""

from __future__ import annotations

import pytest

from modelpool_gateway.config import ConfigError, load_settings


def test_defaults() -> None:
    settings = load_settings([])
    assert (settings.port, settings.namespaces, settings.max_held_per_pool) == (8080, [], 100)
    assert settings.demand_interval_seconds == 5
    assert (settings.metrics_port, settings.max_json_items, settings.max_json_depth) == (8081, 100_000, 64)
    assert (settings.header_timeout_seconds, settings.max_connections) == (10, 4096)
    assert settings.replicas == 1  # one replica: each key's whole limit
    assert (settings.generation_routing, settings.prefix_chars, settings.prefix_load_factor) == (
        "prefix",
        256,
        1.25,
    )


def test_environment_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPOOL_GATEWAY_NAMESPACES", "team-a, team-b")
    monkeypatch.setenv("MODELPOOL_GATEWAY_MAX_HELD_PER_POOL", "7")
    settings = load_settings(["--port", "9000"])
    assert settings.namespaces == ["team-a", "team-b"]
    assert (settings.port, settings.max_held_per_pool) == (9000, 7)
    assert load_settings(["--namespace", "x", "--namespace", "y"]).namespaces == ["x", "y"]
    monkeypatch.setenv("MODELPOOL_GATEWAY_GENERATION_ROUTING", "least-loaded")
    assert load_settings([]).generation_routing == "least-loaded"
    assert load_settings(["--generation-routing", "prefix"]).generation_routing == "prefix"
    monkeypatch.setenv("MODELPOOL_GATEWAY_REPLICAS", "3")  # the chart's gateway.replicaCount
    assert load_settings([]).replicas == 3 and load_settings(["--replicas", "2"]).replicas == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--port", "0"], "--port"),
        (["--max-held-per-pool", "-1"], "--max-held-per-pool"),
        (["--demand-interval-seconds", "0"], "--demand-interval-seconds"),
        (["--log-level", "loud"], "--log-level"),
        (["--metrics-port", "8080"], "--metrics-port must differ from --port"),
        (["--max-json-items", "0"], "--max-json-items"),
        (["--header-timeout-seconds", "0"], "--header-timeout-seconds"),
        (["--max-connections", "0"], "--max-connections"),
        (["--generation-routing", "random"], "--generation-routing"),
        (["--prefix-load-factor", "0.5"], "--prefix-load-factor"),
        (["--prefix-chars", "0"], "--prefix-chars"),
        (["--replicas", "0"], "--replicas"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_invalid_values_are_one_line_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(argv)
    assert message in str(err.value) and "\n" not in str(err.value)
