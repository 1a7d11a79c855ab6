"""Hostile input on a real ``modelpool-server`` process: thousands of generated requests per route, as raw
bytes, answered without a 5xx, with a reason in every 4xx, by a process that stays alive, ready and
bounded in memory.

One server (the echo embedding handler, ``testkit/echo_models.py``: no model weights, so nearly every
case costs only the HTTP path) serves the whole module over one keep-alive connection.  Hypothesis builds
the bodies from strategies of their own (``tests/server/fuzzcases.py``, shared with the gateway's fuzz
test) and runs derandomized, so CI sees the same cases every time.  Route groups: the OpenAI routes
(JSON), v2 infer JSON, v2 infer binary (``Inference-Header-Content-Length``, truncated and overrunning
tensors, wrong datatypes and shapes), and the metadata and health GETs.  Raw-socket cases cover what an
HTTP client library will not send: header blocks over the parser's limit, invalid UTF-8 in the request
line and headers, and a body that arrives slowly.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testkit.echo_models import ECHO
from testkit.server import ServerProcess, start_server
from tests.server.fuzzcases import (
    FUZZ_SETTINGS,
    HUGE_HEADERS,
    MODEL,
    MUTANTS,
    Case,
    Tally,
    metadata_cases,
    mutants,
    openai_cases,
    raw_exchange,
    reason,
    v2_binary_cases,
    v2_json_cases,
)

pytestmark = pytest.mark.slow

# Generated cases per route group (the issue asks for at least 2,000 per route).
EXAMPLES = 2000
# RSS the server's processes may gain across the whole module, after a warm-up (every route's code and
# caches touched once): a leak of even a few hundred bytes per request would exceed it.
RSS_GROWTH_LIMIT = 48 * 2**20


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerProcess]:
    proc = start_server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO,
        "--device", "cpu", "--name", MODEL, "--max-request-bytes", "65536", "--max-batch-delay-ms", "0",
        "--skip-warmup", wait="ready",
    )  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def client(fuzz_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_server.url, timeout=30) as c:
        yield c


def tree_rss(pid: int) -> int:
    """The RSS of a process and its children (the supervisor, HTTP and inference processes), from
    /proc/<pid>/status (``VmRSS``)."""
    root = psutil.Process(pid)
    total = 0
    for proc in [root, *root.children(recursive=True)]:
        with open(f"/proc/{proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


@pytest.fixture(scope="module")
def baseline_rss(fuzz_server: ServerProcess, client: httpx.Client) -> int:
    """RSS after one request of every kind (the routes' lazy imports and caches are then in place)."""
    for case in WARM_UP:
        case.send(client)
    return tree_rss(fuzz_server.proc.pid)


WARM_UP = [
    Case("POST", "/v1/embeddings", {"content-type": "application/json"}, b'{"input": ["a", "b"]}'),
    Case(
        "POST",
        f"/v2/models/{MODEL}/infer",
        {},
        b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}',
    ),
    Case("POST", "/v1/embeddings", {}, b"{not json"),
    Case("GET", f"/v2/models/{MODEL}", {}, b""),
]


