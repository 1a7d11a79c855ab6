"""The pure builders of the NetworkPolicies of a pool's workers and of a ModelHost's host pods: who may
reach them, port by port.

One NetworkPolicy per ModelPool (``modelpool-<pool>``), in the pool's namespace, owned by the pool (deleting
the pool deletes it), selecting the pool's workers (label ``modelpool.dev/pool``). Two ingress rules and
nothing else, so every other caller is refused by a CNI that enforces NetworkPolicy:

* the serving port (``http``): the gateway's pods, the operator's pods (which scrape ``/stats`` there from
  workers made before the probe port) and the callers the installer names;
* the probe port (``probes``: health, ``/stats``, ``/metrics``): the operator's pods and the metrics
  scrapers the installer names. The kubelet's probes are not subject to NetworkPolicy.

A pool with ``spec.inferencePool`` admits its endpoint picker's pods on both ports too (``picker_peers``).

One per ModelHost too (``modelhost-<host>``: no pool's policy has that prefix), owned by the ModelHost and
selecting its host pods (``modelpool.dev/pool=host_<host>``): the serving port admits whom a pool's admits;
the probe port carries the host's control API (load, unload, sleep, wake), so it admits the operator's pods
alone (a host serves no ``/metrics`` there for scrapers).

The operator and the gateway are named by their pods' labels in their own namespace (the chart's release
namespace), which the operator is given in its settings: it cannot see them from the pool. Nothing here
calls the API; ``reconcile`` builds and ``kube`` sends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelpool_contract.labels import HTTP_PORT_NAME, LABEL_MANAGED_BY, LABEL_POOL, PROBE_PORT_NAME
from modelpool_operator.effects.network_peers import NetworkPolicyPeer
from modelpool_operator.effects.resources import (
    MANAGED_BY,
    host_labels,
    host_owner_reference,
    owned_metadata,
    owner_reference,
)
from modelpool_operator.host import HostView, host_pool_label
from modelpool_operator.pool import PoolView

# The label every namespace carries (set by the API server since 1.22): how a peer names one namespace.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class PolicySettings:
    """Whom a pool's NetworkPolicy admits besides nobody (mapped from the operator's configuration)."""

    # The namespace of the operator's and the gateway's pods (the chart's release namespace).
    namespace: str
    # The operator's pod labels: admitted on both ports.
    operator_labels: Mapping[str, str]
    # The gateway's pod labels (empty: no gateway is admitted): the serving port.
    gateway_labels: Mapping[str, str] = field(default_factory=dict)
    # Other callers of the serving port, and scrapers of the probe port.
    callers: tuple[NetworkPolicyPeer, ...] = ()
    metrics_callers: tuple[NetworkPolicyPeer, ...] = ()


def policy_name(pool_name: str) -> str:
    """The pool's NetworkPolicy: prefixed, so that it never takes over a policy of the user's."""
    return f"modelpool-{pool_name}"


def host_policy_name(host_name: str) -> str:
    """The ModelHost's NetworkPolicy: another prefix than a pool's, so that no pool's name can take it."""
    return f"modelhost-{host_name}"


def _pods_in(namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": dict(labels)},
    }


def _rule(port_name: str, peers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"ports": [{"port": port_name, "protocol": "TCP"}], "from": peers}


def _serving(settings: PolicySettings) -> list[dict[str, Any]]:
    """Who may call the serving port: the operator's pods, the gateway's, the callers the installer names."""
    serving = [_pods_in(settings.namespace, settings.operator_labels)]
    if settings.gateway_labels:
        serving.append(_pods_in(settings.namespace, settings.gateway_labels))
    return serving + [peer.wire() for peer in settings.callers]


def _policy(
    metadata: dict[str, Any],
    selector: Mapping[str, str],
    probes: list[dict[str, Any]],
    serving: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress"],
            "ingress": [_rule(PROBE_PORT_NAME, probes), _rule(HTTP_PORT_NAME, serving)],
        },
    }


def picker_peers(pool: PoolView) -> list[dict[str, Any]]:
    """The endpoint picker's pods of a pool with ``spec.inferencePool`` (in its namespace, else the pool's):
    they scrape the workers' metrics on the probe port and poll ``/v1/models`` on the serving port."""
    spec = pool.spec.inference_pool
    if spec is None:
        return []
    return [_pods_in(spec.picker_namespace or pool.namespace, spec.picker_pod_labels)]


def build_network_policy(pool: PoolView, settings: PolicySettings) -> dict[str, Any]:
    """The NetworkPolicy of ``pool``'s workers, as an API dict (owned by the pool when its uid is known)."""
    operator = _pods_in(settings.namespace, settings.operator_labels)
    picker = picker_peers(pool)
    probes = [operator, *(peer.wire() for peer in settings.metrics_callers), *picker]
    labels = {LABEL_POOL: pool.name, LABEL_MANAGED_BY: MANAGED_BY}
    metadata = owned_metadata(policy_name(pool.name), pool.namespace, labels, owner_reference(pool))
    return _policy(metadata, {LABEL_POOL: pool.name}, probes, _serving(settings) + picker)


def build_host_network_policy(host: HostView, settings: PolicySettings) -> dict[str, Any]:
    """The NetworkPolicy of ``host``'s host pods (owned by the ModelHost when its uid is known): the
    serving port as a pool's, the probe port (the control API) the operator alone."""
    metadata = owned_metadata(
        host_policy_name(host.name), host.namespace, host_labels(host), host_owner_reference(host)
    )
    operator = _pods_in(settings.namespace, settings.operator_labels)
    return _policy(metadata, {LABEL_POOL: host_pool_label(host.name)}, [operator], _serving(settings))
