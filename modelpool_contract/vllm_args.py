"""vLLM's command line, both sides: a pool's ``spec.vllm`` rendered as vLLM's flags (the operator passes
them as the server's ``--vllm-args``), and the flags the server sets itself and so refuses to take there.

The server runs vLLM's OpenAI server on a loopback port it chooses, serving the model directory it loaded
under the pool's name, with its own dtype and remote-code settings (``model_server.engine.vllm_engine``).
A ``--vllm-args`` that named one of those flags again would win over ours (argparse keeps the last
value): vLLM listening on every interface, asking for an API key the relay never sends, running the
model's own code against the pool's ``trustRemoteCode``, or serving under a name the relay does not ask
for. So the server refuses them at startup, saying which.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final

from modelpool_contract.api import VllmSpec

#: The flags of vLLM's OpenAI server the server sets, or must keep unset, itself: where vLLM listens and
#: how (host, port, a unix socket, TLS, a root path), what it serves and under which name, the weights'
#: dtype, whether the model's own code runs, where it downloads, its keys, its access log, and a config
#: file (``--config``, which could carry any of them).
OWN_FLAGS: Final = frozenset(
    {
        "--api-key",
        "--config",
        "--disable-uvicorn-access-log",
        "--download-dir",
        "--dtype",
        "--host",
        "--model",
        "--port",
        "--root-path",
        "--served-model-name",
        "--ssl-certfile",
        "--ssl-keyfile",
        "--trust-remote-code",
        "--uds",
    }
)


def vllm_argv(spec: VllmSpec) -> list[str]:
    """Pure: vLLM's flags for a pool's ``spec.vllm``, in field order: an unset field adds none (vLLM's
    default), a boolean one ``--flag`` or ``--no-flag`` (vLLM's boolean flags take both; prefix caching's
    default depends on the model, so false must be said)."""
    argv: list[str] = []
    for name in type(spec).model_fields:
        value = getattr(spec, name)
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        else:
            argv += [flag, str(value)]
    return argv


def vllm_args_string(spec: VllmSpec | None) -> str | None:
    """Pure: the server's ``--vllm-args`` for ``spec.vllm`` (shell-quoted, as the server splits it); None
    without settings, so a pool without ``spec.vllm`` passes no flag."""
    argv = vllm_argv(spec) if spec is not None else []
    return shlex.join(argv) if argv else None


def flag_name(token: str) -> str | None:
    """Pure: the long flag a command-line token names, as vLLM's parser reads it (``--a_b=1`` and
    ``--a-b.c`` are ``--a-b``); None for a value or a short flag."""
    if not token.startswith("--") or token == "--":
        return None
    return token.split("=", 1)[0].split(".", 1)[0].replace("_", "-").lower()


def own_flag_refusal(args: Sequence[str]) -> str | None:
    """Pure: why ``--vllm-args`` (split) may not be passed, None when it may: a flag the server sets itself,
    written whole, negated (``--no-trust-remote-code``) or shortened to a prefix of it (vLLM's parser
    takes an unambiguous prefix as the flag)."""
    for token in args:
        name = flag_name(token)
        if name is None:
            continue
        names = {name, "--" + name.removeprefix("--no-")}
        taken = sorted(own for own in OWN_FLAGS for each in names if own.startswith(each) and len(each) > 2)
        if taken:
            return (
                f"may not set {token.split('=', 1)[0]}: the server sets {taken[0]} itself "
                f"(it runs vLLM on a loopback port, serving the model it loaded under its own name); "
                f"remove it (flags the server keeps: {', '.join(sorted(OWN_FLAGS))})"
            )
    return None


__all__ = ["OWN_FLAGS", "flag_name", "own_flag_refusal", "vllm_args_string", "vllm_argv"]
