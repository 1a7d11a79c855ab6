"""Event messages fit what the API server takes: it refuses an Event whose message passes 1024 bytes
(counted in bytes), and a refused Event is lost. The soak found one: a worker's failure (its clipped
termination message, 1024 characters ending in an ellipsis) behind "worker ... failed: "."""

from __future__ import annotations

from typing import Any

import kopf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelpool_operator.effects.events import EVENT_MESSAGE_BYTES, KopfEventSink, fit_message
from modelpool_operator.planner.draft import Event


@given(st.text(max_size=3000))
def test_a_message_fits_in_1024_bytes_and_is_a_prefix_of_the_original(text: str) -> None:
    fitted = fit_message(text)
    assert len(fitted.encode()) <= EVENT_MESSAGE_BYTES
    if len(text.encode()) <= EVENT_MESSAGE_BYTES:
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
    assert len(event["message"].encode()) <= EVENT_MESSAGE_BYTES
    assert event["message"].startswith("worker minilm-1-ddc51-0 failed: exit code 137 (Error): ")
