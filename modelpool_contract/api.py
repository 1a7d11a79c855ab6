"""The ModelPool, ModelBudget and ModelHost API (group ``modelpool.dev``, ``v1alpha1``) as pydantic models.

This module is the one source of the resources' shape: ``crdgen`` (in the operator) turns these models
into the CRD YAML (field descriptions become ``kubectl explain`` text), the operator parses specs and
writes status through them, and the gateway reads the pools it routes to with them.  It lives in the
contract (pydantic only: no kopf, no torch) so that the gateway need not import the operator.  Python
attributes are snake_case; the wire is camelCase (``by_alias``).

Validation here mirrors the CRD schema (enum, quantity pattern, source schemes, min <= replicas <= max),
so a spec that reaches the operator by another road (tests, an old CRD) is still refused with the same
field-naming message.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from modelpool_contract.flags import (
    BATCH_DELAY_MS,
    DEFAULT_MAX_LOADED_ADAPTERS,
    MAX_ADAPTERS,
    MAX_BATCH_SIZE,
    MAX_QUEUE_CAPACITY,
    QUEUE_CAPACITY,
    REQUEST_TIMEOUT_S,
    Dtype,
    EncoderRuntime,
)
from modelpool_contract.labels import GROUP
from modelpool_contract.messages import Message
from modelpool_contract.picker import speaks_picker
from modelpool_contract.placements import (
    DEFAULT_CPU_MODEL_OVERHEAD,
    DEFAULT_GPU_MODEL_OVERHEAD,
    default_model_overhead,
)
from modelpool_contract.quantity import QUANTITY_PATTERN, QuantityError, parse_quantity
from modelpool_contract.states import WorkerState
from modelpool_contract.tasks import TaskName

VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
MODELPOOL_KIND = "ModelPool"
MODELPOOL_PLURAL = "modelpools"
MODELBUDGET_KIND = "ModelBudget"
MODELBUDGET_PLURAL = "modelbudgets"
MODELHOST_KIND = "ModelHost"
MODELHOST_PLURAL = "modelhosts"

# A pool's summary phase.
PoolPhase = Literal["Pending", "Loading", "Ready", "Degraded", "Failed", "Idle", "ScaledToZero"]
ConditionType = Literal[
    "Ready", "Progressing", "Degraded", "BudgetExceeded", "MemoryExceedsCharge", "ApiError", "PolicyViolation"
]
ConditionStatus = Literal["True", "False", "Unknown"]

# Model sources the server can resolve: a local path, file://, hf://org/name[@rev], pvc://claim/path.
SOURCE_PATTERN = r"^(/|file:///|hf://[^/@\s]+/[^@\s]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/|$))"
_SOURCE_RE = re.compile(SOURCE_PATTERN)

# A name the gateway routes by (spec.servedModelName): one or two dot/dash/underscore/colon-separated
# segments, such as "minilm", "all-MiniLM-L6-v2" or "sentence-transformers/all-MiniLM-L6-v2".
SERVED_NAME_SEGMENT = r"[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?"
SERVED_NAME_PATTERN = rf"^{SERVED_NAME_SEGMENT}(/{SERVED_NAME_SEGMENT})?$"
#: An alias of this shape reads as ``namespace/name`` (a DNS-1123 label, then an object name): the gateway
#: resolves ``namespace/name`` before any alias, and a pool may take an alias of this shape only under its
#: own namespace (``alias_claims_namespace``), so no pool can answer to another namespace's pool name.
NAMESPACED_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_NAMESPACED_NAME_RE = re.compile(NAMESPACED_NAME_PATTERN)
DEFAULT_ACTIVATION_TIMEOUT_SECONDS = 120


def alias_claims_namespace(alias: str | None, namespace: str) -> str | None:
    """The other namespace ``alias`` would speak for (``team-b`` for ``team-b/llama`` on a pool of
    ``team-a``), or None when the alias is not shaped like ``namespace/name`` or names the pool's own."""
    if not alias or _NAMESPACED_NAME_RE.match(alias) is None:
        return None
    claimed = alias.split("/", 1)[0]
    return None if claimed == namespace else claimed


# A Kubernetes quantity: an integer (never negative: the CRD's int-or-string schema carries the bound, since
# its quantity pattern only constrains the string form) or a quantity string.
Quantity = Annotated[int, Field(ge=0)] | str

#: The server container's RAM request on GPU pools when ``resources.hostMemory`` is unset: enough for the
#: Python process with torch, transformers and a CUDA context; weights go to the accelerator.
DEFAULT_GPU_HOST_MEMORY = "2Gi"
# A PersistentVolumeClaim's name (a DNS-1123 subdomain).
CLAIM_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# A ModelHost's name, as spec.host names it (a DNS-1123 subdomain, like every object name).
HOST_NAME_PATTERN = CLAIM_NAME_PATTERN
CacheType = Literal["none", "pvc", "hostPath"]
#: What the autoscaler counts the load in (``spec.autoscaling.metric``).
AutoscalingMetric = Literal["requests", "tokens", "kvCache"]


class _Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields ignored (the API server prunes them)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        validate_assignment=False,
    )

    def wire(self) -> dict[str, Any]:
        """The camelCase JSON form, without unset optional fields (``None``)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def _cel(rule: str, message: str) -> ConfigDict:
    """A model's config that carries one CEL rule into its CRD schema (``crdgen`` keeps
    ``x-kubernetes-validations``): the API server then refuses what the model's own validator refuses."""
    return ConfigDict(json_schema_extra={"x-kubernetes-validations": [{"rule": rule, "message": message}]})


def _check_quantity(value: Quantity | None, field: str) -> Quantity | None:
    if value is None:
        return None
    try:
        parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(f"{field}: {exc}") from None
    return value


# ---- ModelPool spec -----------------------------------------------------------------------------------


class ModelCacheSpec(_Model):
    """Where workers keep hf:// downloads: each in its own emptyDir, or in a cache the workers share."""

    type: CacheType = Field(
        description=(
            "none: each worker downloads into its own emptyDir; pvc: a PersistentVolumeClaim in the pool's "
            "namespace (ReadWriteMany, so workers on every node share it); hostPath: a directory on each "
            "node, shared by the workers on that node."
        )
    )
    claim_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=CLAIM_NAME_PATTERN,
        description="type pvc: the claim's name.",
    )
    path: str | None = Field(
        default=None,
        max_length=4096,
        pattern=r"^/",
        description="type hostPath: the node's directory (created when missing; writable by uid 10001).",
    )

    @model_validator(mode="after")
    def _named(self) -> ModelCacheSpec:
        # Same rules and messages as the CRD's CEL validations.
        if self.type == "pvc" and not self.claim_name:
            raise ValueError(MSG_CACHE_CLAIM)
        if self.type == "hostPath" and not self.path:
            raise ValueError(MSG_CACHE_PATH)
        return self


MSG_CACHE_CLAIM = "spec.model.cache.claimName is required when type is pvc"
MSG_CACHE_PATH = "spec.model.cache.path is required when type is hostPath"


class ModelSpec(_Model):
    """Which model the workers serve, and how the server loads it."""

    source: str = Field(
        description=(
            "Where the model is: a local path (/models/x or file:///models/x), a Hugging Face repository "
            "(hf://org/name[@revision]) or a PersistentVolumeClaim (pvc://claim/sub/path)."
        ),
        min_length=1,
        # Bounded so the CEL rule's cost estimate stays small (the API server refuses unbounded costs).
        max_length=2048,
        pattern=SOURCE_PATTERN,
    )
    task: TaskName = Field(
        description=(
            "What the model does: text-embedding, text-generation, image-embedding, vision or text-to-image."
        )
    )
    revision: str | None = Field(
        default=None,
        description="A revision (branch, tag or commit) for hf:// sources; overrides an @revision suffix.",
    )
    dtype: Dtype = Field(
        default="auto",
        description="Weights dtype: auto (float16 on GPU, float32 on CPU), float32, float16 or bfloat16.",
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Allow the model repository's own Python code to run (off unless you trust the source).",
    )
    # Unset rather than "torch" by default: a field with a value would change every pool's template hash.
    runtime: EncoderRuntime | None = Field(
        default=None,
        description=(
            "What a text-embedding model's forward pass runs on: torch (eager PyTorch, the default) or "
            "onnxruntime (ONNX Runtime on CPUs, the model exported at load from the same weights; needs the "
            "server image's onnx extra). Where onnxruntime cannot serve (a GPU, the extra missing, an export "
            "that fails) the worker serves on torch and logs why. Other tasks always run on torch."
        ),
    )
    cache: ModelCacheSpec | None = Field(
        default=None,
        description=(
            "Where hf:// downloads are kept (other sources need no cache). Unset: the operator's default "
            "(the chart's config.modelCacheType), which is an emptyDir per worker unless set otherwise."
        ),
    )


