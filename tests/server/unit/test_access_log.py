"""An HTTP process's access line (``model_server.frontend.access_log``, pure): method, path, status and
latency; none for the ops routes that pollers call all the time."""

from __future__ import annotations

import pytest

from model_server.frontend.access_log import access_fields


def test_a_request_line() -> None:
    assert access_fields("POST", "/v1/embeddings", 200, 0.002) == {
        "method": "POST",
        "path": "/v1/embeddings",
        "status": 200,
        "latency_ms": 2.0,
    }


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", "/metrics", "/stats"])
def test_the_ops_routes_get_no_line(path: str) -> None:
    assert access_fields("GET", path, 503, 0.0) is None
