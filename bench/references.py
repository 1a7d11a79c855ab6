"""What the server is compared with: the model called directly (tokenize + forward + mean pooling, no
server) and sentence-transformers' ``encode`` on the same weights, each measured in sentences/s."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testkit.corpus import corpus

# Direct-path batch sizes of the standalone table: 1/32/128/512, plus 8 and 64 (the server rows' ratios
# use a direct measurement at exactly the batch they formed, see paired_reference).
DIRECT_BATCHES = (1, 8, 32, 64, 128, 512)

MAX_LENGTH = 256


class Encode:
    """The direct path: tokenize (padded to the longest) + forward + mean pooling, called with texts."""

    def __init__(self, model_dir: Path, device: str, dtype: str) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.torch = torch
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()

    def __call__(self, texts: list[str]) -> Any:
        torch = self.torch
        with torch.inference_mode():
            batch = self.tokenizer(
                texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt"
            ).to(self.device)
            hidden = self.model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out = torch.nn.functional.normalize(pooled.float(), dim=1).cpu().numpy()
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out

    def warm(self, texts: list[str], bs: int) -> int:
        """Call the model once for every shape a run at batch ``bs`` over ``texts`` can meet (on a GPU a
        shape's first call stalls: kernels chosen, memory pools grown; inside a short window that reads
        as a tenfold swing); once on a CPU, where shapes cost nothing extra.  Returns the calls made."""
        if not self.device.startswith("cuda"):
            self(texts[:bs])
            return 1
        lengths = [
            len(ids) for ids in self.tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        ]
        order = sorted(range(len(texts)), key=lengths.__getitem__)
        calls = 0
        for rank, i in enumerate(order):
            if rank + 1 < len(order) and lengths[order[rank + 1]] == lengths[i]:
                continue  # the longest text of each length makes that length the batch's shape
            shorter = [texts[order[k % (rank + 1)]] for k in range(bs - 1)]
            self([texts[i], *shorter])
            calls += 1
        return calls


def direct_encoder(model_dir: Path, device: str, dtype: str) -> Encode:
    """The direct path (see ``Encode``)."""
    return Encode(model_dir, device, dtype)


def direct_rate(encode: Encode, texts: list[str], bs: int, duration: float) -> tuple[float, list[float]]:
    """Sentences/s of the direct path at batch ``bs`` over ``duration`` s (at least one call), and the
    per-call latencies (call ``Encode.warm`` first)."""
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


def bench_direct(encode: Encode, st: Any, duration: float) -> dict[str, Any]:
    """(a) The direct path at each of ``DIRECT_BATCHES``, and sentence-transformers at 32 and 512."""
    results: dict[str, Any] = {}
    texts = corpus(4096, seed=1)
    for bs in DIRECT_BATCHES:
        encode.warm(texts, bs)
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


def paired_reference(
    encode: Encode, st: Any, *, size: int, duration: float, run: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
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
    res = run()
    formed = max(1, round(res["mean_batch"] or 1))
    encode.warm(texts, formed)
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
