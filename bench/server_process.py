"""The server under test: MiniLM (or a handler) served as ``minilm`` by ``modelpool-server`` as a child
process, with a probe port as in a pod (``testkit.server``: the one server harness, the tests' too)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from testkit.environment import ROOT
from testkit.server import ServerProcess, launch


def minilm_server(
    model: Path,
    device: str,
    dtype: str,
    *extra: str,
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    root: Path = ROOT,
) -> ServerProcess:
    """``modelpool-server`` serving ``model`` as ``minilm`` (text-embedding) on a free loopback port, with
    its probe port on another, as in a pod: ``stats()`` (and so ``rss_bytes``) covers the whole worker
    and is read on the probe port, as the operator does.  ``env`` is added to the child's environment;
    ``preexec`` runs in the child before the server (to join a cgroup, say); ``root``: the source tree
    the server runs from (another revision's, to compare with in one run).  Call ``wait`` next."""
    args = [
        "--model", str(model), "--task", "text-embedding", "--name", "minilm", "--device", device,
        "--dtype", dtype, "--log-level", "warning", *extra,
    ]  # fmt: skip
    # A model's load on a loaded machine (or a first import of torch) can take minutes.
    return launch(args, env=env, probe=True, preexec=preexec, root=root, wait_timeout=600)


__all__ = ["ServerProcess", "minilm_server"]
