"""What a ModelPool's author may ask for: the operator's allowlists, and the pure decision over a spec.

The operator creates worker pods with its own right to create pods, so without a policy "may create a
ModelPool" would mean "may run any image, as any service account, with any directory of the node
mounted, on any node, at any priority". ``violations(spec, policy, namespace)`` names each field of a
spec that goes beyond the operator's configured allowlists (``OperatorConfig.policy``); the pool is then
refused (``reconcile``). The chart's ValidatingAdmissionPolicy (``templates/admissionpolicy.yaml``) applies
the same rules, with the same messages, at ``kubectl apply``;
``tests/operator/integration/test_admission_policy.py`` checks them against each other on the real API
server.

The rules (an allowlist left empty allows nothing unless said otherwise):

* ``metadata.namespace`` is never the operator's own (``Policy.operator_namespace``, the chart's release
  namespace): its Secrets (the control seed, the gateway's keys) and its pods' labels (which every pool's
  NetworkPolicy admits) are the operator's and the gateway's. Always on where the namespace is known.
* ``spec.model.cache.path`` (type hostPath) must be a clean absolute path (``CLEAN_PATH_PATTERN``: no
  empty, ``.`` or ``..`` segment, so no ``//`` and no trailing ``/``) under one of the allowed prefixes,
  matched on whole segments: ``/data`` allows ``/data`` and ``/data/x``, never ``/database``; and its last
  segment must be the pool's namespace (``/data/team-a`` for a pool of ``team-a``): the workers of every
  namespace run as uid 10001, so a directory two namespaces share lets one rewrite the other's weights or
  remote code. The path is mounted as written (no hidden suffix), so the node's directory a pool uses is
  the one its spec shows. No prefix allowed (the default): no hostPath cache.
* ``spec.image``, when set: an entry ending in ``/`` allows every image that starts with it
  (``ghcr.io/modelpool/`` allows ``ghcr.io/modelpool/server:1``, not ``ghcr.io/modelpoolx/server``); any
  other entry names one repository, allowed at any tag or digest (``ghcr.io/modelpool/server`` allows
  ``ghcr.io/modelpool/server``, ``...:1.2``, ``...@sha256:...``, not ``ghcr.io/modelpool/server-x``).
  Images are compared as written (``nginx`` is not ``docker.io/library/nginx``). An image with an empty,
  ``.`` or ``..`` path segment is refused. The settings' empty list means the repository of the operator's
  own ``server_image`` (``OperatorConfig.policy``), never any image.
* ``spec.podTemplate.serviceAccountName``, when set: one of the allowed names (none by default: unset, the
  workers run as the namespace's ``default`` service account, which is always allowed).
* ``spec.podTemplate.priorityClassName``, when set: one of the allowed names (none by default:
  ``system-node-critical`` would preempt other tenants' pods cluster-wide).
* ``spec.podTemplate.tolerations``: each toleration's key must be allowed; a toleration without a key
  tolerates every taint and is shown and allowed as ``*``. Default: ``nvidia.com/gpu`` (settings).
* ``spec.podTemplate.nodeSelector``: each key must be allowed. Default: well-known labels of hardware and
  place (settings), never a node role or a node's name.
* ``spec.podTemplate.affinity.nodeAffinity``: each expression's key, required or preferred, must be one
  of the same node label keys (it places pods on nodes as a nodeSelector does; any operator, ``NotIn``
  too). Pod affinity and anti-affinity select pods of the pool's own namespace only: the API itself
  refuses ``namespaces`` and ``namespaceSelector`` in a term (``api.PodAffinityTerm``, always on), and a
  topology spread counts pods of the own namespace by the Kubernetes API's own rule; their
  ``topologyKey`` (which groups nodes, never picks one) is not checked.
* ``spec.podTemplate.labels`` and ``annotations``: a key without a prefix (``team``) is the author's own;
  a key with one must be of an allowed domain (``Policy.label_domains``, ``annotation_domains``: the domain
  or a subdomain of it), and is never of a reserved domain (``modelpool_contract.reserved``:
  ``modelpool.dev``, ``kubernetes.io``, ``k8s.io`` and their subdomains, e.g. AppArmor and seccomp). So
  Multus networks and mesh opt-outs are refused unless the administrator allows their domain.
* ``spec.podTemplate.env``: no name the server or its libraries read (``modelpool_contract.reserved``:
  ``MODELPOOL_*`` such as ``MODELPOOL_TRUST_REMOTE_CODE``, ``LD_*``, the Python start-up and the Hugging
  Face cache variables): the pool's own fields say what the server does. ``Policy.env_names`` lists the
  reserved names allowed anyway, exactly as written (none by default; a development cluster that runs
  test handlers allows ``MODELPOOL_HANDLER`` and ``PYTHONPATH``).
* ``spec.servedModelName``, when shaped like ``namespace/name`` (``NAMESPACED_NAME_PATTERN``), must start
  with the pool's own namespace: an alias ``team-b/llama`` on a pool of ``team-a`` would receive the prompts
  of callers who mean team-b's pool (a key granting both, or ``--auth none``). Not an allowlist: always on.

Where a map or a list has several refused keys, the message names one: the smallest key of a map, the
first refused entry of a list (the chart's CEL picks the same).

A ModelHost obeys the namespace, image, tolerations, nodeSelector and node affinity rules
(``host_violations``): its host pods are created with the same right; a ModelHost that breaks them gets
no host pod.

The operator's own defaults (its ``server_image``, its default model cache) are the administrator's
choice and are not checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from modelpool_contract.api import (
    Affinity,
    ModelHostSpec,
    ModelPoolSpec,
    Toleration,
    alias_claims_namespace,
)
from modelpool_contract.reserved import (
    DEFAULT_NODE_SELECTOR_KEYS,
    DEFAULT_TOLERATION_KEYS,
    RESERVED_KEY_DOMAINS,
    domain_within,
    env_name_reserved,
    key_domain,
    key_reserved,
)

# One path segment that is neither empty, "." nor "..": starting with a character other than "." and
# "/", or a dot then such a character, or two dots then anything but "/".
_SEGMENT = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
#: A clean absolute path: "/" or "/" followed by clean segments (the chart's CEL and schema use it too).
CLEAN_PATH_PATTERN = rf"^(/|(/{_SEGMENT})+)$"
#: An image whose "/"-separated parts are all clean segments.
CLEAN_IMAGE_PATTERN = rf"^{_SEGMENT}(/{_SEGMENT})*$"
#: A label key domain an administrator may allow (a lower-case DNS subdomain).
DOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_CLEAN_PATH = re.compile(CLEAN_PATH_PATTERN)
_CLEAN_IMAGE = re.compile(CLEAN_IMAGE_PATTERN)
_DOMAIN = re.compile(DOMAIN_PATTERN)

FIELD_NAMESPACE = "metadata.namespace"
FIELD_HOST_PATH = "spec.model.cache.path"
FIELD_IMAGE = "spec.image"
FIELD_SERVICE_ACCOUNT = "spec.podTemplate.serviceAccountName"
FIELD_PRIORITY_CLASS = "spec.podTemplate.priorityClassName"
FIELD_TOLERATIONS = "spec.podTemplate.tolerations"
FIELD_NODE_SELECTOR = "spec.podTemplate.nodeSelector"
FIELD_NODE_AFFINITY = "spec.podTemplate.affinity.nodeAffinity"
FIELD_LABELS = "spec.podTemplate.labels"
FIELD_ANNOTATIONS = "spec.podTemplate.annotations"
FIELD_ENV = "spec.podTemplate.env"
FIELD_SERVED_NAME = "spec.servedModelName"
# A ModelHost's own fields of the same meaning.
FIELD_HOST_TOLERATIONS = "spec.tolerations"
FIELD_HOST_NODE_SELECTOR = "spec.nodeSelector"
FIELD_HOST_NODE_AFFINITY = "spec.affinity.nodeAffinity"

#: How a toleration without a key (it tolerates every taint) is written in the allowlist and the messages.
ANY_TAINT = "*"


@dataclass(frozen=True)
class Policy:
    """The operator's allowlists, as enforced: an empty one allows nothing (``service_accounts`` and
    ``images`` empty: only an unset field, the namespace's ``default`` account and the operator's own
    image). ``operator_namespace`` empty: unknown, not checked."""

    host_paths: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()
    priority_classes: tuple[str, ...] = ()
    toleration_keys: tuple[str, ...] = DEFAULT_TOLERATION_KEYS
    node_selector_keys: tuple[str, ...] = DEFAULT_NODE_SELECTOR_KEYS
    label_domains: tuple[str, ...] = ()
    annotation_domains: tuple[str, ...] = ()
    env_names: tuple[str, ...] = ()
    operator_namespace: str = ""


@dataclass(frozen=True)
class Violation:
    """One field of a spec the policy refuses, and why (the message starts with the field)."""

    field: str
    message: str


def is_clean_path(path: str) -> bool:
    """An absolute path without empty, ``.`` or ``..`` segments (so without ``//`` or a trailing ``/``)."""
    return _CLEAN_PATH.match(path) is not None


def host_path_allowed(path: str, prefixes: Sequence[str]) -> bool:
    """A clean path equal to one of ``prefixes`` or below it, on whole segments."""
    if not is_clean_path(path):
        return False
    return any(p in ("/", path) or path.startswith(p + "/") for p in prefixes)


def image_allowed(image: str, entries: Sequence[str]) -> bool:
    """A clean image matching an entry (see the module doc); none when ``entries`` is empty."""
    if _CLEAN_IMAGE.match(image) is None:
        return False
    return any(_image_matches(image, entry) for entry in entries)


def _image_matches(image: str, entry: str) -> bool:
    if entry.endswith("/"):
        return image.startswith(entry)
    return image == entry or image.startswith((entry + ":", entry + "@"))


def image_repository(image: str) -> str:
    """An image without its digest and tag: ``ghcr.io/modelpool/modelpool-server`` for
    ``ghcr.io/modelpool/modelpool-server:0.1.0`` (a ``:`` in the registry's host:port stays)."""
    name = image.split("@", 1)[0]
    head, colon, tag = name.rpartition(":")
    return head if colon and "/" not in tag else name


def allowed_text(entries: Sequence[str]) -> str:
    """The allowlist as the messages show it."""
    return ", ".join(entries) if entries else "none"


def key_allowed(key: str, domains: Sequence[str]) -> bool:
    """A label or annotation key without a prefix, or of an allowed domain (or a subdomain of one), never
    of a reserved domain."""
    domain = key_domain(key)
    if domain is None:
        return True
    return not key_reserved(key) and domain_within(domain, list(domains))


def toleration_key(toleration: Toleration) -> str:
    """A toleration's key as the allowlist names it: ``*`` for none (it tolerates every taint)."""
    return toleration.key or ANY_TAINT


def _first_refused_key(keys: Mapping[str, str], allowed: Callable[[str], bool]) -> str | None:
    refused = sorted(k for k in keys if not allowed(k))
    return refused[0] if refused else None


def violations(spec: ModelPoolSpec, policy: Policy, namespace: str) -> list[Violation]:
    """Every field of ``spec`` (a pool of ``namespace``) the policy refuses, in field order (empty: the
    spec is allowed)."""
    found = _namespace_violations(policy, namespace)
    cache = spec.model.cache
    if cache is not None and cache.type == "hostPath" and cache.path is not None:
        path = cache.path
        if not is_clean_path(path):
            found.append(Violation(FIELD_HOST_PATH, msg_unclean_path(path)))
        elif not host_path_allowed(path, policy.host_paths):
            found.append(Violation(FIELD_HOST_PATH, msg_host_path(path, policy.host_paths)))
        elif path.rsplit("/", 1)[-1] != namespace:
            found.append(Violation(FIELD_HOST_PATH, msg_cache_namespace(path, namespace)))
    if spec.image and not image_allowed(spec.image, policy.images):
        found.append(Violation(FIELD_IMAGE, msg_image(spec.image, policy.images)))
    template = spec.pod_template
    account = template.service_account_name
    if account and account not in policy.service_accounts:
        found.append(Violation(FIELD_SERVICE_ACCOUNT, msg_service_account(account, policy.service_accounts)))
    priority = template.priority_class_name
    if priority and priority not in policy.priority_classes:
        found.append(Violation(FIELD_PRIORITY_CLASS, msg_priority_class(priority, policy.priority_classes)))
    found += _placement_violations(
        template.tolerations, template.node_selector, policy, FIELD_TOLERATIONS, FIELD_NODE_SELECTOR
    )
    found += _node_affinity_violations(template.affinity, policy, FIELD_NODE_AFFINITY)
    for field, keys, domains in (
        (FIELD_LABELS, template.labels, policy.label_domains),
        (FIELD_ANNOTATIONS, template.annotations, policy.annotation_domains),
    ):
        key = _first_refused_key(keys, partial(key_allowed, domains=domains))
        if key is not None:
            found.append(Violation(field, msg_metadata_key(field, key, domains)))
    reserved = [e.name for e in template.env if env_name_reserved(e.name) and e.name not in policy.env_names]
    if reserved:
        found.append(Violation(FIELD_ENV, msg_env(reserved[0], policy.env_names)))
    if spec.served_model_name and alias_claims_namespace(spec.served_model_name, namespace) is not None:
        found.append(Violation(FIELD_SERVED_NAME, msg_served_name(spec.served_model_name, namespace)))
    return found


def host_violations(spec: ModelHostSpec, policy: Policy, namespace: str) -> list[Violation]:
    """The fields of a ModelHost's spec (a host of ``namespace``) beyond the allowlists: its namespace,
    ``spec.image``, ``tolerations`` and ``nodeSelector`` (the host pods run with the operator's right to
    create pods, as workers run a pool's)."""
    found = _namespace_violations(policy, namespace)
    if spec.image and not image_allowed(spec.image, policy.images):
        found.append(Violation(FIELD_IMAGE, msg_image(spec.image, policy.images)))
    found += _placement_violations(
        spec.tolerations, spec.node_selector, policy, FIELD_HOST_TOLERATIONS, FIELD_HOST_NODE_SELECTOR
    )
    found += _node_affinity_violations(spec.affinity, policy, FIELD_HOST_NODE_AFFINITY)
    return found


def node_affinity_keys(affinity: Affinity | None) -> list[str]:
    """The node label keys a node affinity names, in order: the required terms' expressions, then the
    preferred terms' (the chart's CEL walks them in the same order)."""
    node = affinity.node_affinity if affinity is not None else None
    if node is None:
        return []
    required = node.required_during_scheduling_ignored_during_execution
    terms = list(required.node_selector_terms) if required is not None else []
    terms += [p.preference for p in node.preferred_during_scheduling_ignored_during_execution or []]
    return [e.key for term in terms for e in term.match_expressions or []]


def _node_affinity_violations(affinity: Affinity | None, policy: Policy, field: str) -> list[Violation]:
    refused = [k for k in node_affinity_keys(affinity) if k not in policy.node_selector_keys]
    if not refused:
        return []
    return [Violation(field, msg_node_selector(field, refused[0], policy.node_selector_keys))]


def _namespace_violations(policy: Policy, namespace: str) -> list[Violation]:
    if policy.operator_namespace and namespace == policy.operator_namespace:
        return [Violation(FIELD_NAMESPACE, msg_operator_namespace(namespace))]
    return []


def _placement_violations(
    tolerations: Sequence[Toleration],
    node_selector: Mapping[str, str],
    policy: Policy,
    tolerations_field: str,
    node_selector_field: str,
) -> list[Violation]:
    found: list[Violation] = []
    keys = [toleration_key(t) for t in tolerations if toleration_key(t) not in policy.toleration_keys]
    if keys:
        found.append(
            Violation(tolerations_field, msg_toleration(tolerations_field, keys[0], policy.toleration_keys))
        )
    key = _first_refused_key(node_selector, lambda k: k in policy.node_selector_keys)
    if key is not None:
        found.append(
            Violation(
                node_selector_field, msg_node_selector(node_selector_field, key, policy.node_selector_keys)
            )
        )
    return found


# The messages, word for word as the chart's ValidatingAdmissionPolicy writes them.
def msg_operator_namespace(namespace: str) -> str:
    return (
        f"{FIELD_NAMESPACE}: {namespace} is the namespace the operator runs in; pools and hosts are served "
        "from other namespaces"
    )


def msg_unclean_path(path: str) -> str:
    return f"{FIELD_HOST_PATH}: {path} is not a clean absolute path (no empty, '.' or '..' segments)"


def msg_host_path(path: str, prefixes: Sequence[str]) -> str:
    return (
        f"{FIELD_HOST_PATH}: {path} is not under a host path the operator allows "
        f"(allowed: {allowed_text(prefixes)})"
    )


def msg_cache_namespace(path: str, namespace: str) -> str:
    return (
        f"{FIELD_HOST_PATH}: {path} must end in /{namespace}: a hostPath cache is the directory of one "
        "namespace (its workers share uid 10001 with every other namespace's)"
    )


def msg_image(image: str, entries: Sequence[str]) -> str:
    return f"{FIELD_IMAGE}: {image} is not an image the operator allows (allowed: {allowed_text(entries)})"


def msg_service_account(name: str, names: Sequence[str]) -> str:
    return (
        f"{FIELD_SERVICE_ACCOUNT}: {name} is not a service account the operator allows "
        f"(allowed: {allowed_text(names)})"
    )


def msg_priority_class(name: str, names: Sequence[str]) -> str:
    return (
        f"{FIELD_PRIORITY_CLASS}: {name} is not a priority class the operator allows "
        f"(allowed: {allowed_text(names)})"
    )


def msg_toleration(field: str, key: str, keys: Sequence[str]) -> str:
    return (
        f"{field}: {key} is not a toleration key the operator allows (allowed: {allowed_text(keys)}; "
        f"{ANY_TAINT}: a toleration without a key, which tolerates every taint)"
    )


def msg_node_selector(field: str, key: str, keys: Sequence[str]) -> str:
    return f"{field}: {key} is not a node label key the operator allows (allowed: {allowed_text(keys)})"


def msg_metadata_key(field: str, key: str, domains: Sequence[str]) -> str:
    return (
        f"{field}: {key} is not a key the operator allows: a key without a prefix, or of an allowed domain "
        f"(allowed: {allowed_text(domains)}), never of {', '.join(RESERVED_KEY_DOMAINS)} or their subdomains"
    )


def msg_env(name: str, names: Sequence[str]) -> str:
    return (
        f"{FIELD_ENV}: {name} is reserved: the server or its libraries read it (MODELPOOL_*, LD_*, the "
        "Python start-up and Hugging Face cache variables); the pool's own fields say what the server does "
        f"(allowed anyway: {allowed_text(names)})"
    )


def msg_served_name(alias: str, namespace: str) -> str:
    return (
        f"{FIELD_SERVED_NAME}: {alias} reads as a pool of another namespace; an alias of the form "
        f"namespace/name must start with this pool's namespace ({namespace}/)"
    )


# Checks of the allowlists themselves (the operator's settings; the chart's schema has the same rules).
def check_host_path_prefix(entry: str) -> str:
    if not is_clean_path(entry):
        raise ValueError(f"{entry!r} is not a clean absolute path (no empty, '.' or '..' segments)")
    return entry


def check_image_entry(entry: str) -> str:
    if "/" not in entry or entry.startswith("/") or any(ch.isspace() for ch in entry):
        raise ValueError(
            f"{entry!r}: name a registry or path prefix ending in '/' (ghcr.io/modelpool/) or a repository "
            "(ghcr.io/modelpool/modelpool-server)"
        )
    return entry


def check_key_domain(entry: str) -> str:
    if _DOMAIN.match(entry) is None:
        raise ValueError(f"{entry!r} is not a lower-case DNS domain (example.com, sidecar.istio.io)")
    if domain_within(entry, list(RESERVED_KEY_DOMAINS)):
        raise ValueError(
            f"{entry!r} is reserved: {', '.join(RESERVED_KEY_DOMAINS)} and their subdomains are never allowed"
        )
    return entry