class ResourcesSpec(_Model):
    """What one worker needs, and what it is charged against the ModelBudget (memory)."""

    gpus: int = Field(
        default=0, ge=0, le=16, description="nvidia.com/gpu per worker (0 runs the model on CPU)."
    )
    memory: Quantity = Field(
        description=(
            "What one worker is charged against the ModelBudget while it exists and has not failed (a "
            "Kubernetes quantity such as 24Gi): its accelerator memory on GPU pools, its RAM on CPU pools. "
            "The operator compares it with the peak accelerator memory each worker reports and warns when "
            "a worker uses more (condition MemoryExceedsCharge)."
        )
    )
    host_memory: Quantity | None = Field(
        default=None,
        description=(
            "The server container's RAM, as its memory request and limit. Unset: on GPU pools 2Gi requested "
            "and no limit (the weights live on the accelerator); on CPU pools the memory field, requested "
            "and limited (the weights live in RAM)."
        ),
    )
    cpu: Quantity | None = Field(
        default=None,
        description=(
            "CPU request per worker (a quantity such as 2 or 500m; no limit); unset: the operator's "
            "default_worker_cpu (1 CPU unless configured; 0 there: none). The operator passes it to "
            "the server (the downward API), which sizes the model's CPU threads to it where no CPU limit "
            "caps the pod: workers that share a node then do not each run one thread per core."
        ),
    )
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=(
            "The model's CPU threads per worker (torch's intra-op and inter-op pools and the tokenizer's): "
            "the server's --intra-op-threads. Unset: sized from the container's CPU limit, else from "
            "the CPU request (rounded down, at least 1), else torch's default (one per core)."
        ),
    )

    @field_validator("memory")
    @classmethod
    def _memory_is_quantity(cls, value: Quantity) -> Quantity:
        _check_quantity(value, "resources.memory")
        if parse_quantity(value) <= 0:
            raise ValueError("resources.memory must be greater than 0")
        return value

    @field_validator("host_memory")
    @classmethod
    def _host_memory_is_quantity(cls, value: Quantity | None) -> Quantity | None:
        _check_quantity(value, "resources.hostMemory")
        if value is not None and parse_quantity(value) <= 0:
            raise ValueError("resources.hostMemory must be greater than 0")
        return value

    @field_validator("cpu")
    @classmethod
    def _cpu_is_quantity(cls, value: Quantity | None) -> Quantity | None:
        return _check_quantity(value, "resources.cpu")

    @property
    def memory_bytes(self) -> int:
        """``memory`` in bytes."""
        return parse_quantity(self.memory)

    def container_memory(self) -> tuple[int, int | None]:
        """The server container's RAM as (request, limit) in bytes; limit None: no limit (see
        ``host_memory``)."""
        if self.host_memory is not None:
            return parse_quantity(self.host_memory), parse_quantity(self.host_memory)
        if self.gpus > 0:
            return parse_quantity(DEFAULT_GPU_HOST_MEMORY), None
        return self.memory_bytes, self.memory_bytes


class QueueSpec(_Model):
    """The server's bounded request queue and dynamic batching."""

    capacity: int = Field(
        default=QUEUE_CAPACITY,
        ge=1,
        le=MAX_QUEUE_CAPACITY,
        description="Requests that may wait per worker; one more is answered 429 with Retry-After.",
    )
    max_batch_size: int = Field(
        default=MAX_BATCH_SIZE,
        ge=1,
        le=4096,
        description="Most items merged into one forward pass (embedding tasks).",
    )
    max_batch_delay_ms: int = Field(
        default=BATCH_DELAY_MS,
        ge=0,
        le=10_000,
        description="Longest a batch waits for more items before it runs, in milliseconds.",
    )
    request_timeout_seconds: float = Field(
        default=REQUEST_TIMEOUT_S,
        gt=0,
        le=3600,
        description="Deadline of a request in seconds (clients may shorten it); expired requests get 504.",
    )


class Toleration(_Model):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, description="The taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (default Equal)."
    )
    value: str | None = Field(default=None, description="The taint value to match (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )


# ---- scheduling: affinity, topology spread, disruption ---------------------------------------------------

#: The most entries of each scheduling list a spec may hold (terms, expressions, constraints): bounded, so
#: the CRD's and the admission policy's CEL stay within the API server's cost budget and a pod spec stays
#: small; far above what placing a pool needs.
SCHEDULING_LIST_MAX = 8
#: The most values one selector expression may list.
SELECTOR_VALUES_MAX = 64
#: A label key's longest form (a 253-character DNS prefix, '/', a 63-character name).
LABEL_KEY_MAX = 317

#: The CRD's and the operator's refusal of a pod affinity term reaching beyond the pool's namespace.
MSG_AFFINITY_NAMESPACES = (
    "podAffinityTerm: namespaces and namespaceSelector are not supported: a pool's pod affinity and "
    "anti-affinity select pods of its own namespace only (a term reaching other namespaces would place "
    "or keep away another tenant's pods)"
)


class LabelSelectorRequirement(_Model):
    """One expression of a label selector (meta/v1 LabelSelectorRequirement)."""

    key: str = Field(min_length=1, max_length=LABEL_KEY_MAX, description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="How the key is matched.")
    values: list[str] | None = Field(
        default=None, max_length=SELECTOR_VALUES_MAX, description="The values (In, NotIn)."
    )


class LabelSelector(_Model):
    """A label selector over pods of the pool's own namespace (meta/v1 LabelSelector)."""

    match_labels: dict[str, str] | None = Field(default=None, description="Labels a pod must carry.")
    match_expressions: list[LabelSelectorRequirement] | None = Field(
        default=None, max_length=SCHEDULING_LIST_MAX, description="Expressions a pod's labels must meet."
    )


class NodeSelectorRequirement(_Model):
    """One expression over a node's labels (core/v1 NodeSelectorRequirement)."""

    key: str = Field(
        min_length=1,
        max_length=LABEL_KEY_MAX,
        description="The node label key: one the operator allows (config.allowedNodeSelectorKeys).",
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"] = Field(
        description="How the key is matched."
    )
    values: list[str] | None = Field(
        default=None, max_length=SELECTOR_VALUES_MAX, description="The values (In, NotIn, Gt, Lt)."
    )


class NodeSelectorTerm(_Model):
    """Node label expressions, all of which a node must meet (core/v1 NodeSelectorTerm; matchFields, which
    names nodes, is not supported)."""

    match_expressions: list[NodeSelectorRequirement] | None = Field(
        default=None, max_length=SCHEDULING_LIST_MAX, description="Expressions over the node's labels."
    )


class NodeSelector(_Model):
    """Terms of which a node must meet at least one."""

    node_selector_terms: list[NodeSelectorTerm] = Field(
        min_length=1, max_length=SCHEDULING_LIST_MAX, description="The terms (ORed)."
    )


class PreferredSchedulingTerm(_Model):
    """A weighted node preference."""

    weight: int = Field(ge=1, le=100, description="Weight (1-100) added to a node that meets the term.")
    preference: NodeSelectorTerm = Field(description="The node label expressions.")


class NodeAffinity(_Model):
    """Which nodes the pods may (required) or would rather (preferred) run on, by node labels."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = Field(
        default=None, description="Nodes the pods must run on."
    )
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] | None = Field(
        default=None, max_length=SCHEDULING_LIST_MAX, description="Nodes the pods would rather run on."
    )


class PodAffinityTerm(_Model):
    """Pods of the pool's own namespace, and the topology (node, zone) to be near them in or away from."""

    model_config = _cel("!has(self.namespaces) && !has(self.namespaceSelector)", MSG_AFFINITY_NAMESPACES)

    label_selector: LabelSelector | None = Field(
        default=None, description="The pods, in the pool's own namespace (unset: none)."
    )
    topology_key: str = Field(
        min_length=1,
        max_length=LABEL_KEY_MAX,
        description="The node label whose value makes one domain (kubernetes.io/hostname: a node).",
    )
    namespaces: list[str] | None = Field(
        default=None, max_length=SCHEDULING_LIST_MAX, description="Not supported: refused when set."
    )
    namespace_selector: LabelSelector | None = Field(
        default=None, description="Not supported: refused when set."
    )

    @model_validator(mode="after")
    def _own_namespace(self) -> PodAffinityTerm:
        if self.namespaces is not None or self.namespace_selector is not None:
            raise ValueError(MSG_AFFINITY_NAMESPACES)
        return self


class WeightedPodAffinityTerm(_Model):
    """A weighted pod (anti-)affinity preference."""

    weight: int = Field(ge=1, le=100, description="Weight (1-100) added to a node that meets the term.")
    pod_affinity_term: PodAffinityTerm = Field(description="The pods and the topology.")


class PodAffinity(_Model):
    """Pod affinity or anti-affinity: terms the scheduler must (required) or would rather (preferred) meet."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] | None = Field(
        default=None, max_length=SCHEDULING_LIST_MAX, description="Terms every placement must meet."
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] | None = Field(
        default=None, max_length=SCHEDULING_LIST_MAX, description="Terms a placement would rather meet."
    )


class Affinity(_Model):
    """Scheduling affinity (core/v1 Affinity): node affinity within the operator's node label keys, pod
    (anti-)affinity within the pool's own namespace."""

    node_affinity: NodeAffinity | None = Field(
        default=None,
        description="By node labels; every key must be one the operator allows (as nodeSelector's).",
    )
    pod_affinity: PodAffinity | None = Field(default=None, description="Near pods of the own namespace.")
    pod_anti_affinity: PodAffinity | None = Field(
        default=None, description="Away from pods of the own namespace."
    )


class TopologySpreadConstraint(_Model):
    """How the pods spread over a topology (core/v1 TopologySpreadConstraint; its selector counts pods of
    the pool's own namespace, as the API's always does)."""

    max_skew: int = Field(ge=1, le=1000, description="The most the pod count may differ between domains.")
    topology_key: str = Field(
        min_length=1,
        max_length=LABEL_KEY_MAX,
        description="The node label whose value makes one domain (kubernetes.io/hostname: a node).",
    )
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"] = Field(
        description="DoNotSchedule (a hard rule) or ScheduleAnyway (a preference)."
    )
    label_selector: LabelSelector | None = Field(
        default=None, description="The pods counted (e.g. modelpool.dev/pool: <pool>, the pool's workers)."
    )
    min_domains: int | None = Field(
        default=None, ge=1, le=1000, description="Fewest domains to count (DoNotSchedule only)."
    )
    node_affinity_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether the pods' node affinity limits the domains counted."
    )
    node_taints_policy: Literal["Honor", "Ignore"] | None = Field(
        default=None, description="Whether node taints limit the domains counted."
    )


