"""The pure decisions of ``--engine vllm``: vLLM's command line and environment, what its /metrics say, the
worker's state from them, the reason of its failure, and the relay's reading of a body."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_server.config import load_config
from model_server.engine.vllm_engine import (
    failure_reason,
    next_state,
    parse_metrics,
    vllm_command,
    vllm_environment,
)
from model_server.errors import InvalidInput
from model_server.frontend.vllm_relay import budget_s, peek
from model_server.metrics import MULTIPROC_ENV
from model_server.state_machine import State
from model_server.supervisor.slot import INFERENCE_MODULE, VLLM_MODULE, inference_module
from modelpool_contract.settings import ConfigError
from modelpool_contract.vllm_args import OWN_FLAGS

METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="16384"} 1.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="tiny"} 6.0
vllm:e2e_request_latency_seconds_count{engine="0",model_name="tiny"} 4.0
"""


def test_the_command_serves_our_name_on_loopback_then_the_users_arguments() -> None:
    config = load_config(
        ["--model", "/m/x", "--task", "text-generation", "--engine", "vllm", "--name", "tiny",
         "--vllm-python", "/v/bin/python", "--dtype", "float16",
         "--vllm-args", "--max-model-len 64 --enforce-eager"]
    )  # fmt: skip
    command = vllm_command(config, Path("/m/x"), 4321)
    assert command[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert command[command.index("--served-model-name") + 1] == "tiny"
    assert command[command.index("--host") + 1] == "127.0.0.1" and "4321" in command
    assert command[command.index("--dtype") + 1] == "float16"
    assert command[-3:] == ["--max-model-len", "64", "--enforce-eager"]


def test_the_flags_the_server_gives_vllm_are_all_its_own() -> None:
    """Every flag vllm_command writes before --vllm-args is one --vllm-args may not repeat (else the later,
    the user's, would win)."""
    config = load_config(
        ["--model", "/m/x", "--task", "text-generation", "--engine", "vllm", "--dtype", "float16",
         "--trust-remote-code", "--vllm-args", "--max-model-len 64"]
    )  # fmt: skip
    ours = {arg for arg in vllm_command(config, Path("/m/x"), 4321)[:-2] if arg.startswith("--")}
    assert ours and ours <= OWN_FLAGS


@pytest.mark.parametrize(
    "args", ["--host 0.0.0.0", "--max-model-len 64 --api-key k", "--served_model_name=x"]
)
def test_vllm_args_that_set_the_servers_own_flags_stop_it_at_startup(args: str) -> None:
    base = ["--model", "/m", "--task", "text-generation", "--engine", "vllm"]
    with pytest.raises(ConfigError, match=r"--vllm-args .*may not set --\S+: the server sets --\S+ itself"):
        load_config([*base, f"--vllm-args={args}"])
    with pytest.raises(ConfigError, match=r"--vllm-args .*cannot be split"):
        load_config([*base, "--vllm-args=--max-model-len '64"])


def test_the_environment_leaves_our_metrics_directory_out() -> None:
    config = load_config(["--model", "/m", "--task", "text-generation", "--hf-home", "/cache"])
    env = vllm_environment({MULTIPROC_ENV: "/tmp/metrics", "PATH": "/bin"}, config)
    assert env == {"PATH": "/bin", "HF_HOME": "/cache", "VLLM_RPC_BASE_PATH": "."}


def test_the_engine_picks_the_models_process_and_only_generates_text() -> None:
    assert inference_module(load_config(["--model", "/m", "--task", "text-generation"])) == INFERENCE_MODULE
    assert inference_module(
        load_config(["--model", "/m", "--task", "text-generation", "--engine", "vllm"])
    ) == (VLLM_MODULE)
    with pytest.raises(Exception, match="text-generation only"):
        load_config(["--model", "/m", "--task", "text-embedding", "--engine", "vllm"])


def test_metrics_give_the_work_the_cache_and_the_latency() -> None:
    load = parse_metrics(METRICS)
    assert (load.running, load.waiting, load.kv_usage) == (2.0, 3.0, 0.25)
    assert load.kv_tokens == 128 * 16384
    assert load.seconds_per_request == 1.5
    empty = parse_metrics("")
    assert (empty.running, empty.kv_tokens, empty.seconds_per_request) == (0.0, None, None)


@pytest.mark.parametrize(
    ("state", "busy", "quiet", "expected"),
    [
        (State.READY, True, 0.0, State.PROCESSING),
        (State.IDLE, True, 99.0, State.PROCESSING),
        (State.PROCESSING, False, 0.0, State.READY),
        (State.PROCESSING, True, 99.0, None),
        (State.READY, False, 0.5, None),
        (State.READY, False, 1.0, State.IDLE),
        (State.IDLE, False, 99.0, None),
    ],
)
def test_the_state_follows_the_work(state: State, busy: bool, quiet: float, expected: State | None) -> None:
    assert next_state(state, busy, quiet, idle_after=1.0) == expected


def test_a_failure_names_the_exit_and_vllms_last_lines() -> None:
    tail = [
        "Traceback (most recent call last):\n",
        '  File "/v/arg_utils.py", line 1955, in create_model_config\n',
        "    return ModelConfig(\n",
        "           ^^^^^^^^^^^^\n",
        "\n",
        "ValueError: 1 validation error for ModelConfig\n",
        "  Value error, model type `x` is not recognised\n",
    ]
    reason = failure_reason(1, tail, loading=True)
    assert reason == (
        "vLLM exited while loading (exit code 1): ValueError: 1 validation error for ModelConfig"
        " | Value error, model type `x` is not recognised"
    )
    assert (
        failure_reason(-9, [], loading=False) == "vLLM exited while serving (killed by signal 9): no output"
    )


def test_the_relay_reads_stream_and_model_and_refuses_what_is_not_an_object() -> None:
    assert peek(b'{"model": "tiny", "stream": true}') == (True, "tiny")
    assert peek(b'{"prompt": "x"}') == (False, None)
    for bad in (b"[1]", b"not json"):
        with pytest.raises(InvalidInput):
            peek(bad)
    assert budget_s(30.0, None) == 30.0 and budget_s(30.0, 2.0) == 2.0 and budget_s(30.0, 99.0) == 30.0
