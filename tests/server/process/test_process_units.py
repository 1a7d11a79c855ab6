"""The pieces of the multi-process worker on their own: the door (one capacity across processes), the
message framing, the batcher's sweeps by length, the supervisor's verdicts, the default process count."""

from __future__ import annotations

import asyncio
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_server import ipc
from model_server.config import ServerConfig
from model_server.cpu_budget import default_http_workers
from model_server.engine.dataplane import DataPlane
from model_server.engine.sweep import SWEEP_BATCHES, Sweep, sweep_capacity
from model_server.engine.unit import Unit
from model_server.engine.worker import Worker
from model_server.errors import Overloaded, ServerError
from model_server.metrics import Metrics
from model_server.state_machine import State, StateMachine
from model_server.supervisor.probe_server import STALL_AFTER_S, answer
from model_server.supervisor.supervisor import describe_exit, verdict
from model_server.tasks.base import Embedding, TextItem
from model_server.worker_view import SPAWN, Column, Door, WorkerView, http_row
from testkit.echo_models import ECHO


def _grab(door: Door, start: Any, tries: int, taken: Any) -> None:
    start.wait()
    got = sum(door.take() for _ in range(tries))
    with taken.get_lock():
        taken.value += got


def test_the_door_never_admits_more_than_its_capacity_across_processes() -> None:
    door = Door(capacity=7)
    start, taken = SPAWN.Event(), SPAWN.Value("i", 0)
    burst = [SPAWN.Process(target=_grab, args=(door, start, 50, taken)) for _ in range(4)]
    for p in burst:
        p.start()
    start.set()  # four processes take at once
    for p in burst:
        p.join(60)
    assert [p.exitcode for p in burst] == [0] * 4
    assert taken.value == 7 and door.taken == 7 and door.full
    door.give_back(3)
    assert door.taken == 4 and not door.full


def test_a_limited_door_admits_its_size_across_processes_and_a_reset_opens_it_whole() -> None:
    """A shared host's slot: a door as big as any pool may ask, limited by each load to its pool's
    ``queue.capacity``; racing takes past the limit give their slot back."""
    door = Door(capacity=50)
    door.limit(5)
    start, taken = SPAWN.Event(), SPAWN.Value("i", 0)
    burst = [SPAWN.Process(target=_grab, args=(door, start, 50, taken)) for _ in range(4)]
    for p in burst:
        p.start()
    start.set()
    for p in burst:
        p.join(60)
    assert [p.exitcode for p in burst] == [0] * 4
    assert taken.value == 5 and door.taken == 5 and door.full and door.size == 5
    door.give_back(1)
    assert not door.full and door.take() and not door.take()
    with pytest.raises(ValueError, match="cannot admit 51"):
        door.limit(51)
    view = WorkerView(50, http_processes=1)
    view.door.limit(2)
    assert view.door.take() and view.door.take() and not view.door.take()
    view.reset()  # the slot takes another model: every slot back, the whole capacity
    assert view.door.taken == 0 and view.door.size == 50