#: A pool's or ModelHost's default ``disruption.maxUnavailable``.
DEFAULT_MAX_UNAVAILABLE = 1


class DisruptionSpec(_Model):
    """How many of the pods may be down at once for voluntary disruptions: a node drain's evictions (the
    PodDisruptionBudget the operator makes) and the operator's own roll-over when the budget leaves no room
    for a surge."""

    max_unavailable: int = Field(
        default=DEFAULT_MAX_UNAVAILABLE,
        ge=0,
        le=1000,
        description=(
            "Serving pods that may be down at once. A drain evicts a serving pod only while at least the "
            "target count minus this many serve (the PodDisruptionBudget modelpool-<name>); a roll-over "
            "that cannot surge replaces pods one by one, never below the serving count before it minus "
            "this many. 0: a drain never evicts a serving pod (it waits until the count is lowered or this "
            "raised) and a roll-over waits for room for a new pod first. Pods not ready (Pending, Loading) "
            "are always evictable: they serve nothing."
        ),
    )


class SecretKey(_Model):
    """One key of a Secret (or ConfigMap) in the pool's namespace."""

    name: str = Field(min_length=1, max_length=253, description="The object's name, in the pool's namespace.")
    key: str = Field(min_length=1, max_length=253, description="The key within it.")


class KeySelector(SecretKey):
    """One key of a Secret or ConfigMap in the pool's namespace, for an environment variable."""

    optional: bool | None = Field(
        default=None, description="Start the worker even when the object or key is missing."
    )


class EnvVarSource(_Model):
    """Where a variable's value comes from: exactly one Secret key or ConfigMap key."""

    model_config = _cel(
        "has(self.secretKeyRef) != has(self.configMapKeyRef)",
        "valueFrom needs exactly one of secretKeyRef and configMapKeyRef",
    )

    secret_key_ref: KeySelector | None = Field(
        default=None, description="A key of a Secret (e.g. a Hugging Face token), never shown in the spec."
    )
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")

    @model_validator(mode="after")
    def _exactly_one(self) -> EnvVarSource:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError("valueFrom needs exactly one of secretKeyRef and configMapKeyRef")
        return self


class EnvVar(_Model):
    """An environment variable for the server container: a plain value, or a Secret or ConfigMap key."""

    model_config = _cel(
        "!(has(self.value) && has(self.valueFrom))", "an env entry has either value or valueFrom, not both"
    )

    name: str = Field(min_length=1, max_length=256, description="Variable name.")
    value: str | None = Field(default=None, description="Variable value (plain text in the spec).")
    value_from: EnvVarSource | None = Field(
        default=None, description="Take the value from a Secret or ConfigMap key instead (e.g. HF_TOKEN)."
    )

    @model_validator(mode="after")
    def _value_or_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("an env entry has either value or valueFrom, not both")
        return self


class PodTemplate(_Model):
    """Extra settings copied onto every worker pod."""

    labels: dict[str, str] = Field(default_factory=dict, description="Labels added to worker pods.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations added to worker pods.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels a worker's node must have."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints worker pods tolerate (e.g. nvidia.com/gpu)."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="Environment variables for the server container (value, or valueFrom a Secret key).",
    )
    service_account_name: str | None = Field(
        default=None, description="The service account worker pods run as."
    )
    automount_service_account_token: bool | None = Field(
        default=None,
        description=(
            "Mount the service account's API token into worker pods. Unset or false: no token, since the "
            "server runs user-supplied code (trustRemoteCode, any image), which should find no credentials."
        ),
    )
    priority_class_name: str | None = Field(
        default=None, description="The PriorityClass of worker pods (scheduler priority, not budget)."
    )
    image_pull_secrets: list[str] = Field(
        default_factory=list, description="Names of Secrets used to pull the server image."
    )
    runtime_class_name: str | None = Field(
        default=None, description="The RuntimeClass of worker pods (e.g. nvidia)."
    )
    affinity: Affinity | None = Field(
        default=None,
        description=(
            "Node affinity (its keys within the operator's allowed node label keys, as nodeSelector's) and "
            "pod (anti-)affinity over pods of the pool's own namespace."
        ),
    )
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        default=None,
        max_length=SCHEDULING_LIST_MAX,
        description=(
            "How workers spread over nodes or zones. Unset: one soft spread over nodes (maxSkew 1, "
            "kubernetes.io/hostname, ScheduleAnyway, over the pool's workers), so that one node's drain or "
            "failure takes as few of them as the nodes allow; [] for none."
        ),
    )


class AutoscalingSpec(_Model):
    """How the operator moves the worker count between minReplicas and maxReplicas with the load."""

    enabled: bool | None = Field(
        default=None,
        description=(
            "Move the worker count with the load the workers report. Unset: on when maxReplicas > "
            "minReplicas. Set it to false when an HPA or KEDA scales the pool through the scale "
            "subresource (spec.replicas); then spec.replicas is the count, as without autoscaling."
        ),
    )
    metric: AutoscalingMetric = Field(
        default="requests",
        description=(
            "What the load is counted in: requests (in flight plus queued, against targetPerWorker), "
            "tokens (the KV-cache tokens the running generations reserve, prompt plus max_tokens, against "
            "targetTokensPerWorker) or kvCache (the share of each worker's KV cache reserved, against "
            "targetKvCache). tokens and kvCache are for text-generation pools on the continuous-batching "
            "engine: a worker that reports no KV cache has an unknown load."
        ),
    )
    target_per_worker: int = Field(
        default=10,
        ge=1,
        le=100_000,
        description=(
            "metric requests: requests in flight plus queued per worker the autoscaler aims for: it wants "
            "ceil(load / targetPerWorker) workers, the load summed over the serving workers."
        ),
    )
    target_tokens_per_worker: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description=(
            "metric tokens (required with it): KV-cache tokens reserved per worker the autoscaler aims for: "
            "it wants ceil(tokens / targetTokensPerWorker) workers, the tokens summed over the serving "
            "workers. At most a worker's KV cache (--kv-cache-tokens) is useful."
        ),
    )
    target_kv_cache: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "metric kvCache (required with it): the share of each worker's KV cache, in (0, 1], the "
            "autoscaler aims for: it wants ceil(sum of the workers' shares / targetKvCache) workers, i.e. "
            "the mean share over the serving workers brought to the target."
        ),
    )
    scale_up_window_seconds: int = Field(
        default=10,
        ge=1,
        le=300,
        description=(
            "The burst window: when the load averaged over it asks for more than twice the current "
            "workers, the count rises to that at once (never falls while bursting)."
        ),
    )
    stable_window_seconds: int = Field(
        default=60,
        ge=1,
        le=600,
        description=(
            "The calm window: outside bursts the count follows the load averaged over it "
            "(at least scaleUpWindowSeconds)."
        ),
    )
    scale_down_delay_seconds: int = Field(
        default=120,
        ge=0,
        le=3600,
        description=(
            "The count falls only after the load has asked for fewer workers for this long, and then to "
            "the most it asked for meanwhile; only idle workers go, least recently used first. Going to "
            "zero is idleTimeoutSeconds' job: the autoscaler keeps at least one worker."
        ),
    )

    @model_validator(mode="after")
    def _windows(self) -> AutoscalingSpec:
        # Same rules and messages as the CRD's CEL validations.
        if self.stable_window_seconds < self.scale_up_window_seconds:
            raise ValueError(MSG_STABLE_GE_UP_WINDOW)
        if self.metric == "tokens" and self.target_tokens_per_worker is None:
            raise ValueError(MSG_TOKENS_TARGET)
        if self.metric == "kvCache" and self.target_kv_cache is None:
            raise ValueError(MSG_KV_CACHE_TARGET)
        return self


