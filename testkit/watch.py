"""The one list-then-watch loop every watcher of cluster objects in the test kit, the tests and the
benchmarks is built on (the loopback guard, the wake benchmark's pod and Lease watches, the operator
tests' pod watcher and status recorder, the gateway tests' Lease watch).

``ListWatch`` runs a daemon thread over one list call of the kubernetes client (named by API class and
method, e.g. ``"CoreV1Api", "list_namespaced_pod", namespace``): it lists, hands the items to ``on_list``,
then follows the watch from that list's resourceVersion, handing every event to ``on_event`` as
``(type, object)``.  Objects are the API server's JSON (dicts, camelCase keys) in both places.

Two policies for an error (an expired resourceVersion, 410 Gone, arrives as an ``ERROR`` event):

* ``retry=True``: list again after a bounded back-off while the API server is away, so nothing that
  exists at any list, and no change between, is missed (the loopback guard, a status recorder);
* ``retry=False``: keep the error in ``error`` and end (a test's watcher: its ``stop`` raises it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
ERROR_BACKOFF_MAX = 5.0


class WatchError(RuntimeError):
    """The API server ended the watch with an ERROR event (e.g. 410 Gone: the resourceVersion expired)."""


class ListWatch:
    """List, then watch, the objects one list call returns, in a daemon thread (see the module doc)."""

    def __init__(
        self,
        kubeconfig: Path,
        api: str,
        method: str,
        *args: Any,
        on_event: Callable[[str, Obj], None],
        on_list: Callable[[list[Obj]], None] | None = None,
        retry: bool = False,
        watch_seconds: int = 2,
        name: str = "list-watch",
        **kwargs: Any,
    ) -> None:
        from kubernetes import client, config  # only watchers need it: importing it costs

        api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self._list_call: Callable[..., Any] = getattr(getattr(client, api)(api_client), method)
        self._args, self._kwargs = args, kwargs
        self._on_event, self._on_list = on_event, on_list
        self._retry, self._watch_seconds = retry, watch_seconds
        self._stop = threading.Event()
        self.listed = threading.Event()  # set once the first list was handed over
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def start(self, timeout: float | None = None) -> ListWatch:
        """Start the thread; with ``timeout``, return once the first list is handed over (TimeoutError
        if not within it; the error, if the first list failed and ``retry`` is off)."""
        self._thread.start()
        if timeout is not None:
            if not self.listed.wait(timeout):
                raise TimeoutError(f"no list from the API server within {timeout:.0f}s")
            if self.error is not None:
                raise self.error
        return self

    def stop(self, timeout: float = 15) -> None:
        """Stop following (within one watch call, ``watch_seconds``) and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def list_now(self) -> str:
        """List once, handing the items over; returns the list's resourceVersion."""
        response = self._list_call(*self._args, _preload_content=False, _request_timeout=30, **self._kwargs)
        listing = json.loads(response.data)
        items: list[Obj] = listing.get("items") or []
        if self._on_list is None:
            for item in items:
                self._on_event("ADDED", item)
        else:
            self._on_list(items)
        return str(listing["metadata"].get("resourceVersion") or "")

    def _follow(self, version: str) -> None:
        from kubernetes import watch

        while not self._stop.is_set():
            stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                self._list_call,
                *self._args,
                resource_version=version,
                timeout_seconds=self._watch_seconds,
                _request_timeout=self._watch_seconds * 2 + 5,
                **self._kwargs,
            )
            for event in stream:
                obj: Obj = event["raw_object"]
                if event["type"] == "ERROR":
                    raise WatchError(f"watch ended: {obj.get('message', obj)}")
                version = str(obj["metadata"]["resourceVersion"])
                self._on_event(event["type"], obj)
                if self._stop.is_set():
                    return

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self.list_now()
                self.listed.set()
                backoff = 0.5
                self._follow(version)
                return
            except BaseException as exc:
                if not self._retry:
                    self.error = exc
                    self.listed.set()  # start() reports it rather than waiting out its timeout
                    return
                self._stop.wait(backoff)  # list again: the version may have expired, the server be away
                backoff = min(backoff * 2, ERROR_BACKOFF_MAX)
