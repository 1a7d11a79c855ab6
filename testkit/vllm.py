"""vLLM for the tests of ``--engine vllm``: its environment (``make vllm-env`` builds ``.vllm-env/``) and
the settings that make its CPU build start small and fast.

A missing environment is an error naming the command that installs it, never a skipped test: ``make
test`` and CI install it first.
"""

from __future__ import annotations

from pathlib import Path

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


def vllm_args(context: int) -> str:
    """``--vllm-args`` for the tiny model: its context, no CUDA graphs or compilation (eager), few
    sequences (they are what vLLM's CPU build sizes its buffers by)."""
    return f"--max-model-len {context} --enforce-eager --max-num-seqs 4"


__all__ = ["KV_CACHE_GIB", "VLLM_ENV", "vllm_args", "vllm_env", "vllm_python"]
