"""Event messages fit what the API server takes: it refuses an Event whose message passes 1024 bytes
(counted in bytes), and a refused Event is lost. The soak found one: a worker's failure (its clipped
termination message, 1024 characters ending in an ellipsis) behind "worker ... failed: "."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.api import Condition, WorkerStatus
from modelpool_contract.messages import MESSAGE_BYTES, fit_message
from modelpool_operator.effects.events import KopfEventSink
from modelpool_operator.planner.draft import Event


@given(st.text(max_size=3000))
def test_a_message_fits_in_1024_bytes_and_is_a_prefix_of_the_original(text: str) -> None:
    fitted = fit_message(text)
    assert len(fitted.encode()) <= MESSAGE_BYTES
    if len(text.encode()) <= MESSAGE_BYTES:
        assert fitted == text
    else:
        assert fitted.endswith("…") and text.startswith(fitted[:-1])


def test_the_failure_the_soak_found_is_posted_whole_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """What reached the API server: 'worker X failed: ' + a 1024-character message ending in '…' (3
    bytes). The sink hands Kopf the fitted message (kopf.event itself needs a running operator)."""
    posted: list[dict[str, Any]] = []
    monkeypatch.setattr(kopf, "event", lambda _obj, **kw: posted.append(kw))
    clipped = "exit code 137 (Error): " + "worker state Ready -> Processing\n" * 40
    message = f"worker minilm-1-ddc51-0 failed: {clipped[:1023]}…"
    KopfEventSink().post({"metadata": {"name": "minilm-1"}}, Event("Warning", "Error", message))
    [event] = posted
    assert len(event["message"].encode()) <= MESSAGE_BYTES
    assert event["message"].startswith("worker minilm-1-ddc51-0 failed: exit code 137 (Error): ")


def test_status_messages_fit_whoever_built_them() -> None:
    """A condition's and a worker's message are fitted by their type: no producer cuts its own."""
    long = "é" * 2000
    assert Condition(type="Ready", status="False", message=long).message == fit_message(long)
    worker = WorkerStatus.model_validate({"name": "w", "state": "Failed", "message": long})
    assert worker.message == fit_message(long)
