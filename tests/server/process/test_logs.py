"""A worker's logs as a process writes them: with ``--log-format plain`` every process of the worker
(supervisor, inference, HTTP) writes text lines, and the access line of a request carries the id and trace
id it came with; the answer carries the id back.  With the default, JSON, a request whose forward pass
fails has its ids on the inference process's line about it too.  (JSON from the gateway to the worker:
``tests/gateway/integration/test_gateway_logs.py``.)"""

from __future__ import annotations

import json
from typing import Any

import httpx

from testkit.echo_models import ECHO
from testkit.kubectl import wait_for
from testkit.server import ServerFactory

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
HEADERS = {"x-request-id": "plain-42", "traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01"}


def test_the_plain_setting_gives_plain_lines_with_the_requests_ids(server: ServerFactory) -> None:
    args = ["--model", "/", "--task", "text-embedding", "--handler", ECHO, "--name", "emb"]
    proc = server(*args, "--http-workers", "1", "--log-format", "plain", wait="ready")
    response = httpx.post(
        proc.url + "/v1/embeddings", json={"model": "emb", "input": ["hi"]}, headers=HEADERS, timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == "plain-42"

    def access() -> list[str]:
        return [line for line in proc.log().splitlines() if "request_id=plain-42" in line]

    wait_for(access, timeout=10, interval=0.05, message="the access line")
    [line] = access()
    assert " INFO [http-0] modelpool.access POST /v1/embeddings 200 " in line
    assert f"trace_id={TRACE_ID}" in line and "status=200" in line and "model=emb" in line
    lines = proc.log().splitlines()
    assert not any(line.startswith("{") for line in lines)
    assert any(" [supervisor] " in line for line in lines) and any(" [inference] " in line for line in lines)


def test_a_failed_forward_pass_is_logged_with_its_requests_ids(server: ServerFactory) -> None:
    args = ["--model", "/", "--task", "text-embedding", "--handler", ECHO, "--name", "emb"]
    proc = server(*args, "--http-workers", "1", wait="ready")
    headers = {**HEADERS, "x-request-id": "boom-7"}
    response = httpx.post(
        proc.url + "/v1/embeddings", json={"model": "emb", "input": ["boom"]}, headers=headers, timeout=30
    )
    assert response.status_code == 500, response.text

    def failed() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in proc.log().splitlines()]
        return [
            line for line in lines if line["process"] == "inference" and line.get("request_id") == "boom-7"
        ]

    wait_for(failed, timeout=10, interval=0.05, message="the inference process's line")
    [line] = failed()
    assert line["level"] == "warning" and line["trace_id"] == TRACE_ID
    assert line["request_ids"] == ["boom-7"] and "forward pass exploded" in line["message"]
