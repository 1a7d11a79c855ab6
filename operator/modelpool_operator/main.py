"""``modelpool-operator``: the console script that runs the Kopf operator with the project's settings.

The command line overrides only scope, peering, liveness, metrics and verbosity; everything else comes
from the ``MODELPOOL_OPERATOR_*`` environment (``settings.OperatorConfig``). Kopf handles SIGINT/SIGTERM: the
watches stop, the per-pool daemons are cancelled, and the process exits 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from modelpool_operator.settings import OperatorConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelpool-operator",
        description=(
            "Serve ML models on worker pods: reconcile ModelPool and ModelBudget resources. "
            "Further settings: MODELPOOL_OPERATOR_* environment variables (see docs/operator.md)."
        ),
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable; glob patterns as Kopf accepts them)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)"
    )
    parser.add_argument(
        "--liveness",
        type=int,
        default=None,
        metavar="PORT",
        help="serve GET /healthz on this port (0 disables; default MODELPOOL_OPERATOR_LIVENESS_PORT or 8080)",
    )
    parser.add_argument(
        "--metrics",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus GET /metrics on this port (0 disables; default "
        "MODELPOOL_OPERATOR_METRICS_PORT or 8081)",
    )
    peering = parser.add_mutually_exclusive_group()
    peering.add_argument(
        "--peering", default=None, metavar="NAME", help="mandatory Kopf peering under this name"
    )
    peering.add_argument("--standalone", action="store_true", help="no peering at all")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--log-format", choices=("json", "plain"), default=None, help="log format (default: json)"
    )
    return parser


def config_from_args(args: argparse.Namespace, base: OperatorConfig | None = None) -> OperatorConfig:
    """The environment's configuration with the command line's overrides applied."""
    config = base if base is not None else OperatorConfig()
    overrides: dict[str, object] = {}
    if args.all_namespaces:
        overrides["namespaces"] = ()
    elif args.namespace:
        overrides["namespaces"] = tuple(args.namespace)
    if args.liveness is not None:
        overrides["liveness_port"] = args.liveness
    if args.metrics is not None:
        overrides["metrics_port"] = args.metrics
    if args.peering:
        overrides["peering_name"] = args.peering
    if args.standalone:
        overrides["standalone"] = True
    if args.log_format:
        overrides["log_format"] = args.log_format
    # model_validate (not model_copy) so the overrides go through the same validators as the environment.
    return OperatorConfig.model_validate({**config.model_dump(), **overrides})


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:  # pydantic's ValidationError names the offending variable
        print(f"modelpool-operator: invalid configuration: {exc}", file=sys.stderr)
        return 2

    import kopf

    # Importing the handlers module registers them on Kopf's default registry.
    from modelpool_operator.handlers import make_memo

    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.FULL,
        log_refkey="object",
    )
    kopf.run(
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        liveness_endpoint=config.liveness_endpoint,
        peering_name=config.peering_name,
        standalone=True if config.standalone else None,
        memo=make_memo(config),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
