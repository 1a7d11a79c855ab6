"""The test kit's own rules: it imports nothing from the suites and scripts that import it (one direction),
its Prometheus reading (testkit/prom.py) finds samples by name and labels as the exposition states
them, whatever order the labels come in, and the ports it holds while a control plane is down
(testkit/cluster.py) are nobody else's to bind."""

from __future__ import annotations

import socket

import pytest

from testkit import prom
from testkit.cluster import hold_ports
from testkit.environment import ROOT, free_port
from testkit.layout import imports_of

# What testkit may not import: the code built on it.
IMPORTERS = ("tests", "e2e", "bench", "hack", "conftest")

EXPOSITION = """\
# HELP modelpool_requests_total Requests answered.
# TYPE modelpool_requests_total counter
modelpool_requests_total{route="embeddings",code="200"} 7.0
modelpool_requests_total{route="embeddings",code="429"} 2.0
modelpool_requests_total{route="infer",code="200"} 3.0
# HELP modelpool_queue_capacity Queue capacity.
# TYPE modelpool_queue_capacity gauge
modelpool_queue_capacity 4.0
# HELP modelpool_batch_size Batch sizes.
# TYPE modelpool_batch_size histogram
modelpool_batch_size_bucket{le="1.0"} 1.0
modelpool_batch_size_bucket{le="+Inf"} 2.0
modelpool_batch_size_sum 9.0
modelpool_batch_size_count 2.0
"""


def test_testkit_imports_nothing_from_tests_e2e_bench_or_hack() -> None:
    offending = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in (ROOT / "testkit").rglob("*.py")
        for module in imports_of(path)
        if module.split(".")[0] in IMPORTERS
    }
    assert not offending, sorted(offending)


def test_value_is_the_sample_with_exactly_those_labels_in_any_order() -> None:
    assert prom.value(EXPOSITION, "modelpool_requests_total", code="200", route="embeddings") == 7
    assert prom.value(EXPOSITION, "modelpool_queue_capacity") == 4
    assert prom.value(EXPOSITION, "modelpool_batch_size_sum") == 9
    assert prom.value(EXPOSITION, "modelpool_batch_size_bucket", le="+Inf") == 2
    # A subset of the labels is not the sample; an absent counter reads 0.
    assert prom.value(EXPOSITION, "modelpool_requests_total", code="200") == 0
    assert prom.value(EXPOSITION, "modelpool_dropped_total", reason="timeout") == 0


def test_total_sums_the_samples_whose_labels_include_the_given_ones() -> None:
    assert prom.total(EXPOSITION, "modelpool_requests_total") == 12
    assert prom.total(EXPOSITION, "modelpool_requests_total", code="200") == 10
    assert (
        prom.total(EXPOSITION, "modelpool_requests_total", where=lambda labels: labels["route"] != "infer")
        == 9
    )
    assert prom.total(EXPOSITION, "modelpool_requests", code="200") == 0  # the family's name is no sample's


def test_samples_are_keyed_by_name_and_label_set() -> None:
    found = prom.samples(EXPOSITION)
    assert prom.sample(found, "modelpool_requests_total", route="infer", code="200") == 3
    assert prom.sample(found, "modelpool_requests_total", route="infer") is None
    assert prom.sample(found, "modelpool_batch_size_count") == 2


def test_held_ports_cannot_be_bound_by_anyone_else() -> None:
    port = free_port()
    held = hold_ports([port])
    try:
        assert len(held) == 1
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("0.0.0.0", port))
    finally:
        for sock in held:
            sock.close()
    with socket.socket() as other:
        other.bind(("0.0.0.0", port))  # free again once released
