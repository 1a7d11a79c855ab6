"""``modelpool-server``: parse the config (exit 2 when invalid), then run the server's process tree.

One path for both shapes: a dedicated worker (``supervisor.Supervisor``: one model, loaded at start) or,
with ``--shared-host``, a shared host (``host.HostSupervisor``: several models, loaded through the control
API); ``runtime.run`` listens, then starts the processes, so ``/v2/health/live`` answers from the first
moment.  SIGTERM -> Evicting and drain (exit 0); a load failure exits 3, a fatal device error 4, a process
of the worker dying 5 (``modelpool_contract.exits``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from model_server.config import COMMAND_LINE, ServerConfig
from model_server.host_config import HOST_COMMAND_LINE, HostConfig
from model_server.process_setup import exit_now
from modelpool_contract import logs
from modelpool_contract.settings import load_or_exit


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    shared = "--shared-host" in args or os.environ.get("MODELPOOL_SHARED_HOST", "").lower() in ("1", "true")
    config: ServerConfig | HostConfig  # exit 2, one line, when invalid
    if shared:
        config, _ = load_or_exit(HostConfig, args, HOST_COMMAND_LINE)
    else:
        config, _ = load_or_exit(ServerConfig, args, COMMAND_LINE)
    logs.set_up(config.log_format, config.log_level, "host" if shared else "supervisor")
    # Imported here, after the config is valid: a bad flag exits 2 without paying for the rest.
    from model_server.supervisor import host, runtime, supervisor

    shape = host.HostSupervisor(config) if isinstance(config, HostConfig) else supervisor.Supervisor(config)
    exit_now(runtime.run(shape))


if __name__ == "__main__":
    main()
