"""The load generator: simulated clients on raw keep-alive HTTP/1.1 connections, in separate processes,
and a closed loop of embeddings clients in threads.

``run_clients`` starts ``python -m testkit.load SPEC`` processes (so that the client is not the
bottleneck: the server and the clients share the machine), each runs ``client_main`` and prints its
latencies as one JSON line; ``run_clients`` merges them.  ``closed_loop`` is that load in the calling
process (``bench.gateway`` runs it).  ``ClosedLoop``: threads with one embeddings request outstanding
each, whose answers are counted by code and worker (the autoscaling tests, ``make demo``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from testkit.corpus import corpus
from testkit.environment import ROOT, child_env

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


#: The request shapes the clients send (``client_main``'s ``shape``): KServe v2 JSON and its binary tensor
#: extension (modelpool, Triton), OpenAI embeddings (modelpool's /v1/embeddings, infinity-emb's /embeddings),
#: KServe v1 predict (KServe's Python model server).
SHAPES = ("v2", "v2-binary", "openai", "kserve-v1")


def request_body(shape: str, texts: list[str], model: str = "minilm") -> tuple[bytes, dict[str, str]]:
    """Pure: the body and headers of one request for ``texts`` in ``shape`` (one of ``SHAPES``) to
    ``model`` (the OpenAI shape names it in the body; the others in the path)."""
    if shape in {"v2", "v2-binary"}:
        return v2_body(texts, shape == "v2-binary")
    if shape == "openai":
        doc: dict[str, Any] = {"model": model, "input": texts}
    elif shape == "kserve-v1":
        doc = {"instances": texts}
    else:
        raise ValueError(f"unknown request shape {shape!r}: one of {', '.join(SHAPES)}")
    return json.dumps(doc).encode(), {"content-type": "application/json"}


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


class Tally:
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


async def closed_loop(  # noqa: PLR0917 - the load's shape, called positionally
    host: str,
    port: int,
    requests: list[bytes],
    concurrency: int,
    warmup: float,
    duration: float,
    *,
    ramp: float = 0.0,
    honor_retry_after: bool = False,
    pace: float = 0.0,
) -> Tally:
    """``concurrency`` simulated clients in this process, each with one of ``requests`` (pre-built, sent in
    turn) outstanding at a time on its own keep-alive connection.

    Clients start spread over ``ramp`` seconds (as load generators ramp up).  Counted are the answers that
    arrive inside the window [warmup, warmup + duration], whenever their request was sent (as wrk counts):
    the steady-state rate, even when one request takes longer than the window.  ``honor_retry_after``: a
    429 is followed by its Retry-After's sleep (as well-behaved clients, openai's, do); ``pace``: a slow
    client, one request every ``pace`` seconds."""
    tally = Tally()
    # One connection per simulated client, opened before the clock starts.
    connections = [Connection(host, port) for _ in range(concurrency)]
    for conn in connections:
        await conn.open()
    counted_from = time.perf_counter() + warmup
    stop = counted_from + duration

    async def simulated_client(k: int) -> None:
        j = k
        conn = connections[k]
        await asyncio.sleep(ramp * k / concurrency)
        while time.perf_counter() < stop:
            raw = requests[j % len(requests)]
            j += concurrency
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
            if code == 429 and honor_retry_after:
                await asyncio.sleep(float(headers.get(b"retry-after", b"1")))
            elif pace:
                await asyncio.sleep(max(0.0, pace - (done - s)))

    tasks = [asyncio.create_task(simulated_client(k)) for k in range(concurrency)]
    await asyncio.wait(tasks, timeout=max(0.0, stop - time.perf_counter()) + 0.05)
    for task in tasks:  # requests still waiting at the end are not counted: disconnect them
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for conn in connections:
        await conn.close()
    return tally


async def client_main(spec: dict[str, Any]) -> dict[str, Any]:
    """One client process: ``spec["concurrency"]`` simulated clients for ``spec["duration"]`` s."""
    url = urllib.parse.urlsplit(spec["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 80
    texts = corpus(2048, seed=spec["seed"])
    size = spec["size"]
    # The shape and path of another server's API (bench.peers); the v2 infer request by default.
    shape = spec.get("shape") or ("v2-binary" if spec["binary"] else "v2")
    path = spec.get("path") or INFER_PATH
    starts = range(0, 2048 - size, max(1, size))
    bodies = [request_body(shape, texts[i : i + size]) for i in starts][:256]
    requests = [raw_request(host, port, path, b, h) for b, h in bodies]
    warmup = float(spec.get("warmup", 0.0))
    tally = await closed_loop(
        host,
        port,
        requests,
        spec["concurrency"],
        warmup,
        spec["duration"],
        ramp=min(1.0, warmup),
        honor_retry_after=bool(spec.get("honor_retry_after")),
        pace=float(spec.get("pace") or 0.0),
    )
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
            [sys.executable, "-m", "testkit.load", json.dumps(spec)],
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=child_env(),
        )
        running.append((process, duration + float(extra.get("warmup", 0.0))))
    return running


def collect_clients(running: Clients, size: int) -> dict[str, Any]:
    """Wait for the client processes; merge their latencies."""
    tally = Tally()
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


# ---- a closed loop of embeddings clients in threads ---------------------------------------------------
@dataclass
class ClosedLoop:
    """The load the autoscaling tests and ``make demo`` apply: ``clients`` threads (httpx), each with one
    embeddings request outstanding at a time: the pool's load (in flight + queued) stays at ``clients``
    however many workers serve it.  ``target(n)`` is the base URL of a client's n-th request (the workers
    directly or modelpool-gateway; None: nowhere to send yet); every answer's code is counted (200s also
    by worker), and a 429 without ``Retry-After`` and a transport error are kept apart (to the workers
    directly a worker going away is expected; through the gateway it is not)."""

    target: Callable[[int], str | None]
    model: str
    clients: int
    # Sent with every request (the gateway's Authorization header).
    headers: dict[str, str] = field(default_factory=dict)
    codes: Counter[int] = field(default_factory=Counter)
    # 200 answers by the worker that computed them (the gateway's ``x-modelpool-worker`` header).
    workers: Counter[str] = field(default_factory=Counter)
    refused_without_retry_after: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def answered(self) -> int:
        with self._lock:
            return self.codes[200]

    def start(self) -> ClosedLoop:
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def _client(self, index: int) -> None:
        counter = itertools.count(index)
        body = {"model": self.model, "input": [f"client {index}"]}
        with httpx.Client(timeout=30, trust_env=False, headers=self.headers) as client:
            while not self._stop.is_set():
                url = self.target(next(counter))
                if url is None:
                    self._stop.wait(0.1)
                    continue
                try:
                    response = client.post(url + "/v1/embeddings", json=body)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.errors.append(repr(exc))
                    self._stop.wait(0.05)
                    continue
                with self._lock:
                    self.codes[response.status_code] += 1
                    if response.status_code == 200 and "x-modelpool-worker" in response.headers:
                        self.workers[response.headers["x-modelpool-worker"]] += 1
                    if response.status_code == 429 and "retry-after" not in response.headers:
                        self.refused_without_retry_after += 1
                if response.status_code != 200:
                    self._stop.wait(0.05)  # a refusal: a short pause, as a client would back off


if __name__ == "__main__":
    print(json.dumps(asyncio.run(client_main(json.loads(sys.argv[1])))))
