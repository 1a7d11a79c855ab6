"""``modelpool-operator cleanup``: what the chart's ``pre-delete`` hook runs before ``helm uninstall`` removes
the operator, so that nothing is left waiting for an operator that is gone.

The operator keeps a finalizer (Kopf's, ``OperatorConfig.finalizer``) on every ModelPool it watches and on
its ModelBudget; once the operator is gone, deleting such an object (or its namespace) waits forever.  This
command, in order:

1. stops the operator: scales its Deployment to 0 and waits until its pods are gone (a running operator
   would put its finalizer back on the next event of each pool);
2. removes the operator's finalizer (and only it) from every ModelPool and ModelHost in its scope
   (``--namespace``, each once, or ``--all-namespaces``) and from its ModelBudget (``--budget``).

The pools themselves and their workers stay (like the CRDs, they are the users' objects, kept on
uninstall); deleting a pool or its namespace afterwards completes at once, and the garbage collector
removes the pool's worker pods (they are owned by it).  Exit codes: 0 done, 1 an API error or the operator
still running after ``--timeout``, 2 invalid arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from modelpool_contract import logs
from modelpool_contract.api import GROUP, MODELBUDGET_PLURAL, MODELHOST_PLURAL, MODELPOOL_PLURAL, VERSION
from modelpool_contract.labels import PREFIX
from modelpool_contract.logs import DEFAULT_LOG_FORMAT, LOG_FORMATS
from modelpool_operator.effects.kube import api_client, describe_error

log = logging.getLogger("modelpool.operator.cleanup")

# The operator's finalizer (OperatorConfig.finalizer; the settings object is not needed to know it).
FINALIZER = f"{PREFIX}/finalizer"
REQUEST_TIMEOUT_S = 30
# A patch that lost a race with another writer (the test op failed) is read and tried again this often.
PATCH_TRIES = 5
POLL_S = 1.0


def finalizer_patch(finalizers: Sequence[str], ours: str) -> list[dict[str, Any]] | None:
    """The JSON patch that removes ``ours`` from ``finalizers`` (None: not there).  Its ``test`` makes the
    API server refuse it (422) when the list changed since it was read, instead of removing another
    controller's finalizer by index."""
    if ours not in finalizers:
        return None
    index = list(finalizers).index(ours)
    path = f"/metadata/finalizers/{index}"
    return [{"op": "test", "path": path, "value": ours}, {"op": "remove", "path": path}]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelpool-operator cleanup",
        description="Stop the operator and remove its finalizers from the ModelPools in its scope and from "
        "its ModelBudget (run by the chart's pre-delete hook on helm uninstall).",
    )
    scope = parser.add_mutually_exclusive_group(required=True)
    scope.add_argument("-n", "--namespace", action="append", dest="namespaces", metavar="NS",
                       help="a namespace whose pools the operator watches (repeatable)")  # fmt: skip
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="the pools of every namespace")
    parser.add_argument("--deployment", required=True, help="the operator's Deployment")
    parser.add_argument("--deployment-namespace", required=True, help="the operator Deployment's namespace")
    parser.add_argument("--selector", required=True, help="label selector of the operator's pods")
    parser.add_argument("--budget", default="", help="the operator's ModelBudget (empty: none)")
    parser.add_argument("--timeout", type=float, default=120.0, help="longest wait for the operator to stop")
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default=DEFAULT_LOG_FORMAT, help="as the operator"
    )
    return parser


