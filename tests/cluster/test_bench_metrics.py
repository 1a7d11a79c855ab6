"""The control-plane benchmark counts API requests from the API server's /metrics with prometheus-client's
parser: checked against the real API server."""

from __future__ import annotations

import pytest

from bench.controlplane import request_counts
from testkit.cluster import Cluster

pytestmark = pytest.mark.cluster


def test_request_counts_read_the_real_api_server_metrics(cluster: Cluster) -> None:
    total0, own0 = request_counts(cluster.kubectl("get", "--raw", "/metrics").stdout)
    cluster.kubectl("get", "events", "--all-namespaces")  # a request on one of the operator's resources
    total1, own1 = request_counts(cluster.kubectl("get", "--raw", "/metrics").stdout)
    assert total0 > 0
    assert total1 > total0
    assert own1 >= own0 + 1
