"""bench.density's pure parts: the models of a run and the request each gets, the counts of awake and
asleep models, the quantiles, nvidia-smi's rows, and the docs/benchmarks.md table of a run (CPU and CUDA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.density import (
    Model,
    counts,
    nvidia_rows,
    parse_args,
    percentile,
    request_of,
    roster,
    table,
)

MI = 1 << 20
TINY = {task: Path(f"/m/{task}") for task in ("text-generation", "image-embedding", "vision")}


def test_the_roster_loads_the_tiny_models_first_and_keeps_two_minilms_at_least() -> None:
    models = roster(6, Path("/m/minilm"), TINY)
    assert [m.name for m in models] == [
        "tiny-text-generation", "tiny-image-embedding", "tiny-vision", "minilm-0", "minilm-1", "minilm-2",
    ]  # fmt: skip
    assert {m.task for m in models[3:]} == {"text-embedding"}
    assert [m.name for m in roster(3, Path("/m/minilm"), TINY)] == [
        "tiny-text-generation",
        "minilm-0",
        "minilm-1",
    ]


def test_each_task_is_asked_on_the_openai_route_that_names_its_model() -> None:
    png = b"\x89PNG"
    routes = {task: request_of(Model("x", task, Path("/m")), png) for task in (*TINY, "text-embedding")}
    assert routes["text-embedding"] == ("/v1/embeddings", {"model": "x", "input": "A man is eating food."})
    assert routes["image-embedding"] == ("/v1/embeddings", {"model": "x", "input": ["iVBORw=="]})
    assert (
        routes["text-generation"][0] == "/v1/completions" and routes["text-generation"][1]["max_tokens"] == 4
    )
    path, body = routes["vision"]
    assert path == "/v1/chat/completions"
    assert body["messages"][0]["content"][1]["image_url"]["url"] == "data:image/png;base64,iVBORw=="
    with pytest.raises(ValueError, match="text-to-image"):
        request_of(Model("x", "text-to-image", Path("/m")), png)


def test_counts_and_quantiles() -> None:
    states = {"a": "Ready", "b": "Idle", "c": "Sleeping", "d": "Processing", "e": "Failed"}
    assert counts(states) == {"awake": 3, "asleep": 1, "other": 1}
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.5) == 10.0 and percentile(values, 0.95) == 19.0
    assert percentile([0.2, 0.1], 0.95) == 0.2 and percentile([0.3], 0.5) == 0.3


def test_nvidia_smi_rows_are_split_and_trimmed() -> None:
    assert nvidia_rows("4242, 512\n\n 4243 , 498\n") == [["4242", "512"], ["4243", "498"]]


def test_short_mode_and_the_dtype_by_device() -> None:
    short = parse_args(["--short", "--no-docs"])
    assert (short.models, short.cycles, short.rounds, short.dtype, short.memory) == (
        6,
        5,
        1,
        "float32",
        256 * MI,
    )
    assert parse_args(["--device", "cuda", "--model-memory", "1Gi"]).dtype == "float16"
    assert parse_args(["--device", "cuda", "--model-memory", "1Gi"]).memory == 1 << 30


def _snapshot(rss: int, private: int, gpu_reserved: int, gpu_process: int | None) -> dict[str, object]:
    return {
        "state": "Ready",
        "gpu_reserved": gpu_reserved,
        "rss": rss,
        "private": private,
        "gpu_process": gpu_process,
    }


def _run(device: str) -> dict[str, Any]:
    gpu = device != "cpu"
    awake = _snapshot(800 * MI, 300 * MI, 120 * MI if gpu else 0, 600 * MI if gpu else None)
    asleep = _snapshot(900 * MI if gpu else 800 * MI, 300 * MI, 0, 480 * MI if gpu else None)
    return {
        "environment": {
            "command": "python -m bench.density --short", "device": device, "dtype": "float32",
            "weights": "all-MiniLM-L6-v2", "machine": "x86_64 (2 CPUs)", "when": "2026-11-27 16:00 UTC",
            "gpu_used_before": 500 * MI if gpu else None,
        },
        "density": {
            "models": 6, "awake_target": 4, "model_memory": 256 * MI, "awake": 4, "asleep": 2, "other": 0,
            "after_answers": {"awake": 4, "asleep": 2, "other": 0},
            "ledger": {"capacity": 1024 * MI, "awake": 1024 * MI, "asleep": 90 * MI, "free": 0},
            "load_s": [30.0, 32.0, 25.0], "tasks": ["text-embedding", "vision"],
            "answers": [{"name": "a", "task": "vision", "asleep": True, "s": 0.1},
                        {"name": "b", "task": "vision", "asleep": False, "s": 0.05},
                        {"name": "c", "task": "vision", "asleep": True, "s": 0.3}],
            "burst": [{"name": "a", "status": 200, "s": 0.2, "error": ""},
                      {"name": "c", "status": 200, "s": 0.4, "error": ""},
                      {"name": "d", "status": 503, "s": 10.0, "error": "asleep"}],
            "private_awake": [300 * MI, 310 * MI], "private_asleep": [290 * MI],
            "gpu_awake": [], "gpu_asleep": [480 * MI] if gpu else [], "gpu_used": 12000 * MI if gpu else None,
            "load": "5.8",
        },
        "memory": {"awake": awake, "asleep": asleep, "woken": awake, "load": "6.0"},
        "wake": {"cycles": 3, "sleep_s": [0.04, 0.05, 0.2], "wake_s": [0.06, 0.07, 0.5],
                 "before": awake, "after": {**awake, "rss": 801 * MI}, "load": "6.1"},
        "first_answer": {"asleep_s": [0.04, 0.05], "host_load_s": [9.0, 8.0], "dedicated_s": [10.0, 11.0],
                         "loads": ["5.8", "7.0"]},
    }  # fmt: skip


def test_the_cpu_table_gives_every_figure_with_its_target_and_load() -> None:
    text = table(_run("cpu"))
    assert text.startswith("Density of a shared host (`python -m bench.density --short`)")
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    first = {row.split(" | ")[0].removeprefix("| ") for row in rows} - {""}
    assert first == {"density", "a sleeping MiniLM holds", "wake", "first answer"}
    joined = "\n".join(rows)
    assert "| 4 / 2 | ≥ 4 / ≥ 20 on a GPU | 5.8 |" in joined
    assert "first answer of the 2 asleep (a wake, room made first): p50 / max | 200 ms / 300 ms" in joined
    assert "| 305 MiB / 290 MiB | 900 MiB for all 6 |" in joined
    assert "3 requests at once, each for a sleeping model (room for 4): answered / p50 / max |" in joined
    assert "| 2 / 300 ms / 400 ms | refused: 503 |" in joined
    assert "| 800 MiB → 800 MiB (+0 MiB) | private 300 MiB → 300 MiB (+0 MiB) |" in joined
    assert "p50 / p95 | 70 ms / 500 ms | p50 ≤ 1 s | 6.1 |" in joined
    assert "| 800 MiB → 801 MiB (+1 MiB) |" in joined
    assert "| 45 ms |  | 5.8, 7.0 |" in joined
    assert "asleep = 0.005x |" in joined and "asleep = 0.004x (target ≤ 0.25x)" in joined
    assert "nvidia-smi" not in text


def test_a_model_that_failed_to_load_is_named_in_one_cell_of_its_row() -> None:
    run = _run("cuda")
    run["density"]["failed"] = {"tiny-vision": 'load tiny-vision: 500 {"error": "a | b\nc"}'}
    rows = [line for line in table(run).splitlines() if "failed to load" in line]
    assert rows == [
        "|  | models that failed to load (left out of the figures) | 1 | "
        'tiny-vision: load tiny-vision: 500 {"error": "a / b c"} |  |'
    ]


def test_the_gpu_table_adds_the_device_memory_rows() -> None:
    text = table(_run("cuda"))
    assert (
        "| device memory in use with every model loaded (nvidia-smi; 500 MiB before the host started) | "
        "12,000 MiB | 480 MiB each asleep |" in text
    )
    assert "| 600 MiB → 480 MiB (-120 MiB) | what stays is the process's CUDA context |" in text
    assert "| 120 MiB → 0 MiB (-120 MiB) |" in text
