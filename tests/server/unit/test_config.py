"""Configuration: flags, MODELPOOL_* environment, precedence, and a one-line reason for a bad setting (the
console script's exit code 2: ``tests/server/process/test_behaviour.py``)."""

from __future__ import annotations

import pytest

from model_server.config import ConfigError, ServerConfig, ServingConfig, _parser, load_config
from model_server.host_config import HostConfig, load_host_config


def test_flags_and_defaults() -> None:
    cfg = load_config(["--model", "/models/minilm", "--task", "text-embedding", "--queue-capacity", "7"])
    assert cfg.queue_capacity == 7
    assert cfg.served_name == "minilm"
    assert cfg.max_batch_size == 32 and cfg.max_batch_delay_ms == 5 and cfg.request_timeout == 30
    assert cfg.device == "auto" and cfg.dtype == "auto" and not cfg.trust_remote_code


def test_env_and_flag_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELPOOL_MODEL", "hf://org/name@v1")
    monkeypatch.setenv("MODELPOOL_TASK", "vision")
    monkeypatch.setenv("MODELPOOL_MAX_BATCH_SIZE", "64")
    monkeypatch.setenv("MODELPOOL_TRUST_REMOTE_CODE", "true")
    cfg = load_config(["--max-batch-size", "8"])
    assert cfg.task == "vision" and cfg.max_batch_size == 8 and cfg.trust_remote_code
    assert cfg.served_name == "name"


def test_prefix_sharing_is_on_unless_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    base = ["--model", "/m", "--task", "text-generation"]
    assert load_config(base).prefix_sharing
    assert not load_config([*base, "--no-prefix-sharing"]).prefix_sharing
    monkeypatch.setenv("MODELPOOL_PREFIX_SHARING", "false")
    assert not load_config(base).prefix_sharing
    assert load_config([*base, "--prefix-sharing"]).prefix_sharing  # the flag wins over the environment
    with pytest.raises(SystemExit):  # one or the other
        _parser().parse_args([*base, "--prefix-sharing", "--no-prefix-sharing"])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--task", "text-embedding"], "--model"),
        (["--model", "/m", "--task", "speech"], "--task"),
        (["--model", "/m", "--task", "vision", "--queue-capacity", "0"], "--queue-capacity"),
        (["--model", "/m", "--task", "vision", "--port", "http"], "--port"),
        (["--model", "/m", "--task", "vision", "--device", "tpu"], "--device"),
        (["--model", "/m", "--task", "vision", "--dtype", "int4"], "--dtype"),
        (["--model", "/m", "--task", "vision", "--handler", "nocolon"], "--handler"),
        (["--model", "s3://bucket/m", "--task", "vision"], "--model"),
        (["--model", "/m", "--task", "vision", "--no-such-flag"], "no-such-flag"),
    ],
)
def test_invalid(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(argv)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_every_field_is_a_flag() -> None:
    flags = {a.dest for a in _parser()._actions}
    assert set(ServerConfig.model_fields) <= flags


def test_a_shared_host_and_a_worker_define_their_common_settings_once() -> None:
    """The host's settings repeated ten of the worker's, and had drifted (a host took ``--port 0``): every
    setting both have is now the one of their base, but the two whose defaults differ on purpose."""
    own = {"probe_port", "http_workers"}  # a host always has a probe port, and one HTTP process unless told
    common = (set(HostConfig.model_fields) & set(ServerConfig.model_fields)) - own
    assert common == set(ServingConfig.model_fields)
    for name in common:
        assert repr(HostConfig.model_fields[name]) == repr(ServingConfig.model_fields[name])
        assert repr(ServerConfig.model_fields[name]) == repr(ServingConfig.model_fields[name])
    with pytest.raises(ConfigError, match="--port"):
        load_host_config(["--shared-host", "--device-memory", "1Gi", "--port", "0"])
