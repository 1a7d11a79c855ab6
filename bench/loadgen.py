"""The load generator: simulated clients on raw keep-alive HTTP/1.1 connections, in separate processes.

``run_clients`` starts ``python -m bench.loadgen SPEC`` processes (so that the client is not the
bottleneck: the server and the clients share the machine), each runs ``client_main`` and prints its
latencies as one JSON line; ``run_clients`` merges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import struct
import subprocess
import sys
import time
import urllib.parse
from typing import Any

from bench.corpus import corpus
from bench.environment import REPO, child_env

INFER_PATH = "/v2/models/minilm/infer"


def v2_body(texts: list[str], binary: bool) -> tuple[bytes, dict[str, str]]:
    """A KServe v2 infer request for ``texts`` (JSON, or the binary tensor extension) and its headers."""
    if not binary:
        doc = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
        return json.dumps(doc).encode(), {"content-type": "application/json"}
    blob = b"".join(struct.pack("<I", len(t.encode())) + t.encode() for t in texts)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [len(texts)],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ],
            "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + blob, {
        "Inference-Header-Content-Length": str(len(head)),
        "content-type": "application/octet-stream",
    }


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)] * 1000


class Connection:
    """A minimal HTTP/1.1 keep-alive client over asyncio streams.

    A general-purpose client (httpx) spends about a millisecond of CPU per request; at hundreds of
    requests per second on a small machine the client, not the server, would be measured.  This one
    writes a pre-built request and reads the status line, the headers and a Content-Length body, as
    load generators such as wrk do (the server under test always answers with a Content-Length).
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes) -> tuple[int, dict[bytes, bytes]]:
        reused = self.writer is not None
        try:
            return await self._request(raw)
        except (OSError, asyncio.IncompleteReadError):
            await self.close()
            if not reused:
                raise
        # The server closed an idle keep-alive connection (a client that slept a long Retry-After):
        # like any HTTP client, send again on a fresh one.
        return await self._request(raw)

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.writer is None or self.reader is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self.reader, self.writer

    async def _request(self, raw: bytes) -> tuple[int, dict[bytes, bytes]]:
        reader, writer = await self.open()
        writer.write(raw)
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                key, _, value = line.partition(b":")
                headers[key.strip().lower()] = value.strip()
        await reader.readexactly(int(headers.get(b"content-length", b"0")))
        if headers.get(b"connection", b"").lower() == b"close":
            await self.close()
        return status, headers

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def raw_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Tally:
    """The answers counted in the measured window: latencies of 200s and 429s, other outcomes."""

    def __init__(self) -> None:
        self.ok: list[float] = []
        self.rejected: list[float] = []
        self.other: dict[str, int] = {}

    def add(self, code: int | str, latency: float) -> None:
        if code == 200:
            self.ok.append(latency)
        elif code == 429:
            self.rejected.append(latency)
        else:
            self.other[str(code)] = self.other.get(str(code), 0) + 1


