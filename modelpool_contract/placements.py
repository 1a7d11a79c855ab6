"""Where a shared pool's model lives: the label of a shared host's pods and the annotation of its models.

A shared host (a ``ModelHost``'s pod running ``modelpool-server --shared-host``) serves several models.
The operator decides which (``modelpool_operator.placement``), loads them through the host's control API
under each pool's served model name (the name clients send: the gateway forwards a request unchanged),
and records the result on the host pod, so that a gateway, which may read pods but not call hosts'
control APIs, routes by it:

* the label ``modelpool.dev/host=<ModelHost name>`` (``LABEL_HOST``) marks a host pod (the gateway's and
  the operator's watches select on it);
* the annotation ``modelpool.dev/models`` (``ANNOTATION_MODELS``) holds a JSON object of the pools placed
  on that pod, by pool name (the pod's namespace is the pools'), each with the model's state on the host
  as the operator last observed it: ``{"minilm": "Ready", "gpt": "Sleeping"}``.

``models_annotation`` is the one writer, ``read_models`` the one reader: it never raises (an unreadable
annotation places nothing; an unknown state is dropped), since a gateway must keep routing whatever a pod
says.  The states are the worker states (Sleeping and Waking, a host's own, among them).
``host_model_name`` is the name a pool's model has on a host: the operator loads it under that name, the
gateway sends it in requests (the OpenAI body's ``model``, the name in a v2 URL).

``device_charge`` is what each model on a host is charged on its device while awake, in both ledgers.
``default_model_overhead`` is what each model on a host costs beyond its weights when the ModelHost
(``spec.modelOverhead``) and the host (``--model-overhead``) say nothing: both ledgers, the host's and the
operator's, charge it on the model's device for as long as the model is there, awake or asleep.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final, TypeGuard, get_args

from modelpool_contract.labels import PREFIX
from modelpool_contract.quantity import parse_quantity
from modelpool_contract.states import WorkerState

LABEL_HOST: Final = f"{PREFIX}/host"
ANNOTATION_MODELS: Final = f"{PREFIX}/models"

#: Each model on a shared host runs in an inference process of its own (isolation), which costs memory
#: that its weights do not account for, asleep as much as awake: on a GPU host its CUDA context, which
#: stays on the device while the model sleeps (300-600 MiB per process is typical); on a CPU host the
#: process's private RAM beyond its weights (torch, transformers, the interpreter: ``bench.density``
#: measured 457 MiB private per all-MiniLM-L6-v2 process, awake or asleep, 87 MiB of it the weights).
#: The defaults of ``ModelHost.spec.modelOverhead`` and of the host's ``--model-overhead``.
DEFAULT_GPU_MODEL_OVERHEAD: Final = "512Mi"
DEFAULT_CPU_MODEL_OVERHEAD: Final = "384Mi"


def default_model_overhead(*, gpu: bool) -> int:
    """Bytes each model on a host is charged on its device beyond its weights, awake or asleep, when
    nothing says otherwise: a CUDA context on a GPU host, the process's RAM on a CPU host."""
    return parse_quantity(DEFAULT_GPU_MODEL_OVERHEAD if gpu else DEFAULT_CPU_MODEL_OVERHEAD)


def device_charge(declared: int, measured: int | None) -> int:
    """What a model on a shared host is charged on its device while awake: the larger of its declared
    size (its pool's ``resources.memory``) and what its process measured (None or 0: no measurement yet).

    The one rule both ledgers import, the host's (``model_server.supervisor.host``, which refuses a load
    it has no room for) and the operator's (``modelpool_operator.placement.ledger``, which decides where
    a model goes): were the operator to credit a measurement below the declaration, it would see room the
    host does not give, and place a model the host then refuses. The declaration stays a floor, as a
    dedicated worker is charged its declaration in the ModelBudget; a measurement above it is charged, so
    an under-declared model cannot over-commit a device."""
    return max(declared, measured or 0)


_STATES: Final[frozenset[str]] = frozenset(get_args(WorkerState))


def _is_state(value: object) -> TypeGuard[WorkerState]:
    return isinstance(value, str) and value in _STATES


def models_annotation(models: Mapping[str, WorkerState]) -> str:
    """The annotation's value: the placed pools by name, in a stable order (no write when nothing changed)."""
    return json.dumps(dict(sorted(models.items())), separators=(",", ":"))


def read_models(annotations: Mapping[str, str] | None) -> dict[str, WorkerState]:
    """The pools placed on a host pod and their states; empty when the annotation is absent or unreadable."""
    raw = (annotations or {}).get(ANNOTATION_MODELS)
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {str(pool): state for pool, state in parsed.items() if _is_state(state)}


def host_model_name(pool: str) -> str:
    """The name of a pool's model on a host: the pool's name. Not its served model name, which may hold a
    ``/`` that a v2 URL's path segment cannot carry; the pools sharing a host share its namespace, where
    pool names are unique. As for a dedicated worker, the gateway rewrites the client's name to it."""
    return pool
