"""Hostile input on a real ``modelpool-gateway`` in front of a real worker: 2,000 generated requests per
route group (the strategies and checks of ``tests/server/fuzzcases.py``), raw-socket cases, a slow body
(408 after ``--request-body-timeout-seconds``) and header blocks over the bound (431).  The gateway
answers no 5xx (none of its documented ones applies: the pool has a serving worker and nothing
drains), every 4xx has a reason, it stays alive and ready, its RSS stays bounded, and its log holds no
traceback.

One namespace, operator, echo pool (one worker on the process node) and gateway serve the module; every
generated case carries the gateway's API key except a few that drop it (401).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testkit.cluster import Cluster
from tests.gateway.integration.gwharness import GatewayProcess, echo_pool, serving_stack
from tests.server.fuzzcases import (
    FUZZ_SETTINGS,
    MODEL,
    MUTANTS,
    Case,
    Tally,
    metadata_cases,
    mutants,
    openai_cases,
    raw_exchange,
    v2_binary_cases,
    v2_json_cases,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

EXAMPLES = 2000
BODY_TIMEOUT_S = 1.0
# The gateway is one process holding its watches' caches; after a warm-up, thousands of refused and
# relayed requests must not grow it by more than this.
RSS_GROWTH_LIMIT = 32 * 2**20


@dataclass
class Setup:
    gateway: GatewayProcess
    client: httpx.Client
    baseline_rss: int


def rss(pid: int) -> int:
    """VmRSS of one process, from /proc/<pid>/status."""
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def setup(crds: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    logs = tmp_path_factory.mktemp("gateway-fuzz")
    pools = [(echo_pool(MODEL, queue_capacity=1000), 1)]
    flags = ("--request-body-timeout-seconds", str(BODY_TIMEOUT_S))
    with (
        serving_stack(crds, "gwfuzz", logs, pools, *flags) as stack,
        httpx.Client(base_url=stack.gateway.url, headers=stack.gateway.headers, timeout=30) as client,
    ):
        for case in WARM_UP:
            assert case.send(client).status_code < 500
        yield Setup(stack.gateway, client, rss(stack.gateway.proc.pid))


WARM_UP = [
    Case("POST", "/v1/embeddings", {}, b'{"model": "echo", "input": ["a", "b"]}'),
    Case(
        "POST",
        f"/v2/models/{MODEL}/infer",
        {},
        b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}',
    ),
    Case("POST", "/v1/embeddings", {}, b"{not json"),
    Case("GET", f"/v2/models/{MODEL}", {}, b""),
]


def without_key(case: Case, seed: int) -> bool:
    """One case in fifty goes without the API key (401 before anything else)."""
    return (seed + len(case.body)) % 50 == 0


@pytest.mark.parametrize(
    "strategy", [openai_cases(), v2_json_cases(), v2_binary_cases(), metadata_cases()],
    ids=["openai", "v2-json", "v2-binary", "metadata-health"],
)  # fmt: skip
def test_generated_requests(setup: Setup, strategy: st.SearchStrategy[Case]) -> None:
    tally = Tally()

    @FUZZ_SETTINGS(EXAMPLES // MUTANTS)
    @given(case=strategy, seed=st.integers(0, 2**32 - 1))
    def run(case: Case, seed: int) -> None:
        for variant in mutants(case, seed):
            extra = {"authorization": "Bearer wrong"} if without_key(variant, seed) else None
            tally.check(variant, variant.send(setup.client, extra))

    run()
    tally.assert_varied(EXAMPLES)
    assert setup.gateway.alive(), setup.gateway.log_tail()


def test_raw_http_and_huge_headers(setup: Setup) -> None:
    port = setup.gateway.port
    auth = b"Authorization: Bearer " + (setup.gateway.key or "").encode() + b"\r\n"
    huge = [
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%05d: v\r\n" % i for i in range(8000))
        + b"\r\n",
    ]
    for request in huge:
        status, body = raw_exchange(port, request)
        assert status == 431 and b"too large" in body, (status, body)
    odd = [
        b"GET /v2/models/\xff\xfe/ready HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n",
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
        + auth
        + b"X-Odd: \xff\xfe\r\nContent-Length: 13\r\n\r\n"
        b'{"input":"a"}',
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n"
        + auth
        + b'Content-Length: 30\r\n\r\n{"model":"echo","input":"\xff\xfe"}',
        b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n"
        b"zz\r\nabc\r\n0\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),
    ]
    for request in odd:
        status, body = raw_exchange(port, request)
        assert status is None or status == 200 or (400 <= status < 500 and body.strip()), (
            request[:120],
            status,
        )


def test_slow_body_is_408(setup: Setup) -> None:
    """A body that does not arrive within ``--request-body-timeout-seconds`` is answered 408 with the
    reason; meanwhile the gateway answers others."""
    body = b'{"model": "echo", "input": ["slow"]}'
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + (setup.gateway.key or "").encode() + b"\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", setup.gateway.port), timeout=BODY_TIMEOUT_S + 20) as slow:
        slow.sendall(head + body[:5])
        assert setup.client.get("/v2/health/ready").status_code == 200
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            # The head, then the body to its Content-Length (they may arrive in separate reads).
            while not _complete(answer):
                chunk = slow.recv(4096)
                if not chunk:
                    break
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"did not arrive within" in answer or b"timeout" in answer, answer[:500]


def _complete(answer: bytes) -> bool:
    """Whether ``answer`` holds a whole HTTP answer: its head and as many body bytes as it announces."""
    head, found, body = answer.partition(b"\r\n\r\n")
    if not found:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return True


def test_still_serving_and_bounded(setup: Setup) -> None:
    """After everything above (it runs last in the module)."""
    gateway = setup.gateway
    assert gateway.alive(), gateway.log_tail()
    assert setup.client.get("/v2/health/ready").status_code == 200
    r = setup.client.post("/v1/embeddings", json={"model": MODEL, "input": "still serving"})
    assert r.status_code == 200 and r.json()["data"][0]["embedding"] == [13.0, 1.0]
    growth = rss(gateway.proc.pid) - setup.baseline_rss
    assert growth < RSS_GROWTH_LIMIT, f"gateway RSS grew {growth / 2**20:.1f} MiB over the fuzz run"
    assert "Traceback" not in gateway.log_tail(10**8), gateway.log_tail()
