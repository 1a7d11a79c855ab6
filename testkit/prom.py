"""Reading Prometheus text exposition (a server's, the gateway's, the operator's or the API server's
``/metrics``) with prometheus_client's own parser: the one place tests and benchmarks turn that text into
numbers, so none matches lines by hand (label order, escaping and the ``_total``/``_count`` suffixes are
the parser's business).

Pure functions of the text; fetching it is the caller's (each has its own client and address).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def iter_samples(text: str, name: str | None = None) -> Iterator[Sample]:
    """Every sample in ``text`` (only those named ``name``, e.g. ``x_total`` or ``x_bucket``, when given)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if name is None or sample.name == name:
                yield sample


def samples(text: str) -> Samples:
    """Every sample, keyed by (name, its labels as a frozenset of pairs)."""
    return {(s.name, frozenset(s.labels.items())): s.value for s in iter_samples(text)}


def sample(found: Samples, name: str, **labels: str) -> float | None:
    """The sample named ``name`` with exactly ``labels`` in ``found``; None when absent."""
    return found.get((name, frozenset(labels.items())))


def value(text: str, name: str, **labels: str) -> float:
    """The sample named ``name`` with exactly ``labels``; 0 when absent (a counter not yet incremented)."""
    return next((s.value for s in iter_samples(text, name) if s.labels == labels), 0.0)


def total(
    text: str,
    name: str,
    where: Callable[[Mapping[str, str]], bool] | None = None,
    **labels: str,
) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels`` (and satisfy ``where``)."""
    return sum(
        s.value
        for s in iter_samples(text, name)
        if all(s.labels.get(k) == v for k, v in labels.items()) and (where is None or where(s.labels))
    )
