"""The watches' lists come in pages, each page slimmed before the next is read: a gateway watching 10,000
worker pods never holds the whole list's JSON (bench.controlplane --gateway: its RSS at 1,000 pools)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from modelpool_contract.labels import LABEL_POOL
from modelpool_gateway.cache import Registry
from modelpool_gateway.state import Worker
from modelpool_gateway.watch import list_all, pod_watch


class Answer:
    """What ``list_all`` reads of the API client's raw (unpreloaded) answer."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.status = 200
        self._body = json.dumps(doc).encode()

    async def read(self) -> bytes:
        return self._body

    async def text(self) -> str:
        return self._body.decode()

    def release(self) -> None:
        pass


def pod(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"w{i}", "namespace": "ns", "labels": {LABEL_POOL: "p"}},
        "spec": {"containers": [{"name": "server", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {"podIP": f"127.0.0.{i + 1}", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def paged_api(pods: list[dict[str, Any]], asked: list[dict[str, Any]]) -> Any:
    """The API server's paging: at most ``limit`` items, and a continue token while more remain."""

    async def list_pod_for_all_namespaces(**kwargs: Any) -> Answer:
        asked.append(kwargs)
        start = int(kwargs.get("_continue") or 0)
        end = start + (kwargs.get("limit") or len(pods))
        meta: dict[str, Any] = {"resourceVersion": "42"}
        if end < len(pods):
            meta["continue"] = str(end)
        return Answer({"items": pods[start:end], "metadata": meta})

    return SimpleNamespace(list_pod_for_all_namespaces=list_pod_for_all_namespaces)


def test_a_list_is_read_in_pages_and_each_page_slimmed() -> None:
    asked: list[dict[str, Any]] = []
    registry = Registry()
    spec = pod_watch(registry, paged_api([pod(i) for i in range(7)], asked), None)
    items, version = asyncio.run(list_all(spec, page_size=3))
    assert [kw.get("limit") for kw in asked] == [3, 3, 3]
    assert [kw.get("_continue") for kw in asked] == [None, "3", "6"]
    assert version == "42" and all(isinstance(w, Worker) for w in items)
    spec.on_list(items)
    assert sorted(name for _, name in registry.workers) == [f"w{i}" for i in range(7)]