@pytest.mark.parametrize(
    "strategy", [openai_cases(), v2_json_cases(), v2_binary_cases(), metadata_cases()],
    ids=["openai", "v2-json", "v2-binary", "metadata-health"],
)  # fmt: skip
def test_generated_requests(
    fuzz_server: ServerProcess, client: httpx.Client, baseline_rss: int, strategy: st.SearchStrategy[Case]
) -> None:
    """``EXAMPLES`` cases per route group: each drawn case and its mutants (``fuzzcases.mutants``)."""
    tally = Tally()

    @FUZZ_SETTINGS(EXAMPLES // MUTANTS)
    @given(case=strategy, seed=st.integers(0, 2**32 - 1))
    def run(case: Case, seed: int) -> None:
        for variant in mutants(case, seed):
            tally.check(variant, variant.send(client))

    run()
    tally.assert_varied(EXAMPLES)
    assert fuzz_server.proc.poll() is None, fuzz_server.log()[-4000:]


# Cases the fuzzer found, kept as explicit examples (each was a 500 before its fix).
REGRESSIONS = [
    # kserve_codec: an unhashable datatype (a list) raised TypeError looking it up in DTYPES.
    Case("POST", f"/v2/models/{MODEL}/infer", {}, b'{"inputs": [{"name": "text", "datatype": []}]}'),
]


@pytest.mark.parametrize("case", REGRESSIONS, ids=lambda c: c.body[:40].decode(errors="replace"))
def test_found_cases_are_refused_with_a_reason(client: httpx.Client, case: Case) -> None:
    response = case.send(client)
    assert response.status_code == 400 and reason(response), response.text


def test_raw_http(fuzz_server: ServerProcess) -> None:
    """Invalid UTF-8 in the request line and headers, conflicting lengths, bad chunking and bytes that are
    not HTTP: a 4xx with a reason, or the connection closed; never a 5xx."""
    for request in RAW_CASES:
        status, body = raw_exchange(fuzz_server.port, request)
        assert status is None or (400 <= status < 500 and body.strip()) or status == 200, (
            request[:200], status, body,
        )  # fmt: skip


RAW_CASES = [
    b"GET /v2/models/\xff\xfe/ready HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Odd: \xff\xfe\xfd\r\n"
    b'Content-Length: 13\r\n\r\n{"input":"a"}',
    b'POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n{"input":"\xff\xfe"}',
    b"POST /v2/models/" + MODEL.encode() + b"/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
    b"Content-Length: 7\r\n\r\n{}{}{}{",
    b"POST /v2/models/" + MODEL.encode() + b"/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"POST /v2/models/" + MODEL.encode() + b"/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"zz\r\nabc\r\n0\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(256)),  # a TLS ClientHello
    b"GARBAGE\r\n\r\n",
]


def test_huge_headers_are_refused_431(fuzz_server: ServerProcess) -> None:
    for request in HUGE_HEADERS:
        status, body = raw_exchange(fuzz_server.port, request)
        assert status == 431 and b"too large" in body, (request[:100], status, body)
    # A large header block within the bound is served.
    status, _ = raw_exchange(
        fuzz_server.port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 32_000 + b"\r\n\r\n"
    )
    assert status == 200


def test_endless_header_is_cut_off(fuzz_server: ServerProcess) -> None:
    """A client that never ends its header line gets 431 once it passes the bound; the server does not
    buffer what follows."""
    with socket.create_connection(("127.0.0.1", fuzz_server.port), timeout=10) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Endless: ")
        answer = b""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(100):  # up to 1.6 MB, 16 KiB at a time
                sock.sendall(b"z" * 16384)
        with contextlib.suppress(ConnectionResetError):
            answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_slow_body_does_not_block_others(fuzz_server: ServerProcess, client: httpx.Client) -> None:
    """A client that sends its body a few bytes at a time holds its own connection only: other requests
    are answered meanwhile, and the slow one is answered (200) once its body is complete."""
    body = b'{"input": ["slow", "body"]}'
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with socket.create_connection(("127.0.0.1", fuzz_server.port), timeout=10) as slow:
        slow.sendall(head + body[:3])
        for _ in range(20):  # while the slow body is unfinished, the server answers others
            assert client.get("/v2/health/ready").status_code == 200
        for i in range(3, len(body), 4):
            slow.sendall(body[i : i + 4])
            time.sleep(0.01)
        answer = slow.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]


def test_still_serving_and_bounded(
    fuzz_server: ServerProcess, client: httpx.Client, baseline_rss: int
) -> None:
    """After everything above (it runs last in the module): alive, ready, serving, and RSS bounded."""
    assert fuzz_server.proc.poll() is None, fuzz_server.log()[-4000:]
    assert client.get("/v2/health/ready").status_code == 200
    r = client.post("/v1/embeddings", json={"input": "still serving"})
    assert r.status_code == 200 and r.json()["data"][0]["embedding"] == [13.0, 1.0]
    growth = tree_rss(fuzz_server.proc.pid) - baseline_rss
    assert growth < RSS_GROWTH_LIMIT, f"RSS grew {growth / 2**20:.1f} MiB over the fuzz run"
    assert "Traceback" not in fuzz_server.log(), fuzz_server.log()[-6000:]
