"""The machine the test kit runs on: where the repository and the control-plane binaries are, whether this
is CI, a free loopback port, and the environment every child process of the benchmarks gets."""

from __future__ import annotations

import os
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(os.environ.get("MODELPOOL_TEST_BIN_DIR", ROOT / "bin"))
IN_CI = os.environ.get("CI", "").lower() == "true"


def free_port() -> int:
    """A port nothing on this machine listens on now: a server on the process node binds its pod IP,
    but a port of its own keeps a test clear of any other server on the machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env() -> dict[str, str]:
    """This repository importable, no hub access, bytecode caches written (later processes import torch
    faster)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
