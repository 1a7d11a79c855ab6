"""The pure builder of a pool's InferencePool (Gateway API Inference Extension,
``inference.networking.k8s.io/v1``; issue 33): the pool's serving workers as an endpoint picker's endpoints.

Made only when the pool asks (``spec.inferencePool``), named as the pool, in its namespace, owned by it
(deleting the pool deletes it). It selects the workers by the same two labels as the pool's Service
(``modelpool.dev/pool`` and ``modelpool.dev/serving=true``): an eviction drops the serving label before the
drain starts, so a draining worker leaves the picker's endpoints as it leaves the Service, and the picker
sends it nothing new while it finishes what it holds. The target port is the workers' serving port; the
picker scrapes the metrics on their probe port (its metrics data source's ``port``, docs/operator-api.md).

The v1 schema followed: gateway-api-inference-extension v1.6.0,
``config/crd/bases/inference.networking.k8s.io_inferencepools.yaml`` (selector.matchLabels, targetPorts,
appProtocol, endpointPickerRef with its name, kind, port and failureMode); the tests install that CRD
(tests/operator/integration/testdata/).
"""

from __future__ import annotations

from typing import Any

from modelpool_contract.api import InferencePoolSpec
from modelpool_contract.labels import LABEL_MANAGED_BY, LABEL_POOL
from modelpool_contract.picker import INFERENCE_GROUP, INFERENCE_POOL_KIND, INFERENCE_VERSION
from modelpool_operator.effects.resources import (
    MANAGED_BY,
    owned_metadata,
    owner_reference,
    serving_selector,
)
from modelpool_operator.pool import PoolView


def endpoint_picker_ref(spec: InferencePoolSpec) -> dict[str, Any]:
    """The InferencePool's ``endpointPickerRef``: the picker's Service and port (group and kind written out:
    what the API server would default them to, so a later patch of ours changes nothing it filled in)."""
    return {
        "group": "",
        "kind": "Service",
        "name": spec.endpoint_picker,
        "port": {"number": spec.endpoint_picker_port},
        "failureMode": spec.failure_mode,
    }


def build_inference_pool(pool: PoolView, spec: InferencePoolSpec, port: int) -> dict[str, Any]:
    """``pool``'s InferencePool (``port``: the workers' serving port), as an API dict."""
    labels = {LABEL_POOL: pool.name, LABEL_MANAGED_BY: MANAGED_BY}
    return {
        "apiVersion": f"{INFERENCE_GROUP}/{INFERENCE_VERSION}",
        "kind": INFERENCE_POOL_KIND,
        "metadata": owned_metadata(pool.name, pool.namespace, labels, owner_reference(pool)),
        "spec": {
            "selector": {"matchLabels": serving_selector(pool.name)},
            "targetPorts": [{"number": port}],
            "appProtocol": "http",
            "endpointPickerRef": endpoint_picker_ref(spec),
        },
    }


__all__ = ["build_inference_pool", "endpoint_picker_ref"]
