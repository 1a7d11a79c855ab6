"""``modelpool-server``: parse the config (exit 2 when invalid), then run the worker's supervisor.

The supervisor (``supervisor.py``) listens, then starts the inference process (which imports torch and
loads the model) and the HTTP processes (which never do), so ``/v2/health/live`` answers from the first
moment.  SIGTERM -> Evicting and drain (exit 0); a load failure exits 3, a fatal device error 4, a
process of the worker dying 5 (``modelpool_contract.exits``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from model_server.config import COMMAND_LINE, ServerConfig
from model_server.process_setup import exit_now
from modelpool_contract.settings import load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--shared-host" in args or os.environ.get("MODELPOOL_SHARED_HOST", "").lower() in ("1", "true"):
        _main_host(args)
    config, _ = load_or_exit(ServerConfig, argv, COMMAND_LINE)  # exit 2, one line, when invalid
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s [supervisor] %(name)s %(message)s",
    )
    # Imported here, after the config is valid: a bad flag exits 2 without paying for the rest.
    from model_server.supervisor import supervisor

    exit_now(supervisor.run(config))


def _main_host(argv: list[str]) -> None:
    """``--shared-host``: several models, loaded through the control API (``supervisor/host.py``)."""
    from model_server.host_config import HOST_COMMAND_LINE, HostConfig

    config, _ = load_or_exit(HostConfig, argv, HOST_COMMAND_LINE)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s [host] %(name)s %(message)s"
    )
    from model_server.supervisor import host_control

    exit_now(host_control.run_host(config))


if __name__ == "__main__":
    main()
