"""The peer bench's pure parts (``bench.peers``): each server's request body, when an environment is
remade, the turns of a round, the summary of a load's rounds, the ratios and the table they make; and its
wait for a server's backlog, against a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bench.peers import (
    INFINITY,
    KSERVE,
    LOADS,
    cell,
    drain,
    infinity_command,
    kserve_command,
    modelpool,
    needs_install,
    rates,
    ratio,
    round_order,
    span,
    summarize,
    table,
)
from testkit.load import SHAPES, request_body, v2_body

TEXTS = ["one sentence.", "Another, longer sentence."]


def test_each_shape_is_the_body_its_server_reads() -> None:
    assert json.loads(request_body("openai", TEXTS, "minilm")[0]) == {"model": "minilm", "input": TEXTS}
    assert json.loads(request_body("kserve-v1", TEXTS)[0]) == {"instances": TEXTS}
    assert request_body("v2", TEXTS) == v2_body(TEXTS, False)
    assert request_body("v2-binary", TEXTS) == v2_body(TEXTS, True)
    for shape in SHAPES:
        assert request_body(shape, TEXTS)[1]["content-type"]


def test_an_unknown_shape_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown request shape 'grpc'"):
        request_body("grpc", TEXTS)


def test_the_servers_are_asked_on_their_own_routes() -> None:
    assert (INFINITY.shape, INFINITY.path) == ("openai", "/embeddings")
    assert (KSERVE.shape, KSERVE.path) == ("kserve-v1", "/v1/models/minilm:predict")
    assert modelpool("v2").path == "/v2/models/minilm/infer"
    assert modelpool("openai").path == "/v1/embeddings"
    assert (modelpool("v2").name, modelpool("v2").flags) == ("modelpool", ())
    onnx = modelpool("v2", "onnxruntime")
    assert (onnx.name, onnx.label, onnx.flags) == (
        "modelpool-onnxruntime", "modelpool (onnxruntime)", ("--runtime", "onnxruntime"),
    )  # fmt: skip
    assert all("==" in pin for peer in (INFINITY, KSERVE) for pin in peer.requirements)


def test_an_environment_is_remade_only_when_missing_or_its_pins_changed() -> None:
    pins = ("infinity-emb[server,torch]==0.0.78", "torch==2.15.0")
    assert needs_install(None, pins)
    assert not needs_install("\n".join(pins) + "\n", pins)
    assert needs_install("infinity-emb[server,torch]==0.0.77\ntorch==2.15.0\n", pins)
    assert needs_install("", pins)


def test_the_peers_listen_on_loopback_on_the_port_given() -> None:
    venv, model = Path("/envs/x"), Path("/m")
    inf = infinity_command(venv, model, 4321)
    assert inf[:2] == ["/envs/x/bin/infinity_emb", "v2"]
    assert inf[inf.index("--host") + 1] == "127.0.0.1" and inf[inf.index("--port") + 1] == "4321"
    assert inf[inf.index("--engine") + 1] == "torch" and inf[inf.index("--model-id") + 1] == "/m"
    ks = kserve_command(venv, model, 4321)
    assert ks[0] == "/envs/x/bin/python" and ks[1].endswith("bench/peer_kserve.py")
    assert ks[ks.index("--http_port") + 1] == "4321" and ks[ks.index("--enable_grpc") + 1] == "false"


def test_each_round_rotates_the_turns_and_every_server_has_one() -> None:
    names = ["modelpool", "infinity", "kserve"]
    orders = [round_order(names, i) for i in range(4)]
    assert orders[0] == names
    assert orders[1] == ["infinity", "kserve", "modelpool"]
    assert orders[3] == orders[0]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert [o[0] for o in orders[:3]] == names  # each first once in three rounds
    assert round_order([], 2) == []


def _run(per_s: float, p50: float | None, p99: float | None, **errors: int) -> dict[str, Any]:
    return rates(int(per_s * 10), 10.0, LOADS[0], p50, p99, errors)


def test_a_load_is_summed_up_as_median_rates_latency_ranges_and_all_errors() -> None:
    s = summarize([_run(100, 7.4, 16.5), _run(120, 7.7, 17.1, timeout=1), _run(130, 7.5, 16.9, timeout=2)])
    assert s["requests_per_s"] == pytest.approx(120)
    assert s["p50_ms"] == (7.4, 7.7) and s["p99_ms"] == (16.5, 17.1)
    assert s["errors"] == {"timeout": 3}
    assert summarize([_run(0, None, None)])["p50_ms"] is None


def test_sentences_per_second_count_every_sentence_of_a_request() -> None:
    c64x32 = next(load for load in LOADS if load.sentences == 32)
    r = rates(100, 10.0, c64x32, 900.0, 1500.0, {})
    assert (r["requests_per_s"], r["sentences_per_s"]) == (10.0, 320.0)


def test_ratios_and_ranges_read_as_the_issue_writes_them() -> None:
    assert ratio(261, 97) == pytest.approx(2.69, abs=0.005)
    assert ratio(5, 0) is None
    assert span((7.44, 7.66)) == "7.4-7.7"
    assert span((7.51, 7.54)) == "7.5"
    assert span(None) == "-"


def test_a_cell_shows_sentences_for_batches_and_errors_in_bold() -> None:
    one, batch = LOADS[0], LOADS[-1]
    summary = summarize([rates(99, 10.0, batch, 1900.0, 2400.0, {})])
    assert cell(summary, batch).startswith("9.9 req/s (317 sentences/s), p50 1900.0 ms")
    failed = summarize([rates(1220, 10.0, one, 7.5, 16.5, {"ConnectionError": 2})])
    assert cell(failed, one) == "122.0 req/s, p50 7.5 ms, p99 16.5 ms, **2 errors**"


def test_the_table_has_a_row_a_load_a_column_a_server_and_the_ratios_last() -> None:
    figures = {"modelpool": 122.0, "infinity": 51.5, "kserve": 131.0}
    servers = [
        {"name": "modelpool", "label": "modelpool"},
        {"name": "infinity", "label": "infinity-emb 0.0.78"},
        {"name": "kserve", "label": "KServe 0.21"},
    ]
    summary = {
        load.key: {n: summarize([rates(int(v * 10), 10.0, load, 7.5, 10.3, {})]) for n, v in figures.items()}
        for load in LOADS
    }
    env = {
        "cpu": "x86_64 (2 CPUs)", "generator": "wrk", "warmup_s": 5.0, "window_s": 20.0, "rounds": 2,
        "modelpool_shape": "v2", "load_before": "0.3", "load_during": "2.0-2.4", "when": "2026-12-07",
        "idle_cores": {"modelpool": 0.011, "infinity": 0.0, "kserve": 0.02},
    }  # fmt: skip
    text = table({"environment": env, "servers": servers, "summary": summary, "ours": "modelpool"})
    lines = text.splitlines()
    assert "load average 0.3 before, 2.0-2.4 during" in lines[0]
    assert lines[0].endswith(
        "Cores each server used while another was measured: modelpool 0.01, infinity-emb 0.0.78 0.00, "
        "KServe 0.21 0.02."
    )
    columns = "| modelpool | infinity-emb 0.0.78 | KServe 0.21 |"
    assert lines[2] == f"| load {columns} modelpool vs infinity-emb 0.0.78 / KServe 0.21 |"
    assert lines[3] == "|---|---:|---:|---:|---|"
    assert len(lines) == 4 + len(LOADS)
    assert lines[4].startswith("| 1 connection, 1 sentence | 122.0 req/s")
    assert lines[4].endswith("| 2.37x / 0.93x |")


def test_the_server_under_test_is_compared_with_every_other_and_loads_not_run_are_left_out() -> None:
    servers = [
        {"name": "modelpool", "label": "modelpool"},
        {"name": "modelpool-onnxruntime", "label": "modelpool (onnxruntime)"},
    ]
    c64x32 = LOADS[-1]
    summary = {
        c64x32.key: {
            "modelpool": summarize([rates(100, 10.0, c64x32, 2000.0, 2500.0, {})]),
            "modelpool-onnxruntime": summarize([rates(150, 10.0, c64x32, 1400.0, 1900.0, {})]),
        }
    }
    env = {
        "cpu": "x86_64 (2 CPUs)", "generator": "python", "warmup_s": 2.0, "window_s": 8.0, "rounds": 1,
        "modelpool_shape": "v2", "load_before": "1.0", "load_during": "2.0-2.0", "when": "2026-12-07",
    }  # fmt: skip
    results = {"environment": env, "servers": servers, "summary": summary, "ours": "modelpool-onnxruntime"}
    lines = table(results).splitlines()
    assert lines[2].endswith("| modelpool (onnxruntime) vs modelpool |")
    assert len(lines) == 5 and lines[4].startswith("| 64 connections, 32 sentences |")
    assert lines[4].endswith("| 1.50x |")


def test_the_drain_waits_until_a_request_behind_the_backlog_is_answered() -> None:
    answers = iter([429, 429, 200])  # a full door twice, then the backlog is done
    seen: list[tuple[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append((self.path, json.loads(body)))
            self.send_response(next(answers))
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        waited = drain(f"http://127.0.0.1:{server.server_port}", KSERVE, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    assert [path for path, _ in seen] == ["/v1/models/minilm:predict"] * 3
    assert seen[-1][1] == {"instances": ["The backlog is done."]}
    assert 0 < waited < 30