async def stop_operator(api: client.ApiClient, name: str, namespace: str, selector: str) -> None:
    """Scale the operator's Deployment to 0 and wait until none of its pods is left (the caller bounds
    the wait)."""
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    try:
        await apps.patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": 0}})
        log.info("deployment %s/%s scaled to 0", namespace, name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        log.info("deployment %s/%s is gone already", namespace, name)
    # A poll, not a watch: a one-shot hook waits a few seconds once.
    while (await core.list_namespaced_pod(namespace, label_selector=selector)).items:  # noqa: ASYNC110
        await asyncio.sleep(POLL_S)


async def _unfinalize(read: Any, patch: Any, what: str) -> bool:
    """Remove the operator's finalizer from one object (``read()`` -> the object, ``patch(body)``);
    True when it was there.  A 404 (deleted meanwhile) is done; a lost race is read and tried again."""
    for _ in range(PATCH_TRIES):
        try:
            obj = await read()
            body = finalizer_patch((obj.get("metadata") or {}).get("finalizers") or [], FINALIZER)
            if body is None:
                return False
            await patch(body)
            log.info("%s: finalizer %s removed", what, FINALIZER)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status not in (409, 422):
                raise
    raise RuntimeError(f"{what}: its finalizers kept changing; tried {PATCH_TRIES} times")


async def unfinalize_pools(
    api: client.ApiClient, namespaces: Sequence[str] | None, plural: str = MODELPOOL_PLURAL
) -> int:
    """Remove the operator's finalizer from every ModelPool (or ModelHost: ``plural``) of ``namespaces``
    (None: of every one)."""
    # Any: the generated stubs do not know the _content_type a JSON patch needs.
    custom: Any = client.CustomObjectsApi(api)
    if namespaces is None:
        listed = await custom.list_cluster_custom_object(GROUP, VERSION, plural)
        items = listed.get("items") or []
    else:
        items = []
        for namespace in dict.fromkeys(namespaces):
            listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
            items += listed.get("items") or []
    removed = 0
    for item in items:
        ns, name = item["metadata"]["namespace"], item["metadata"]["name"]

        def read(ns: str = ns, name: str = name) -> Any:
            return custom.get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)

        def patch(body: Any, ns: str = ns, name: str = name) -> Any:
            return custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, plural, name, body, _content_type="application/json-patch+json"
            )

        removed += await _unfinalize(read, patch, f"{plural} {ns}/{name}")
    return removed


async def unfinalize_budget(api: client.ApiClient, name: str) -> bool:
    # Any: the generated stubs do not know the _content_type a JSON patch needs.
    custom: Any = client.CustomObjectsApi(api)
    return await _unfinalize(
        lambda: custom.get_cluster_custom_object(GROUP, VERSION, MODELBUDGET_PLURAL, name),
        lambda body: custom.patch_cluster_custom_object(
            GROUP, VERSION, MODELBUDGET_PLURAL, name, body, _content_type="application/json-patch+json"
        ),
        f"modelbudget {name}",
    )


async def run(args: argparse.Namespace) -> None:
    api = await api_client()  # as the operator connects: its service account, else $KUBECONFIG
    try:
        try:
            async with asyncio.timeout(args.timeout):
                await stop_operator(api, args.deployment, args.deployment_namespace, args.selector)
        except TimeoutError:
            raise TimeoutError(
                f"the operator's pods ({args.selector}) still exist after {args.timeout:g} s"
            ) from None
        scope = None if args.all_namespaces else args.namespaces
        removed = await unfinalize_pools(api, scope)
        hosts = await unfinalize_pools(api, scope, MODELHOST_PLURAL)
        budget = bool(args.budget) and await unfinalize_budget(api, args.budget)
        log.info(
            "done: the finalizer removed from %d pools, %d hosts%s",
            removed,
            hosts,
            " and the budget" if budget else "",
        )
    finally:
        await api.close()


def main(argv: Sequence[str]) -> int:
    """The ``cleanup`` subcommand of ``modelpool-operator``; the exit code."""
    args = build_parser().parse_args(argv)  # exits 2 when invalid
    logs.set_up(args.log_format, logging.INFO, "cleanup")
    try:
        asyncio.run(run(args))
    except (ApiException, TimeoutError, RuntimeError) as exc:
        log.error("cleanup failed: %s", describe_error(exc))
        return 1
    return 0
