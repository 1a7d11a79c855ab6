"""A failed pass is told on its object by one Event, the project's ``ReconcileError``: its traceback is
logged where Kopf does not post (``daemon_loop``'s own logger), never at a warning or above on the daemon's
per-object logger, whose records at ``posting_level`` Kopf posts as a second Event (issue 36)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import pytest

from modelpool_operator import daemon_loop
from modelpool_operator.planner import Event
from modelpool_operator.services import Services

BODY = {"metadata": {"namespace": "ns", "name": "p"}}


class Told:
    def __init__(self) -> None:
        self.posted: list[Event] = []

    def post(self, body: Mapping[str, Any], event: Event) -> None:
        self.posted.append(event)


class Stub:
    def __init__(self, told: Told) -> None:
        self.events = told


def test_a_failed_pass_is_one_event_and_its_traceback_is_not_on_the_object_logger(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told = Told()
    services = cast(Services, Stub(told))
    object_logger = logging.getLogger("kopf.objects.test")
    caplog.set_level(logging.INFO)
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        last = daemon_loop.tell_pass_error(services, BODY, object_logger, exc, None)
        again = daemon_loop.tell_pass_error(services, BODY, object_logger, exc, last)
    assert last == again == "RuntimeError: boom"
    assert [(e.type, e.reason) for e in told.posted] == [("Warning", "ReconcileError")]
    on_object = [r for r in caplog.records if r.name == object_logger.name]
    assert all(r.levelno < logging.WARNING for r in on_object), on_object
    [traceback] = [r for r in caplog.records if r.name == daemon_loop.__name__]
    assert traceback.levelno == logging.ERROR and traceback.exc_info is not None
    assert traceback.getMessage().startswith("ns/p: reconciliation failed")
