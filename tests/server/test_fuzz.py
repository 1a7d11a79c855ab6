"""A bounded schemathesis pass over the server's own OpenAPI schema: whatever the generated request, the
answer is never a 5xx (bad input is a 4xx with a reason), and the server keeps serving afterwards."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.server.conftest import ServerProcess, start_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", "/", "--task", "text-embedding", "--handler", "tests.server.handlers:EchoEmbedding",
        "--device", "cpu", "--name", "echo", "--max-request-bytes", "65536", wait="ready",
    )  # fmt: skip
    yield proc
    proc.stop()


def test_no_5xx(fuzz_server: ServerProcess) -> None:
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 10
    seen: list[int] = []

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=8,  # ~13 operations x 8: about 100 requests in all
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def check(case: schemathesis.Case[Any]) -> None:
            if case.path_parameters and case.operation.path.endswith("/infer") and random_name(case):
                case.path_parameters["name"] = "echo"  # reach the tensor decoder, not only the 404
            response = case.call(base_url=fuzz_server.url, timeout=30)
            seen.append(response.status_code)
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
            )

        check()
    assert len(seen) >= 50
    assert any(400 <= code < 500 for code in seen)
    assert httpx.get(fuzz_server.url + "/v2/health/ready", timeout=10).status_code == 200
    r = httpx.post(fuzz_server.url + "/v1/embeddings", json={"input": "still serving"}, timeout=30)
    assert r.status_code == 200


def random_name(case: schemathesis.Case[Any]) -> bool:
    """Half the infer cases keep the generated model name (404 path), half use the served one."""
    return zlib.crc32(repr(case.body).encode()) % 2 == 0