class AuthSpec(_Model):
    """Who may call the workers."""

    api_key_secret: SecretKey | None = Field(
        default=None,
        description=(
            "A Secret key holding the API key: mounted read-only into every worker and passed to the "
            "server as --api-key-file. Requests without the key are answered 401; only the health routes "
            "stay open (the probes). /stats and /metrics answer without the key on the probe port."
        ),
    )


#: A LoRA adapter's source: a Hugging Face repository or a PersistentVolumeClaim (never a path of the node).
ADAPTER_SOURCE_PATTERN = r"^(hf://[^/@\s]+/[^@\s]+|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/|$))"
MSG_ADAPTER_SOURCE = "spec.adapters[].source must be hf://org/name[@revision] or pvc://claim/sub/path"
MSG_ADAPTER_UNIQUE = "spec.adapters[].name must be unique within the pool"
MSG_ADAPTER_SERVED_NAME = (
    "spec.adapters[].name must differ from spec.servedModelName: that name serves the base model"
)
MSG_ADAPTER_POOL_NAME = (
    "spec.adapters[].name must differ from the pool's name: that name serves the base model"
)
MSG_ADAPTER_TASK = "spec.adapters needs spec.model.task text-generation (LoRA adapters of a causal LM)"


class AdapterSpec(_Model):
    """A LoRA adapter of the pool's model, served under its own name (the request's ``model``)."""

    name: str = Field(
        min_length=1,
        max_length=253,
        pattern=SERVED_NAME_PATTERN,
        description=(
            "The name a request's model field selects the adapter by (through modelpool-gateway and on the "
            "workers, as vLLM does); unique in the pool, never the pool's name or servedModelName."
        ),
    )
    source: str = Field(
        min_length=1,
        max_length=2048,
        pattern=ADAPTER_SOURCE_PATTERN,
        description=(
            "Where the adapter is (a PEFT LoRA folder: adapter_config.json and its weights): "
            "hf://org/name[@revision] or pvc://claim/sub/path."
        ),
    )


def adapter_refusal(spec: ModelPoolSpec, pool_name: str | None = None) -> str | None:
    """Pure: the first rule ``spec.adapters`` breaks (the CRD's CEL rules say the same), None: none."""
    names = [a.name for a in spec.adapters]
    if not names:
        return None
    if spec.model.task != "text-generation":
        return MSG_ADAPTER_TASK
    if len(set(names)) != len(names):
        return MSG_ADAPTER_UNIQUE
    if spec.served_model_name is not None and spec.served_model_name in names:
        return MSG_ADAPTER_SERVED_NAME
    if pool_name is not None and pool_name in names:
        return MSG_ADAPTER_POOL_NAME
    return None


#: The endpoint picker's gRPC port (its ext_proc service) as its Service exposes it: the port llm-d-router's
#: and gateway-api-inference-extension's charts give it.
DEFAULT_PICKER_PORT = 9002
PickerFailureMode = Literal["FailOpen", "FailClose"]


class InferencePoolSpec(_Model):
    """The InferencePool (Gateway API Inference Extension, ``inference.networking.k8s.io/v1``) the operator
    makes for the pool: its serving workers as an endpoint picker's endpoints."""

    endpoint_picker: str = Field(
        min_length=1,
        max_length=253,
        description=(
            "The endpoint picker's Service in the pool's namespace (the InferencePool's endpointPickerRef): "
            "an llm-d-router or gateway-api-inference-extension EPP the installer runs."
        ),
    )
    endpoint_picker_port: int = Field(
        default=DEFAULT_PICKER_PORT, ge=1, le=65535, description="That Service's port (its gRPC ext_proc)."
    )
    failure_mode: PickerFailureMode = Field(
        default="FailClose",
        description=(
            "What the gateway does while the picker does not answer: FailClose refuses the request, "
            "FailOpen sends it to a worker of its own choosing."
        ),
    )
    picker_pod_labels: dict[str, str] = Field(
        min_length=1,
        description=(
            "The picker's pod labels: the pool's NetworkPolicy admits those pods on the workers' probe "
            "port (the metrics they scrape) and serving port (/v1/models)."
        ),
    )
    picker_namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        description="The picker pods' namespace; unset: the pool's.",
    )


class ModelPoolSpec(_Model):
    """The desired pool: a model, a task, how many workers and what each one needs."""

    model: ModelSpec = Field(description="The model the workers serve.")
    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description=(
            "Workers wanted while the pool is in use; idle workers are scaled down towards minReplicas."
        ),
    )
    min_replicas: int = Field(
        default=0, ge=0, le=1000, description="Idle scale-down never goes below this many workers."
    )
    max_replicas: int = Field(default=10, ge=1, le=1000, description="Upper bound for replicas.")
    resources: ResourcesSpec = Field(description="What one worker needs and is charged.")
    queue: QueueSpec = Field(default_factory=QueueSpec, description="The bounded queue and batching.")
    idle_timeout_seconds: int = Field(
        default=300,
        ge=0,
        description=(
            "A worker idle (no requests) longer than this is evicted, down to minReplicas; 0 disables "
            "idle eviction."
        ),
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description=(
            "Budget priority: when memory is short, idle workers of lower-priority pools are evicted first."
        ),
    )
    autoscaling: AutoscalingSpec = Field(
        default_factory=AutoscalingSpec,
        description=(
            "Autoscaling between minReplicas and maxReplicas on the load the workers report; on by default "
            "when maxReplicas > minReplicas. While on, spec.replicas is the starting count (a change of it "
            "sets the count once, e.g. kubectl scale)."
        ),
    )
    image: str | None = Field(
        default=None, description="The model server image; unset: the operator's default image."
    )
    pod_template: PodTemplate = Field(
        default_factory=PodTemplate, description="Labels, scheduling and env copied onto worker pods."
    )
    auth: AuthSpec | None = Field(default=None, description="API-key authentication of the workers.")
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=SERVED_NAME_PATTERN,
        description=(
            "Another name clients may use for this pool through modelpool-gateway (the OpenAI body's "
            "model, or the name in a KServe v2 URL), besides the pool name and namespace/name; e.g. "
            "sentence-transformers/all-MiniLM-L6-v2. Letters, digits, '.', '_', ':', '-', at most one '/'."
        ),
    )
    host: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=HOST_NAME_PATTERN,
        description=(
            "The ModelHost (same namespace) whose shared host pods serve this model, each beside other "
            "models on the same GPUs; unset: dedicated workers, one pod per worker. On a shared pool "
            "replicas, minReplicas and maxReplicas count the hosts that hold the model, resources.memory "
            "is the model's declared size (charged on its device until its server measures it), and the "
            "pod-level fields (image, podTemplate, auth, resources.gpus/hostMemory/cpu) belong to the "
            "ModelHost: set there, refused here."
        ),
    )
    disruption: DisruptionSpec = Field(
        default_factory=DisruptionSpec,
        description=(
            "Voluntary disruptions: how many serving workers a node drain or a roll-over without room for "
            "a surge may take down at once (the operator makes a PodDisruptionBudget per pool)."
        ),
    )
    inference_pool: InferencePoolSpec | None = Field(
        default=None,
        description=(
            "An InferencePool (inference.networking.k8s.io/v1, named as the pool, owned by it) selecting "
            "the pool's serving workers, for an endpoint picker behind a Gateway API gateway; a worker being "
            "drained leaves it, as it leaves the pool's Service. Text-generation pools only (the workers "
            "export the picker's metrics); the InferencePool CRD must be installed."
        ),
    )
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        max_length=MAX_ADAPTERS,
        description=(
            "LoRA adapters of a text-generation pool's model, each selected by a request's model field "
            "(its name) and applied per request: requests for different adapters and the base share one "
            "batch. A worker loads an adapter on its first request and keeps at most maxLoadedAdapters."
        ),
    )
    max_loaded_adapters: int = Field(
        default=DEFAULT_MAX_LOADED_ADAPTERS,
        ge=1,
        le=MAX_ADAPTERS,
        description=(
            "Adapters a worker keeps in memory at once; a request for another evicts the least recently "
            "used one that no running request uses (429 while every loaded one is in use)."
        ),
    )
    activation_timeout_seconds: int = Field(
        default=DEFAULT_ACTIVATION_TIMEOUT_SECONDS,
        ge=1,
        le=3600,
        description=(
            "How long modelpool-gateway holds a request for this pool while no worker serves it (scaled "
            "to zero, or still loading), within the client's own deadline; then it answers 503 saying why."
        ),
    )

    @model_validator(mode="after")
    def _replica_bounds(self) -> ModelPoolSpec:
        # Same rules and messages as the CRD's CEL validations.
        if self.min_replicas > self.replicas:
            raise ValueError(MSG_MIN_LE_REPLICAS)
        if self.replicas > self.max_replicas:
            raise ValueError(MSG_REPLICAS_LE_MAX)
        # Only when spec.autoscaling is written: the API server then fills in targetPerWorker's default,
        # and a pool whose workers can never hold the target would never scale up by its queues.
        written = "autoscaling" in self.model_fields_set
        policy = self.autoscaling
        if written and policy.metric == "requests" and policy.target_per_worker > self.queue.capacity:
            raise ValueError(MSG_TARGET_LE_CAPACITY)
        if self.inference_pool is not None and not speaks_picker(self.model.task):
            raise ValueError(MSG_INFERENCE_POOL_TASK)
        adapters = adapter_refusal(self)
        if adapters is not None:
            raise ValueError(adapters)
        if self.host is not None:
            refused = shared_pool_refusals(self)
            if refused:
                raise ValueError(refused[0])
        return self


