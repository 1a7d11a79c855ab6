"""The operator's one configuration object, read from ``MODELPOOL_OPERATOR_*`` environment variables.

Everything the operator process can be tuned with lives here, documented field by field, so that the
Helm chart, ``docs/operator.md`` and ``modelpool-operator --help`` all describe the same knobs. The
command line (``main``) only overrides a few of these fields; ``apply_to_kopf`` copies the relevant
ones onto Kopf's own ``OperatorSettings`` in the startup hook.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from modelpool_contract.api import CacheType, MissingBudget, ModelCacheSpec, parse_budget_spec
from modelpool_contract.flags import (
    DEFAULT_SAMPLE_RATIO,
    DEFAULT_SERVER_IMAGE,
    DEFAULT_WORKER_CPU,
    WORKER_PORT,
    WORKER_PROBE_PORT,
)
from modelpool_contract.labels import LABEL_POOL, PREFIX
from modelpool_contract.logs import DEFAULT_LOG_FORMAT, LogFormat
from modelpool_contract.quantity import QuantityError, quantity_value
from modelpool_contract.reserved import DEFAULT_NODE_SELECTOR_KEYS, DEFAULT_TOLERATION_KEYS
from modelpool_operator.effects.network_peers import NetworkPolicyPeer
from modelpool_operator.leader import (
    DEFAULT_LEASE_DURATION_S,
    DEFAULT_RENEW_DEADLINE_S,
    DEFAULT_RETRY_PERIOD_S,
    Timing,
    check_timing,
)
from modelpool_operator.policy import (
    Policy,
    check_host_path_prefix,
    check_image_entry,
    check_key_domain,
    image_repository,
)

# Defaults of the knobs that the pure decisions also take as settings (``PlannerSettings``,
# ``LifecycleSettings``), so that both read the same numbers.
DEFAULT_BACKOFF_BASE_S = 5.0
DEFAULT_BACKOFF_CAP_S = 300.0
DEFAULT_UNSCHEDULABLE_TIMEOUT_S = 120.0


class OperatorConfig(BaseSettings):
    """How the operator watches, scrapes, admits and replaces workers.

    Every field maps to the environment variable ``MODELPOOL_OPERATOR_<FIELD NAME IN CAPITALS>``.
    """

    model_config = SettingsConfigDict(env_prefix="MODELPOOL_OPERATOR_", extra="ignore", frozen=True)

    # --- scope -------------------------------------------------------------------------------------
    namespaces: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Namespaces to watch (comma-separated in the environment). Empty: all namespaces.",
    )

    # --- stats scraping ----------------------------------------------------------------------------
    stats_interval_seconds: float = Field(
        default=5.0, gt=0, description="How often each worker's GET /stats is scraped."
    )
    processing_grace_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "How long past a pool's spec.queue.requestTimeoutSeconds a worker's claim to be busy "
            "(Processing, or requests in flight or queued) is believed without progress; then it counts as "
            "Idle for eviction (ProcessingNotBelieved). A few scrape intervals and the server's answer time."
        ),
    )
    stats_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        description="Deadline of one /stats request: connect, headers and the whole answer.",
    )
    stats_concurrency: int = Field(
        default=64, ge=1, description="At most this many /stats requests in flight at once, operator-wide."
    )
    stats_unreachable_backoff_cap_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "A worker whose /stats cannot be reached is retried with a doubling delay up to this cap "
            "(its stats are unknown meanwhile; that never fails the worker by itself)."
        ),
    )
    server_port: int = Field(
        default=WORKER_PORT,
        ge=1,
        le=65535,
        description="Port of the worker's HTTP server when the pod names none.",
    )
    server_probe_port: int = Field(
        default=WORKER_PROBE_PORT,
        ge=1,
        le=65535,
        description=(
            "Port on which each worker answers its probes and /stats apart from the traffic (so a flooded "
            "worker still answers the kubelet and the operator at once)."
        ),
    )

    # --- reconciliation ----------------------------------------------------------------------------
    creating_status_interval_seconds: float = Field(
        default=5.0,
        ge=0,
        description=(
            "While a pool only waits for Pending workers to be scheduled and started, its status is written "
            "at most this often (its first write, a worker loading or failing, and the pool settled are "
            "written at once): fewer API writes while the scheduler and the kubelets are busiest. 0: every "
            "change at once."
        ),
    )
    resync_interval_seconds: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Each pool is re-reconciled this often even without events (level-based safety net); pod "
            "changes wake it at once. The pools' resyncs take turns, 10 a second for the process: with more "
            "than 10 x this many pools each comes less often."
        ),
    )
    reservation_ttl_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "A budget reservation whose pod the watch has not shown this long after its create answered is "
            "checked against the API (a list by name): it ends only when the pod does not exist, never by "
            "age alone. The name is kept from when it was a lifetime."
        ),
    )

    # --- workers -----------------------------------------------------------------------------------
    server_image: str = Field(
        default=DEFAULT_SERVER_IMAGE,
        description="Worker image when a pool's spec.image is empty.",
    )
    default_worker_cpu: str = Field(
        default=DEFAULT_WORKER_CPU,
        description=(
            "CPU request of the workers of pools that set no spec.resources.cpu, and of ModelHost pods that "
            "set none (a quantity such as 1 or 500m; a request, no limit, as resources.cpu is): the server "
            "sizes the model's CPU threads to it, so that workers sharing a node do not each run one "
            "thread per core of it. 0 or empty: no default request."
        ),
    )
    worker_otlp_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[^\s]+$",
        description=(
            "An OTLP/HTTP receiver (e.g. http://otel-collector.monitoring:4318) passed to every worker and "
            "ModelHost pod as --otlp-endpoint: they send the traces of their requests there. Unset: no "
            "traces (the operator itself sends none)."
        ),
    )
    worker_trace_sample_ratio: float = Field(
        default=DEFAULT_SAMPLE_RATIO,
        ge=0.0,
        le=1.0,
        description=(
            "With worker_otlp_endpoint: the workers' --trace-sample-ratio (the share of requests without "
            "a traceparent they trace; requests through the gateway follow its decision)."
        ),
    )
    budget_name: str = Field(
        default="default", description="The ModelBudget (cluster-scoped) the operator uses."
    )
    missing_budget: MissingBudget = Field(
        default="admit",
        description=(
            "While the ModelBudget budget_name does not exist: refuse (no worker or host pod is created; "
            "each pool that wants one shows BudgetExceeded with reason BudgetMissing, naming the budget) or "
            "admit (everything, still accounted). The chart sets refuse unless told otherwise."
        ),
    )
    budget_create: bool = Field(
        default=False,
        description=(
            "At startup, create the ModelBudget budget_name with budget_memory when it does not exist. "
            "Create only: an existing one (a 409) is left as it is, so changes made with kubectl survive "
            "restarts and upgrades."
        ),
    )
    budget_memory: str = Field(
        default="",
        description="budget_create: the memory of the ModelBudget created (a quantity such as 640Gi).",
    )
    backoff_base_seconds: float = Field(
        default=DEFAULT_BACKOFF_BASE_S,
        gt=0,
        description="First delay before replacing a failed worker (doubles per failure).",
    )
    backoff_cap_seconds: float = Field(
        default=DEFAULT_BACKOFF_CAP_S, gt=0, description="Longest replacement delay."
    )
    unschedulable_timeout_seconds: float = Field(
        default=DEFAULT_UNSCHEDULABLE_TIMEOUT_S,
        gt=0,
        description="A Pending pod the scheduler could not place for this long is reported Unschedulable.",
    )
    model_cache_type: CacheType = Field(
        default="none",
        description=(
            "The model cache of pools that set no spec.model.cache: none (an emptyDir per worker), pvc "
            "(the claim model_cache_claim_name in the pool's namespace, ReadWriteMany) or hostPath "
            "(model_cache_host_path on each node)."
        ),
    )
    model_cache_claim_name: str = Field(
        default="", description="model_cache_type pvc: the claim's name (in each pool's namespace)."
    )
    model_cache_host_path: str = Field(
        default="", description="model_cache_type hostPath: the directory on each node."
    )

    # --- the workers' NetworkPolicy (network_policy.py) ----------------------------------------------
    network_policy_enabled: bool = Field(
        default=False,
        description=(
            "Give each pool a NetworkPolicy (owned by the pool) admitting into its workers only the "
            "operator, the gateway and the callers named below. Needs network_policy_namespace and "
            "network_policy_operator_labels (the chart sets them and turns this on)."
        ),
    )
    network_policy_namespace: str = Field(
        default="",
        description="The namespace of the operator's and the gateway's pods (the chart's release namespace).",
    )
    network_policy_operator_labels: dict[str, str] = Field(
        default_factory=dict,
        description="The operator's pod labels (a JSON object): admitted on the serving and probe ports.",
    )
    network_policy_gateway_labels: dict[str, str] = Field(
        default_factory=dict,
        description="The gateway's pod labels (a JSON object), admitted on the serving port; empty: none.",
    )
    network_policy_from: tuple[NetworkPolicyPeer, ...] = Field(
        default=(),
        description="Other callers admitted on the serving port (a JSON list of NetworkPolicyPeer).",
    )
    network_policy_metrics_from: tuple[NetworkPolicyPeer, ...] = Field(
        default=(),
        description=(
            "Callers admitted on the probe port, where /metrics and /stats are answered, e.g. Prometheus "
            "(a JSON list of NetworkPolicyPeer)."
        ),
    )

    # --- InferencePools (effects/inference_pool.py; issue 33) -------------------------------------------
    inference_pools_enabled: bool = Field(
        default=False,
        description=(
            "Make an InferencePool (inference.networking.k8s.io/v1) for each pool with spec.inferencePool, "
            "and remove it when the field is removed. Off: the operator never reads or writes "
            "InferencePools, and such a pool is told so (ApiError, InferencePoolsDisabled). The chart "
            "turns it on with inferencePool.enabled, which grants the RBAC it needs."
        ),
    )

    # --- what pool authors may ask for (modelpool_operator.policy; the chart's admission policy) --------
    allowed_host_paths: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Path prefixes under which a pool's spec.model.cache of type hostPath may lie, matched on whole "
            "segments (/data allows /data/x, not /database); comma-separated in the environment. Empty: "
            "hostPath caches are refused."
        ),
    )
    allowed_images: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Images a pool's or a ModelHost's spec.image may name: a prefix ending in '/' "
            "(ghcr.io/modelpool/) or one repository at any tag or digest "
            "(ghcr.io/modelpool/modelpool-server); comma-separated in the environment. Empty: the "
            "repository of server_image only (the operator's own server image, at any tag)."
        ),
    )
    allowed_service_accounts: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Service accounts a pool's spec.podTemplate.serviceAccountName may name; comma-separated in "
            "the environment. Empty: none (a pool that names none runs as its namespace's default one)."
        ),
    )
    allowed_priority_classes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "PriorityClasses a pool's spec.podTemplate.priorityClassName may name; comma-separated in the "
            "environment. Empty: none (system-node-critical would preempt other tenants' pods)."
        ),
    )
    allowed_toleration_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        default=DEFAULT_TOLERATION_KEYS,
        description=(
            "Taint keys a pool's (or a ModelHost's) tolerations may name; * allows a toleration without a "
            "key, which tolerates every taint; comma-separated in the environment."
        ),
    )
    allowed_node_selector_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        default=DEFAULT_NODE_SELECTOR_KEYS,
        description=(
            "Node label keys a pool's (or a ModelHost's) nodeSelector may name: hardware and place by "
            "default, never a node's role or name; comma-separated in the environment."
        ),
    )
    allowed_label_domains: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Domains (and their subdomains) of the keys a pool's spec.podTemplate.labels may use beside "
            "keys without a prefix; never modelpool.dev, kubernetes.io, k8s.io; comma-separated in the "
            "environment. Empty: keys without a prefix only."
        ),
    )
    allowed_annotation_domains: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Domains (and their subdomains) of the keys a pool's spec.podTemplate.annotations may use beside "
            "keys without a prefix (e.g. prometheus.io); never modelpool.dev, kubernetes.io, k8s.io; "
            "comma-separated in the environment. Empty: keys without a prefix only."
        ),
    )
    allowed_env_names: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description=(
            "Reserved names a pool's spec.podTemplate.env may set anyway, exactly as written (the server's "
            "MODELPOOL_* flags, LD_*, PYTHONPATH, the Hugging Face cache variables are refused otherwise: "
            "MODELPOOL_TRUST_REMOTE_CODE would bypass spec.model.trustRemoteCode); comma-separated in the "
            "environment. Empty: none."
        ),
    )
    own_namespace: str = Field(
        default="",
        description=(
            "The namespace the operator (and the gateway) run in, the chart's release namespace: a pool or "
            "ModelHost there is refused. Empty: not checked."
        ),
    )

    # --- the process -------------------------------------------------------------------------------
    peering_name: str | None = Field(
        default=None,
        description=(
            "Kopf peering object name. Set: peering is mandatory (two replicas never act at once). "
            "Unset: Kopf's default peering is used when it exists, standalone otherwise."
        ),
    )
    standalone: bool = Field(default=False, description="Disable peering entirely.")
    peering_priority: int | None = Field(
        default=None,
        description=(
            "Kopf peering priority: of the live peers, only the one with the highest priority acts; peers of "
            "equal priority all pause until one of them goes. Unset: a random priority drawn at start, so "
            "the replicas of one Deployment (which share their settings) still elect one active peer."
        ),
    )
    peering_lifetime_seconds: int = Field(
        default=60,
        ge=1,
        description=(
            "How long this operator's peering record counts as alive without a keep-alive: a peer that "
            "dies without saying so blocks the others for at most this long."
        ),
    )
    leader_election: bool = Field(
        default=False,
        description=(
            "Act only while holding the coordination.k8s.io Lease leader_election_lease_name (client-go's "
            "leader election: one acting replica, fenced; modelpool_operator.leader). The chart turns it on; "
            "off: the process acts at once (tests, development)."
        ),
    )
    leader_election_lease_name: str = Field(
        default="modelpool-operator", min_length=1, description="The leader election Lease's name."
    )
    leader_election_namespace: str = Field(
        default="",
        description="The leader election Lease's namespace. Empty: own_namespace (the release namespace).",
    )
    leader_election_lease_duration_seconds: float = Field(
        default=DEFAULT_LEASE_DURATION_S,
        gt=0,
        description=(
            "How long a standby waits after it last saw the Lease change before it takes it over (a killed "
            "leader that did not release it blocks the standbys this long)."
        ),
    )
    leader_election_renew_deadline_seconds: float = Field(
        default=DEFAULT_RENEW_DEADLINE_S,
        gt=0,
        description=(
            "A leader that has not renewed the Lease for this long stops acting: it exits (non-zero) so that "
            "it restarts as a candidate. Shorter than the lease duration."
        ),
    )
    leader_election_retry_period_seconds: float = Field(
        default=DEFAULT_RETRY_PERIOD_S,
        gt=0,
        description="How often the leader renews the Lease and a standby tries to take it. Shorter than the "
        "renew deadline.",
    )
    liveness_port: int = Field(
        default=8080, ge=0, le=65535, description="Port of the /healthz liveness endpoint (0 disables it)."
    )
    metrics_port: int = Field(
        default=8081,
        ge=0,
        le=65535,
        description="Port of the Prometheus GET /metrics endpoint (0 disables it).",
    )
    control_seed_file: Path | None = Field(
        default=None,
        description=(
            "A file holding the seed of the shared hosts' control keys (each ModelHost's key is "
            "HMAC-SHA256(seed, namespace/name/uid)); the chart mounts its Secret <release>-control-seed. "
            "Unset: a random seed per start (the keys do not survive a restart)."
        ),
    )
    # An integer: the API server parses ``timeoutSeconds`` as one ("300.0" is a 400 Bad Request).
    watch_server_timeout_seconds: int = Field(
        default=300, gt=0, description="Server-side timeout of each watch request (then it is renewed)."
    )
    watch_client_timeout_seconds: float = Field(
        default=330.0, gt=0, description="Client-side timeout of each watch request."
    )
    request_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Timeout of every other API request."
    )
    connect_timeout_seconds: float = Field(default=10.0, gt=0, description="TCP connect timeout to the API.")
    posting_level: str = Field(
        default="WARNING",
        description=(
            "Log records at or above this level are also posted as Kubernetes Events on the object. "
            "Lifecycle transitions are always posted as Events, independently of this."
        ),
    )
    log_format: LogFormat = Field(
        default=DEFAULT_LOG_FORMAT,
        description="'json' (one JSON object per line) or 'plain', for the operator and the workers and "
        "shared hosts it creates (modelpool_contract.logs).",
    )

    @field_validator(
        "namespaces",
        "allowed_host_paths",
        "allowed_images",
        "allowed_service_accounts",
        "allowed_priority_classes",
        "allowed_toleration_keys",
        "allowed_node_selector_keys",
        "allowed_label_domains",
        "allowed_annotation_domains",
        "allowed_env_names",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        # The environment carries "a,b,c"; code and tests may pass a list or tuple directly.
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("allowed_host_paths")
    @classmethod
    def _clean_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_host_path_prefix(entry) for entry in value)

    @field_validator("allowed_images")
    @classmethod
    def _image_entries(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_image_entry(entry) for entry in value)

    @field_validator("allowed_label_domains", "allowed_annotation_domains")
    @classmethod
    def _key_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(check_key_domain(entry) for entry in value)

    @field_validator("default_worker_cpu")
    @classmethod
    def _cpu_is_quantity(cls, value: str) -> str:
        value = value.strip()
        if value:
            try:
                quantity_value(value)
            except QuantityError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("posting_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.upper()
        if not isinstance(logging.getLevelName(level), int):
            raise ValueError(f"unknown log level {value!r}")
        return level

    @model_validator(mode="after")
    def _cache_is_complete(self) -> OperatorConfig:
        self.model_cache  # noqa: B018 - raises when the type's claim or path is missing
        return self

    @model_validator(mode="after")
    def _budget_to_create_is_sized(self) -> OperatorConfig:
        if not self.budget_create:
            return self
        if not self.budget_memory.strip():
            raise ValueError("budget_create needs budget_memory (the ModelBudget's memory, e.g. 640Gi)")
        try:
            parse_budget_spec({"memory": self.budget_memory.strip()})
        except ValidationError as exc:
            reason = (
                str(exc.errors()[0].get("msg", exc))
                .removeprefix("Value error, ")
                .removeprefix("spec.memory: ")
            )
            raise ValueError(f"budget_memory: {reason}") from None
        return self

    @model_validator(mode="after")
    def _ports_differ(self) -> OperatorConfig:
        if self.server_port == self.server_probe_port:
            raise ValueError(
                f"server_probe_port must differ from server_port (both {self.server_port}): the worker "
                "listens on each"
            )
        return self

    @model_validator(mode="after")
    def _network_policy_names_the_operator(self) -> OperatorConfig:
        # Without them the policy would cut the operator itself off from the workers' /stats.
        if self.network_policy_enabled and not (
            self.network_policy_namespace and self.network_policy_operator_labels
        ):
            raise ValueError(
                "network_policy_enabled needs network_policy_namespace and network_policy_operator_labels "
                "(where the operator's pods run and their labels)"
            )
        return self

    @model_validator(mode="after")
    def _election_can_fence(self) -> OperatorConfig:
        problem = check_timing(
            self.leader_election_lease_duration_seconds,
            self.leader_election_renew_deadline_seconds,
            self.leader_election_retry_period_seconds,
        )
        if problem:
            raise ValueError(problem)
        if self.leader_election and not self.lease_namespace:
            raise ValueError(
                "leader_election needs leader_election_namespace or own_namespace (where the Lease lives)"
            )
        return self

    @property
    def lease_namespace(self) -> str:
        """The leader election Lease's namespace."""
        return self.leader_election_namespace or self.own_namespace

    @property
    def lease_timing(self) -> Timing:
        return Timing(
            lease_duration=self.leader_election_lease_duration_seconds,
            renew_deadline=self.leader_election_renew_deadline_seconds,
            retry_period=self.leader_election_retry_period_seconds,
        )

    @property
    def model_cache(self) -> ModelCacheSpec | None:
        """The default ``spec.model.cache`` (None: an emptyDir per worker)."""
        if self.model_cache_type == "none":
            return None
        try:
            return ModelCacheSpec(
                type=self.model_cache_type,
                claim_name=self.model_cache_claim_name or None,
                path=self.model_cache_host_path or None,
            )
        except ValidationError as exc:
            raise ValueError("; ".join(_cache_error(e) for e in exc.errors())) from None

    @property
    def worker_cpu(self) -> str | None:
        """The default CPU request of worker and host pods (None: none; ``default_worker_cpu`` 0 or
        empty)."""
        return worker_cpu_default(self.default_worker_cpu)

    @property
    def policy(self) -> Policy:
        """What pool authors may ask for (``modelpool_operator.policy``)."""
        return Policy(
            host_paths=self.allowed_host_paths,
            # Empty: the operator's own server image (its repository, at any tag), never any image.
            images=self.allowed_images or (image_repository(self.server_image),),
            service_accounts=self.allowed_service_accounts,
            priority_classes=self.allowed_priority_classes,
            toleration_keys=self.allowed_toleration_keys,
            node_selector_keys=self.allowed_node_selector_keys,
            label_domains=self.allowed_label_domains,
            annotation_domains=self.allowed_annotation_domains,
            env_names=self.allowed_env_names,
            operator_namespace=self.own_namespace,
        )

    @property
    def clusterwide(self) -> bool:
        """True when no namespace is named: the operator watches every namespace."""
        return not self.namespaces

    @property
    def finalizer(self) -> str:
        return f"{PREFIX}/finalizer"

    @property
    def liveness_endpoint(self) -> str | None:
        return f"http://0.0.0.0:{self.liveness_port}/healthz" if self.liveness_port else None


