"""The operator's Prometheus metrics: its own registry, served on ``GET /metrics`` (``--metrics PORT``).

Names (all prefixed ``modelpool_operator_``; docs/operator.md has example queries):

* ``reconcile_total{result}`` (ok, invalid, forbidden: refused by the operator's policy, shared: a pool
  with spec.host waiting for placement, error) and
  ``reconcile_duration_seconds``: the pool passes and how long each took.
* ``workers{namespace,pool,state}``: each pool's workers by state, as its last pass wrote them to status
  (every state is exported, zeros included; a deleted pool's series are removed).
* ``pool_target_replicas{namespace,pool}`` and ``pool_condition{namespace,pool,condition}`` (1 while the
  condition is True, else 0; every condition type is exported): the rest of what the last pass wrote,
  what the chart's alerts need to tell a pool that should serve from one at zero on purpose.
* ``budget_bytes{kind}`` (total, used, reserved): the ModelBudget as the operator last wrote its status.
* ``evictions_total{reason}`` (IdleTimeout, Preempted, RollOver, ScaleDown) and
  ``worker_failures_total{reason}`` (OOMKilled, LoadFailed, ...; an unknown reason counts as Other).
* ``api_errors_total{operation,code}``: the operator's own API requests that failed (code: the HTTP
  status, or ``error`` when no answer came).
* ``host_memory_bytes{namespace,modelhost,pod,device,kind}`` (capacity, awake, asleep, overhead, free): each
  shared host pod's devices as the ModelHost's last status counted them (a host pod gone, its series too),
  and ``host_models{namespace,modelhost,state}``: the models on a ModelHost's pods by state.
* ``placement_calls_total{action,result}`` (load, sleep, unload; ok, failed): control calls on host pods.
* ``foreign_pods_total``: pods labelled ``modelpool.dev/pool`` that no pool or ModelHost owns (by
  controller owner reference and uid): never counted in the ledger nor touched, each counted once.
* ``stats_unreadable_total{reason}`` (too_large, deadline, invalid): workers' ``/stats`` answers dropped
  unread: over the size bound, not whole by the deadline, or not a JSON object (the stats are unknown).
* ``leader``: 1 on the replica that acts (it holds the leader election Lease, or runs without an
  election), 0 on a standby (``modelpool_operator.leader``).
* ``process_*``: prometheus-client's process collector (CPU, resident memory, open files).

Cardinality is bounded: no label names a worker; ``pool`` grows with the pools, each adding a series per
state; ``pod`` names only host pods (five series per device).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.process_collector import ProcessCollector

from modelpool_contract.api import ConditionType, ModelHostStatus, ModelPoolStatus
from modelpool_contract.states import WORKER_STATES
from modelpool_operator.observe.worker_state import FAILURE_REASONS
from modelpool_operator.pool import PoolKey

PREFIX = "modelpool_operator"
HOST_MEMORY_KINDS = ("capacity", "awake", "asleep", "overhead", "free")
POOL_CONDITIONS: tuple[str, ...] = get_args(ConditionType)
# A pass takes milliseconds when nothing changes, up to seconds when many workers are created.
_PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


@dataclass
class PassOutcome:
    """How a reconciliation pass ended (set by the pass; ``error`` when it raised)."""

    result: str = "ok"


class OperatorMetrics:
    """Every metric object of one operator process, and the HTTP server that exposes them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.passes = Counter(f"{PREFIX}_reconcile", "Pool reconciliation passes", ["result"], registry=r)
        self.pass_seconds = Histogram(
            f"{PREFIX}_reconcile_duration_seconds",
            "Duration of one pool reconciliation pass",
            buckets=_PASS_BUCKETS,
            registry=r,
        )
        self.workers = Gauge(
            f"{PREFIX}_workers", "Workers by state per pool", ["namespace", "pool", "state"], registry=r
        )
        self.target = Gauge(
            f"{PREFIX}_pool_target_replicas",
            "Each pool's status.targetReplicas",
            ["namespace", "pool"],
            registry=r,
        )
        self.conditions = Gauge(
            f"{PREFIX}_pool_condition",
            "1 while a pool's condition is True, else 0",
            ["namespace", "pool", "condition"],
            registry=r,
        )
        self.budget = Gauge(
            f"{PREFIX}_budget_bytes", "The ModelBudget: total, used, reserved", ["kind"], registry=r
        )
        self.evictions = Counter(
            f"{PREFIX}_evictions", "Worker evictions started, by reason", ["reason"], registry=r
        )
        self.failures = Counter(
            f"{PREFIX}_worker_failures", "Workers seen failing, by reason", ["reason"], registry=r
        )
        self.api_errors = Counter(
            f"{PREFIX}_api_errors",
            "Failed Kubernetes API requests of the operator's own calls",
            ["operation", "code"],
            registry=r,
        )
        self.host_memory = Gauge(
            f"{PREFIX}_host_memory_bytes",
            "Each shared host pod's device memory as the ModelHost's ledger counts it",
            ["namespace", "modelhost", "pod", "device", "kind"],
            registry=r,
        )
        self.host_models = Gauge(
            f"{PREFIX}_host_models",
            "Models on a ModelHost's pods by state",
            ["namespace", "modelhost", "state"],
            registry=r,
        )
        self.placement_calls = Counter(
            f"{PREFIX}_placement_calls",
            "Control calls on shared host pods, by action and result",
            ["action", "result"],
            registry=r,
        )
        self.foreign_pods = Counter(
            f"{PREFIX}_foreign_pods",
            "Pods labelled modelpool.dev/pool that no pool or ModelHost owns: ignored, counted once each",
            registry=r,
        )
        self.stats_unreadable = Counter(
            f"{PREFIX}_stats_unreadable",
            "Workers' /stats answers dropped: over the size bound, past the deadline, or not a JSON object",
            ["reason"],
            registry=r,
        )
        self.leader = Gauge(
            f"{PREFIX}_leader",
            "1 while this replica acts (holds the leader election Lease, or runs without an election), "
            "0 while it stands by",
            registry=r,
        )
        # The host_memory series each ModelHost last set, so a host pod or device gone loses its series.
        # Every failure reason from 0: Prometheus's increase() counts no rise in a series' first sample, so
        # a reason's first failure would never fire an alert (files/alerts.yaml) if its series began at 1.
        for reason in (*sorted(FAILURE_REASONS), "Other"):
            self.failures.labels(reason=reason)
        self._host_series: dict[tuple[str, str], set[HostSeries]] = {}
        self._server: object | None = None

    def serve(self, port: int) -> None:
        """Serve ``/metrics`` on all addresses in a background thread (prometheus-client's own server)."""
        server, _ = start_http_server(port, addr="0.0.0.0", registry=self.registry)
        self._server = server

    def close(self) -> None:
        shutdown = getattr(self._server, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self._server = None

    @contextmanager
    def reconcile_pass(self) -> Iterator[PassOutcome]:
        """Time one pass and count it by outcome (a cancelled pass, the daemon stopping, is not counted)."""
        outcome = PassOutcome()
        started = time.perf_counter()
        try:
            yield outcome
        except asyncio.CancelledError:
            outcome.result = ""
            raise
        except Exception:
            outcome.result = "error"
            raise
        finally:
            if outcome.result:
                self.passes.labels(result=outcome.result).inc()
                self.pass_seconds.observe(time.perf_counter() - started)

    def pool_written(self, key: PoolKey, previous: ModelPoolStatus, status: ModelPoolStatus) -> None:
        """A pass wrote ``status`` over ``previous``: the pool's workers by state, and failures new in it."""
        counts = dict.fromkeys(WORKER_STATES, 0)
        for worker in status.workers:
            counts[worker.state] += 1
        for state, count in counts.items():
            self.workers.labels(namespace=key[0], pool=key[1], state=state).set(count)
        self.target.labels(namespace=key[0], pool=key[1]).set(status.target_replicas or 0)
        true = {c.type for c in status.conditions if c.status == "True"}
        for condition in POOL_CONDITIONS:
            self.conditions.labels(namespace=key[0], pool=key[1], condition=condition).set(condition in true)
        failed_before = {w.name for w in previous.workers if w.state == "Failed"}
        for worker in status.workers:
            if worker.state == "Failed" and worker.name not in failed_before:
                reason = worker.reason if worker.reason in FAILURE_REASONS else "Other"
                self.failures.labels(reason=reason).inc()

    def pool_gone(self, key: PoolKey) -> None:
        """The pool's daemon stopped: drop its series."""
        for state in WORKER_STATES:
            with suppress(KeyError):
                self.workers.remove(key[0], key[1], state)
        with suppress(KeyError):
            self.target.remove(key[0], key[1])
        for condition in POOL_CONDITIONS:
            with suppress(KeyError):
                self.conditions.remove(key[0], key[1], condition)

    def host_written(self, namespace: str, name: str, status: ModelHostStatus) -> None:
        """A ModelHost pass wrote ``status``: its host pods' device memory and its models by state."""
        values = host_memory_series(namespace, name, status)
        for gone in self._host_series.get((namespace, name), set()) - values.keys():
            with suppress(KeyError):
                self.host_memory.remove(*gone)
        for labels, amount in values.items():
            self.host_memory.labels(*labels).set(amount)
        self._host_series[(namespace, name)] = set(values)
        counts = dict.fromkeys(WORKER_STATES, 0)
        for pod in status.hosts:
            for model in pod.models:
                counts[model.state] += 1
        for state, count in counts.items():
            self.host_models.labels(namespace=namespace, modelhost=name, state=state).set(count)

    def host_gone(self, namespace: str, name: str) -> None:
        """The ModelHost's daemon stopped: drop its series."""
        for labels in self._host_series.pop((namespace, name), set()):
            with suppress(KeyError):
                self.host_memory.remove(*labels)
        for state in WORKER_STATES:
            with suppress(KeyError):
                self.host_models.remove(namespace, name, state)

    def placement_call(self, action: str, ok: bool) -> None:
        self.placement_calls.labels(action=action, result="ok" if ok else "failed").inc()

    def evicted(self, reason: str) -> None:
        self.evictions.labels(reason=reason).inc()

    def leading(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def budget_written(self, total: int | None, used: int, reserved: int) -> None:
        if total is not None:
            self.budget.labels(kind="total").set(total)
        self.budget.labels(kind="used").set(used)
        self.budget.labels(kind="reserved").set(reserved)

    def api_error(self, operation: str, code: int | None) -> None:
        self.api_errors.labels(operation=operation, code=str(code) if code else "error").inc()


HostSeries = tuple[str, str, str, str, str]


def host_memory_series(namespace: str, name: str, status: ModelHostStatus) -> dict[HostSeries, int]:
    """The ``host_memory_bytes`` series of a ModelHost's status: labels -> bytes, per pod, device, kind."""
    return {
        (namespace, name, pod.name, str(device.index), kind): getattr(device, f"{kind}_bytes")
        for pod in status.hosts
        for device in pod.devices
        for kind in HOST_MEMORY_KINDS
    }