async def client_main(spec: dict[str, Any]) -> dict[str, Any]:
    """One client process: ``spec["concurrency"]`` simulated clients for ``spec["duration"]`` s."""
    url = urllib.parse.urlsplit(spec["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 80
    texts = corpus(2048, seed=spec["seed"])
    size, binary = spec["size"], spec["binary"]
    bodies = [v2_body(texts[i : i + size], binary) for i in range(0, 2048 - size, max(1, size))][:256]
    requests = [raw_request(host, port, INFER_PATH, b, h) for b, h in bodies]
    tally = _Tally()
    # One connection per simulated client, opened before the clock starts.
    connections = [Connection(host, port) for _ in range(spec["concurrency"])]
    for conn in connections:
        await conn.open()
    # Clients start spread over the ramp (as load generators ramp up).  Counted are the answers that
    # arrive inside the window [warm-up, warm-up + duration], whenever their request was sent (as wrk
    # counts): the steady-state rate, even when one request takes longer than the window.
    warmup = float(spec.get("warmup", 0.0))
    ramp = min(1.0, warmup)
    counted_from = time.perf_counter() + warmup
    stop = counted_from + spec["duration"]

    async def simulated_client(k: int) -> None:
        j = k
        conn = connections[k]
        await asyncio.sleep(ramp * k / spec["concurrency"])
        while time.perf_counter() < stop:
            raw = requests[j % len(requests)]
            j += spec["concurrency"]
            s = time.perf_counter()
            headers: dict[bytes, bytes] = {}
            code: int | str
            try:
                code, headers = await asyncio.wait_for(conn.request(raw), 60)
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                code = type(exc).__name__
            done = time.perf_counter()
            if counted_from <= done <= stop:
                tally.add(code, done - s)
            if code == 429 and spec.get("honor_retry_after"):  # as well-behaved clients (openai's) do
                await asyncio.sleep(float(headers.get(b"retry-after", b"1")))
            elif spec.get("pace"):  # a slow client: one request every ``pace`` seconds
                await asyncio.sleep(max(0.0, float(spec["pace"]) - (done - s)))

    tasks = [asyncio.create_task(simulated_client(k)) for k in range(spec["concurrency"])]
    await asyncio.wait(tasks, timeout=max(0.0, stop - time.perf_counter()) + 0.05)
    for task in tasks:  # requests still waiting at the end are not counted: disconnect them
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for conn in connections:
        await conn.close()
    return {"ok": tally.ok, "rejected": tally.rejected, "other": tally.other, "elapsed": spec["duration"]}


Clients = list[tuple[subprocess.Popen[bytes], float]]


def start_clients(  # noqa: PLR0917 - a bench helper, called positionally
    url: str, size: int, binary: bool, concurrency: int, duration: float, procs: int, **extra: Any
) -> Clients:
    """Start the load from ``procs`` separate client processes (``collect_clients`` waits for them)."""
    procs = max(1, min(procs, concurrency))
    running: Clients = []
    for p in range(procs):
        share = concurrency // procs + (1 if p < concurrency % procs else 0)
        spec = {
            "url": url,
            "size": size,
            "binary": binary,
            "concurrency": share,
            "duration": duration,
            "seed": p,
            **extra,
        }
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen", json.dumps(spec)],
            stdout=subprocess.PIPE,
            cwd=REPO,
            env=child_env(),
        )
        running.append((process, duration + float(extra.get("warmup", 0.0))))
    return running


def collect_clients(running: Clients, size: int) -> dict[str, Any]:
    """Wait for the client processes; merge their latencies."""
    tally = _Tally()
    elapsed = 0.0
    for proc, duration in running:
        out, _ = proc.communicate(timeout=duration + 120)
        doc = json.loads(out.decode().strip().splitlines()[-1])
        tally.ok += doc["ok"]
        tally.rejected += doc["rejected"]
        for k, v in doc["other"].items():
            tally.other[k] = tally.other.get(k, 0) + v
        elapsed = max(elapsed, doc["elapsed"])
    ok, rejected = tally.ok, tally.rejected
    return {
        "requests_per_s": len(ok) / elapsed,
        "sentences_per_s": len(ok) * size / elapsed,
        "p50_ms": percentile(ok, 50),
        "p99_ms": percentile(ok, 99),
        "ok": len(ok),
        "rejected": len(rejected),
        "rejected_p50_ms": percentile(rejected, 50),
        "rejected_p99_ms": percentile(rejected, 99),
        "errors": tally.other,
    }


def run_clients(  # noqa: PLR0917 - a bench helper, called positionally
    url: str, size: int, binary: bool, concurrency: int, duration: float, procs: int, **extra: Any
) -> dict[str, Any]:
    """Run the load from ``procs`` separate client processes; merge their latencies."""
    return collect_clients(start_clients(url, size, binary, concurrency, duration, procs, **extra), size)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(client_main(json.loads(sys.argv[1])))))
