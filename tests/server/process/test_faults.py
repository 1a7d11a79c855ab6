"""The worker's fault paths, with real server processes: a wedged forward pass fails the worker within
its bound, requests that fail after admission give their queue slot back, and a drain that runs out of
time exits non-zero with the reason.

The forward pass is held with a gate file that is never opened (``HANDLER_RUN_GATE``): the test decides
that the model is stuck, not this machine's speed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from model_server.supervisor.supervisor import WATCH_PERIOD_S
from modelpool_contract.exits import EXIT_DRAIN_TIMED_OUT, EXIT_INFERENCE_WEDGED
from testkit.echo_models import ECHO, FailsAfterAdmission, handler_name
from testkit.environment import free_port
from testkit.server import ServerFactory, ServerProcess
from testkit.waiting import wait_for, wait_for_async

pytestmark = pytest.mark.slow

DEADLINE = 30.0  # bound on every wait below (the events come in milliseconds)


def _held(server: ServerFactory, tmp_path: Path, *flags: str) -> tuple[ServerProcess, httpx.Client]:
    """A worker whose forward pass never finishes, and a client of its probe port."""
    probe_port = free_port()
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", ECHO, "--device", "cpu", "--name", "echo",
        "--http-workers", "1", "--probe-port", str(probe_port), *flags,
        env={"HANDLER_RUN_GATE": str(tmp_path / "never")}, wait="ready",
    )  # fmt: skip
    return proc, httpx.Client(base_url=f"http://127.0.0.1:{probe_port}", timeout=5)


def test_a_wedged_forward_pass_fails_the_worker_within_its_bound(
    server: ServerFactory, tmp_path: Path
) -> None:
    timeout, grace = 1.0, 1.0
    proc, probes = _held(server, tmp_path, "--request-timeout", str(timeout), "--wedge-grace", str(grace))
    assert probes.get("/v2/health/live").status_code == 200

    def dead() -> bool:
        try:
            return probes.get("/v2/health/live").status_code == 503
        except httpx.TransportError:  # already gone
            return True

    async def go() -> float:
        async with httpx.AsyncClient(base_url=proc.url, timeout=DEADLINE) as client:
            started = time.monotonic()
            # The client is answered at its deadline; the forward pass goes on, stuck.
            assert (await client.post("/v1/embeddings", json={"input": "stuck"})).status_code == 504
            await wait_for_async(dead, DEADLINE, message="liveness to fail")
            return time.monotonic() - started

    failed_after = asyncio.run(go())
    # Not before the request timeout + grace has passed, and within one watch period of it (plus slack
    # for this shared machine).
    assert timeout + grace <= failed_after <= timeout + grace + WATCH_PERIOD_S + 2.0, failed_after
    assert proc.wait_exit(DEADLINE) == EXIT_INFERENCE_WEDGED, proc.log()[-3000:]
    message = proc.termination_log.read_text()
    assert message.startswith("inference wedged: batch running for "), message
    assert "over the 1 s request timeout + 1 s grace" in message, message


def test_requests_that_fail_after_admission_give_their_slot_back(server: ServerFactory) -> None:
    """A length hint that raises and an item that cannot be pickled fail in the HTTP process after the
    door's slot was taken: 1,000 of them leave the capacity whole and the worker serving."""
    proc = server(
        "--model", "/", "--task", "text-embedding", "--handler", handler_name(FailsAfterAdmission),
        "--device", "cpu", "--name", "echo", "--http-workers", "2", "--queue-capacity", "4",
        wait="ready",
    )  # fmt: skip
    unpicklable = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["unpicklable"]}]}
    with httpx.Client(base_url=proc.url, timeout=DEADLINE) as client:
        for _ in range(500):
            hint = client.post("/v1/embeddings", json={"input": "nohint"})
            assert hint.status_code == 500, hint.text
            pickled = client.post("/v2/models/echo/infer", json=unpicklable)
            assert pickled.status_code == 500, pickled.text
        stats = proc.stats()
        assert (stats["queue_depth"], stats["in_flight"], stats["state"]) == (0, 0, "Ready"), stats
        ok = client.post("/v1/embeddings", json={"input": ["fine", "also fine"]})
        assert ok.status_code == 200, ok.text
        assert [d["embedding"] for d in ok.json()["data"]] == [[4.0, 2.0], [9.0, 2.0]]
    wait_for(
        lambda: proc.stats()["state"] == "Ready" and not proc.stats()["queue_depth"], DEADLINE, 0.02, "Ready"
    )


def test_a_drain_that_times_out_exits_non_zero_with_the_reason(server: ServerFactory, tmp_path: Path) -> None:
    proc, _ = _held(server, tmp_path, "--drain-timeout", "1")

    async def go() -> int:
        async with httpx.AsyncClient(base_url=proc.url, timeout=DEADLINE) as client:
            held = asyncio.create_task(client.post("/v1/embeddings", json={"input": "held"}))
            await wait_for_async(
                lambda: proc.stats()["in_flight"] == 1, DEADLINE, message="the forward pass to start"
            )
            proc.terminate()
            return (await held).status_code

    assert asyncio.run(go()) == 503  # answered when the drain gave up, not left hanging
    assert proc.wait_exit(DEADLINE) == EXIT_DRAIN_TIMED_OUT, proc.log()[-3000:]
    assert proc.termination_log.read_text().strip() == "drain timed out after 1 s: 1 request abandoned"