MSG_MIN_LE_REPLICAS = "spec.minReplicas must be less than or equal to spec.replicas"
MSG_REPLICAS_LE_MAX = "spec.replicas must be less than or equal to spec.maxReplicas"
MSG_TARGET_LE_CAPACITY = (
    "spec.autoscaling.targetPerWorker must be less than or equal to spec.queue.capacity (a worker holds at "
    "most spec.queue.capacity queued requests)"
)
MSG_INFERENCE_POOL_TASK = (
    "spec.inferencePool needs spec.model.task text-generation: the endpoint picker reads the metrics only "
    "text-generation workers export"
)
MSG_STABLE_GE_UP_WINDOW = (
    "spec.autoscaling.stableWindowSeconds must be at least spec.autoscaling.scaleUpWindowSeconds"
)
MSG_TOKENS_TARGET = (
    "spec.autoscaling.targetTokensPerWorker is required when spec.autoscaling.metric is tokens (the KV-cache "
    "tokens reserved per worker to aim for, at least 1)"
)
MSG_KV_CACHE_TARGET = (
    "spec.autoscaling.targetKvCache is required when spec.autoscaling.metric is kvCache (the share of each "
    "worker's KV cache to aim for, greater than 0 and at most 1)"
)


def _pod_template_unset() -> str:
    """CEL: ``spec.podTemplate`` absent or asking for nothing (``{}``, or empty maps and lists, as a client
    that writes the model's defaults sends it)."""
    parts = []
    for name, info in PodTemplate.model_fields.items():
        wire = info.alias or to_camel(name)
        if info.default_factory is not None:
            parts.append(f"(!has(self.podTemplate.{wire}) || size(self.podTemplate.{wire}) == 0)")
        else:
            parts.append(f"!has(self.podTemplate.{wire})")
    return "!has(self.podTemplate) || (" + " && ".join(parts) + ")"


# A shared pool (spec.host) runs in its ModelHost's pods: the fields that shape a pod of its own are the
# host's. Each: (the field's path under spec, the CEL condition that it is unset, the message). The CRD
# carries the same rules (crdgen), so `kubectl apply` and the operator refuse with the same words.
SHARED_POOL_RULES: tuple[tuple[str, str, str], ...] = (
    (
        "image",
        "!has(self.image)",
        "spec.image is the ModelHost's on a shared pool (spec.host): set the image on the ModelHost, or "
        "remove spec.host for dedicated workers",
    ),
    (
        "podTemplate",
        _pod_template_unset(),
        "spec.podTemplate is the ModelHost's on a shared pool (spec.host): the model runs in the host's "
        "pods (set nodeSelector and tolerations on the ModelHost), or remove spec.host",
    ),
    (
        "disruption",
        "!has(self.disruption) || !has(self.disruption.maxUnavailable) || "
        f"self.disruption.maxUnavailable == {DEFAULT_MAX_UNAVAILABLE}",
        "spec.disruption is the ModelHost's on a shared pool (spec.host): the host pods' disruption budget "
        "is set on the ModelHost, or remove spec.host",
    ),
    (
        "auth",
        "!has(self.auth)",
        "spec.auth is not supported on a shared pool (spec.host): the host's pods serve several models "
        "behind one door; remove spec.auth, or remove spec.host for dedicated workers",
    ),
    (
        "inferencePool",
        "!has(self.inferencePool)",
        "spec.inferencePool is not supported on a shared pool (spec.host): an InferencePool selects pods, "
        "and a host pod serves several models; remove spec.inferencePool, or remove spec.host",
    ),
    (
        "adapters",
        "!has(self.adapters) || size(self.adapters) == 0",
        "spec.adapters is not supported on a shared pool (spec.host): use dedicated workers for a model "
        "with LoRA adapters, or remove spec.adapters",
    ),
    (
        "resources.gpus",
        "!has(self.resources.gpus) || self.resources.gpus == 0",
        "spec.resources.gpus must be 0 or unset on a shared pool (spec.host): the ModelHost's gpusPerHost "
        "gives the GPUs, and spec.resources.memory the model's share of one",
    ),
    (
        "resources.hostMemory",
        "!has(self.resources.hostMemory)",
        "spec.resources.hostMemory is the ModelHost's on a shared pool (spec.host): set hostMemory on the "
        "ModelHost (RAM for sleeping models), or remove spec.host",
    ),
    (
        "resources.cpu",
        "!has(self.resources.cpu)",
        "spec.resources.cpu is the ModelHost's on a shared pool (spec.host): set resources.cpu on the "
        "ModelHost, or remove spec.host",
    ),
)


def shared_pool_refusals(spec: ModelPoolSpec) -> list[str]:
    """The messages of the ``SHARED_POOL_RULES`` a pool with ``spec.host`` breaks (empty: none, or not a
    shared pool). Fields at their defaults count as unset, as the API server's ``has()`` sees them."""
    if spec.host is None:
        return []
    written = {
        "image": spec.image is not None,
        "podTemplate": spec.pod_template != PodTemplate(),
        "disruption": spec.disruption != DisruptionSpec(),
        "auth": spec.auth is not None,
        "inferencePool": spec.inference_pool is not None,
        "adapters": bool(spec.adapters),
        "resources.gpus": spec.resources.gpus != 0,
        "resources.hostMemory": spec.resources.host_memory is not None,
        "resources.cpu": spec.resources.cpu is not None,
    }
    return [message for field, _, message in SHARED_POOL_RULES if written[field]]


def autoscaling_enabled(spec: ModelPoolSpec) -> bool:
    """Whether the operator moves the count with the load: ``autoscaling.enabled``, else maxReplicas >
    minReplicas."""
    enabled = spec.autoscaling.enabled
    return spec.max_replicas > spec.min_replicas if enabled is None else enabled


def replica_ceiling(spec: ModelPoolSpec) -> int:
    """The most workers the pool may aim for: maxReplicas while autoscaling, spec.replicas otherwise.  A
    pool at zero is woken by demand only when it is at least one (the operator's rule; the gateway tells
    held requests whether it will)."""
    return spec.max_replicas if autoscaling_enabled(spec) else spec.replicas


# ---- ModelPool status ---------------------------------------------------------------------------------


class MeasuredMemory(_Model):
    """Accelerator memory a worker's server reports in /stats (its CUDA caching allocator)."""

    reserved: str = Field(description="Reserved now (a quantity).")
    reserved_bytes: int = Field(description="The same in bytes.")
    peak: str | None = Field(default=None, description="The most it has reserved since it started.")
    peak_bytes: int | None = Field(default=None, description="The same in bytes.")

    @property
    def highest(self) -> int:
        """The peak when reported, else what is reserved now."""
        return self.peak_bytes if self.peak_bytes is not None else self.reserved_bytes


class WorkerGeneration(_Model):
    """A text-generation worker's engine figures, from its /stats (``generation``)."""

    engine: str = Field(
        description=(
            "continuous-batching (requests join and leave the running batch at token boundaries) or serial "
            "(one generate at a time: no KV-cache figures)."
        )
    )
    running: int | None = Field(default=None, description="Generations running now.")
    tokens_in_flight: int | None = Field(
        default=None,
        description="KV-cache tokens the running generations reserve (prompt plus max_tokens each).",
    )
    kv_cache_tokens: int | None = Field(default=None, description="The worker's KV cache, in tokens.")
    kv_cache_use: float | None = Field(
        default=None, description="tokensInFlight / kvCacheTokens: the share of the cache reserved (0 to 1)."
    )


