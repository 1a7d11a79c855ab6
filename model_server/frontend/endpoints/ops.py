"""Health, readiness, server/model metadata, /metrics and /stats: cheap, never touch the model."""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from model_server import __version__, worker_stats
from model_server.errors import ModelNotReady
from model_server.frontend.endpoints.common import ORJSONResponse, check_model
from model_server.frontend.server import ModelServer
from modelpool_contract.stats import LIVE_PATH, METRICS_PATH, READY_PATH, STATS_PATH


def register(app: FastAPI, server: ModelServer) -> None:
    # The same answers as the supervisor's probe port (worker_stats).
    @app.get(LIVE_PATH, tags=["health"])
    async def live() -> Response:
        status, body = worker_stats.liveness(server.state_machine)
        return ORJSONResponse(body, status_code=status)

    @app.get(READY_PATH, tags=["health"])
    async def ready() -> Response:
        status, body = worker_stats.readiness(server.state_machine, server.view)
        return ORJSONResponse(body, status_code=status)

    @app.get("/v2", tags=["v2"])
    async def server_metadata() -> Response:
        return ORJSONResponse(
            {"name": "modelpool-server", "version": __version__, "extensions": ["binary_tensor_data"]}
        )

    @app.get("/v2/models/{name}", tags=["v2"])
    @app.get("/v2/models/{name}/versions/{version}", tags=["v2"], include_in_schema=False)
    async def model_metadata(name: str, version: str | None = None) -> Response:
        check_model(server, name)
        cls = server.inference.task_class
        if cls is None:
            raise ModelNotReady(f"model {name!r} is still loading; metadata is known once its task is")

        def spec(t: object) -> dict[str, object]:
            return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}  # type: ignore[attr-defined]

        return ORJSONResponse(
            {
                "name": server.config.served_name,
                "versions": ["1"],
                "platform": f"modelpool/{server.config.task}",
                "inputs": [spec(t) for t in cls.v2_inputs],
                "outputs": [spec(t) for t in cls.v2_outputs],
            }
        )

    @app.get("/v2/models/{name}/ready", tags=["v2"])
    @app.get("/v2/models/{name}/versions/{version}/ready", tags=["v2"], include_in_schema=False)
    async def model_ready(name: str, version: str | None = None) -> Response:
        check_model(server, name)
        ok = server.ready
        return ORJSONResponse({"name": name, "ready": ok}, status_code=200 if ok else 503)

    @app.get(METRICS_PATH, tags=["ops"])
    async def metrics() -> Response:
        return Response(server.render_metrics(), media_type=CONTENT_TYPE_LATEST)

    @app.get(STATS_PATH, tags=["ops"])
    async def stats() -> Response:
        return ORJSONResponse(server.stats())
