"""The uninstall hook's one decision: the JSON patch that takes the operator's finalizer (and only it) off."""

from __future__ import annotations

import pytest

from modelpool_operator.cleanup import FINALIZER, build_parser, finalizer_patch
from modelpool_operator.settings import OperatorConfig


def test_the_finalizer_removed_is_the_operators_own() -> None:
    assert OperatorConfig().finalizer == FINALIZER


def test_only_the_operators_finalizer_is_removed_guarded_by_a_test_of_its_index() -> None:
    assert finalizer_patch([], FINALIZER) is None
    assert finalizer_patch(["other.io/keep"], FINALIZER) is None
    assert finalizer_patch(["other.io/keep", FINALIZER], FINALIZER) == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]


def test_the_scope_is_required_and_exclusive() -> None:
    base = ["--deployment", "d", "--deployment-namespace", "ns", "--selector", "a=b"]
    args = build_parser().parse_args(["-n", "a", "--namespace", "b", *base])
    assert args.namespaces == ["a", "b"] and not args.all_namespaces
    for bad in (base, ["-A", "-n", "a", *base]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)