class WorkerStatus(_Model):
    """One worker as the operator last saw it."""

    name: str = Field(description="The worker's pod name.")
    state: WorkerState = Field(
        description="Pending, Loading, Ready, Processing, Idle, Sleeping, Waking, Evicting, Dead or Failed."
    )
    since: str | None = Field(default=None, description="When the worker entered this state (RFC 3339).")
    node: str | None = Field(default=None, description="The node the worker runs on.")
    memory: str = Field(
        default="0", description="Memory charged against the budget (a quantity; 0 once failed)."
    )
    queue_depth: int | None = Field(
        default=None, description="Requests waiting in the worker's queue (unset: stats unknown)."
    )
    last_request_time: str | None = Field(
        default=None, description="When the worker last received a request (RFC 3339)."
    )
    restarts: int = Field(default=0, description="Container restarts the kubelet reports.")
    reason: str | None = Field(
        default=None, description="Why the worker is in this state (e.g. LoadFailed, OOMKilled)."
    )
    message: Message | None = Field(default=None, description="Details, e.g. the termination message.")
    load_progress: float | None = Field(
        default=None, description="Load progress between 0 and 1 while Loading, when the server reports it."
    )
    downloaded_bytes: int | None = Field(
        default=None,
        description=(
            "While Loading an hf:// model: bytes of its files in the worker's cache so far (files another "
            "worker already fetched into a shared cache count)."
        ),
    )
    download_total_bytes: int | None = Field(
        default=None, description="While Loading an hf:// model: bytes of all the files it needs."
    )
    template_hash: str | None = Field(
        default=None, description="The spec revision the worker was built from."
    )
    accelerator_memory: MeasuredMemory | None = Field(
        default=None,
        description="Accelerator memory the worker reports (unset on CPU pools and while unknown).",
    )
    generation: WorkerGeneration | None = Field(
        default=None,
        description=(
            "A text-generation worker's engine, running generations, tokens in flight and KV-cache use "
            "(unset for other tasks and while unknown)."
        ),
    )
    adapters: list[str] | None = Field(
        default=None,
        description=(
            "The LoRA adapters (spec.adapters names) the worker holds in memory now, as its /stats says "
            "(unset: none declared, or unknown); modelpool-gateway sends an adapter's requests to workers "
            "holding it first."
        ),
    )
    host: str | None = Field(
        default=None,
        description=(
            "A shared pool's replica: the host pod (of spec.host's ModelHost) its model lives on; the "
            "replica is named after it. Unset for a dedicated worker."
        ),
    )
    device: int | None = Field(
        default=None,
        description=(
            "A shared pool's replica: the index of the host pod's device its model lives on (GPU i is cuda:i "
            "in the host pod). Unset for a dedicated worker and while unknown."
        ),
    )


class MemoryStatus(_Model):
    """Memory the pool is charged."""

    charged: str = Field(default="0", description="Total memory charged for this pool's workers.")
    charged_bytes: int = Field(default=0, description="The same in bytes.")
    waiting_bytes: int = Field(
        default=0,
        description=(
            "Memory the pool wants but the budget could not admit (0 when not blocked); lower-priority "
            "pools leave freed memory to it."
        ),
    )
    declared: str | None = Field(
        default=None, description="What each worker is charged: spec.resources.memory (a quantity)."
    )
    measured_peak: str | None = Field(
        default=None,
        description=(
            "The highest accelerator-memory peak any current worker reports (unset on CPU pools and while "
            "no worker reports one)."
        ),
    )
    measured_peak_bytes: int | None = Field(default=None, description="The same in bytes.")


class Condition(_Model):
    """A standard Kubernetes condition."""

    type: str = Field(
        description=(
            "A pool's: Ready, Progressing, Degraded, BudgetExceeded, MemoryExceedsCharge, ApiError (the "
            "last pass's failed API requests, with the API server's message) or PolicyViolation; a "
            "budget's: Valid."
        )
    )
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="A CamelCase reason.")
    message: Message = Field(default="", description="A human-readable explanation.")
    last_transition_time: str | None = Field(default=None, description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(
        default=None, description="The spec generation this condition was computed for."
    )


class BackoffStatus(_Model):
    """Failure backoff: replacements of failed workers wait until nextAttemptAfter."""

    failures: int = Field(default=0, description="Consecutive worker failures.")
    next_attempt_after: str | None = Field(
        default=None, description="No worker is created before this time (RFC 3339)."
    )
    last_worker: str | None = Field(default=None, description="The worker that failed last.")
    last_reason: str | None = Field(
        default=None, description="Why it failed (LoadFailed, OOMKilled, ...), kept after its pod is gone."
    )
    last_message: Message | None = Field(default=None, description="Details of the last failure.")


class AutoscalingStatus(_Model):
    """What the autoscaler sees and decided (the load fields are filled also when it is off)."""

    enabled: bool = Field(default=False, description="Whether the autoscaler moves the count.")
    desired_replicas: int | None = Field(
        default=None, description="The count the pool aims for (targetReplicas; the DESIRED column)."
    )
    recommended_replicas: int | None = Field(
        default=None,
        description="What the load asks for now, within [max(minReplicas, 1), maxReplicas] (unset: unknown).",
    )
    observed_load: int | None = Field(
        default=None,
        description=(
            "The load as last observed, in the unit of spec.autoscaling.metric: requests in flight plus "
            "queued over the serving workers (or their reserved KV-cache tokens, or their KV-cache use in "
            "percent of one worker's cache, summed), plus the requests they refused (estimated from the "
            "rate of refusals) and, with metric requests, the requests held at the gateway while no worker "
            "serves and the requests the gateway refused because its hold was full."
        ),
    )
    held_requests: int | None = Field(
        default=None,
        description=(
            "Requests held at the gateway for the pool, counted in the load (while no worker serves and "
            "the gateway's count on the demand Lease is fresh; unset otherwise)."
        ),
    )
    last_scale_time: str | None = Field(
        default=None, description="When the autoscaler or a wake from zero last changed the count (RFC 3339)."
    )
    scale_down_since: str | None = Field(
        default=None,
        description="Since when the load has asked for fewer workers than desired (the delay runs).",
    )
    scale_down_to: int | None = Field(
        default=None, description="The most workers the load asked for since scaleDownSince."
    )
    scaled_to_zero_at: str | None = Field(
        default=None,
        description="When the pool last reached zero workers; only demand recorded after it wakes the pool.",
    )
    woken_by_demand_at: str | None = Field(
        default=None,
        description=(
            "The demand that woke the pool from zero, until one of its workers exists: when that demand is "
            "older than activationTimeoutSeconds before a worker could be created (the budget), the wake "
            "is dropped."
        ),
    )


class PoolGeneration(_Model):
    """A text-generation pool's engine figures, summed over its serving workers that report them."""

    running: int = Field(default=0, description="Generations running on the serving workers.")
    tokens_in_flight: int = Field(
        default=0, description="KV-cache tokens the running generations reserve, over the serving workers."
    )
    kv_cache_use: float | None = Field(
        default=None,
        description="The mean share of the serving workers' KV caches reserved (0 to 1; unset: unknown).",
    )


class RolloutStatus(_Model):
    """A roll-over in progress (workers of an older template hash remain)."""

    ready_before: int = Field(
        description=(
            "Serving workers when the roll-over began: without room in the budget for a surge it never "
            "brings the pool below this count (or the target, when lower) minus "
            "spec.disruption.maxUnavailable."
        ),
    )


class ModelPoolStatus(_Model):
    """What the operator observed and decided; written only by the operator."""

    phase: PoolPhase | None = Field(
        default=None, description="Pending, Loading, Ready, Degraded, Failed, Idle or ScaledToZero."
    )
    replicas: int = Field(default=0, description="Workers that exist and have not failed.")
    ready_replicas: int = Field(default=0, description="Workers able to serve (Ready, Processing, Idle).")
    target_replicas: int | None = Field(
        default=None,
        description="Workers the operator currently aims for (replicas, lowered by idle scale-down).",
    )
    spec_replicas: int | None = Field(
        default=None, description="spec.replicas when targetReplicas was last reset to it."
    )
    ready_text: str | None = Field(default=None, description="ready/desired, for kubectl get.")
    workers: list[WorkerStatus] = Field(default_factory=list, description="Every worker of the pool.")
    memory: MemoryStatus = Field(default_factory=MemoryStatus, description="Memory charged.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Ready, Progressing, Degraded, BudgetExceeded, MemoryExceedsCharge, ApiError, PolicyViolation."
        ),
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation the status reflects."
    )
    backoff: BackoffStatus = Field(
        default_factory=BackoffStatus, description="Replacement backoff after failures."
    )
    selector: str | None = Field(
        default=None, description="Label selector of the pool's workers (for the scale subresource)."
    )
    autoscaling: AutoscalingStatus = Field(
        default_factory=AutoscalingStatus, description="The autoscaler's view: desired count, load, times."
    )
    generation: PoolGeneration | None = Field(
        default=None,
        description=(
            "Text-generation pools: running generations, tokens in flight and mean KV-cache use over the "
            "serving workers (unset for other tasks and while no serving worker reports them)."
        ),
    )
    rollout: RolloutStatus | None = Field(
        default=None, description="The roll-over in progress, if any (unset: every worker is current)."
    )


