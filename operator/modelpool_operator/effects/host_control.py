"""The operator's client of a shared host's control API (``model_server/supervisor/host_control.py``): list,
load, unload, sleep and wake the models of one host pod, each call carrying the ModelHost's control key.

``HostControl`` is the protocol a pass uses (``services.Services.host_control``; tests may give another);
``HttpHostControl`` is it over HTTP (httpx, no proxy from the environment: a host pod's address is a pod
IP). Every call is bounded: a load waits until the model serves or fails (the host answers then, within
its own ten minutes), an unload until the model has drained, a sleep or a wake until the weights moved.
A failed call raises ``ControlError`` with the host's own message (``{"error": ...}``) and its status
(None: no answer at all), so the pass can say why in an Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import httpx

from modelpool_contract.host_control import INDEX_PATH, LoadConfig, ModelAction, load_body, model_action_path

#: Waiting for a connection to a host pod (it is a pod IP on the cluster network, or unreachable).
CONNECT_TIMEOUT_S = 3.0
#: A load answers once the model serves or failed: the host itself gives up after 600 s.
LOAD_TIMEOUT_S = 630.0
#: An unload drains the model's admitted requests; a sleep or wake moves its weights (host: 60 s each).
ACTION_TIMEOUT_S = 120.0


class ControlError(Exception):
    """A control call that failed: ``status`` is the host's HTTP status (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class HostControl(Protocol):
    """A shared host's control API, as the operator calls it (``url``: the host pod's probe port base,
    ``http://<pod IP>:<port>``; ``key``: the ModelHost's control key)."""

    async def index(self, url: str, key: str) -> list[dict[str, Any]]: ...
    async def load(self, url: str, key: str, model: str, config: Mapping[str, Any]) -> dict[str, Any]: ...
    async def unload(self, url: str, key: str, model: str) -> None: ...
    async def sleep(self, url: str, key: str, model: str) -> dict[str, Any]: ...
    async def wake(self, url: str, key: str, model: str) -> dict[str, Any]: ...
    async def aclose(self) -> None: ...


class HttpHostControl:
    """``HostControl`` over HTTP."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(trust_env=False)

    async def _post(self, url: str, key: str, body: Mapping[str, Any] | None, wait: float) -> Any:
        try:
            response = await self._client.post(
                url,
                json=dict(body) if body is not None else None,
                headers={"Authorization": f"Bearer {key}"},
                timeout=httpx.Timeout(wait, connect=CONNECT_TIMEOUT_S),
            )
        except httpx.HTTPError as exc:
            raise ControlError(f"{type(exc).__name__}: {exc or 'no answer'}") from None
        try:
            document = response.json()
        except ValueError:
            document = None
        if response.status_code >= 400:
            said = document.get("error") if isinstance(document, dict) else None
            raise ControlError(f"{response.status_code}: {said or response.text[:200]}", response.status_code)
        return document

    async def index(self, url: str, key: str) -> list[dict[str, Any]]:
        listed = await self._post(f"{url}{INDEX_PATH}", key, None, ACTION_TIMEOUT_S)
        return [m for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []

    async def _model(self, url: str, key: str, model: str, action: ModelAction, body: Any = None) -> Any:
        wait = LOAD_TIMEOUT_S if action == "load" else ACTION_TIMEOUT_S
        return await self._post(f"{url}{model_action_path(model, action)}", key, body, wait)

    async def load(self, url: str, key: str, model: str, config: Mapping[str, Any]) -> dict[str, Any]:
        body = load_body(LoadConfig.model_validate(dict(config)))
        answer = await self._model(url, key, model, "load", body)
        return answer if isinstance(answer, dict) else {}

    async def unload(self, url: str, key: str, model: str) -> None:
        await self._model(url, key, model, "unload")

    async def sleep(self, url: str, key: str, model: str) -> dict[str, Any]:
        answer = await self._model(url, key, model, "sleep")
        return answer if isinstance(answer, dict) else {}

    async def wake(self, url: str, key: str, model: str) -> dict[str, Any]:
        answer = await self._model(url, key, model, "wake")
        return answer if isinstance(answer, dict) else {}

    async def aclose(self) -> None:
        await self._client.aclose()
