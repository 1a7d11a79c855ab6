"""A thin, thread-safe JSON layer over the `kubernetes` client's transport.

The agent speaks plain dicts (the API's own JSON) rather than the generated model classes: a pod status is
built and compared as data, patches carry explicit nulls, and a watch is a stream of JSON lines.  The
`kubernetes` package still does what it is good at: reading the kubeconfig (client certificates, tokens,
exec plugins) and owning the connection pool.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

JSON = dict[str, Any]
log = logging.getLogger("processnode.kubeapi")
STRATEGIC_MERGE = "application/strategic-merge-patch+json"
# What the transport raises when no answer comes: urllib3's MaxRetryError, ProtocolError, ReadTimeoutError
# (none of them an OSError) and socket errors.
_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
MERGE = "application/merge-patch+json"


class KubeError(Exception):
    """A non-2xx answer from the API server: `status` is the HTTP code, `body` the Status object."""

    def __init__(self, status: int, body: str, method: str, path: str) -> None:
        self.status = status
        self.body = body
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")


class ApiUnreachableError(KubeError):
    """No answer at all (connection refused or reset, a timeout, a stream cut off): the API server is down
    or restarting.  Status 0, so every caller that handles KubeError keeps going and retries."""

    def __init__(self, err: Exception, method: str, path: str) -> None:
        super().__init__(0, f"API server unreachable: {err}", method, path)


class Kube:
    """One API client shared by every thread of the agent (urllib3's pool is thread-safe)."""

    def __init__(self, kubeconfig: Path, pool_size: int = 64) -> None:
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)  # type: ignore[no-untyped-call]
        # Each pod worker thread may hold a connection (status patches) while the watch holds another.
        cfg.connection_pool_maxsize = pool_size
        self.server: str = str(cfg.host)  # https://HOST:PORT: what image-mode pods get as the in-cluster API
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
        try:
            data = resp.read()
        except _TRANSPORT_ERRORS as err:
            raise ApiUnreachableError(err, method, path) from err
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
        if not 200 <= resp.status < 300:
            raise KubeError(resp.status, text, method, path)
        decoded: JSON = json.loads(text) if text else {}
        return decoded

    def get(self, path: str) -> JSON | None:
        """GET one object; None when it does not exist (404), KubeError otherwise."""
        try:
            return self.request("GET", path)
        except KubeError as err:
            if err.status == 404:
                return None
            raise

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
        except _TRANSPORT_ERRORS as err:
            # The server went away mid-stream (a control-plane restart): the caller relists.
            raise ApiUnreachableError(err, "WATCH", path) from err
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
        try:
            return self._api.call_api(m, url, header_params=hdrs, body=payload, _request_timeout=timeout)
        except ApiException as err:  # the client's own wrapping of TLS failures (status 0)
            if err.status:
                raise KubeError(int(err.status), str(err.body or err.reason), method, path) from err
            raise ApiUnreachableError(err, method, path) from err
        except _TRANSPORT_ERRORS as err:
            raise ApiUnreachableError(err, method, path) from err

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]


class ClusterGuard:
    """Which cluster the agent joined, by the uid of its kube-system namespace (the usual cluster ID).

    After an outage the server answering on the same address may be another cluster: a local control
    plane deleted and the next one started on the freed port.  Its node of the same name is not ours, nor
    are its pods; `same_cluster` tells, so the agent stops instead of taking them over.  A restart of the
    same control plane (etcd kept) keeps the uid."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.uid = ""

    def _current(self) -> str:
        return str(self.kube.request("GET", "/api/v1/namespaces/kube-system")["metadata"]["uid"])

    def join(self) -> None:
        self.uid = self._current()

    def same_cluster(self) -> bool:
        """True when the API server still serves the cluster joined; KubeError while it does not answer."""
        current = self._current()
        if current != self.uid:
            log.error(
                "the API server now serves another cluster (kube-system uid %s, was %s)", current, self.uid
            )
            return False
        return True


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    """The API path of one pod (optionally a subresource such as "status")."""
    p = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
    return f"{p}/{sub}" if sub else p


def pod_event(pod: JSON, node: str, *, reason: str, message: str, warning: bool, now: str) -> JSON:
    """A core/v1 Event about `pod`, as the kubelet on `node` records one (e.g. FailedMount)."""
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message,
        "type": "Warning" if warning else "Normal",
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