# ---- ModelBudget --------------------------------------------------------------------------------------


#: What an operator does while its ModelBudget does not exist (its ``missing_budget`` setting, the chart's
#: ``config.missingBudget``): admit every worker, or refuse them all until the budget exists.
MissingBudget = Literal["admit", "refuse"]


class ModelBudgetSpec(_Model):
    """The cluster's memory for model workers."""

    memory: Quantity = Field(
        description="Total memory all pools' workers may be charged together (a quantity such as 80Gi)."
    )

    @field_validator("memory")
    @classmethod
    def _memory_is_quantity(cls, value: Quantity) -> Quantity:
        _check_quantity(value, "spec.memory")
        return value

    @property
    def memory_bytes(self) -> int:
        """``memory`` in bytes."""
        return parse_quantity(self.memory)


class PoolShare(_Model):
    """One pool's share of the budget."""

    namespace: str = Field(description="The pool's namespace.")
    name: str = Field(description="The pool's name.")
    memory: str = Field(description="Memory charged for the pool's workers (a quantity).")
    memory_bytes: int = Field(default=0, description="The same in bytes.")


class ModelBudgetStatus(_Model):
    """Memory in use, derived from the workers that exist at every pass."""

    used: str = Field(default="0", description="Memory charged for existing, non-failed workers.")
    used_bytes: int = Field(default=0, description="The same in bytes.")
    reserved: str = Field(default="0", description="Memory reserved for workers being created.")
    reserved_bytes: int = Field(default=0, description="The same in bytes.")
    pools: list[PoolShare] = Field(default_factory=list, description="Each pool's share.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Valid: whether the operator can read the spec (False: no worker is admitted, and why).",
    )
    active_operator: str | None = Field(
        default=None,
        description=(
            "The operator replica that acts and wrote this status (its pod's name; with leader election, the "
            "holder of the operator's Lease). Written when it changes."
        ),
    )


# ---- ModelHost ----------------------------------------------------------------------------------------


class HostResourcesSpec(_Model):
    """What one host pod asks of its node besides its GPUs and memory."""

    cpu: Quantity | None = Field(
        default=None,
        description=(
            "CPU request per host pod (a quantity such as 8 or 500m; no limit); unset: the operator's "
            "default_worker_cpu (1 CPU unless configured; 0 there: none). The host's models share it: the "
            "server sizes each model's CPU threads within it."
        ),
    )

    @field_validator("cpu")
    @classmethod
    def _cpu_is_quantity(cls, value: Quantity | None) -> Quantity | None:
        return _check_quantity(value, "spec.resources.cpu")


#: The most GPUs a host pod may own (``ModelHost.spec.gpusPerHost``; the host's ``--gpus``): a node's.
MODELHOST_MAX_GPUS_PER_HOST = 16


class ModelHostSpec(_Model):
    """Shared host pods: each owns its GPUs (nvidia.com/gpu) and serves several shared pools' models."""

    replicas: int = Field(
        default=1,
        ge=0,
        le=1000,
        description="Host pods to keep running (0: none; their models go elsewhere).",
    )
    gpus_per_host: int = Field(
        default=0,
        ge=0,
        le=MODELHOST_MAX_GPUS_PER_HOST,
        description=(
            "nvidia.com/gpu per host pod; each GPU is one device of the ledger, with deviceMemory of its own "
            "(the host pod's GPU i, cuda:i in its container; each model lives on one). 0: a CPU host, whose "
            "one device is the CPU with deviceMemory of RAM for awake models."
        ),
    )
    device_memory: Quantity | None = Field(
        default=None,
        description=(
            "Required: the memory of each device that the operator may hand out to the models on it (a "
            "quantity such as 80Gi): awake models' weights, and modelOverhead for each model there, awake "
            "or asleep (its process's CUDA context). On a CPU host (gpusPerHost 0): the RAM awake models' "
            "weights and every model's process may use."
        ),
    )
    host_memory: Quantity | None = Field(
        default=None,
        description=(
            "The host's RAM for sleeping models' weights (pinned memory on GPU hosts), e.g. 64Gi. Unset: 0, "
            "nothing sleeps: an idle model that must make room is unloaded (its next request is a cold "
            "load)."
        ),
    )
    model_overhead: Quantity | None = Field(
        default=None,
        description=(
            "What each model on a host pod costs beyond its weights, charged on its device for as long as "
            "it is there, awake or asleep: its own inference process. On a GPU host its CUDA context "
            f"(default {DEFAULT_GPU_MODEL_OVERHEAD}); on a CPU host the process's RAM "
            f"(default {DEFAULT_CPU_MODEL_OVERHEAD}), out of deviceMemory. 0: not charged."
        ),
    )
    image: str | None = Field(
        default=None, description="The model server image; unset: the operator's default image."
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels a host pod's node must have (e.g. the GPU product)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Taints host pods tolerate (e.g. nvidia.com/gpu)."
    )
    resources: HostResourcesSpec = Field(default_factory=HostResourcesSpec, description="CPU per host pod.")
    affinity: Affinity | None = Field(
        default=None,
        description=(
            "Node affinity (its keys within the operator's allowed node label keys, as nodeSelector's) and "
            "pod (anti-)affinity over pods of the ModelHost's own namespace."
        ),
    )
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        default=None,
        max_length=SCHEDULING_LIST_MAX,
        description=(
            "How host pods spread over nodes or zones. Unset: one soft spread over nodes (maxSkew 1, "
            "kubernetes.io/hostname, ScheduleAnyway, over the host's pods); [] for none."
        ),
    )
    disruption: DisruptionSpec = Field(
        default_factory=DisruptionSpec,
        description=(
            "Voluntary disruptions: how many ready host pods a node drain may evict at once (the operator "
            "makes a PodDisruptionBudget per ModelHost)."
        ),
    )

    @field_validator("device_memory")
    @classmethod
    def _device_memory(cls, value: Quantity | None) -> Quantity | None:
        if value is None:
            raise ValueError(MSG_DEVICE_MEMORY_REQUIRED)
        _check_quantity(value, "spec.deviceMemory")
        if parse_quantity(value) <= 0:
            raise ValueError(MSG_DEVICE_MEMORY_POSITIVE)
        return value

    @field_validator("host_memory")
    @classmethod
    def _host_memory(cls, value: Quantity | None) -> Quantity | None:
        return _check_quantity(value, "spec.hostMemory")

    @field_validator("model_overhead")
    @classmethod
    def _model_overhead(cls, value: Quantity | None) -> Quantity | None:
        return _check_quantity(value, "spec.modelOverhead")

    @model_validator(mode="after")
    def _device_memory_given(self) -> ModelHostSpec:
        # The field validator runs only for a value given; an absent field is refused here.
        if self.device_memory is None:
            raise ValueError(MSG_DEVICE_MEMORY_REQUIRED)
        return self

    @property
    def devices(self) -> int:
        """Devices per host pod: its GPUs, or the CPU alone."""
        return max(self.gpus_per_host, 1)

    @property
    def device_memory_bytes(self) -> int:
        """``deviceMemory`` in bytes (validated: present and positive)."""
        return parse_quantity(self.device_memory or 0)

    @property
    def host_memory_bytes(self) -> int:
        """``hostMemory`` in bytes (0 when unset: nothing sleeps)."""
        return 0 if self.host_memory is None else parse_quantity(self.host_memory)

    @property
    def model_overhead_bytes(self) -> int:
        """``modelOverhead`` in bytes: each model's charge on its device beyond its weights, awake or asleep
        (unset: ``placements.default_model_overhead`` for a GPU or a CPU host)."""
        if self.model_overhead is None:
            return default_model_overhead(gpu=self.gpus_per_host > 0)
        return parse_quantity(self.model_overhead)


MSG_DEVICE_MEMORY_REQUIRED = (
    "spec.deviceMemory is required: the memory of each GPU the operator may hand out to models (e.g. 80Gi "
    "on an 80 GB card, less the CUDA contexts), or on a CPU host (gpusPerHost 0) the RAM for awake models"
)
MSG_DEVICE_MEMORY_POSITIVE = "spec.deviceMemory must be greater than 0"

#: The ``modelpool.dev/pool`` label of a ModelHost's pods is this prefix and the ModelHost's name (the
#: operator watches and charges host pods as it does workers; the ``_`` is in no object name, so no
#: ModelPool has it).
HOST_POOL_PREFIX = "host_"
#: A label value's limit (Kubernetes): 63 characters.
LABEL_VALUE_MAX_LENGTH = 63
#: The longest ModelHost name whose host pods can be made: its pods carry ``modelpool.dev/pool=host_<name>``
#: (and ``modelpool.dev/host=<name>``), label values of at most 63 characters; their names
#: ``<name>-<index>`` (index < 1000) fit a pod's name and hostname then too. The CRD refuses longer ones.
MODELHOST_NAME_MAX_LENGTH = LABEL_VALUE_MAX_LENGTH - len(HOST_POOL_PREFIX)
MSG_HOST_NAME_LENGTH = (
    f"metadata.name must be at most {MODELHOST_NAME_MAX_LENGTH} characters: the host pods carry it in the "
    f"label modelpool.dev/pool={HOST_POOL_PREFIX}<name>, and a label value has at most "
    f"{LABEL_VALUE_MAX_LENGTH} characters"
)

