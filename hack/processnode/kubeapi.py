"""A thin, thread-safe JSON layer over the `kubernetes` client's transport.

The agent speaks plain dicts (the API's own JSON) rather than the generated model classes: a pod status is
built and compared as data, patches carry explicit nulls, and a watch is a stream of JSON lines.  The
`kubernetes` package still does what it is good at: reading the kubeconfig (client certificates, tokens,
exec plugins) and owning the connection pool.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kubernetes import client, config

JSON = dict[str, Any]
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class KubeError(Exception):
    """A non-2xx answer from the API server: `status` is the HTTP code, `body` the Status object."""

    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")


class Kube:
    """One API client shared by every thread of the agent (urllib3's pool is thread-safe)."""

    def __init__(self, kubeconfig: Path, pool_size: int = 64) -> None:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        # Each pod worker thread may hold a connection (status patches) while the watch holds another.
        cfg.connection_pool_maxsize = pool_size
        self._api = client.ApiClient(cfg)
        self._lock = threading.Lock()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> JSON:
        """One API call; returns the decoded JSON answer or raises KubeError."""
        resp = self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=(5.0, timeout)
        )
        data = resp.read()
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        if not 200 <= resp.status < 300:
            raise KubeError(resp.status, text, method, path)
        decoded: JSON = json.loads(text) if text else {}
        return decoded

    def watch(self, path: str, query: dict[str, str], timeout_seconds: int) -> Iterator[JSON]:
        """Yields watch events ({type, object}) until the server ends the stream after timeout_seconds."""
        q = dict(query, watch="1", timeoutSeconds=str(timeout_seconds), allowWatchBookmarks="true")
        resp = self._send(
            "GET",
            path,
            query=q,
            body=None,
            content_type="application/json",
            timeout=(5.0, timeout_seconds + 15.0),
        )
        if not 200 <= resp.status < 300:
            data = resp.read()
            raise KubeError(resp.status, data.decode("utf-8", "replace"), "WATCH", path)
        buf = b""
        raw = resp.response
        try:
            for chunk in raw.stream(16384):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            raw.release_conn()

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None,
        body: Any,
        content_type: str,
        timeout: tuple[float, float],
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        m, url, hdrs, payload, _ = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self._api.call_api(m, url, header_params=hdrs, body=payload, _request_timeout=timeout)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    """The API path of one pod (optionally a subresource such as "status")."""
    p = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
    return f"{p}/{sub}" if sub else p
