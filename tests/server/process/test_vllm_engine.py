"""``--engine vllm`` end to end: a real ``modelpool-server`` whose inference side is vLLM's CPU build (its own
environment: ``make vllm-env``; missing, every test here fails saying so), serving a tiny random Llama
built here, called with the real openai client.

One server for the module (vLLM takes from ~30 s to minutes to start on two shared cores), with a queue of
one request and ``--idle-after 1``: it is seen Loading, then Idle; a completion and a streamed chat; a long
generation makes it Processing (vLLM's own running count on the probe port's picker names), the next
request meets 429 with Retry-After, and closing the stream aborts the generation in vLLM; a deadline
shorter than the generation is a 504; SIGTERM drains a running stream to its end and exits 0 (last).
A second server, on a model vLLM cannot load, fails with vLLM's own words; a third, killed by a second
signal while vLLM loads, leaves no process of vLLM's behind.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from testkit import tiny_models
from testkit.server import ServerProcess, start_server
from testkit.vllm import vllm_args, vllm_env
from testkit.waiting import wait_for

# The first test's budget covers the module's server start (READY_S) as well.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CONTEXT = 4096
# A generation that lasts seconds on the CPU (3 to 5 ms a token on the tiny model here): long enough to
# look at, and to leave before it ends.
LONG = 4000
# The stream SIGTERM finds running: seconds of work, so the drain is seen under way.
DRAINED = 600
# vLLM's start: ~30 s on an idle machine, minutes on two cores other tests share.
READY_S = 600.0
WAIT_S = 60.0
# Greedy, and past the end-of-text token: every generation runs to max_tokens.
GREEDY: dict[str, Any] = {"model": "tiny", "temperature": 0, "extra_body": {"ignore_eos": True}}


@dataclass
class Started:
    proc: ServerProcess
    seen: list[str]  # the states /stats reported while it started, each change once


def _start(model: Path, *flags: str) -> ServerProcess:
    return start_server(
        "--model", str(model), "--task", "text-generation", "--engine", "vllm", "--name", "tiny",
        "--vllm-args", vllm_args(CONTEXT) + " --enable-log-requests", "--http-workers", "1", *flags,
        env=vllm_env(), probe=True, wait="live",
    )  # fmt: skip


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    model = tiny_models.build_vllm_llama(tmp_path_factory.mktemp("vllm") / "llama", context=CONTEXT)
    proc = _start(model, "--queue-capacity", "1", "--idle-after", "1")
    seen: list[str] = []

    def idle() -> bool:
        state = str(proc.stats()["state"])
        if not seen or seen[-1] != state:
            seen.append(state)
        return state == "Idle"

    try:
        wait_for(idle, READY_S, 0.05, lambda: f"Idle (seen {seen}); log:\n{proc.log()[-4000:]}")
    except BaseException:
        proc.stop()
        raise
    yield Started(proc, seen)
    proc.stop(60)


def _client(proc: ServerProcess) -> openai.OpenAI:
    proc.settle(WAIT_S)  # the queue holds one request: the last test's is out of it
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=WAIT_S)


def _state(proc: ServerProcess, *states: str) -> dict[str, Any]:
    """``/stats`` once the worker is in one of ``states``."""

    def reached() -> dict[str, Any] | None:
        doc = proc.stats()
        return doc if doc["state"] in states else None

    return wait_for(reached, WAIT_S, 0.02, lambda: f"state in {states}; log:\n{proc.log()[-3000:]}")


def test_loading_then_idle_with_vllms_figures(vllm_server: Started) -> None:
    seen, proc = vllm_server.seen, vllm_server.proc
    assert "Loading" in seen and seen[-1] == "Idle", seen
    assert seen.index("Loading") < seen.index("Idle")
    doc = proc.stats()
    assert doc["generation"]["engine"] == "vllm"
    assert doc["generation"]["kv_cache_tokens"] > 0  # vLLM's cache, from its cache_config_info
    assert doc["load_seconds"] > 0
    # vLLM's processes (API server and engine core) are measured with the worker's.
    assert proc.metric("modelpool_resident_memory_bytes", process="vllm") > 100 * 2**20
    assert doc["memory"]["rss_bytes"] > proc.metric("modelpool_resident_memory_bytes", process="vllm")


def test_completion_and_streamed_chat(vllm_server: Started) -> None:
    client = _client(vllm_server.proc)
    completion = client.completions.create(prompt="Hello, world!", max_tokens=8, **GREEDY)
    assert completion.model == "tiny" and completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 8
    messages: Any = [{"role": "user", "content": "Once upon a time"}]
    chunks = list(client.chat.completions.create(messages=messages, max_tokens=8, stream=True, **GREEDY))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason == "length", chunks[-1]
    with pytest.raises(openai.NotFoundError):  # our name check, before vLLM
        client.completions.create(prompt="x", max_tokens=1, **{**GREEDY, "model": "other"})


def _long_stream(proc: ServerProcess) -> openai.Stream[Any]:
    """A generation of ``LONG`` tokens, streamed, once its first chunk came (vLLM runs it)."""
    stream: openai.Stream[Any] = _client(proc).completions.create(
        prompt="Once upon a time", max_tokens=LONG, stream=True, **GREEDY
    )
    assert next(iter(stream)).choices
    return stream


def test_a_full_queue_is_a_429_and_a_client_leaving_aborts_in_vllm(vllm_server: Started) -> None:
    proc = vllm_server.proc
    aborted = proc.log().count("Aborted request")
    stream = _long_stream(proc)
    # The queue holds one request: the next is refused at once, with when to come back.
    refused = httpx.post(proc.url + "/v1/completions", json={"model": "tiny", "prompt": "x"}, timeout=WAIT_S)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, refused.text
    stream.close()  # the client leaves: the upstream connection closes, vLLM aborts the generation
    wait_for(lambda: proc.log().count("Aborted request") > aborted, WAIT_S, 0.05, "vLLM aborting it")
    doc = _state(proc, "Ready", "Idle")
    assert doc["queue_depth"] == 0 and doc["in_flight"] == 0


def test_processing_while_vllm_runs_the_request(vllm_server: Started) -> None:
    proc = vllm_server.proc
    stream = _long_stream(proc)
    doc = _state(proc, "Processing")
    assert doc["queue_depth"] == 1
    # vLLM's own running count, on the probe port under the endpoint picker's name.
    wait_for(lambda: proc.metric("vllm:num_requests_running") == 1, WAIT_S, 0.02, "vLLM running one")
    stream.close()
    _state(proc, "Ready", "Idle")


def test_deadline_is_a_504(vllm_server: Started) -> None:
    proc = vllm_server.proc
    proc.settle(WAIT_S)
    body = {"model": "tiny", "prompt": "slow", "max_tokens": LONG, "ignore_eos": True}
    answer = httpx.post(
        proc.url + "/v1/completions", json=body, headers={"x-request-timeout": "0.5"}, timeout=WAIT_S
    )
    assert answer.status_code == 504, answer.text
    _state(proc, "Ready", "Idle")  # its slot is back


def test_sigterm_drains_the_running_stream(vllm_server: Started) -> None:
    proc = vllm_server.proc
    _state(proc, "Ready", "Idle")
    stream = _client(proc).completions.create(
        prompt="drain me", max_tokens=DRAINED, stream=True, stream_options={"include_usage": True}, **GREEDY
    )
    chunks = [next(iter(stream))]
    proc.proc.send_signal(signal.SIGTERM)
    _state(proc, "Evicting", "Dead")
    chunks += list(stream)
    # The whole generation came: every token, and its end.
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].completion_tokens == DRAINED, usage
    assert proc.wait_exit(WAIT_S) == 0, proc.log()[-3000:]


def test_vllm_failing_to_load_fails_the_worker_with_its_words(tmp_path: Path) -> None:
    model = tmp_path / "broken"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "no-such-architecture"}')
    proc = _start(model)
    try:
        assert proc.wait_exit(READY_S) == 3, proc.log()[-3000:]  # EXIT_LOAD_FAILED: the operator's LoadFailed
        reason = proc.termination_log.read_text()
        assert reason.startswith("vLLM exited while loading") and "no-such-architecture" in reason, reason
    finally:
        proc.stop()


def _engine_core(proc: ServerProcess) -> list[psutil.Process] | None:
    """The server's process tree once vLLM's engine core is in it (its API server's child)."""
    tree = psutil.Process(proc.proc.pid).children(recursive=True)
    named = [p for p in tree if "EngineCore" in " ".join(_cmdline(p))]
    return tree if named else None


def _alive(tree: list[psutil.Process]) -> list[int]:
    """The pids of ``tree`` still running (a zombie has ended)."""
    alive = []
    for process in tree:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process.pid)
        except psutil.Error:
            continue
    return alive


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_a_second_signal_leaves_no_vllm_process_behind(tmp_path: Path) -> None:
    model = tiny_models.build_vllm_llama(tmp_path / "llama", context=CONTEXT)
    proc = _start(model)
    try:
        tree = wait_for(lambda: _engine_core(proc), READY_S, 0.1, "vLLM's engine core started")
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.send_signal(signal.SIGTERM)  # the second: every process of the worker killed at once
        proc.wait_exit(WAIT_S)
        # The engine core's parent (the API server) died of its parent-death signal; vLLM's guard kills
        # the rest of its group, the engine core with it.
        wait_for(lambda: not _alive(tree), WAIT_S, 0.1, lambda: f"no process left: {_alive(tree)}")
    finally:
        proc.stop()
