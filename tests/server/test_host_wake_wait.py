"""A request for a sleeping model on a full device waits for room, and is answered once there is some.

A real host (``modelpool-server --shared-host``) whose device holds one of two echo models: ``busy`` is
awake and computing a request (held on a gate), ``sleeper`` is asleep.  A request for ``sleeper`` cannot
wake it at once: the only model that could make room has work in hand.  Once ``busy``'s request is
answered, ``sleeper`` must wake and answer (well within ``--wake-timeout``), not wait out the timeout
for a 503 because its one wake attempt found no room.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.environment import free_port
from tests.server.conftest import start_server

pytestmark = pytest.mark.slow

MI = 1 << 20
ECHO = "tests.server.handlers:EchoEmbedding"
WAKE_TIMEOUT_S = 20.0
WAIT_S = 30.0


def _until(condition: Any, what: str, log: Any = str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {WAIT_S:g} s: {what}; host log:\n{log()[-3000:]}"
        time.sleep(0.02)


def _no_room_logged(log: str, name: str) -> bool:
    return any("cannot wake" in line and name in line and "do not fit" in line for line in log.splitlines())


def test_a_wake_that_finds_no_room_is_tried_again_while_its_request_waits(tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # every forward pass of the echo models waits for this file
    probe = free_port()
    server = start_server(
        "--shared-host", "--probe-port", str(probe), "--device-memory", f"{100 * MI}", "--http-workers", "1",
        "--max-models", "2", "--wake-timeout", str(WAKE_TIMEOUT_S),
        env={"HANDLER_RUN_GATE": str(gate)}, wait="live", timeout=60,
    )  # fmt: skip
    control = f"http://127.0.0.1:{probe}"
    answers: dict[str, tuple[int, float]] = {}

    def ask(name: str) -> None:
        started = time.monotonic()
        body = {"model": name, "input": "hello"}
        status = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60).status_code
        answers[name] = (status, time.monotonic() - started)

    def states() -> dict[str, str]:
        entries = httpx.post(control + "/v2/repository/index", timeout=10).json()
        return {e["name"]: e["state"] for e in entries}

    try:
        config = {"source": str(tmp_path), "task": "text-embedding", "handler": ECHO, "memory": f"{100 * MI}"}
        for name in ("sleeper", "busy"):  # busy's load puts sleeper to sleep: the device holds one
            body = {"parameters": {"config": json.dumps({**config, "skip_warmup": True})}}
            loaded = httpx.post(f"{control}/v2/repository/models/{name}/load", json=body, timeout=60)
            assert loaded.status_code == 200, loaded.text
        assert states() == {"sleeper": "Sleeping", "busy": "Ready"}

        held = threading.Thread(target=ask, args=("busy",))
        held.start()
        _until(lambda: states()["busy"] == "Processing", "busy computing (held on the gate)")
        waiting = threading.Thread(target=ask, args=("sleeper",))
        waiting.start()
        _until(
            lambda: _no_room_logged(server.log(), "sleeper"),
            "the host found no room for sleeper's wake",
            server.log,
        )
        gate.touch()  # busy's request is answered: busy turns idle, and may now sleep to make room
        held.join(WAIT_S)
        waiting.join(WAIT_S)
        assert answers["busy"][0] == 200
        status, seconds = answers["sleeper"]
        assert status == 200, f"sleeper answered {status} after {seconds:.1f} s"
        assert seconds < WAKE_TIMEOUT_S / 2, f"sleeper answered only after {seconds:.1f} s"
        assert states() == {"sleeper": "Ready", "busy": "Sleeping"}
    finally:
        gate.touch()
        server.stop()
