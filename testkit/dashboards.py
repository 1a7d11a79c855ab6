"""modelpool's Grafana dashboards, made from the panel lists below: the one definition of them.

``python -m testkit.dashboards --write`` writes ``charts/modelpool-operator/files/dashboards/<uid>.json``,
which the chart ships as ConfigMaps for Grafana's dashboard sidecar (``dashboards.enabled``);
``tests/test_dashboards.py`` fails when a file differs from what this module makes, and
``e2e/test_images.py`` asks a real Prometheus that scraped the released images serving a pool for each
panel's query: every panel that needs nothing more than a serving pool returns series, and every other
query is valid PromQL.

A panel says what its series need (``needs``): nothing beyond a release serving a pool and traffic through
its gateway, a text-generation pool, a shared host (ModelHost), or an event (an eviction, a refusal): only
the first kind is required to have series in the end-to-end check; the generation and host panels are
asked of a real Prometheus scraping the worker's, the host's and the operator's metric objects fed as a
generation and a ModelHost pass feed them (``tests/test_dashboard_series.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from testkit.environment import ROOT

FOLDER = ROOT / "charts" / "modelpool-operator" / "files" / "dashboards"
Needs = Literal["", "generation", "host", "event"]
_WIDTH = 24  # Grafana's grid is 24 columns wide
_HEIGHT = 8


@dataclass(frozen=True)
class Query:
    """One series of a panel: its PromQL and its legend (Grafana's ``{{label}}`` format)."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    needs: Needs = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]


def _q(expr: str, legend: str) -> tuple[Query, ...]:
    return (Query(expr, legend),)


def _p99(metric: str, by: str) -> str:
    return f"histogram_quantile(0.99, sum by ({by}, le) (rate({metric}_bucket[5m])))"


def _p50(metric: str, by: str) -> str:
    return f"histogram_quantile(0.5, sum by ({by}, le) (rate({metric}_bucket[5m])))"


SERVING = 'state=~"Ready|Processing|Idle"'
# The PodMonitor's podTargetLabels put each worker's pool on its series as modelpool_dev_pool.
WORKER_POOL = "namespace, modelpool_dev_pool"
WORKER_LEGEND = "{{namespace}}/{{modelpool_dev_pool}}"

POOLS = Dashboard(
    "modelpool-pools",
    "modelpool / Pools",
    "Each ModelPool's workers, target and conditions as the operator last wrote them; failures, evictions, "
    "the operator's passes and its leader.",
    (
        Panel(
            "Serving workers against the target, per pool",
            (
                Query(
                    f"sum by (namespace, pool) (modelpool_operator_workers{{{SERVING}}})",
                    "{{namespace}}/{{pool}} serving",
                ),
                Query(
                    "max by (namespace, pool) (modelpool_operator_pool_target_replicas)",
                    "{{namespace}}/{{pool}} target",
                ),
            ),
        ),
        Panel("Workers by state", _q("sum by (state) (modelpool_operator_workers)", "{{state}}")),
        Panel(
            "Pools with each condition True",
            _q("sum by (condition) (modelpool_operator_pool_condition)", "{{condition}}"),
        ),
        Panel(
            "Worker failures by reason (1 h)",
            _q("sum by (reason) (increase(modelpool_operator_worker_failures_total[1h]))", "{{reason}}"),
        ),
        Panel(
            "Evictions by reason (1 h)",
            _q("sum by (reason) (increase(modelpool_operator_evictions_total[1h]))", "{{reason}}"),
            needs="event",
        ),
        Panel(
            "Operator passes per second by result",
            _q("sum by (result) (rate(modelpool_operator_reconcile_total[5m]))", "{{result}}"),
            unit="ops",
        ),
        Panel(
            "Operator pass duration (p99)",
            _q(_p99("modelpool_operator_reconcile_duration_seconds", "job"), "p99"),
            unit="s",
        ),
        Panel("Leading replicas", _q("sum(modelpool_operator_leader)", "leading")),
    ),
)

GATEWAY = Dashboard(
    "modelpool-gateway",
    "modelpool / Gateway",
    "Requests through modelpool-gateway per pool: answers by status, latency to the workers, held and "
    "in-flight requests, the workers it routes to, each API key's requests and tokens, refusals.",
    (
        Panel(
            "Answers per second by pool and status",
            _q("sum by (pool, code) (rate(modelpool_gateway_requests_total[5m]))", "{{pool}} {{code}}"),
            unit="reqps",
        ),
        Panel(
            "Latency to the worker's headers (p99)",
            _q(_p99("modelpool_gateway_upstream_seconds", "pool"), "{{pool}}"),
            unit="s",
        ),
        Panel(
            "In flight at workers, per pool",
            _q("sum by (pool) (modelpool_gateway_in_flight_requests)", "{{pool}}"),
        ),
        Panel(
            "Held while a pool wakes, per pool",
            _q("sum by (pool) (modelpool_gateway_held_requests)", "{{pool}}"),
            needs="event",
        ),
        Panel(
            "Workers routed to, per pool",
            _q("max by (pool) (modelpool_gateway_serving_workers)", "{{pool}}"),
        ),
        Panel(
            "Sent to workers by outcome",
            _q(
                "sum by (pool, outcome) (rate(modelpool_gateway_upstream_attempts_total[5m]))",
                "{{pool}} {{outcome}}",
            ),
            unit="reqps",
        ),
        Panel(
            "Requests per second by API key",
            _q("sum by (key, code) (rate(modelpool_gateway_key_requests_total[5m]))", "{{key}} {{code}}"),
            unit="reqps",
        ),
        Panel(
            "Tokens per second by API key",
            _q("sum by (key, kind) (rate(modelpool_gateway_key_tokens_total[5m]))", "{{key}} {{kind}}"),
        ),
        Panel(
            "Refused by the gateway, by reason",
            _q("sum by (pool, reason) (rate(modelpool_gateway_refused_total[5m]))", "{{pool}} {{reason}}"),
            unit="reqps",
            needs="event",
        ),
    ),
)

WORKERS = Dashboard(
    "modelpool-workers",
    "modelpool / Workers and LLMs",
    "What each pool's workers report on their probe port: requests, latency, queues, batches, memory; for "
    "text-generation pools, time to first token, inter-token latency, tokens per second and KV cache.",
    (
        Panel(
            "Requests per second by route and status",
            _q(
                f"sum by ({WORKER_POOL}, route, code) (rate(modelpool_requests_total[5m]))",
                f"{WORKER_LEGEND} {{{{route}}}} {{{{code}}}}",
            ),
            unit="reqps",
        ),
        Panel(
            "Request latency (p99) by route",
            _q(
                _p99("modelpool_request_latency_seconds", f"{WORKER_POOL}, route"),
                f"{WORKER_LEGEND} {{{{route}}}}",
            ),
            unit="s",
        ),
        Panel(
            "Queued and in flight against capacity",
            (
                Query(f"sum by ({WORKER_POOL}) (modelpool_queue_depth)", f"{WORKER_LEGEND} queued"),
                Query(f"sum by ({WORKER_POOL}) (modelpool_in_flight)", f"{WORKER_LEGEND} in flight"),
                Query(f"sum by ({WORKER_POOL}) (modelpool_queue_capacity)", f"{WORKER_LEGEND} capacity"),
            ),
        ),
        Panel(
            "Batch size (p50)",
            _q(_p50("modelpool_batch_size", WORKER_POOL), WORKER_LEGEND),
        ),
        Panel(
            "Resident memory by process",
            _q(
                f"sum by ({WORKER_POOL}, process) (modelpool_resident_memory_bytes)",
                f"{WORKER_LEGEND} {{{{process}}}}",
            ),
            unit="bytes",
        ),
        Panel(
            "Refused by workers, by reason",
            _q(
                f"sum by ({WORKER_POOL}, reason) (rate(modelpool_rejected_total[5m]))",
                f"{WORKER_LEGEND} {{{{reason}}}}",
            ),
            unit="reqps",
            needs="event",
        ),
        Panel(
            "Time to first token (p50, p99)",
            (
                Query(_p50("modelpool_time_to_first_token_seconds", WORKER_POOL), f"{WORKER_LEGEND} p50"),
                Query(_p99("modelpool_time_to_first_token_seconds", WORKER_POOL), f"{WORKER_LEGEND} p99"),
            ),
            unit="s",
            needs="generation",
        ),
        Panel(
            "Inter-token latency (p99)",
            _q(_p99("modelpool_inter_token_latency_seconds", WORKER_POOL), WORKER_LEGEND),
            unit="s",
            needs="generation",
        ),
        Panel(
            "Generated tokens per second",
            _q(f"sum by ({WORKER_POOL}) (rate(modelpool_generated_tokens_total[5m]))", WORKER_LEGEND),
            needs="generation",
        ),
        Panel(
            "KV cache reserved by running generations",
            _q(
                f"sum by ({WORKER_POOL}) (modelpool_kv_cache_reserved_tokens) / sum by ({WORKER_POOL}) "
                "(modelpool_kv_cache_tokens)",
                WORKER_LEGEND,
            ),
            unit="percentunit",
            needs="generation",
        ),
    ),
)

# A ModelHost's series from the operator, and the device memory of its pods by kind (the ledger's).
HOST = "namespace, modelhost"
HOST_LEGEND = "{{namespace}}/{{modelhost}}"
_HOST_MEMORY = f'sum by ({HOST}) (modelpool_operator_host_memory_bytes{{kind="'
_END = '"})'

BUDGET = Dashboard(
    "modelpool-budget",
    "modelpool / Budget and shared hosts",
    "The ModelBudget's memory, and each ModelHost's devices (used against capacity), its models awake and "
    "asleep, their sleeps and wakes, and the operator's control calls.",
    (
        Panel(
            "ModelBudget: total, used, reserved",
            _q("max by (kind) (modelpool_operator_budget_bytes)", "{{kind}}"),
            unit="bytes",
        ),
        Panel(
            "Shared host device memory by kind",
            _q(
                "sum by (namespace, modelhost, kind) (modelpool_operator_host_memory_bytes)",
                "{{namespace}}/{{modelhost}} {{kind}}",
            ),
            unit="bytes",
            needs="host",
        ),
        Panel(
            "Models on shared hosts by state",
            _q(
                "sum by (namespace, modelhost, state) (modelpool_operator_host_models)",
                "{{namespace}}/{{modelhost}} {{state}}",
            ),
            needs="host",
        ),
        Panel(
            "Shared host device memory used against capacity",
            (
                Query(f"{_HOST_MEMORY}capacity{_END} - {_HOST_MEMORY}free{_END}", f"{HOST_LEGEND} used"),
                Query(f"{_HOST_MEMORY}capacity{_END}", f"{HOST_LEGEND} capacity"),
            ),
            unit="bytes",
            needs="host",
        ),
        Panel(
            "Models awake and asleep, per host",
            (
                Query(
                    f"sum by ({HOST}) (modelpool_operator_host_models{{{SERVING}}})", f"{HOST_LEGEND} awake"
                ),
                Query(
                    f'sum by ({HOST}) (modelpool_operator_host_models{{state=~"Sleeping|Waking"}})',
                    f"{HOST_LEGEND} asleep",
                ),
            ),
            needs="host",
        ),
        Panel(
            "Sleeps and wakes per hour, per model",
            (
                Query(
                    "sum by (namespace, model) (increase(modelpool_sleeps_total[1h]))",
                    "{{namespace}}/{{model}} sleeps",
                ),
                Query(
                    "sum by (namespace, model) (increase(modelpool_wakes_total[1h]))",
                    "{{namespace}}/{{model}} wakes",
                ),
            ),
            needs="host",
        ),
        Panel(
            "Control calls on host pods per minute",
            _q(
                "sum by (action, result) (rate(modelpool_operator_placement_calls_total[5m])) * 60",
                "{{action}} {{result}}",
            ),
            needs="host",
        ),
    ),
)

DASHBOARDS: tuple[Dashboard, ...] = (POOLS, GATEWAY, WORKERS, BUDGET)


def _panel(panel: Panel, index: int) -> dict[str, Any]:
    """A Grafana time-series panel, two to a row."""
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {
            "h": _HEIGHT,
            "w": _WIDTH // 2,
            "x": (index % 2) * _WIDTH // 2,
            "y": (index // 2) * _HEIGHT,
        },
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + k), "expr": q.expr, "legendFormat": q.legend}
            for k, q in enumerate(panel.queries)
        ],
    }


def render(dashboard: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a data source variable, so any Prometheus can back it)."""
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": ["modelpool"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"}
            ]
        },
        "panels": [_panel(p, i) for i, p in enumerate(dashboard.panels)],
    }


def text(dashboard: Dashboard) -> str:
    return json.dumps(render(dashboard), indent=2) + "\n"


def stale() -> list[Path]:
    """The dashboard files that are not what this module makes (missing ones included)."""
    return [FOLDER / f"{d.uid}.json" for d in DASHBOARDS if _read(FOLDER / f"{d.uid}.json") != text(d)]


def _read(path: Path) -> str | None:
    return path.read_text() if path.exists() else None


def main() -> int:
    parser = argparse.ArgumentParser(description="Write or check the chart's Grafana dashboards.")
    parser.add_argument("--write", action="store_true", help="write the files (default: check them)")
    args = parser.parse_args()
    if args.write:
        FOLDER.mkdir(parents=True, exist_ok=True)
        for dashboard in DASHBOARDS:
            (FOLDER / f"{dashboard.uid}.json").write_text(text(dashboard))
        return 0
    bad = stale()
    for path in bad:
        print(f"{path.relative_to(ROOT)} is stale: run python -m testkit.dashboards --write", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
