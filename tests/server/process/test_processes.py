"""The worker as several processes: one capacity across HTTP processes, a dead process ends the worker,
SIGTERM drains work held in every process, streaming and deadlines across the process boundary.

Every test holds work in the worker with a gate file the handler waits for (``HANDLER_RUN_GATE``), so
nothing depends on how fast this machine is: the test decides when a forward pass may finish.  Which
HTTP process holds a connection is read from the processes themselves (psutil), so a test that needs
work in every HTTP process opens connections until each has some.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from testkit.echo_models import ECHO, GENERATION, WarmEcho, handler_name
from testkit.server import ServerFactory, ServerProcess
from testkit.waiting import wait_for_async

pytestmark = pytest.mark.slow

DEADLINE = 30.0  # bound on every wait below (the events come in milliseconds)


def worker_processes(server: ServerProcess) -> dict[str, psutil.Process]:
    """The worker's processes by name (``mp-inference``, ``mp-http-0``, ...)."""
    children = psutil.Process(server.proc.pid).children()
    return {p.name(): p for p in children if p.name().startswith("mp-")}


async def until(check: Callable[[], bool], what: str | Callable[[], str]) -> None:
    """Wait (bounded) until ``check()`` is true."""
    await wait_for_async(check, DEADLINE, message=what)


def _owners(https: dict[str, psutil.Process], connections: list[Connection]) -> str:
    """For a failure message: our connections' ports, and what each HTTP process holds."""
    held = {
        name: sorted(str(c.raddr) for c in p.net_connections("tcp") if c.raddr) for name, p in https.items()
    }
    return f"ours {[c.port for c in connections]}, theirs {held}"