def test_frames_carry_arrays_out_of_band_and_survive_any_split() -> None:
    big = np.arange(300_000, dtype=np.float32)
    messages = [
        ipc.Submit(1, 12.5, [TextItem("a"), TextItem("héllo")], [1, 5], False),
        ipc.Result(1, [Embedding(big, tokens=3), Embedding(big[:2].copy())]),
        ipc.Failure(2, Overloaded("full", 3)),
        ipc.Piece(3, "tok"),
    ]
    stream = b"".join(bytes(piece) for m in messages for piece in ipc.encode(m))
    _head, payload, *buffers = ipc.encode(messages[1])
    assert len(buffers) == 2 and len(payload) < 1000  # the arrays are not in the pickle
    for cut in (1, 7, 4096, len(stream) // 2, len(stream) - 1, len(stream)):
        got, used = ipc.decode(stream[:cut])
        rest, used2 = ipc.decode(stream[used:])
        decoded = got + rest
        assert used + used2 == len(stream) and len(decoded) == 4
    result = decoded[1].results
    np.testing.assert_array_equal(result[0].vector, big)
    error = decoded[2].error
    assert isinstance(error, Overloaded) and error.retry_after_s == 3 and str(error) == "full"
    assert decoded[0].items == [TextItem("a"), TextItem("héllo")]


def test_each_message_crosses_the_framing_as_its_own_class_with_its_fields() -> None:
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    messages: list[ipc.ToEngine | ipc.ToFrontend] = [
        ipc.Submit(7, 99.25, ipc.pack([TextItem("a"), TextItem("bc")]), [1, 2], True),
        ipc.Cancel(7, "disconnected"),
        ipc.Result(7, ipc.pack([Embedding(v, tokens=4, truncated=k == 1) for k, v in enumerate(vectors)])),
        ipc.Failure(8, Overloaded("full", 2)),
        ipc.Piece(9, " wor"),
    ]
    stream = b"".join(bytes(piece) for m in messages for piece in ipc.encode(m))
    decoded, used = ipc.decode(stream)
    assert used == len(stream)
    assert [type(m) for m in decoded] == [type(m) for m in messages]
    submit, cancel, result, failure, piece = decoded
    assert ipc.unpack(submit.items) == [TextItem("a"), TextItem("bc")]
    assert (submit.id, submit.deadline, submit.lengths, submit.streaming) == (7, 99.25, [1, 2], True)
    assert cancel == ipc.Cancel(7, "disconnected") and piece == ipc.Piece(9, " wor")
    embeddings = ipc.unpack(result.results)
    assert result.id == 7 and [e.truncated for e in embeddings] == [False, True, False]
    np.testing.assert_array_equal(np.stack([e.vector for e in embeddings]), vectors)
    assert failure.id == 8 and isinstance(failure.error, Overloaded) and failure.error.retry_after_s == 2


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12),
    limit=st.integers(min_value=1, max_value=32),
    seed=st.integers(min_value=0, max_value=10**6),
)
def test_a_sweep_hands_out_every_item_once_by_length_in_bounded_batches(
    sizes: list[int], limit: int, seed: int
) -> None:
    rng = random.Random(seed)
    units = [[rng.randint(0, 50) for _ in range(n)] for n in sizes]
    capacity = sweep_capacity(limit, hinted=True)
    # The requests a sweep takes: the first always, then while they fit (as the data plane gathers).
    taken, total = [units[0]], len(units[0])
    for unit in units[1:]:
        if total + len(unit) > capacity:
            break
        taken.append(unit)
        total += len(unit)
    sweep: Sweep[list[int]] = Sweep()
    sweep.start(taken, lambda u: u, limit)
    batches = []
    while sweep:
        batches.append(sweep.take(lambda u: True))
    handed = [(id(u), i) for batch in batches for u, i in batch]
    assert sorted(handed) == sorted((id(u), i) for u in taken for i in range(len(u)))
    assert all(0 < len(b) <= limit for b in batches)
    lengths = [u[i] for batch in batches for u, i in batch]
    assert lengths == sorted(lengths)
    # No request waits more than SWEEP_BATCHES batches in a sweep (one larger than that: its own size).
    assert len(batches) <= max(SWEEP_BATCHES, -(-len(taken[0]) // limit))


def test_a_sweep_skips_requests_that_are_gone() -> None:
    keep, gone = [3, 1, 2], [1, 1]
    sweep: Sweep[list[int]] = Sweep()
    sweep.start([keep, gone], lambda u: u, 10)
    batch = sweep.take(lambda u: u is keep)
    assert [(u is keep, i) for u, i in batch] == [(True, 1), (True, 2), (True, 0)]
    assert not sweep


async def test_batches_group_items_of_similar_length_across_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four requests of mixed lengths, two batches of four: one carries the four shortest texts, the
    other the four longest, and every request gets its own results back in its own order."""
    record = tmp_path / "record.txt"
    monkeypatch.setenv("HANDLER_RECORD", str(record))
    config = ServerConfig(
        model=str(tmp_path), task="text-embedding", handler=ECHO,
        max_batch_size=4, max_batch_delay_ms=0,
    )  # fmt: skip
    view = WorkerView(capacity=8, http_processes=1)
    machine = StateMachine(store=view.state_store())
    worker = Worker(config, machine, lambda code, reason: None)
    plane = DataPlane(config, worker, machine, Metrics(), view)
    texts = [["a" * 9, "b"], ["c" * 8, "d" * 2], ["e" * 3, "f" * 7], ["g" * 6, "h" * 4]]
    answers: dict[int, list[Any] | ServerError] = {}
    everyone = asyncio.Event()

    def answer(k: int, outcome: list[Any] | ServerError) -> None:
        answers[k] = outcome
        if len(answers) == len(texts):
            everyone.set()

    try:
        assert await worker.load()
        for k, request in enumerate(texts):
            assert view.door.take()  # as an HTTP process does before it sends a request
            items = [TextItem(t) for t in request]
            plane.submit(Unit(items, time.monotonic() + 30, partial(answer, k), [len(t) for t in request]))
        owner = asyncio.create_task(plane.run())
        await asyncio.wait_for(everyone.wait(), 30)
        owner.cancel()
    finally:
        worker.close()
    computed = record.read_text().split()
    assert len(computed) == 8 and max(map(len, computed[:4])) < min(map(len, computed[4:]))
    for k, request in enumerate(texts):
        outcome = answers[k]
        assert not isinstance(outcome, ServerError)
        assert [int(e.vector[0]) for e in outcome] == [len(t) for t in request]
    assert view.door.taken == 0 and machine.state is State.READY


async def test_a_sweep_waits_for_the_last_sweeps_clients_only(tmp_path: Path) -> None:
    """Closed-loop clients at a long batch delay (10 s): after a sweep of two requests, the next sweep
    dispatches as soon as two are back (never the whole delay), and waits for a third that an HTTP
    process has admitted (its slot taken) but not yet sent, so all three share one batch."""
    config = ServerConfig(
        model=str(tmp_path), task="text-embedding", handler=ECHO, max_batch_size=32, max_batch_delay_ms=10_000
    )
    view = WorkerView(capacity=8, http_processes=1)
    machine = StateMachine(store=view.state_store())
    worker = Worker(config, machine, lambda code, reason: None)
    metrics = Metrics()
    plane = DataPlane(config, worker, machine, metrics, view)
    answered: list[int] = []
    arrived = asyncio.Event()

    def answer(k: int, outcome: list[Any] | ServerError) -> None:
        assert not isinstance(outcome, ServerError)
        answered.append(k)
        arrived.set()

    def send(k: int) -> None:
        plane.submit(Unit([TextItem("ab")], time.monotonic() + 120, partial(answer, k), [2]))

    async def answers(count: int) -> None:
        while len(answered) < count:
            arrived.clear()
            await asyncio.wait_for(arrived.wait(), 8)  # bounded: a wait of the whole delay fails

    def batches() -> list[float]:
        samples = {s.name: s.value for m in metrics.batch_size.collect() for s in m.samples}
        return [samples["modelpool_batch_size_count"], samples["modelpool_batch_size_sum"]]

    try:
        assert await worker.load()
        owner = asyncio.create_task(plane.run())
        for k in (0, 1):  # both queued before the first sweep: one batch of two, no wait
            assert view.door.take()
            send(k)
        await answers(2)
        assert batches() == [1, 2]
        for k in (2, 3):  # the two clients come back: dispatched at once, not after 10 s
            assert view.door.take()
            send(k)
        await answers(4)
        assert batches() == [2, 4]
        for _ in range(3):  # three admitted; two arrive, the third is still on its way
            assert view.door.take()
        send(4)
        send(5)
        await asyncio.sleep(0)  # one turn of the loop: the sweep starts, and waits for the one on its way
        assert batches() == [2, 4]
        send(6)
        await answers(7)
        assert batches() == [3, 7]
        owner.cancel()
    finally:
        worker.close()
    assert view.door.taken == 0


@pytest.mark.parametrize(
    ("name", "code", "draining", "expected"),
    [
        ("inference", 0, True, 0),
        ("inference", 3, False, 3),
        ("inference", 4, False, 4),
        ("inference", -9, False, 5),
        ("inference", 0, False, 5),
        ("http-1", 0, True, 5),
        ("http-0", -11, False, 5),
    ],
)
def test_the_supervisors_verdict(name: str, code: int, draining: bool, expected: int) -> None:
    exit_code, reason = verdict(name, 42, code, "load failed: boom", draining)
    assert exit_code == expected
    if expected in (3, 4):
        assert reason == "load failed: boom"
    elif expected == 5:
        assert reason == f"the {name} process (pid 42) died: {describe_exit(code)}"
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(1) == "exit code 1"


def test_default_http_workers() -> None:
    assert [default_http_workers(c) for c in (1, 2, 3, 4, 8, 16, 64, 2.5)] == [1, 1, 1, 2, 4, 4, 4, 1]


def test_state_moves_are_seen_by_every_process() -> None:
    view = WorkerView(capacity=1, http_processes=1)
    StateMachine(store=view.state_store()).to(State.LOADING)
    child = SPAWN.Process(target=_move_to_failed, args=(view,))
    child.start()
    child.join(60)
    machine = StateMachine(store=view.state_store())
    assert child.exitcode == 0
    assert machine.state is State.FAILED and machine.reason == "seen elsewhere"


def _move_to_failed(view: WorkerView) -> None:
    machine = StateMachine(store=view.state_store())
    assert machine.state is State.LOADING
    machine.to(State.FAILED, "seen elsewhere")


def _hold_the_lock(view: WorkerView, held: Any) -> None:
    view.lock.acquire()
    held.set()
    time.sleep(120)


def test_a_process_killed_holding_the_state_lock_does_not_freeze_the_others() -> None:
    view = WorkerView(capacity=1, http_processes=1)
    held = SPAWN.Event()
    holder = SPAWN.Process(target=_hold_the_lock, args=(view, held))
    holder.start()
    assert held.wait(60)
    holder.kill()
    holder.join(10)
    machine = StateMachine(store=view.state_store())
    machine.to(State.FAILED, "the inference process died")  # waits at most LOCK_TIMEOUT_S, then goes on
    assert machine.state is State.FAILED and machine.reason == "the inference process died"


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=256), min_size=1, max_size=300),
    limit=st.integers(min_value=1, max_value=64),
)
def test_a_sweep_pads_no_more_than_arrival_order(lengths: list[int], limit: int) -> None:
    """Batches of a sweep carry no more padded tokens than the same items batched in arrival order:
    contiguous runs of the sorted order, the short batch placed where it costs least, minimise the sum
    of each batch's size x longest item."""
    sweep: Sweep[list[int]] = Sweep()
    sweep.start([lengths], lambda u: u, limit)
    swept = []
    while sweep:
        swept.append([lengths[i] for _, i in sweep.take(lambda u: True)])
    arrival = [lengths[k : k + limit] for k in range(0, len(lengths), limit)]

    def padded(batches: list[list[int]]) -> int:
        return sum(len(b) * max(b) for b in batches)

    assert padded(swept) <= padded(arrival)


def test_the_probe_ports_answers() -> None:
    """Health, readiness and /stats from the view; liveness fails while an HTTP process that accepts
    connections has not ticked its heartbeat for STALL_AFTER_S (one still starting is not wedged)."""
    config = ServerConfig(model="/", task="text-embedding", name="echo", queue_capacity=7)
    view = WorkerView(config.queue_capacity, http_processes=2)
    machine = StateMachine(store=view.state_store())
    now = 1000.0
    assert answer("/v2/health/live", config, view, machine, now) == (200, {"live": True, "state": "Pending"})
    assert answer("/v2/health/ready", config, view, machine, now)[0] == 503
    for state in (State.LOADING, State.READY):
        machine.to(state)
    view.put(http_row(0), Column.UP, 1.0)
    view.put(http_row(0), Column.BEAT, now - 1)
    # Ready needs every HTTP process up; the second is still starting (no beat yet, and not wedged).
    assert answer("/v2/health/ready", config, view, machine, now)[0] == 503
    assert answer("/v2/health/live", config, view, machine, now)[0] == 200
    view.put(http_row(1), Column.UP, 1.0)
    view.put(http_row(1), Column.BEAT, now - STALL_AFTER_S - 1)
    assert answer("/v2/health/ready", config, view, machine, now) == (200, {"ready": True, "state": "Ready"})
    status, body = answer("/v2/health/live", config, view, machine, now)
    assert status == 503 and "HTTP process 1 has not run its event loop" in body["reason"]
    status, stats = answer("/stats", config, view, machine, now)
    assert status == 200 and stats["state"] == "Ready" and stats["queue_capacity"] == 7
    assert answer("/v2/models/echo/infer", config, view, machine, now)[0] == 404
