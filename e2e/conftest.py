"""Fixtures of the e2e suite: which cluster the tests talk to.

* ``MODELPOOL_E2E_CLUSTER=external`` (set by e2e/kind.sh): the cluster in ``KUBECONFIG`` (kind), as is.
* Otherwise the local control plane: the session's ``cluster`` fixture (the repository-root conftest.py),
  so the whole suite shares one control plane.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def e2e_external() -> bool:
    """True when the tests run against an external cluster (kind), not the local control plane."""
    return os.environ.get("MODELPOOL_E2E_CLUSTER", "") == "external"


@pytest.fixture(scope="session")
def e2e_kubeconfig(request: pytest.FixtureRequest, e2e_external: bool) -> Iterator[Path]:
    """The kubeconfig of the cluster under test."""
    if e2e_external:
        path = os.environ.get("KUBECONFIG", "")
        if not path or not Path(path).exists():
            pytest.fail("MODELPOOL_E2E_CLUSTER=external needs KUBECONFIG pointing at the cluster")
        yield Path(path)
        return
    # The session's one local control plane (the root conftest.py's `cluster` fixture).
    yield Path(request.getfixturevalue("cluster").kubeconfig)
