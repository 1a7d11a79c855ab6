"""``modelpool-operator``: the console script that runs the Kopf operator with the project's settings.

Loaded by the project's one settings loader (``modelpool_contract.settings``): every setting of
``settings.OperatorConfig`` is a ``MODELPOOL_OPERATOR_*`` environment variable and a flag ``--x-y`` (a flag
wins); scope, peering, liveness and metrics keep their own flag names (``-n/--namespace``,
``-A/--all-namespaces``, ``--peering``, ``--standalone``, ``--liveness``, ``--metrics``), and ``-v`` is
verbosity. Invalid settings: one line on stderr and exit 2. With ``leader_election`` on, Kopf's operator
starts only once this replica holds the leader election Lease (``modelpool_operator.leader``); a leader that
loses it exits 9 (``leader.EXIT_LOST_LEASE``).  ``modelpool-operator cleanup ...`` is the
chart's uninstall hook instead (``modelpool_operator.cleanup``). Kopf handles SIGINT/SIGTERM: the
watches stop, the per-pool daemons are cancelled, and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from modelpool_contract import logs
from modelpool_contract import settings as settings_loader
from modelpool_contract.logs import LogFormat
from modelpool_contract.settings import CommandLine, Flag
from modelpool_operator.settings import OperatorConfig

if TYPE_CHECKING:
    from modelpool_operator.metrics import OperatorMetrics


def _verbose(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")


#: The operator's command line: every setting is a flag ``--x-y`` (``modelpool_contract.settings``), with
#: the scope, peering, liveness and metrics under their own names.
COMMAND_LINE = CommandLine(
    prog="modelpool-operator",
    description=(
        "Serve ML models on worker pods: reconcile ModelPool and ModelBudget resources. Every setting is "
        "also a MODELPOOL_OPERATOR_* environment variable (see docs/operator.md); a flag wins over it."
    ),
    flags={
        "namespaces": [
            Flag(
                names=("-n", "--namespace"),
                append=True,
                metavar="NS",
                group="scope",
                help="watch this namespace (repeatable; glob patterns as Kopf accepts them)",
            ),
            Flag(
                names=("-A", "--all-namespaces"),
                const=(),
                group="scope",
                help="watch every namespace (the default)",
            ),
        ],
        "liveness_port": [
            Flag(
                names=("--liveness",),
                metavar="PORT",
                help="serve GET /healthz on this port (0 disables; default 8080)",
            )
        ],
        "metrics_port": [
            Flag(
                names=("--metrics",),
                metavar="PORT",
                help="serve Prometheus GET /metrics on this port (0 disables; default 8081)",
            )
        ],
        "peering_name": [
            Flag(
                names=("--peering",),
                metavar="NAME",
                group="peering",
                help="mandatory Kopf peering under this name",
            )
        ],
        "standalone": [Flag(names=("--standalone",), group="peering", help="no peering at all")],
        "log_format": [
            Flag(names=("--log-format",), choices=("json", "plain"), help="log format (default: json)")
        ],
    },
    extra=_verbose,
)


def set_up_logging(fmt: LogFormat, *, verbose: bool) -> None:
    """The project's one log format (``modelpool_contract.logs``) in place of Kopf's own set-up: Kopf's
    object reference (``k8s_ref``) becomes each line's ``object`` field; asyncio's own chatter stays out
    unless verbose, as ``kopf.configure`` keeps it."""
    logs.set_up(fmt, "DEBUG" if verbose else "INFO", "operator", renamed={"k8s_ref": "object"})
    chatter = logging.getLogger("asyncio")
    chatter.propagate = verbose
    if not verbose:
        chatter.handlers[:] = [logging.NullHandler()]


def build_parser() -> argparse.ArgumentParser:
    return settings_loader.build_parser(OperatorConfig, COMMAND_LINE)


def config_from_args(args: argparse.Namespace, base: OperatorConfig | None = None) -> OperatorConfig:
    """The environment's configuration (or ``base``) with the command line's flags applied; raises
    ``ConfigError`` (one line) when invalid."""
    overrides = settings_loader.given(OperatorConfig, args)
    if base is None:
        return settings_loader.validate(OperatorConfig, overrides, COMMAND_LINE)
    # Through the validators again, as the environment's values were.
    return settings_loader.validate(OperatorConfig, {**base.model_dump(), **overrides}, COMMAND_LINE)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["cleanup"]:  # the chart's pre-delete hook (modelpool_operator.cleanup)
        from modelpool_operator.cleanup import main as cleanup

        return cleanup(given[1:])
    config, args = settings_loader.load_or_exit(OperatorConfig, argv, COMMAND_LINE)

    from modelpool_operator import heap, memtrace

    memtrace.install(os.environ)  # a debugging switch: nothing at all unless MODELPOOL_TRACEMALLOC is set
    heap.shrink_tls_buffers()  # before any connection to the API server

    import kopf

    # Importing the handlers module registers them on Kopf's default registry.
    from modelpool_operator.handlers import make_memo, watch_owned
    from modelpool_operator.leader import default_identity
    from modelpool_operator.metrics import OperatorMetrics

    watch_owned(config)  # the kinds of owned object this configuration makes
    set_up_logging(config.log_format, verbose=args.verbose)
    # Served from the start: a standby reports modelpool_operator_leader 0 before its operator runs.
    metrics = OperatorMetrics()
    if config.metrics_port:
        metrics.serve(config.metrics_port)
    identity = default_identity()
    operator_args: dict[str, Any] = dict(
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        liveness_endpoint=config.liveness_endpoint,
        peering_name=config.peering_name,
        standalone=True if config.standalone else None,
        memo=make_memo(config, metrics, identity),
    )
    if not config.leader_election:
        kopf.run(**operator_args)
        return 0
    return run_elected(config, identity, metrics, operator_args)


def run_elected(
    config: OperatorConfig, identity: str, metrics: OperatorMetrics, operator_args: dict[str, Any]
) -> int:
    """Kopf's operator, started only once this replica holds the leader election Lease, on an event loop
    that exits the process when the Lease is not renewed in time (``modelpool_operator.leader``)."""
    import kopf
    from kubernetes_asyncio.client import CoordinationV1Api

    from modelpool_operator.effects.kube import api_client
    from modelpool_operator.leader import Fence, FencedEventLoop, LeaderElector, lead

    timing = config.lease_timing
    fence = Fence(timing.renew_deadline)

    async def elected() -> int:
        client = await api_client()
        try:
            elector = LeaderElector(
                CoordinationV1Api(client),
                name=config.leader_election_lease_name,
                namespace=config.lease_namespace,
                identity=identity,
                timing=timing,
                fence=fence,
            )
            return await lead(
                elector,
                lambda: kopf.operator(**operator_args),
                on_leading=metrics.leading,
                liveness_port=config.liveness_port,
            )
        finally:
            await client.close()

    def new_loop() -> asyncio.AbstractEventLoop:
        loop = FencedEventLoop()
        loop.fence = fence
        return loop

    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(elected())


if __name__ == "__main__":
    sys.exit(main())
