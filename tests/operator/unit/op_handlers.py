"""The operator's Kopf handlers called directly, with the arguments a unit test gives them.

Kopf's decorators type each decorated handler as Kopf's protocol of its kind (``IndexingFn``,
``WatchingFn``, ``DaemonFn``): every keyword argument Kopf passes, typed as Kopf's own wrappers (``Body``,
``Meta``, ``Index``). A test passes only the arguments the handler reads (its ``**_`` takes the rest), as
plain mappings, which the handlers read only as mappings. Each function here gives one handler the
signature the tests call it with, so every call is checked against it, and casts the handler (looked up at
each call: a test may patch the module) to what it is, an async function; each returns the handler's own
coroutine, which the test runs or makes a task of."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Coroutine, Mapping
from typing import Any, TypedDict, TypeVar, Unpack, cast

import kopf

from modelpool_contract.demand import Demand
from modelpool_operator import handlers
from modelpool_operator.observe.ownership import OwnerRecord
from modelpool_operator.pool import OtherPool, PoolKey

K = TypeVar("K")
V = TypeVar("V")

Body = Mapping[str, Any]
# What a handler reads of a Kopf index: each key's values (Kopf's Index is a Mapping of Stores, each a
# Collection); a test gives a dict of lists.
Index = Mapping[K, Collection[V]]


def pods_by_pool(
    *, namespace: str, labels: Mapping[str, str], meta: Body, body: Body, memo: kopf.Memo
) -> Coroutine[Any, Any, dict[PoolKey, dict[str, Any]]]:
    handler = cast("Callable[..., Coroutine[Any, Any, dict[PoolKey, dict[str, Any]]]]", handlers.pods_by_pool)
    return handler(namespace=namespace, labels=labels, meta=meta, body=body, memo=memo)


def demand_by_pool(*, namespace: str, body: Body) -> Coroutine[Any, Any, dict[PoolKey, Demand]]:
    handler = cast("Callable[..., Coroutine[Any, Any, dict[PoolKey, Demand]]]", handlers.demand_by_pool)
    return handler(namespace=namespace, body=body)


def pool_changed(
    *, type: str | None, namespace: str, name: str, meta: Body, body: Body, memo: kopf.Memo
) -> Coroutine[Any, Any, None]:
    handler = cast("Callable[..., Coroutine[Any, Any, None]]", handlers.pool_changed)
    return handler(type=type, namespace=namespace, name=name, meta=meta, body=body, memo=memo)


class DaemonArgs(TypedDict):
    """The arguments both daemons read (the indices are Kopf's, by their functions' names)."""

    namespace: str
    name: str
    body: Body
    memo: kopf.Memo
    logger: logging.Logger
    stopped: kopf.DaemonStopped
    pods_by_pool: Index[PoolKey, dict[str, Any]]
    pools_by_key: Index[PoolKey, OtherPool]
    budgets_by_name: Index[str, dict[str, Any]]
    pool_owners: Index[PoolKey, OwnerRecord]
    host_owners: Index[PoolKey, OwnerRecord]


class PoolDaemonArgs(DaemonArgs):
    """A pool's daemon reads the gateways' demand and the ModelHosts too."""

    demand_by_pool: Index[PoolKey, Demand]
    hosts_by_key: Index[PoolKey, dict[str, Any]]


def pool_daemon(**kwargs: Unpack[PoolDaemonArgs]) -> Coroutine[Any, Any, None]:
    handler = cast("Callable[..., Coroutine[Any, Any, None]]", handlers.pool_daemon)
    return handler(**kwargs)


def host_daemon(**kwargs: Unpack[DaemonArgs]) -> Coroutine[Any, Any, None]:
    handler = cast("Callable[..., Coroutine[Any, Any, None]]", handlers.host_daemon)
    return handler(**kwargs)
