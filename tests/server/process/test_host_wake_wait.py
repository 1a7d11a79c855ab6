"""Requests for sleeping models on a full device: each waits for room and is answered once there is some.

One real host (``modelpool-server --shared-host``) whose device holds one of its three echo models (each
declares the whole device), all three loaded in turn, so that two sleep.  Every forward pass of the echo
models waits for a gate file (``HANDLER_RUN_GATE``), which the tests open or close.

* Requests for two sleeping models at once: the host wakes one, and must not put it back to sleep to wake
  the other before that one's request got in (it used to: that request then waited out ``--wake-timeout``
  for a 503).
* A request for a sleeping model while the only model that could make room is computing: its wake finds no
  room; once that computation ends it must be woken and answered (it used to be tried once, and the request
  waited out ``--wake-timeout`` for a 503).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from testkit.echo_models import ECHO
from testkit.server import ServerProcess, SharedHost, start_host
from testkit.waiting import wait_for

pytestmark = pytest.mark.slow

MI = 1 << 20
WAKE_TIMEOUT_S = 10.0
ANSWERED_WITHIN_S = WAKE_TIMEOUT_S / 2
WAIT_S = 30.0
NAMES = ("a", "b", "c")


class Host(SharedHost):
    """The host, its control API and the gate file its echo models' forward passes wait for."""

    def __init__(self, server: ServerProcess, gate: Path) -> None:
        super().__init__(server, timeout=60)
        self.gate = gate

    def ask_in_thread(self, name: str, answers: dict[str, tuple[int, float]]) -> threading.Thread:
        """Ask ``name`` for an embedding in a thread; its status and seconds land in ``answers``."""

        def ask() -> None:
            started = time.monotonic()
            body = {"model": name, "input": "hello"}
            status = httpx.post(self.server.url + "/v1/embeddings", json=body, timeout=60).status_code
            answers[name] = (status, time.monotonic() - started)

        thread = threading.Thread(target=ask)
        thread.start()
        return thread


def _until(condition: Callable[[], bool], what: str, log: Callable[[], str]) -> None:
    wait_for(condition, WAIT_S, 0.02, lambda: f"{what}; host log:\n{log()[-3000:]}")


def _answered(answers: dict[str, tuple[int, float]], names: list[str]) -> None:
    for name in names:
        status, seconds = answers[name]
        assert status == 200, f"{name} answered {status} after {seconds:.1f} s"
        assert seconds < ANSWERED_WITHIN_S, f"{name} answered only after {seconds:.1f} s"


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    folder = tmp_path_factory.mktemp("host")
    gate = folder / "gate"
    # Room for one model's declared 100 MiB: its process is charged nothing (the default model overhead 0).
    server = start_host(
        "--wake-timeout", str(WAKE_TIMEOUT_S),
        device_memory=100 * MI, max_models=len(NAMES), env={"HANDLER_RUN_GATE": str(gate)},
    )  # fmt: skip
    host = Host(server, gate)
    try:
        config = {"source": str(folder), "task": "text-embedding", "handler": ECHO, "memory": f"{100 * MI}"}
        for name in NAMES:  # each load puts the one before to sleep: the device holds one
            loaded = host.call(name, "load", {**config, "skip_warmup": True})
            assert loaded.status_code == 200, loaded.text
        assert host.states() == {"a": "Sleeping", "b": "Sleeping", "c": "Ready"}
        yield host
    finally:
        gate.touch()
        host.stop()


def test_two_requests_for_sleeping_models_at_once_are_both_answered(host: Host) -> None:
    host.gate.touch()  # forward passes run at once
    answers: dict[str, tuple[int, float]] = {}
    threads = [host.ask_in_thread(name, answers) for name in ("a", "b")]
    for thread in threads:
        thread.join(WAIT_S)
    _answered(answers, ["a", "b"])
    states = host.states()
    assert sorted(states.values()) == ["Ready", "Sleeping", "Sleeping"] and states["c"] == "Sleeping", states


def test_a_wake_that_finds_no_room_is_tried_again_while_its_request_waits(host: Host) -> None:
    host.gate.unlink(missing_ok=True)  # forward passes wait for the gate
    (busy,) = [name for name, state in host.states().items() if state == "Ready"]
    sleeper = next(name for name in NAMES if name != busy)
    answers: dict[str, tuple[int, float]] = {}
    held = host.ask_in_thread(busy, answers)
    _until(
        lambda: host.states()[busy] == "Processing", f"{busy} computing (held on the gate)", host.server.log
    )
    waiting = host.ask_in_thread(sleeper, answers)
    _until(
        lambda: any(
            "cannot wake" in line and sleeper in line and "do not fit" in line
            for line in host.server.log().splitlines()
        ),
        f"the host found no room for {sleeper}'s wake",
        host.server.log,
    )
    host.gate.touch()  # busy's request is answered: busy turns idle, and may now sleep to make room
    held.join(WAIT_S)
    waiting.join(WAIT_S)
    _answered(answers, [busy, sleeper])
    assert host.states()[sleeper] == "Ready" and host.states()[busy] == "Sleeping"