#: A model's state on a host: a worker's states, Sleeping (weights parked in host RAM) and Waking among them.
HostModelState = WorkerState


class HostDeviceStatus(_Model):
    """One device of a host pod as the ledger counts it."""

    index: int = Field(description="The device's index in the pod (0 for a CPU host's one device).")
    capacity: str = Field(description="deviceMemory: what the ledger may hand out (a quantity).")
    capacity_bytes: int = Field(description="The same in bytes.")
    awake: str = Field(
        description="Charged to awake models: each its measured accelerator memory, else its declared size."
    )
    awake_bytes: int = Field(description="The same in bytes.")
    asleep: str = Field(description="Host RAM held by this device's sleeping models (a quantity).")
    asleep_bytes: int = Field(description="The same in bytes.")
    overhead: str = Field(
        default="0",
        description="Charged to its models' processes: modelOverhead for each model on it, awake or asleep.",
    )
    overhead_bytes: int = Field(default=0, description="The same in bytes.")
    free: str = Field(description="capacity - awake - overhead (negative: over-committed by measurement).")
    free_bytes: int = Field(description="The same in bytes.")


class HostModelStatus(_Model):
    """One model on a host pod."""

    namespace: str = Field(description="The shared pool's namespace.")
    pool: str = Field(description="The shared pool (ModelPool) whose model this is.")
    state: HostModelState = Field(
        description="Pending, Loading, Ready, Processing, Idle, Sleeping, Waking, Evicting, Dead or Failed."
    )
    reason: str | None = Field(
        default=None, description="Why it is in this state (e.g. MadeRoom, IdleSleep)."
    )
    device: int | None = Field(default=None, description="The device it is (or wakes) on.")
    memory: str = Field(
        default="0",
        description=(
            "What its weights are charged: on its device while awake, in host RAM while Sleeping (a "
            "quantity); its process's modelOverhead comes on top, on its device, in either state."
        ),
    )
    memory_bytes: int = Field(default=0, description="The same in bytes.")
    measured: bool = Field(
        default=False,
        description=(
            "Whether the charge is a figure the host reported: asleep, its parked bytes; awake, a "
            "measurement above the declared size (else the declared size, which is a floor)."
        ),
    )
    last_request_time: str | None = Field(
        default=None, description="When it last received a request (RFC 3339): the least recent sleeps first."
    )


class HostPodStatus(_Model):
    """One host pod: its devices and models."""

    name: str = Field(description="The host pod's name.")
    state: WorkerState = Field(description="The pod's state, as a worker's (Pending, Loading, Ready, ...).")
    node: str | None = Field(default=None, description="The node it runs on.")
    devices: list[HostDeviceStatus] = Field(default_factory=list, description="Its devices' ledgers.")
    host_memory: str = Field(default="0", description="spec.hostMemory: RAM for sleeping models.")
    host_memory_free: str = Field(default="0", description="hostMemory less what sleeping models hold.")
    models: list[HostModelStatus] = Field(default_factory=list, description="The models it holds.")


class HostMemoryTotals(_Model):
    """Device memory over every host pod (the printer columns)."""

    awake: str = Field(default="0", description="Charged to awake models, over all devices (a quantity).")
    awake_bytes: int = Field(default=0, description="The same in bytes.")
    asleep: str = Field(default="0", description="Host RAM held by sleeping models, over all host pods.")
    asleep_bytes: int = Field(default=0, description="The same in bytes.")
    overhead: str = Field(
        default="0", description="Device memory charged to the models' processes (modelOverhead each)."
    )
    overhead_bytes: int = Field(default=0, description="The same in bytes.")
    free: str = Field(default="0", description="Device memory not charged, over all devices.")
    free_bytes: int = Field(default=0, description="The same in bytes.")


class ModelHostStatus(_Model):
    """What the operator observed and placed; written only by the operator."""

    replicas: int = Field(default=0, description="Host pods that exist and have not failed.")
    ready_replicas: int = Field(default=0, description="Host pods able to serve.")
    ready_text: str | None = Field(default=None, description="ready/desired, for kubectl get.")
    models: int = Field(default=0, description="Models on the host pods, awake or asleep.")
    memory: HostMemoryTotals = Field(default_factory=HostMemoryTotals, description="Device memory totals.")
    hosts: list[HostPodStatus] = Field(default_factory=list, description="Every host pod.")
    selector: str | None = Field(
        default=None, description="Label selector of the host pods (for the scale subresource)."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Ready, Progressing, ...")
    observed_generation: int | None = Field(
        default=None, description="The spec generation the status reflects."
    )


# ---- helpers ------------------------------------------------------------------------------------------


def parse_pool_spec(spec: dict[str, Any] | Any) -> ModelPoolSpec:
    """A ModelPool ``spec`` mapping (camelCase) as a model; raises pydantic ``ValidationError``."""
    return ModelPoolSpec.model_validate(dict(spec))


def parse_pool_status(status: dict[str, Any] | Any | None) -> ModelPoolStatus:
    """The stored status, tolerating anything unparseable (the operator rewrites it every pass)."""
    try:
        return ModelPoolStatus.model_validate(dict(status or {}))
    except ValueError:
        return ModelPoolStatus()


def parse_budget_spec(spec: dict[str, Any] | Any) -> ModelBudgetSpec:
    """A ModelBudget ``spec`` mapping as a model; raises pydantic ``ValidationError``."""
    return ModelBudgetSpec.model_validate(dict(spec))


def parse_host_spec(spec: dict[str, Any] | Any) -> ModelHostSpec:
    """A ModelHost ``spec`` mapping as a model; raises pydantic ``ValidationError``."""
    return ModelHostSpec.model_validate(dict(spec))


def source_is_supported(source: str) -> bool:
    """True for the source schemes the server resolves (see ``SOURCE_PATTERN``)."""
    return _SOURCE_RE.match(source) is not None


__all__ = [
    "API_VERSION",
    "DEFAULT_ACTIVATION_TIMEOUT_SECONDS",
    "DEFAULT_GPU_HOST_MEMORY",
    "DEFAULT_MAX_UNAVAILABLE",
    "GROUP",
    "MODELBUDGET_KIND",
    "MODELBUDGET_PLURAL",
    "MODELHOST_KIND",
    "MODELHOST_PLURAL",
    "MODELPOOL_KIND",
    "MODELPOOL_PLURAL",
    "MSG_AFFINITY_NAMESPACES",
    "MSG_DEVICE_MEMORY_POSITIVE",
    "MSG_DEVICE_MEMORY_REQUIRED",
    "MSG_KV_CACHE_TARGET",
    "MSG_STABLE_GE_UP_WINDOW",
    "MSG_TARGET_LE_CAPACITY",
    "MSG_TOKENS_TARGET",
    "QUANTITY_PATTERN",
    "SCHEDULING_LIST_MAX",
    "SERVED_NAME_PATTERN",
    "SHARED_POOL_RULES",
    "VERSION",
    "Affinity",
    "AuthSpec",
    "AutoscalingMetric",
    "AutoscalingSpec",
    "AutoscalingStatus",
    "BackoffStatus",
    "Condition",
    "DisruptionSpec",
    "EnvVar",
    "EnvVarSource",
    "HostDeviceStatus",
    "HostMemoryTotals",
    "HostModelState",
    "HostModelStatus",
    "HostPodStatus",
    "HostResourcesSpec",
    "KeySelector",
    "LabelSelector",
    "LabelSelectorRequirement",
    "MeasuredMemory",
    "MemoryStatus",
    "MissingBudget",
    "ModelBudgetSpec",
    "ModelBudgetStatus",
    "ModelCacheSpec",
    "ModelHostSpec",
    "ModelHostStatus",
    "ModelPoolSpec",
    "ModelPoolStatus",
    "ModelSpec",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PodAffinity",
    "PodAffinityTerm",
    "PodTemplate",
    "PoolGeneration",
    "PoolShare",
    "PreferredSchedulingTerm",
    "QueueSpec",
    "ResourcesSpec",
    "RolloutStatus",
    "SecretKey",
    "Toleration",
    "TopologySpreadConstraint",
    "WeightedPodAffinityTerm",
    "WorkerGeneration",
    "WorkerStatus",
    "autoscaling_enabled",
    "parse_host_spec",
    "parse_pool_spec",
    "parse_pool_status",
    "replica_ceiling",
    "shared_pool_refusals",
]