@dataclass
class Connection:
    """A raw keep-alive HTTP/1.1 connection to the server, and the HTTP process that accepted it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    owner: str = ""

    @property
    def port(self) -> int:
        return int(self.writer.get_extra_info("sockname")[1])

    async def post(self, path: str, doc: dict[str, Any], **headers: str) -> tuple[int, dict[str, Any]]:
        body = json.dumps(doc).encode()
        head = [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json"]
        head += [f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items())]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        lines = (await self.reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        status = int(lines[0].split()[1])
        length = next(int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length"))
        return status, json.loads(await self.reader.readexactly(length))

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def spread(server: ServerProcess, per_process: int) -> list[Connection]:
    """Open connections until every HTTP process of ``server`` has accepted ``per_process`` of them."""
    expected = int(server.args[server.args.index("--http-workers") + 1])

    def http_processes() -> dict[str, psutil.Process]:
        # A process takes its name first thing in its main, a moment after it was spawned.
        return {n: p for n, p in worker_processes(server).items() if n.startswith("mp-http")}

    await until(lambda: len(http_processes()) == expected, f"{expected} named HTTP processes")
    https = http_processes()
    connections: list[Connection] = []
    while len(connections) < 300:
        for _ in range(4):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            connections.append(Connection(reader, writer))

        def owned() -> bool:
            ports = {
                name: {c.raddr.port for c in p.net_connections("tcp") if c.raddr} for name, p in https.items()
            }
            for conn in connections:
                conn.owner = next((name for name, held in ports.items() if conn.port in held), "")
            return all(conn.owner for conn in connections)

        await until(
            owned, lambda: f"the HTTP processes to accept the connections: {_owners(https, connections)}"
        )
        counts = {name: sum(c.owner == name for c in connections) for name in https}
        if min(counts.values()) >= per_process:
            return connections
    raise AssertionError(f"connections never reached every HTTP process: {counts}")


def _echo(server: ServerFactory, tmp_path: Path, *flags: str) -> tuple[ServerProcess, Path, Path]:
    gate, record = tmp_path / "gate", tmp_path / "record.txt"
    record.touch()
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO, "--device", "cpu", "--name", "echo",
        "--max-batch-size", "1", "--max-batch-delay-ms", "0", "--request-timeout", "60", *flags,
        env={"HANDLER_RUN_GATE": str(gate), "HANDLER_RECORD": str(record)}, wait="ready",
    )  # fmt: skip
    return proc, gate, record


def open_gate(gate: Path) -> None:
    gate.touch()


def close_gate(gate: Path) -> None:
    gate.unlink()


def _computed(record: Path) -> list[str]:
    return record.read_text().split()


async def _burst(
    server: ServerProcess, connections: list[Connection], gate: Path, record: Path, tag: str
) -> int:
    """One request per connection at once, with the forward pass held; returns how many were admitted."""
    capacity = 4
    tasks = [
        asyncio.create_task(c.post("/v1/embeddings", {"input": f"{tag}-{i}"}))
        for i, c in enumerate(connections)
    ]

    def settled() -> bool:
        stats = server.stats()
        refused = sum(t.done() for t in tasks)
        return bool(refused + stats["queue_depth"] + stats["in_flight"] == len(tasks))

    await until(settled, "every request of the burst to be admitted or refused")
    refused = [t.result() for t in tasks if t.done()]
    assert all(status == 429 for status, _ in refused), refused
    admitted = len(tasks) - len(refused)
    stats = server.stats()
    # One request may be in the forward pass; the queue never holds more than the capacity.
    assert stats["queue_depth"] <= capacity and stats["in_flight"] <= 1, stats
    assert capacity <= admitted <= capacity + 1, (admitted, stats)
    open_gate(gate)
    answers = await asyncio.gather(*tasks)
    assert sum(status == 200 for status, _ in answers) == admitted
    computed = [t for t in _computed(record) if t.startswith(tag + "-")]
    assert len(computed) == admitted, computed
    await until(lambda: server.stats()["in_flight"] == 0 and server.stats()["queue_depth"] == 0, "idle")
    close_gate(gate)
    return admitted


def test_one_capacity_across_http_processes_under_concurrent_bursts(
    server: ServerFactory, tmp_path: Path
) -> None:
    proc, gate, record = _echo(server, tmp_path, "--http-workers", "3", "--queue-capacity", "4")

    async def go() -> None:
        connections = await spread(proc, per_process=3)
        owners = {c.owner for c in connections}
        assert owners == {"mp-http-0", "mp-http-1", "mp-http-2"}
        refused = 0
        for round_ in ("first", "second"):
            refused += len(connections) - await _burst(proc, connections, gate, record, round_)
        for c in connections:
            await c.close()
        assert proc.stats()["rejected_total"] == refused

    asyncio.run(go())


def test_sigterm_drains_work_held_in_every_process(server: ServerFactory, tmp_path: Path) -> None:
    proc, gate, record = _echo(server, tmp_path, "--http-workers", "2", "--drain-timeout", "60")

    async def go() -> list[tuple[int, dict[str, Any]]]:
        connections = await spread(proc, per_process=2)
        chosen = [
            c for name in ("mp-http-0", "mp-http-1") for c in [k for k in connections if k.owner == name][:2]
        ]
        held = [
            asyncio.create_task(c.post("/v1/embeddings", {"input": f"held-{i}"}))
            for i, c in enumerate(chosen)
        ]
        # All four admitted: one in the forward pass, three in the inference process's queue, and each
        # waited for by the HTTP process that took it.
        await until(lambda: proc.stats()["queue_depth"] + proc.stats()["in_flight"] == 4, "all admitted")
        proc.terminate()
        await until(lambda: httpx.get(proc.url + "/v2/health/ready").status_code == 503, "Evicting")
        async with httpx.AsyncClient(timeout=DEADLINE) as client:
            new = await client.post(proc.url + "/v1/embeddings", json={"input": "after-sigterm"})
        assert new.status_code == 503, new.text
        open_gate(gate)
        return list(await asyncio.gather(*held))

    answers = asyncio.run(go())
    assert [status for status, _ in answers] == [200] * 4, answers
    assert proc.wait_exit(DEADLINE) == 0
    assert sorted(t for t in _computed(record) if t.startswith("held-")) == [f"held-{i}" for i in range(4)]


@pytest.mark.parametrize("victim", ["mp-http-1", "mp-inference"])
def test_a_dead_process_ends_the_worker_with_the_reason(
    server: ServerFactory, tmp_path: Path, victim: str
) -> None:
    proc, _, _ = _echo(server, tmp_path, "--http-workers", "2")

    async def go() -> None:
        connections = await spread(proc, per_process=1)
        survivor = next(c for c in connections if c.owner == "mp-http-0")
        waiting = asyncio.create_task(survivor.post("/v1/embeddings", {"input": "waiting"}))
        await until(lambda: proc.stats()["in_flight"] == 1, "the request in the forward pass")
        worker_processes(proc)[victim].send_signal(signal.SIGKILL)
        status, body = await waiting  # answered, not left hanging
        assert status == 503, body

    asyncio.run(go())
    assert proc.wait_exit(DEADLINE) == 5
    message = proc.termination_log.read_text()
    assert f"the {victim.removeprefix('mp-')} process" in message and "killed by SIGKILL" in message


def test_no_request_waits_past_its_deadline(server: ServerFactory, tmp_path: Path) -> None:
    proc, gate, record = _echo(server, tmp_path, "--http-workers", "2", "--queue-capacity", "16")

    async def go() -> None:
        connections = await spread(proc, per_process=3)
        busy = asyncio.create_task(connections[0].post("/v1/embeddings", {"input": "occupy"}))
        await until(lambda: proc.stats()["in_flight"] == 1, "the forward pass to start")

        async def late(i: int, conn: Connection) -> float:
            started = time.monotonic()
            status, body = await conn.post(
                "/v1/embeddings", {"input": f"late-{i}"}, **{"x-request-timeout": "0.5"}
            )
            assert status == 504 and body["error"]["type"] == "timeout", body
            return time.monotonic() - started

        waited = await asyncio.gather(*(late(i, c) for i, c in enumerate(connections[1:5])))
        # Answered at the deadline, not when the worker got round to the request (it is still held).
        assert all(0.45 <= w < 0.5 + 5.0 for w in waited), waited
        assert not busy.done()
        open_gate(gate)
        assert (await busy)[0] == 200
        await until(lambda: proc.stats()["queue_depth"] == 0, "the queue to empty")

    asyncio.run(go())
    assert not [t for t in _computed(record) if t.startswith("late-")]
    assert proc.metric("modelpool_dropped_total", reason="timeout") == 4


def test_streaming_crosses_the_process_boundary_piece_by_piece(server: ServerFactory, tmp_path: Path) -> None:
    gate = tmp_path / "emit-gate"
    proc = server(
        "--model", "/", "--task", "text-generation", "--handler", GENERATION,
        "--device", "cpu", "--name", "gen", env={"HANDLER_EMIT_GATE": str(gate)}, wait="ready",
    )  # fmt: skip
    body = {"prompt": "alpha beta gamma", "max_tokens": 10, "stream": True}
    texts: list[str] = []
    with httpx.stream("POST", proc.url + "/v1/completions", json=body, timeout=DEADLINE) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            text = json.loads(line[len("data: ") :])["choices"][0].get("text", "")
            texts.append(text)
            if "alpha" in text:
                # The first piece came through while the generation is held after it.
                assert not gate.exists()
                open_gate(gate)
    assert "".join(texts).split() == ["alpha", "beta", "gamma"]


def test_warm_up_runs_before_ready_and_is_reported(server: ServerFactory, tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    warm = server(
        "--model", "/", "--task", "text-embedding", "--handler", handler_name(WarmEcho),
        "--device", "cpu", env={"HANDLER_RECORD": str(record)}, wait="ready",
    )  # fmt: skip
    assert _computed(record) == ["warm-up"]
    assert warm.stats()["warmup_seconds"] is not None
    assert warm.metric("modelpool_model_warmup_seconds") == warm.stats()["warmup_seconds"]
    record.unlink()
    cold = server(
        "--model", "/", "--task", "text-embedding", "--handler", handler_name(WarmEcho),
        "--device", "cpu", "--skip-warmup", env={"HANDLER_RECORD": str(record)}, wait="ready",
    )  # fmt: skip
    assert not record.exists()
    assert cold.stats()["warmup_seconds"] is None


def test_the_probe_port_answers_while_the_http_processes_cannot(
    server: ServerFactory, tmp_path: Path
) -> None:
    """The supervisor answers health, readiness and /stats on --probe-port without the HTTP processes (a
    flood keeps them busy at a low priority); a wedged one still fails liveness there, and recovers."""
    from testkit.environment import free_port

    probe_port = free_port()
    proc, _, _ = _echo(server, tmp_path, "--http-workers", "2", "--probe-port", str(probe_port))
    probes = httpx.Client(base_url=f"http://127.0.0.1:{probe_port}", timeout=5)
    assert probes.get("/v2/health/ready").json() == {"ready": True, "state": "Ready"}
    same = ("state", "queue_capacity", "requests_total", "model")
    served, probed = proc.stats(), probes.get("/stats").json()
    assert {k: served[k] for k in same} == {k: probed[k] for k in same}
    assert probes.get("/v1/embeddings").status_code == 404  # the traffic stays on the serving port
    # /metrics too, with the HTTP processes' counters (their multiprocess files) and the shared gauges.
    exposition = probes.get("/metrics").text
    assert 'modelpool_requests_total{code="200",route="health"}' in exposition, exposition
    assert "modelpool_queue_capacity" in exposition
    # The probe port's threads block SIGTERM and SIGINT: only the supervisor's main thread, which has
    # its handlers in place, takes them (a signal to another thread would end the worker undrained).
    stop_bits = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))
    threads = [t for t in Path(f"/proc/{proc.proc.pid}/task").iterdir() if t.name != str(proc.proc.pid)]
    assert threads, "the probe port's thread"
    for thread in threads:
        status = (thread / "status").read_text()
        blocked = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk")), 16)
        assert blocked & stop_bits == stop_bits, status
    https = [p for name, p in worker_processes(proc).items() if name.startswith("mp-http")]
    assert len(https) == 2
    for p in https:
        p.suspend()  # SIGSTOP: nothing the HTTP processes hold can answer
    try:
        with pytest.raises(httpx.TimeoutException):
            httpx.get(proc.url + "/v2/health/live", timeout=0.5)
        started = time.monotonic()
        assert probes.get("/v2/health/live").status_code == 200
        assert probes.get("/stats").json()["state"] == "Ready"
        assert "modelpool_worker_state" in probes.get("/metrics").text
        assert time.monotonic() - started < 1.0

        # Stopped for longer than STALL_AFTER_S: liveness fails on the probe port too, naming why.
        asyncio.run(until(lambda: probes.get("/v2/health/live").status_code == 503, "liveness to fail"))
        assert "has not run its event loop" in probes.get("/v2/health/live").json()["reason"]
    finally:
        for p in https:
            p.resume()
    asyncio.run(until(lambda: probes.get("/v2/health/live").status_code == 200, "liveness to recover"))
    assert httpx.get(proc.url + "/v2/health/live").status_code == 200
