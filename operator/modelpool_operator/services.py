"""The operator process's services: built once at startup (``start_services``), immutable, closed at cleanup.

``Services`` is what a reconciliation pass uses without owning it: the configuration, the API client, the
``/stats`` scraper, the observation cache, the sink Events are posted through and the Prometheus metrics.
Every field is required, so nothing downstream checks whether the process has started; the Kopf startup
handler (``handlers.startup``) is the one place that builds it. What the process *remembers* between passes
(reservations, wake-ups, last observations) is apart, in ``bookkeeping``.

The functions below map the configuration onto the settings each layer takes (``observe``, ``planner``,
``effects``), so that no layer reads ``OperatorConfig`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpool_operator.control_keys import load_seed
from modelpool_operator.effects.events import EventSink, KopfEventSink
from modelpool_operator.effects.host_control import HostControl, HttpHostControl
from modelpool_operator.effects.kube import KubeApi, connect
from modelpool_operator.effects.network_policy import PolicySettings
from modelpool_operator.effects.resources import PodSettings
from modelpool_operator.metrics import OperatorMetrics
from modelpool_operator.observe.observation import ObservationCache
from modelpool_operator.observe.stats import StatsScraper
from modelpool_operator.observe.worker_state import LifecycleSettings
from modelpool_operator.planner import PlannerSettings
from modelpool_operator.settings import OperatorConfig


@dataclass(frozen=True)
class Services:
    """The process's connections and services (kept in Kopf's memo as ``memo.services``)."""

    config: OperatorConfig
    kube: KubeApi
    scraper: StatsScraper
    observations: ObservationCache
    events: EventSink
    metrics: OperatorMetrics
    # Shared hosts' control API (load, unload, sleep, wake a model on a host pod).
    host_control: HostControl
    # The seed each ModelHost's control key is derived from (``control_keys.derive_control_key``).
    control_seed: bytes
    # This replica's name (the pod's; ``leader.default_identity``): the ModelBudget's status.activeOperator.
    identity: str = ""

    async def aclose(self) -> None:
        """Stop serving metrics, close the scraper's, the hosts' and the API's connections."""
        self.metrics.close()
        await self.scraper.aclose()
        await self.host_control.aclose()
        await self.kube.close()


def make_scraper(config: OperatorConfig, metrics: OperatorMetrics | None = None) -> StatsScraper:
    """The ``/stats`` scraper; the answers it drops are counted in ``metrics`` when given."""
    return StatsScraper(
        interval=config.stats_interval_seconds,
        timeout=config.stats_timeout_seconds,
        concurrency=config.stats_concurrency,
        backoff_cap=config.stats_unreachable_backoff_cap_seconds,
        default_port=config.server_port,
        on_unreadable=(lambda reason: metrics.stats_unreadable.labels(reason=reason).inc())
        if metrics is not None
        else None,
    )


async def start_services(
    config: OperatorConfig, metrics: OperatorMetrics | None = None, identity: str = ""
) -> Services:
    """The services of an operator process: metrics served (when a port is set; ``metrics``: already made
    and served, before the leader election), the API connected (its failed requests counted in the
    metrics), the scraper and the observation cache made."""
    if metrics is None:
        metrics = OperatorMetrics()
        if config.metrics_port:
            metrics.serve(config.metrics_port)
    kube = await connect(config.request_timeout_seconds, metrics.api_error)
    return Services(
        config=config,
        kube=kube,
        scraper=make_scraper(config, metrics),
        observations=ObservationCache(lifecycle_settings(config)),
        events=KopfEventSink(),
        metrics=metrics,
        host_control=HttpHostControl(),
        control_seed=load_seed(config.control_seed_file),
        identity=identity,
    )


def lifecycle_settings(config: OperatorConfig) -> LifecycleSettings:
    return LifecycleSettings(unschedulable_timeout_s=config.unschedulable_timeout_seconds)


def planner_settings(config: OperatorConfig) -> PlannerSettings:
    return PlannerSettings(
        backoff_base_s=config.backoff_base_seconds, backoff_cap_s=config.backoff_cap_seconds
    )


def pod_settings(config: OperatorConfig) -> PodSettings:
    return PodSettings(
        default_image=config.server_image,
        port=config.server_port,
        probe_port=config.server_probe_port,
        model_cache=config.model_cache,
        default_cpu=config.worker_cpu,
        otlp_endpoint=config.worker_otlp_endpoint,
        trace_sample_ratio=config.worker_trace_sample_ratio,
        log_format=config.log_format,
    )


def policy_settings(config: OperatorConfig) -> PolicySettings | None:
    """Whom the pools' NetworkPolicies admit; None when the operator makes none."""
    if not config.network_policy_enabled:
        return None
    return PolicySettings(
        namespace=config.network_policy_namespace,
        operator_labels=config.network_policy_operator_labels,
        gateway_labels=config.network_policy_gateway_labels,
        callers=config.network_policy_from,
        metrics_callers=config.network_policy_metrics_from,
    )
