"""The pod requests' answers are read as bytes and dropped, never made into the client's models (a created
pod's ``V1Pod`` was 8 % of the operator at 1,000 pools), with the outcomes kept: made, already there, gone,
and an error raised with the API server's own message. Against a loopback HTTP server standing in for the
API server's pod endpoints."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from modelpool_operator.effects.kube import ApiException, Kube, describe_error

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "ns"}, "spec": {}}


def status(code: int, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}
    return web.json_response(body, status=code)


async def create(request: web.Request) -> web.Response:
    name = (await request.json())["metadata"]["name"]
    if name == "there":
        return status(409, 'pods "there" already exists')
    if name == "bad":
        return status(422, 'Pod "bad" is invalid: spec.containers: Required value')
    return web.json_response({**POD, "metadata": {"name": name, "namespace": "ns"}}, status=201)


async def patch(request: web.Request) -> web.Response:
    if request.match_info["name"] == "gone":
        return status(404, 'pods "gone" not found')
    return web.json_response(POD)


async def delete(request: web.Request) -> web.Response:
    if request.match_info["name"] == "gone":
        return status(404, 'pods "gone" not found')
    return web.json_response(POD)


def test_pod_answers_are_never_made_into_models(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    def deserialize(self: object, response: object, response_type: object, *args: object) -> None:
        made.append(response_type)
        raise AssertionError(f"an answer was made into {response_type}")

    monkeypatch.setattr(client.ApiClient, "deserialize", deserialize)

    async def scenario() -> None:
        app = web.Application()
        app.router.add_post("/api/v1/namespaces/{ns}/pods", create)
        app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", patch)
        app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", delete)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}"))
        kube = Kube(api, request_timeout=10)
        try:
            assert await kube.create_pod("ns", POD) is True
            assert await kube.create_pod("ns", {**POD, "metadata": {"name": "there"}}) is False
            with pytest.raises(ApiException) as refused:
                await kube.create_pod("ns", {**POD, "metadata": {"name": "bad"}})
            assert (
                describe_error(refused.value) == '422 Pod "bad" is invalid: spec.containers: Required value'
            )
            assert await kube.patch_pod("ns", "w", {"metadata": {"labels": {"a": None}}}) is True
            assert await kube.patch_pod("ns", "gone", {"metadata": {}}) is False
            assert await kube.delete_pod("ns", "w") is True
            assert await kube.delete_pod("ns", "gone") is False
            # Every connection was given back (the answers were read to the end).
            assert kube._slots._value == 100
        finally:
            await api.close()
            await runner.cleanup()

    asyncio.run(scenario())
    assert made == []
