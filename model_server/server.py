"""What the routes of one HTTP process see of the worker: its config, the shared state, the metrics, the
way to the model (``InferenceClient``), and the ``/stats`` document of the whole worker.

Every HTTP process builds one ``ModelServer`` over the worker's shared view (``worker_view``); a test
may build one alone, over a view of its own.  Nothing here touches the model: health, readiness,
``/stats`` and ``/metrics`` are answered from shared memory, without a round trip to the inference
process, so they answer while it loads or computes.
"""

from __future__ import annotations

import time
from typing import Any

from model_server.config import ServerConfig
from model_server.inference_client import InferenceClient
from model_server.metrics import Metrics, WorkerGauges, worker_rss
from model_server.state_machine import StateMachine
from model_server.worker_view import Column, Field, WorkerView, http_row
from modelpool_contract.stats import StatsDownload, StatsMemory, StatsModel, WorkerStats


class ModelServer:
    """One HTTP process's view of the worker."""

    def __init__(self, config: ServerConfig, view: WorkerView | None = None, index: int = 0) -> None:
        self.config = config
        self.view = view if view is not None else WorkerView(config.queue_capacity, http_processes=1)
        self.state_machine = StateMachine(store=self.view.state_store())
        self.metrics = Metrics()
        self.gauges = WorkerGauges(self.view, self.state_machine)
        self.inference = InferenceClient(config, self.view, self.state_machine, self.metrics, http_row(index))

    @property
    def ready(self) -> bool:
        """Readiness: the worker serves, and every HTTP process accepts connections (until then some of
        the connections the kernel hands out would wait for one still starting)."""
        return self.state_machine.serving and self.view.http_up()

    def render_metrics(self) -> bytes:
        return self.metrics.render(self.gauges)

    def stats(self) -> dict[str, Any]:
        """The JSON the operator scrapes: ``modelpool_contract.stats.WorkerStats`` (docs/design.md),
        for the whole worker (every process's counters and memory)."""
        view = self.view
        failed_to_load = view.flag(Field.LOAD_FAILED)
        last = view.latest(Column.LAST_REQUEST)
        return WorkerStats(
            state=self.state_machine.state.value,
            state_since=self.state_machine.since,
            reason=self.state_machine.reason,
            queue_depth=view.door.taken,
            queue_capacity=self.config.queue_capacity,
            in_flight=int(view.get(Field.IN_FLIGHT)),
            last_request_time=last or None,
            requests_total=view.total(Column.REQUESTS),
            rejected_total=view.total(Column.REJECTED),
            errors_total=view.total(Column.ERRORS),
            load_error=self.state_machine.reason if failed_to_load else None,
            load_progress=view.get(Field.LOAD_PROGRESS),
            load_seconds=view.optional(Field.LOAD_SECONDS),
            warmup_seconds=view.optional(Field.WARMUP_SECONDS),
            download=self._download(),
            memory=StatsMemory(
                rss_bytes=sum(worker_rss(view).values()),
                gpu_allocated_bytes=int(view.get(Field.GPU_ALLOCATED)),
                gpu_reserved_bytes=int(view.get(Field.GPU_RESERVED)),
                gpu_peak_reserved_bytes=_count(view.optional(Field.GPU_PEAK_RESERVED)),
            ),
            model=StatsModel(name=self.config.served_name, task=self.config.task, source=self.config.model),
            time=time.time(),
        ).wire()

    def _download(self) -> StatsDownload | None:
        """An hf:// source's download progress (the inference process measures it), else None."""
        if not self.config.model.startswith("hf://"):
            return None
        return StatsDownload(
            downloaded_bytes=int(self.view.get(Field.DOWNLOADED_BYTES)),
            total_bytes=_count(self.view.optional(Field.DOWNLOAD_TOTAL_BYTES)),
        )


def _count(value: float | None) -> int | None:
    """A byte count read from the view (None: not known)."""
    return None if value is None else int(value)
