"""vLLM for the tests of ``--engine vllm``: its environment (``make vllm-env`` builds ``.vllm-env/``) and
the settings that make its CPU build start small and fast.

A missing environment is an error naming the command that installs it, never a skipped test: ``make
test`` and CI install it first.
"""

from __future__ import annotations

from pathlib import Path

from modelpool_contract.api import VllmSpec
from modelpool_contract.vllm_args import vllm_args_string
from testkit.environment import ROOT

VLLM_ENV = ROOT / ".vllm-env"
# vLLM's CPU build reserves this many GiB of KV cache (its default, 4, is more than the tests need).
KV_CACHE_GIB = "1"


def vllm_python() -> Path:
    """The python of vLLM's environment; an AssertionError saying how to install it when it is missing."""
    python = VLLM_ENV / "bin" / "python"
    if not (VLLM_ENV / ".installed").is_file() or not python.is_file():
        raise AssertionError(
            f"vLLM's environment {VLLM_ENV} is missing or incomplete: run `make vllm-env` "
            "(make test and .ci/run install it)"
        )
    return python


def vllm_env() -> dict[str, str]:
    """The server's environment for ``--engine vllm`` on the CPU: vLLM's python and a small KV cache."""
    return {"MODELPOOL_VLLM_PYTHON": str(vllm_python()), "VLLM_CPU_KVCACHE_SPACE": KV_CACHE_GIB}


def vllm_settings(context: int) -> VllmSpec:
    """A pool's ``spec.vllm`` for the tiny model: its context, no CUDA graphs or compilation (eager), few
    sequences (they are what vLLM's CPU build sizes its buffers by)."""
    return VllmSpec(max_model_len=context, enforce_eager=True, max_num_seqs=4)


def vllm_args(context: int) -> str:
    """``--vllm-args`` for the tiny model, rendered from its ``spec.vllm`` as the operator renders a pool's
    (``modelpool_contract.vllm_args``): the tests run vLLM with the flags a pool would give it."""
    rendered = vllm_args_string(vllm_settings(context))
    assert rendered is not None  # the settings above are never empty
    return rendered


__all__ = ["KV_CACHE_GIB", "VLLM_ENV", "vllm_args", "vllm_env", "vllm_python", "vllm_settings"]
