"""A pool's ``spec.vllm`` as vLLM's flags, and the flags the server keeps for itself
(``modelpool_contract.vllm_args``)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import Any, get_args

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.api import VllmKvCacheDtype, VllmQuantization, VllmSpec
from modelpool_contract.vllm_args import (
    OWN_FLAGS,
    flag_name,
    own_flag_refusal,
    vllm_args_string,
    vllm_argv,
)

specs = st.builds(
    VllmSpec,
    max_model_len=st.none() | st.integers(16, 16_777_216),
    max_num_seqs=st.none() | st.integers(1, 1024),
    max_num_batched_tokens=st.none() | st.integers(16, 16_777_216),
    gpu_memory_utilization=st.none() | st.floats(0.1, 0.99),
    enable_prefix_caching=st.none() | st.booleans(),
    quantization=st.none() | st.sampled_from(get_args(VllmQuantization)),
    kv_cache_dtype=st.none() | st.sampled_from(get_args(VllmKvCacheDtype)),
    enforce_eager=st.none() | st.booleans(),
)


def vllm_like_parser() -> argparse.ArgumentParser:
    """The spec's flags as vLLM's parser declares them (booleans take --flag and --no-flag)."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    types: dict[Any, Callable[[str], Any]] = {int | None: int, float | None: float}
    for name, info in VllmSpec.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind: Any = info.annotation
        if kind == bool | None:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, dest=name, type=types.get(kind, str))
    return parser


@given(specs)
def test_the_flags_say_exactly_the_spec_and_are_never_the_servers_own(spec: VllmSpec) -> None:
    argv = vllm_argv(spec)
    assert VllmSpec(**vars(vllm_like_parser().parse_args(argv))) == spec
    assert own_flag_refusal(argv) is None
    # The server splits --vllm-args as a shell would.
    rendered = vllm_args_string(spec)
    assert (shlex.split(rendered) if rendered is not None else []) == argv


def test_unset_settings_add_no_flag() -> None:
    assert vllm_argv(VllmSpec()) == [] and vllm_args_string(VllmSpec()) is None
    assert vllm_args_string(None) is None
    spec = VllmSpec(max_model_len=4096, enforce_eager=True, enable_prefix_caching=False, quantization="awq")
    assert vllm_argv(spec) == [
        "--max-model-len",
        "4096",
        "--no-enable-prefix-caching",
        "--quantization",
        "awq",
        "--enforce-eager",
    ]


@pytest.mark.parametrize(
    ("token", "own"),
    [
        ("--host", "--host"),
        ("--port=9", "--port"),
        ("--api_key", "--api-key"),
        ("--served-model-name", "--served-model-name"),
        ("--serv", "--served-model-name"),
        ("--no-trust-remote-code", "--trust-remote-code"),
        ("--trust-remote-code", "--trust-remote-code"),
        ("--Download-Dir", "--download-dir"),
        ("--config=x.yaml", "--config"),
        ("--model.x", "--model"),
        ("--uds", "--uds"),
    ],
)
def test_the_servers_own_flags_are_refused_in_any_spelling(token: str, own: str) -> None:
    refusal = own_flag_refusal(["--max-model-len", "64", token, "v"])
    assert refusal is not None and f"the server sets {own} itself" in refusal
    assert refusal.startswith(f"may not set {token.split('=', maxsplit=1)[0]}:")


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--max-model-len", "64", "--enforce-eager", "--max-num-seqs", "4"],
        [
            "--model-impl",
            "vllm",
            "--config-format",
            "hf",
            "--hostname-like-value",
            "--no-enable-prefix-caching",
        ],
        ["-q", "awq", "--tensor-parallel-size=2"],
    ],
)
def test_flags_of_vllms_own_pass(args: list[str]) -> None:
    assert own_flag_refusal(args) is None


@given(st.sampled_from(sorted(OWN_FLAGS)), st.booleans())
def test_every_own_flag_is_refused_whole_or_with_a_value(flag: str, inline: bool) -> None:
    token = f"{flag}=1" if inline else flag
    assert own_flag_refusal([token]) is not None
    assert flag_name(token) == flag
