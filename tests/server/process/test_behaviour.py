"""The server as a real process with ``--handler`` test classes: admission, deadlines, disconnects,
crash recovery, lifecycle (slow load, idle, drain, load failure, fatal device error), limits.

Handlers run on ``--device cpu`` so no torch import is needed: these tests exercise the server, fast.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.echo_models import ECHO, FailingLoad, handler_name
from testkit.environment import ROOT
from testkit.server import ServerFactory, ServerProcess, start_server
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow


def _embed(url: str, texts: list[str], **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/embeddings", json={"input": texts}, headers=headers, timeout=30)


def _v2(name: str, datatype: str, shape: list[int], data: list[Any]) -> bytes:
    return json.dumps(
        {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}
    ).encode()


def _wait_state(server: ServerProcess, state: str, timeout: float = 20) -> None:
    wait_for(
        lambda: server.stats()["state"] == state,
        timeout,
        0.05,
        lambda: f"state {state}; stats: {server.stats()}",
    )


@pytest.fixture(scope="module")
def record_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("record") / "texts.txt"


@pytest.fixture(scope="module")
def echo(record_file: Path) -> Iterator[ServerProcess]:
    """One shared server: capacity 4, batches of 4, a 0.3 s forward pass, idle after 2 s."""
    proc = start_server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO, "--device", "cpu",
        "--queue-capacity", "4", "--max-batch-size", "4", "--max-batch-delay-ms", "0",
        "--request-timeout", "20", "--idle-after", "2", "--max-request-bytes", "4096",
        "--max-request-items", "16", "--name", "echo",
        env={"HANDLER_RUN_SECONDS": "0.3", "HANDLER_RECORD": str(record_file)}, wait="ready",
    )  # fmt: skip
    yield proc
    proc.stop()


def test_happy_path_and_stats(echo: ServerProcess) -> None:
    r = _embed(echo.url, ["abc", "hello"])
    assert r.status_code == 200, r.text
    assert [d["embedding"][0] for d in r.json()["data"]] == [3.0, 5.0]
    stats = echo.stats()
    for key in ("state", "state_since", "queue_depth", "queue_capacity", "in_flight", "last_request_time",
                "requests_total", "rejected_total", "errors_total", "load_error", "load_progress", "memory",
                "model"):  # fmt: skip
        assert key in stats
    assert stats["version"] == 1 and stats["queue_capacity"] == 4
    assert stats["model"] == {"name": "echo", "task": "text-embedding", "source": "/"}
    assert stats["memory"]["rss_bytes"] > 0
    assert echo.metric("modelpool_queue_capacity") == 4


def test_overload_burst_gets_429_with_retry_after_and_no_5xx(echo: ServerProcess) -> None:
    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *[client.post(echo.url + "/v1/embeddings", json={"input": f"text {i}"}) for i in range(40)]
            )

    started = time.monotonic()
    responses = asyncio.run(burst())
    codes = [r.status_code for r in responses]
    assert all(c in (200, 429) for c in codes), codes
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected and codes.count(200) >= 4, codes
    for r in rejected:
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["error"]["type"] == "overloaded"
    assert time.monotonic() - started < 30
    assert echo.metric("modelpool_rejected_total", reason="overloaded") >= len(rejected)


def test_deadline_header_gives_504_and_request_is_dropped(echo: ServerProcess, record_file: Path) -> None:
    async def go() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            busy = asyncio.create_task(client.post(echo.url + "/v1/embeddings", json={"input": "occupy"}))
            await asyncio.sleep(0.1)
            late = await client.post(
                echo.url + "/v1/embeddings",
                json={"input": "too-late-header"},
                headers={"x-request-timeout": "0.05"},
            )
            return await busy, late

    busy, late = asyncio.run(go())
    assert busy.status_code == 200
    assert late.status_code == 504, late.text
    assert late.json()["error"]["type"] == "timeout"
    # One queue, in order: once a later request is answered, the timed-out one was computed or dropped.
    assert _embed(echo.url, ["after"]).status_code == 200
    assert "too-late-header" not in record_file.read_text()


def test_v2_timeout_parameter_gives_504(echo: ServerProcess) -> None:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(timeout=30) as client:
            busy = asyncio.create_task(client.post(echo.url + "/v1/embeddings", json={"input": "occupy"}))
            await asyncio.sleep(0.1)
            body = {
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["late-v2"]}],
                "parameters": {"timeout": 50_000},  # microseconds, as tritonclient sends it
            }
            late = await client.post(echo.url + "/v2/models/echo/infer", json=body)
            await busy
            return late

    late = asyncio.run(go())
    assert late.status_code == 504, late.text


def test_disconnected_client_is_dropped_before_compute(echo: ServerProcess, record_file: Path) -> None:
    async def go() -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            busy = asyncio.create_task(client.post(echo.url + "/v1/embeddings", json={"input": "occupy2"}))
            await asyncio.sleep(0.1)
            with pytest.raises(httpx.ReadTimeout):
                await client.post(
                    echo.url + "/v1/embeddings",
                    json={"input": "gone-client"},
                    timeout=httpx.Timeout(30, read=0.05),
                )
            assert (await busy).status_code == 200

    before = echo.metric("modelpool_dropped_total", reason="disconnected")
    asyncio.run(go())
    wait_for(
        lambda: echo.metric("modelpool_dropped_total", reason="disconnected") == before + 1,
        10,
        0.05,
        "the disconnected request counted as dropped",
    )
    # One queue, in order: once a later request is answered, the dropped one was not computed after all.
    assert _embed(echo.url, ["after-gone"]).status_code == 200
    assert "gone-client" not in record_file.read_text()
    assert echo.metric("modelpool_dropped_total", reason="disconnected") == before + 1


def test_failing_forward_pass_fails_only_that_request(echo: ServerProcess) -> None:
    r = _embed(echo.url, ["boom"])
    assert r.status_code == 500
    assert "forward pass exploded" in r.json()["error"]["message"]
    assert _embed(echo.url, ["fine"]).status_code == 200
    assert echo.stats()["errors_total"] >= 1


def test_oom_splits_the_batch_and_retries_halves(echo: ServerProcess) -> None:
    r = _embed(echo.url, ["oom", "abcd", "xy"])
    assert r.status_code == 200, r.text
    vectors = [d["embedding"] for d in r.json()["data"]]
    assert [v[0] for v in vectors] == [3.0, 4.0, 2.0]
    assert vectors[0][1] == 1.0  # the item that triggered OOM ran alone after the split


def test_bad_item_does_not_fail_its_batch_mates(echo: ServerProcess) -> None:
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            busy = asyncio.create_task(client.post(echo.url + "/v1/embeddings", json={"input": "occupy3"}))
            await asyncio.sleep(0.1)  # the next two are queued together and batched
            rest = await asyncio.gather(
                client.post(echo.url + "/v1/embeddings", json={"input": "bad"}),
                client.post(echo.url + "/v1/embeddings", json={"input": "good"}),
            )
            return [await busy, *rest]

    busy, bad, good = asyncio.run(go())
    assert busy.status_code == 200 and good.status_code == 200
    assert bad.status_code == 400 and "refused" in bad.json()["error"]["message"]


@pytest.mark.parametrize(
    ("path", "body", "code"),
    [
        ("/v1/embeddings", b"{not json", 400),
        ("/v1/embeddings", b'{"input": []}', 400),
        ("/v1/embeddings", b'{"input": [1, 2, 3]}', 400),
        ("/v1/embeddings", b'{"input": "x", "model": "other"}', 404),
        ("/v1/embeddings", b'{"input": ' + b'["x"' + b', "x"' * 20 + b"]}", 413),
        ("/v1/embeddings", b'{"input": "' + b"x" * 5000 + b'"}', 413),
        ("/v1/completions", b'{"prompt": "x"}', 400),
        ("/v1/images/generations", b'{"prompt": "x"}', 400),
        ("/v2/models/other/infer", b'{"inputs": []}', 404),
        ("/v2/models/echo/infer", _v2("wrong", "BYTES", [1], ["a"]), 400),
        ("/v2/models/echo/infer", _v2("text", "FP32", [1], [1.0]), 400),
        ("/v2/models/echo/infer", _v2("text", "BYTES", [1, 1], ["a"]), 400),
        ("/v2/models/echo/infer", _v2("text", "BYTES", [0], []), 400),
        ("/v2/models/echo/infer", _v2("text", "BYTES", [2], ["a"]), 400),
    ],
)  # fmt: skip
def test_bad_input_is_4xx_and_next_request_succeeds(
    echo: ServerProcess, path: str, body: bytes, code: int
) -> None:
    r = httpx.post(echo.url + path, content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == code, r.text
    assert r.json()["error"]
    assert _embed(echo.url, ["next"]).status_code == 200


def test_non_utf8_v2_bytes_is_400(echo: ServerProcess) -> None:
    blob = b"\x02\x00\x00\x00\xff\xfe"
    head = json.dumps(
        {
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 6}}
            ]
        }
    ).encode()
    r = httpx.post(
        echo.url + "/v2/models/echo/infer", content=head + blob,
        headers={"Inference-Header-Content-Length": str(len(head))}, timeout=30,
    )  # fmt: skip
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]


def test_chunked_body_over_limit_is_413(echo: ServerProcess) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"input": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}'

    r = httpx.post(echo.url + "/v1/embeddings", content=chunks(), timeout=30)
    assert r.status_code == 413


def test_ready_goes_idle_then_processing_again(echo: ServerProcess) -> None:
    _wait_state(echo, "Idle", timeout=15)
    assert httpx.get(echo.url + "/v2/health/ready", timeout=5).status_code == 200
    assert _embed(echo.url, ["wake"]).status_code == 200
    assert echo.stats()["state"] in ("Ready", "Processing")


def test_health_and_stats_answer_during_a_slow_cpu_heavy_load(server: ServerFactory, tmp_path: Path) -> None:
    # The load spins the CPU in pure Python until the test opens the gate, so every probe below is
    # guaranteed to happen while the worker is Loading (no race against a timer).
    gate = tmp_path / "load-may-finish"
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO, "--device", "cpu",
        env={"HANDLER_LOAD_GATE": str(gate)},
    )  # fmt: skip
    latencies: list[float] = []
    with httpx.Client(timeout=5) as client:
        while len(latencies) < 30:
            t0 = time.perf_counter()
            live = client.get(proc.url + "/v2/health/live")
            stats = client.get(proc.url + "/stats").json()
            latencies.append((time.perf_counter() - t0) / 2)
            assert live.status_code == 200
            assert stats["state"] == "Loading", stats
            assert client.get(proc.url + "/v2/health/ready").status_code == 503
            refused = client.post(proc.url + "/v1/embeddings", json={"input": "x"})
            assert refused.status_code == 503 and refused.headers.get("retry-after"), refused.text
            time.sleep(0.02)
        gate.touch()
        _wait_state(proc, "Ready", timeout=60)
        assert client.get(proc.url + "/v2/health/ready").status_code == 200
        assert client.post(proc.url + "/v1/embeddings", json={"input": "x"}).status_code == 200
    # Generous bound: the test machine is shared; `make bench` reports the real numbers.
    assert statistics.median(latencies) < 0.1, sorted(latencies)


def test_console_script_exits_2_with_one_line() -> None:
    script = Path(sys.executable).parent / "modelpool-server"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "model_server"]
    proc = subprocess.run(
        [*cmd, "--model", "/m", "--task", "text-embedding", "--max-batch-delay-ms", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--max-batch-delay-ms" in lines[0], proc.stderr


def test_load_failure_exits_3_with_termination_message(server: ServerFactory) -> None:
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", handler_name(FailingLoad),
        "--device", "cpu", wait="none",
    )  # fmt: skip
    assert proc.wait_exit(60) == 3
    message = proc.termination_log.read_text()
    assert "weights file missing" in message and message.startswith("load failed")


def test_bad_handler_exits_3(server: ServerFactory) -> None:
    proc = server("--model", "/", "--task", "text-embedding", "--handler", "tests.server.nope:X", wait="none")
    assert proc.wait_exit(60) == 3
    assert "cannot import module" in proc.termination_log.read_text()


def test_fatal_device_error_fails_the_worker_and_exits_non_zero(server: ServerFactory) -> None:
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO, "--device", "cpu", wait="ready"
    )
    r = _embed(proc.url, ["fatal"])
    assert r.status_code == 500 and r.json()["error"]["type"] == "device_error"
    code = proc.wait_exit(30)
    assert code not in (0, None)
    assert "illegal memory access" in proc.termination_log.read_text()


def test_sigterm_drains_in_flight_work_then_exits_0(server: ServerFactory) -> None:
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO, "--device", "cpu",
        "--drain-timeout", "20", env={"HANDLER_RUN_SECONDS": "1.5"}, wait="ready",
    )  # fmt: skip

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            first = asyncio.create_task(client.post(proc.url + "/v1/embeddings", json={"input": "in-flight"}))
            await asyncio.sleep(0.3)
            queued = asyncio.create_task(client.post(proc.url + "/v1/embeddings", json={"input": "queued"}))
            await asyncio.sleep(0.2)
            proc.terminate()
            await asyncio.sleep(0.3)
            ready = await client.get(proc.url + "/v2/health/ready")
            assert ready.status_code == 503
            new = await client.post(proc.url + "/v1/embeddings", json={"input": "new"})
            return await first, await queued, new

    first, queued, new = asyncio.run(go())
    assert first.status_code == 200 and queued.status_code == 200
    assert new.status_code == 503
    assert proc.wait_exit(30) == 0


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf"])
def test_bad_timeout_header_is_400(echo: ServerProcess, value: str) -> None:
    r = _embed(echo.url, ["x"], **{"x-request-timeout": value})
    assert r.status_code == 400 and "x-request-timeout" in r.json()["error"]["message"]


def test_sigterm_while_loading_exits_0_promptly(server: ServerFactory) -> None:
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO, "--device", "cpu",
        env={"HANDLER_LOAD_SECONDS": "60"},
    )  # fmt: skip
    assert proc.stats()["state"] == "Loading"
    started = time.monotonic()
    proc.terminate()
    assert proc.wait_exit(30) == 0
    assert time.monotonic() - started < 20  # not held hostage by the load still running on its thread


@pytest.mark.parametrize(
    ("texts", "status"),
    [(["fast"], 200), (["bad"], 400), (["boom"], 500), ([], 400)],
)
def test_infer_fast_path_answers_like_the_fastapi_route(
    echo: ServerProcess, texts: list[str], status: int
) -> None:
    # /v2/models/echo/infer is served by the outermost middleware's fast path; the /versions/1 form
    # goes through FastAPI's routing and exception handlers. Both must answer the same way.
    doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    rejected_before = echo.stats()["rejected_total"]
    answers = [
        httpx.post(echo.url + path, json=doc, timeout=30)
        for path in ("/v2/models/echo/infer", "/v2/models/echo/versions/1/infer")
    ]
    assert [a.status_code for a in answers] == [status, status], [a.text for a in answers]
    assert answers[0].json() == answers[1].json()
    if status == 400:  # refused requests are counted as rejections on both paths
        assert echo.stats()["rejected_total"] == rejected_before + 2
    unknown = httpx.post(echo.url + "/v2/models/nope/infer", json=doc, timeout=30)
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
