"""Where the repository is, and the environment every child process of the benchmarks gets."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child_env() -> dict[str, str]:
    """This repository importable, no hub access, bytecode caches written (later processes import torch
    faster)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