# The pool fields a default model cache is checked as, and the settings they come from.
_CACHE_SETTING = {"claim_name": "model_cache_claim_name", "path": "model_cache_host_path"}
_CACHE_FIELD = {"spec.model.cache.claimName": "claim_name", "spec.model.cache.path": "path"}


def _cache_error(error: Any) -> str:
    """A ``ModelCacheSpec`` error in the words of the operator's settings."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["loc"]:
        return f"{_CACHE_SETTING.get(str(error['loc'][0]), error['loc'][0])}: {message}"
    for field, name in _CACHE_FIELD.items():
        message = message.replace(field, _CACHE_SETTING[name])
    return message


def worker_cpu_default(value: str) -> str | None:
    """Pure: a ``default_worker_cpu`` setting as the pod builder takes it: the quantity, or None for 0
    and empty (no request; a zero request would also make the server's CPU share say nothing)."""
    value = value.strip()
    return value if value and quantity_value(value) > 0 else None


def peering_priority(configured: int | None, rng: random.Random) -> int:
    """The configured priority, or a random one in [1, 2**31): two replicas draw the same with odds of
    one in two billion, and a replica that restarts draws anew (it may take over, which is harmless)."""
    return configured if configured is not None else rng.randrange(1, 2**31)


def apply_to_kopf(config: OperatorConfig, settings: Any) -> None:
    """Copy the operator's configuration onto Kopf's ``OperatorSettings`` (called in the startup hook)."""
    import kopf

    from modelpool_operator.diffbase import LeanDiffBaseStorage

    settings.persistence.finalizer = config.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    # Kopf's own storage deep-copies every watched body at every event (a fifth of the CPU at 150 pools).
    settings.persistence.diffbase_storage = LeanDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    # Only worker pods are watched (server-side filter): the operator never holds the cluster's other pods.
    settings.watching.label_selectors["pods"] = LABEL_POOL
    settings.watching.server_timeout = config.watch_server_timeout_seconds
    settings.watching.client_timeout = config.watch_client_timeout_seconds
    settings.watching.connect_timeout = config.connect_timeout_seconds
    settings.networking.request_timeout = config.request_timeout_seconds
    settings.networking.connect_timeout = config.connect_timeout_seconds
    settings.posting.level = logging.getLevelName(config.posting_level)
    settings.posting.reporting_component = "modelpool-operator"
    settings.peering.clusterwide = config.clusterwide
    if config.peering_name:
        settings.peering.name = config.peering_name
        settings.peering.mandatory = True
    settings.peering.standalone = config.standalone
    settings.peering.priority = peering_priority(config.peering_priority, random.SystemRandom())
    settings.peering.lifetime = config.peering_lifetime_seconds
