"""The Gateway API Inference Extension's model-server protocol, as our text-generation workers speak it.

The endpoint picker (llm-d-router's EPP; the InferencePool API stays in gateway-api-inference-extension)
scrapes every pod of an InferencePool for a handful of metrics and chooses the names by the pod's
engine-type label.  Our workers export the vLLM engine's names on their probe port, so a picker with
its defaults reads them, and the operator labels those workers ``llm-d.ai/engine-type: vllm``.

Names and labels followed: llm-d/llm-d-router v0.10.0 (71f4f0999f95b96c49a9d0c4afbd18dfdb943c26),
``pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go`` (``defaultEngineConfigs``, the
``vllm`` entry), ``mapping_registry.go`` (``DefaultEngineTypeLabelKey`` and the legacy GAIE key it still
reads) and ``extractor.go`` (the LoRA and cache-info label names); the same names are
gateway-api-inference-extension v1.5.0's (whose label key is the legacy one).  One definition here: the
server exports by these names, the operator labels by them, the docs and tests read them.
"""

from __future__ import annotations

from typing import Final

from modelpool_contract.tasks import TaskName

#: The pod label the picker reads the engine type from (llm-d-router's default key).
ENGINE_TYPE_LABEL: Final = "llm-d.ai/engine-type"
#: The key gateway-api-inference-extension's own EPP (v1.x) reads; llm-d-router falls back to it.
LEGACY_ENGINE_TYPE_LABEL: Final = "inference.networking.k8s.io/engine-type"
#: The engine whose metric names our workers export.
ENGINE_TYPE: Final = "vllm"

#: Requests waiting (our queue depth: admitted, not yet taken by the engine).
WAITING: Final = "vllm:num_requests_waiting"
#: Requests running (our in-flight count).
RUNNING: Final = "vllm:num_requests_running"
#: The KV cache in use, 0..1 (the tokens the running generations reserve over the cache's tokens).
KV_USAGE: Final = "vllm:kv_cache_usage_perc"
#: An info gauge (always 1) whose labels carry the cache's geometry.
CACHE_INFO: Final = "vllm:cache_config_info"
CACHE_BLOCK_SIZE: Final = "block_size"
CACHE_NUM_BLOCKS: Final = "num_gpu_blocks"
#: An info gauge whose labels list the LoRA adapters (comma-separated); its value is the time of the
#: sample (the picker keeps the newest series).
LORA_INFO: Final = "vllm:lora_requests_info"
LORA_RUNNING: Final = "running_lora_adapters"
LORA_WAITING: Final = "waiting_lora_adapters"
LORA_MAX: Final = "max_lora"

#: The InferencePool API (gateway-api-inference-extension, v1): the object the operator makes per pool on
#: request (``spec.inferencePool``), its resource for the chart's RBAC and the tests.
INFERENCE_GROUP: Final = "inference.networking.k8s.io"
INFERENCE_VERSION: Final = "v1"
INFERENCE_POOL_KIND: Final = "InferencePool"
INFERENCE_POOL_PLURAL: Final = "inferencepools"

#: The tasks whose workers speak the protocol: the picker is for generative language models.
PICKER_TASKS: Final[frozenset[TaskName]] = frozenset({"text-generation"})


def speaks_picker(task: str) -> bool:
    """Whether a worker of ``task`` exports the picker's metrics (and carries the engine-type labels)."""
    return task in PICKER_TASKS


def engine_labels(task: str) -> dict[str, str]:
    """The labels a worker of ``task`` carries for the picker: both keys (llm-d-router's and the one
    gateway-api-inference-extension's EPP reads), none for a task the picker does not serve."""
    if not speaks_picker(task):
        return {}
    return {ENGINE_TYPE_LABEL: ENGINE_TYPE, LEGACY_ENGINE_TYPE_LABEL: ENGINE_TYPE}


__all__ = [
    "CACHE_BLOCK_SIZE",
    "CACHE_INFO",
    "CACHE_NUM_BLOCKS",
    "ENGINE_TYPE",
    "ENGINE_TYPE_LABEL",
    "INFERENCE_GROUP",
    "INFERENCE_POOL_KIND",
    "INFERENCE_POOL_PLURAL",
    "INFERENCE_VERSION",
    "KV_USAGE",
    "LEGACY_ENGINE_TYPE_LABEL",
    "LORA_INFO",
    "LORA_MAX",
    "LORA_RUNNING",
    "LORA_WAITING",
    "PICKER_TASKS",
    "RUNNING",
    "WAITING",
    "engine_labels",
    "speaks_picker",
]
