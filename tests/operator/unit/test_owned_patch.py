"""The operator patches only what it owns (effects.kube.owned_patch, failed_test): the JSON patch tests the
owner reference first, and the API server's answer to a failed test is told apart from an invalid patch."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from modelpool_operator.effects.kube import failed_test, owned_patch

BODY = {
    "metadata": {
        "name": "emb",
        "ownerReferences": [{"kind": "ModelPool", "name": "emb", "uid": "u-1", "controller": True}],
    },
    "spec": {"selector": {"a": "b"}},
}


def test_the_patch_tests_the_owner_uid_before_it_sets_anything() -> None:
    patch = owned_patch(BODY, {"/metadata/labels": {"x": "y"}, "/spec/selector": {"a": "b"}})
    assert patch == [
        {"op": "test", "path": "/metadata/ownerReferences/0/uid", "value": "u-1"},
        {"op": "add", "path": "/metadata/labels", "value": {"x": "y"}},
        {"op": "add", "path": "/spec/selector", "value": {"a": "b"}},
    ]


def test_an_object_without_an_owner_cannot_be_checked() -> None:
    with pytest.raises(ValueError, match="no owner reference"):
        owned_patch({"metadata": {"name": "emb"}}, {})


def _answer(code: int, status: dict[str, object]) -> ApiException:
    exc = ApiException(status=code, reason="x")
    exc.body = json.dumps(status).encode()
    return exc


def test_a_failed_test_is_told_apart_from_an_invalid_patch() -> None:
    # What kube-apiserver answered a failed test on the real API server (tests/.../test_names_owned.py).
    generic = {"kind": "Status", "status": "Failure", "reason": "Invalid", "details": {}, "code": 422}
    assert failed_test(_answer(422, generic))
    invalid = {
        **generic,
        "details": {"causes": [{"field": "spec.ports[0].port", "reason": "FieldValueInvalid"}]},
    }
    assert not failed_test(_answer(422, invalid))
    assert not failed_test(_answer(409, generic))
    assert not failed_test(_answer(500, generic))
    broken = ApiException(status=422, reason="x")
    broken.body = b"not json"
    assert not failed_test(broken)
