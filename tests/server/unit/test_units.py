"""Pure parts of the server: the v2 codec, sources, Retry-After, error classification, pooling config."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_server.config import ServerConfig
from model_server.engine import worker as worker_module
from model_server.engine.heap import HeapTrimmer, due
from model_server.engine.sources import SourceError, parse_source, resolve
from model_server.errors import InvalidInput, is_fatal_device_error, is_oom
from model_server.frontend import kserve_codec
from model_server.frontend.inference_client import retry_after_seconds
from model_server.metrics import gpu_memory, gpu_peak_reserved
from model_server.state_machine import StateMachine
from model_server.tasks.base import TextItem
from model_server.tasks.text_embedding import micro_batches, read_pooling
from testkit.echo_models import ECHO


def _bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def test_v2_json_request_roundtrip() -> None:
    body = orjson.dumps(
        {
            "id": "r1",
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["a", "héllo"]},
                {"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
            ],
            "parameters": {"timeout": 2_500_000},
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        }
    )
    req = kserve_codec.decode_request(body, None)
    assert req.id == "r1" and req.timeout_s == 2.5
    assert req.inputs["text"].tolist() == [b"a", "héllo".encode()]
    assert req.inputs["x"].dtype == np.float32 and req.inputs["x"].shape == (2, 2)
    assert req.outputs == (kserve_codec.RequestedOutput("y", True),)


def test_v2_binary_request() -> None:
    floats = np.arange(6, dtype="<f4")
    blob_text = _bytes_blob([b"one", b"\xff\xfe"])
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "t",
                    "datatype": "BYTES",
                    "shape": [2],
                    "parameters": {"binary_data_size": len(blob_text)},
                },
                {"name": "f", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}},
            ]
        }
    )
    req = kserve_codec.decode_request(head + blob_text + floats.tobytes(), str(len(head)))
    assert req.inputs["t"].tolist() == [b"one", b"\xff\xfe"]
    np.testing.assert_array_equal(req.inputs["f"], floats.reshape(2, 3))


@pytest.mark.parametrize(
    ("body", "header", "needle"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[]", None, "JSON object"),
        (b'{"inputs": []}', None, "non-empty"),
        (b'{"inputs": [{"name": "t", "datatype": "STRING", "shape": [1], "data": ["a"]}]}', None, "datatype"),
        (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}', None, "needs 2"),
        (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [-1], "data": ["a"]}]}', None, "negative"),
        (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": "x", "data": ["a"]}]}', None, "shape"),
        (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1], "data": ["a"]}]}', None, "numbers"),
        (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": [1]}]}', None, "strings"),
        (b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1]}]}', None, "neither"),
        (b'{"inputs": [{"name": "t", "datatype": "INT8", "shape": [1], "data": [999]}]}', None, "INT8"),
        (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [99999, 99999], "data": []}]}', None,
         "large"),
        (b'{"inputs": [{"name": "t", "datatype": "FP32", "shape": [1], '
         b'"parameters": {"binary_data_size": 4}}]}',
         None, "binary_data_size"),
        (b'{"inputs":[]}', "999", "larger than the body"),
        (b'{"inputs":[]}', "abc", "integer"),
    ],
)  # fmt: skip
def test_v2_bad_requests(body: bytes, header: str | None, needle: str) -> None:
    with pytest.raises(InvalidInput, match=needle):
        kserve_codec.decode_request(body, header)


def test_v2_timeout_parameter_validated() -> None:
    req = kserve_codec.decode_request(
        b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}], '
        b'"parameters": {"timeout": -5}}',
        None,
    )
    with pytest.raises(InvalidInput, match="timeout"):
        _ = req.timeout_s


def test_v2_response_json_and_binary() -> None:
    req_json = kserve_codec.decode_request(
        b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}', None
    )
    emb = np.array([[1.5, 2.0]], dtype=np.float32)
    body, hlen = kserve_codec.encode_response("m", req_json, {"embedding": emb})
    assert hlen is None
    doc = json.loads(body)
    assert doc["outputs"][0] == {"name": "embedding", "datatype": "FP32", "shape": [1, 2], "data": [1.5, 2.0]}

    req_bin = kserve_codec.decode_request(
        b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}],'
        b' "outputs": [{"name": "embedding", "parameters": {"binary_data": true}}]}',
        None,
    )
    body, hlen = kserve_codec.encode_response("m", req_bin, {"embedding": emb})
    assert hlen is not None
    head = json.loads(body[:hlen])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == 8
    np.testing.assert_array_equal(np.frombuffer(body[hlen:], dtype="<f4"), emb.ravel())

    with pytest.raises(InvalidInput, match="unknown output"):
        bad = kserve_codec.decode_request(
            b'{"inputs": [{"name": "t", "datatype": "BYTES", "shape": [1], "data": ["a"]}],'
            b' "outputs": [{"name": "nope"}]}',
            None,
        )
        kserve_codec.encode_response("m", bad, {"embedding": emb})


def test_sources(tmp_path: Path) -> None:
    assert parse_source("/models/x").path == "/models/x"
    assert parse_source("file:///models/x%20y").path == "/models/x y"
    hf = parse_source("hf://sentence-transformers/all-MiniLM-L6-v2@abc123")
    assert (hf.kind, hf.path, hf.revision) == ("hf", "sentence-transformers/all-MiniLM-L6-v2", "abc123")
    pvc = parse_source("pvc://models-claim/minilm/v1")
    assert (pvc.kind, pvc.claim, pvc.path) == ("pvc", "models-claim", "minilm/v1")
    for bad in ("hf://", "hf://a/b/c", "hf://org/name@", "pvc://", "s3://b/k", "file://host/x"):
        with pytest.raises(SourceError):
            parse_source(bad)
    (tmp_path / "claim" / "m").mkdir(parents=True)
    assert resolve("pvc://claim/m", pvc_root=tmp_path) == tmp_path / "claim" / "m"
    assert resolve(f"file://{tmp_path}") == tmp_path
    with pytest.raises(SourceError, match="does not exist"):
        resolve(str(tmp_path / "missing"))


def test_retry_after_and_error_classes() -> None:
    assert retry_after_seconds(0, 0.5) == 1
    assert retry_after_seconds(100, 0.05) == 5
    # Jitter spreads a burst of refusals over [base, 2 x base], never below the estimate.
    assert retry_after_seconds(100, 0.05, 0.99) == 10
    assert {retry_after_seconds(0, 0.5, j / 10) for j in range(10)} == {1, 2}
    assert all(5 <= retry_after_seconds(100, 0.05, j / 100) <= 10 for j in range(100))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 20 MiB"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert is_fatal_device_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_fatal_device_error(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_fatal_device_error(ValueError("bad value"))


def test_micro_batches_sort_and_bound() -> None:
    lengths = [100, 3, 50, 3, 100, 7]
    groups = micro_batches(lengths, budget=200)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(6))
    assert [lengths[i] for i in flat] == sorted(lengths)
    for g in groups:
        assert len(g) == 1 or len(g) * max(lengths[i] for i in g) <= 200


def _cost(groups: list[list[int]], lengths: list[int], overhead: int) -> int:
    return sum(overhead + len(g) * max(max(1, lengths[i]) for i in g) for g in groups)


def test_micro_batches_on_cpu_group_texts_of_similar_length() -> None:
    lengths = [60, 5] * 8
    groups = micro_batches(lengths, budget=16384, overhead_tokens=48)
    # Two passes (short texts together, long together) beat one padded pass and sixteen single ones.
    assert [sorted({lengths[i] for i in g}) for g in groups] == [[5], [60]]
    assert _cost(groups, lengths, 48) < _cost([list(range(16))], lengths, 48)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=150),
    budget=st.integers(min_value=50, max_value=4000),
    overhead=st.integers(min_value=0, max_value=500),
)
def test_micro_batches_plan_is_a_bounded_sorted_partition_no_worse_than_greedy(
    lengths: list[int], budget: int, overhead: int
) -> None:
    groups = micro_batches(lengths, budget=budget, overhead_tokens=overhead)
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)
    for g in groups:
        assert len(g) == 1 or len(g) * max(max(1, lengths[i]) for i in g) <= budget
    greedy = micro_batches(lengths, budget=budget)
    if max(len(g) for g in greedy) <= 64:  # the programme looks at most 64 texts back
        assert _cost(groups, lengths, overhead) <= _cost(greedy, lengths, overhead)


def test_read_pooling(tmp_path: Path) -> None:
    assert read_pooling(tmp_path) == ("mean", False, None)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text('{"pooling_mode_cls_token": true}')
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {"path": "", "type": "sentence_transformers.models.Transformer"},
                {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
            ]
        )
    )
    (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 128}')
    assert read_pooling(tmp_path) == ("cls", True, 128)


def test_heap_trimmer_trims_at_most_once_per_interval() -> None:
    assert due(10.0, 4.0, 5.0) and not due(8.0, 4.0, 5.0)
    trimmer = HeapTrimmer(interval_s=3600)
    assert trimmer.available  # glibc: the CI and the container images are Debian-based
    assert not trimmer.maybe_trim()  # the interval has not passed since it was made
    eager = HeapTrimmer(interval_s=0)
    assert eager.maybe_trim() and eager.maybe_trim() and eager.trims == 2


async def test_an_idle_worker_trims_its_heap_once_after_a_quiet_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst leaves freed activations in glibc's heap; once no unit has run for IDLE_TRIM_AFTER_S the
    worker gives them back (one trim per quiet period, none while idle with nothing new to return)."""
    quiet = 0.5
    monkeypatch.setattr(worker_module, "IDLE_TRIM_AFTER_S", quiet)
    config = ServerConfig(
        model=str(tmp_path), task="text-embedding", handler=ECHO,
        termination_log=tmp_path / "termination-log",
    )  # fmt: skip
    worker = worker_module.Worker(config, StateMachine(), lambda code, reason: None)
    try:
        assert await worker.load()
        worker._heap.interval_s = 3600  # only the idle trim may fire
        before = worker._heap.trims
        for _ in range(3):  # back-to-back units: busy, no idle trim in between
            assert len(await worker.run([TextItem("a"), TextItem("bb")])) == 2
        assert worker._heap.trims == before and worker._heap.dirty
        for _ in range(200):  # the trim runs on the inference thread: wait for it (up to 10 s)
            if worker._heap.trims != before:
                break
            await asyncio.sleep(0.05)
        assert worker._heap.trims == before + 1 and not worker._heap.dirty
        await asyncio.sleep(3 * quiet)  # still idle, nothing new allocated: no second trim
        assert worker._heap.trims == before + 1
    finally:
        worker.close()


def test_accelerator_memory_is_reported_only_where_cuda_is_in_use() -> None:
    """A CPU worker reports no peak (None, so the operator shows no accelerator memory for it); a CUDA
    worker's peak is at least what its allocator holds now."""
    import sys

    torch = sys.modules.get("torch")
    in_use = torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
    peak = gpu_peak_reserved()
    if not in_use:
        assert peak is None and gpu_memory() == (0, 0)
    else:
        assert peak is not None and peak >= gpu_memory()[1]
