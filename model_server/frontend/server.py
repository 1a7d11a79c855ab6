"""What the routes of one HTTP process see of the worker: its config, the shared state, the metrics, the
way to the model (``InferenceClient``), and the ``/stats`` document of the whole worker.

Every HTTP process builds one ``ModelServer`` over the worker's shared view (``worker_view``); a test
may build one alone, over a view of its own.  Nothing here touches the model: health, readiness,
``/stats`` and ``/metrics`` are answered from shared memory, without a round trip to the inference
process, so they answer while it loads or computes.
"""

from __future__ import annotations

from typing import Any

from model_server import worker_stats
from model_server.config import ServerConfig
from model_server.frontend.inference_client import InferenceClient
from model_server.metrics import Metrics, WorkerGauges
from model_server.state_machine import StateMachine
from model_server.worker_view import WorkerView, http_row
from modelpool_contract.picker import speaks_picker


class ModelServer:
    """One HTTP process's view of the worker."""

    def __init__(
        self,
        config: ServerConfig,
        view: WorkerView | None = None,
        index: int = 0,
        metrics_model: str | None = None,
    ) -> None:
        """``metrics_model``: the ``model`` label of its counters (a shared host's model; see ``Metrics``)."""
        self.config = config
        self.view = view if view is not None else WorkerView(config.queue_capacity, http_processes=1)
        self.state_machine = StateMachine(store=self.view.state_store())
        self.metrics = Metrics(model=metrics_model)
        # The endpoint picker's names on a dedicated text-generation worker (a shared host's models are no
        # picker's endpoints: it scrapes pods, and a host pod holds many models).
        picker = metrics_model is None and speaks_picker(config.task)
        self.gauges = WorkerGauges(
            self.view,
            self.state_machine,
            picker=picker,
            adapters=list(config.adapters),
            max_adapters=config.max_adapters,
        )
        self.inference = InferenceClient(config, self.view, self.state_machine, self.metrics, http_row(index))

    @property
    def ready(self) -> bool:
        return worker_stats.ready(self.state_machine, self.view)

    def render_metrics(self) -> bytes:
        return self.metrics.render(self.gauges)

    def stats(self) -> dict[str, Any]:
        return worker_stats.stats(self.config, self.view, self.state_machine)


__all__ = ["ModelServer"]
