"""What a ModelPool's author may ask for: the operator's allowlists, and the pure decision over a spec.

The operator creates worker pods with its own right to create pods, so without a policy "may create a
ModelPool" would mean "may run any image, as any service account, with any directory of the node
mounted". ``violations(spec, policy)`` names each field of a spec that goes beyond the operator's
configured allowlists (``OperatorConfig.allowed_host_paths``, ``allowed_images``,
``allowed_service_accounts``); the pool is then refused (``reconcile``). The chart's
ValidatingAdmissionPolicy (``templates/admissionpolicy.yaml``) applies the same rules, with the same
messages, at ``kubectl apply``; ``tests/operator/integration/test_admission_policy.py`` checks them
against each other on the real API server.

The rules:

* ``spec.model.cache.path`` (type hostPath) must be a clean absolute path (``CLEAN_PATH_PATTERN``: no
  empty, ``.`` or ``..`` segment, so no ``//`` and no trailing ``/``) under one of the allowed prefixes,
  matched on whole segments: ``/data`` allows ``/data`` and ``/data/x``, never ``/database``. No prefix
  allowed (the default): no hostPath cache.
* ``spec.image``, when set: an entry ending in ``/`` allows every image that starts with it
  (``ghcr.io/modelpool/`` allows ``ghcr.io/modelpool/server:1``, not ``ghcr.io/modelpoolx/server``); any
  other entry names one repository, allowed at any tag or digest (``ghcr.io/modelpool/server`` allows
  ``ghcr.io/modelpool/server``, ``...:1.2``, ``...@sha256:...``, not ``ghcr.io/modelpool/server-x``).
  Images are compared as written (``nginx`` is not ``docker.io/library/nginx``). An image with an empty,
  ``.`` or ``..`` path segment is refused. No entry (the default): any image.
* ``spec.podTemplate.serviceAccountName``, when set: one of the allowed names. No entry (the default):
  any. Unset, the workers run as the namespace's ``default`` service account, which is always allowed.
* ``spec.servedModelName``, when shaped like ``namespace/name`` (``NAMESPACED_NAME_PATTERN``), must start
  with the pool's own namespace: an alias ``team-b/llama`` on a pool of ``team-a`` would receive the prompts
  of callers who mean team-b's pool (a key granting both, or ``--auth none``). Not an allowlist: always on.

A ModelHost's ``spec.image`` obeys the same image rule (``host_violations``): its host pods are created
with the same right; a ModelHost that breaks it gets no host pod.

The operator's own defaults (its ``server_image``, its default model cache) are the administrator's
choice and are not checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from modelpool_contract.api import ModelHostSpec, ModelPoolSpec, alias_claims_namespace

# One path segment that is neither empty, "." nor "..": starting with a character other than "." and
# "/", or a dot then such a character, or two dots then anything but "/".
_SEGMENT = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
#: A clean absolute path: "/" or "/" followed by clean segments (the chart's CEL and schema use it too).
CLEAN_PATH_PATTERN = rf"^(/|(/{_SEGMENT})+)$"
#: An image whose "/"-separated parts are all clean segments.
CLEAN_IMAGE_PATTERN = rf"^{_SEGMENT}(/{_SEGMENT})*$"
_CLEAN_PATH = re.compile(CLEAN_PATH_PATTERN)
_CLEAN_IMAGE = re.compile(CLEAN_IMAGE_PATTERN)

FIELD_HOST_PATH = "spec.model.cache.path"
FIELD_IMAGE = "spec.image"
FIELD_SERVICE_ACCOUNT = "spec.podTemplate.serviceAccountName"
FIELD_SERVED_NAME = "spec.servedModelName"


@dataclass(frozen=True)
class Policy:
    """The operator's allowlists. ``host_paths`` empty: no hostPath cache; ``images`` or
    ``service_accounts`` empty: any."""

    host_paths: tuple[str, ...] = ()
    images: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()


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
    """Any image when ``entries`` is empty; else a clean image matching an entry (see the module doc)."""
    if not entries:
        return True
    if _CLEAN_IMAGE.match(image) is None:
        return False
    return any(_image_matches(image, entry) for entry in entries)


def _image_matches(image: str, entry: str) -> bool:
    if entry.endswith("/"):
        return image.startswith(entry)
    return image == entry or image.startswith((entry + ":", entry + "@"))


def allowed_text(entries: Sequence[str]) -> str:
    """The allowlist as the messages show it."""
    return ", ".join(entries) if entries else "none"


def violations(spec: ModelPoolSpec, policy: Policy, namespace: str) -> list[Violation]:
    """Every field of ``spec`` (a pool of ``namespace``) the policy refuses, in field order (empty: the
    spec is allowed)."""
    found: list[Violation] = []
    cache = spec.model.cache
    if cache is not None and cache.type == "hostPath" and cache.path is not None:
        path = cache.path
        if not is_clean_path(path):
            found.append(Violation(FIELD_HOST_PATH, msg_unclean_path(path)))
        elif not host_path_allowed(path, policy.host_paths):
            found.append(Violation(FIELD_HOST_PATH, msg_host_path(path, policy.host_paths)))
    if spec.image and not image_allowed(spec.image, policy.images):
        found.append(Violation(FIELD_IMAGE, msg_image(spec.image, policy.images)))
    account = spec.pod_template.service_account_name
    if account and policy.service_accounts and account not in policy.service_accounts:
        found.append(Violation(FIELD_SERVICE_ACCOUNT, msg_service_account(account, policy.service_accounts)))
    if spec.served_model_name and alias_claims_namespace(spec.served_model_name, namespace) is not None:
        found.append(Violation(FIELD_SERVED_NAME, msg_served_name(spec.served_model_name, namespace)))
    return found


# The messages, word for word as the chart's ValidatingAdmissionPolicy writes them.
def host_violations(spec: ModelHostSpec, policy: Policy) -> list[Violation]:
    """The fields of a ModelHost's spec beyond the allowlists: its ``spec.image`` (the host pods run it
    with the operator's right to create pods, as workers run a pool's)."""
    if spec.image and not image_allowed(spec.image, policy.images):
        return [Violation(FIELD_IMAGE, msg_image(spec.image, policy.images))]
    return []


def msg_unclean_path(path: str) -> str:
    return f"{FIELD_HOST_PATH}: {path} is not a clean absolute path (no empty, '.' or '..' segments)"


def msg_host_path(path: str, prefixes: Sequence[str]) -> str:
    return (
        f"{FIELD_HOST_PATH}: {path} is not under a host path the operator allows "
        f"(allowed: {allowed_text(prefixes)})"
    )


def msg_image(image: str, entries: Sequence[str]) -> str:
    return f"{FIELD_IMAGE}: {image} is not an image the operator allows (allowed: {allowed_text(entries)})"


def msg_service_account(name: str, names: Sequence[str]) -> str:
    return (
        f"{FIELD_SERVICE_ACCOUNT}: {name} is not a service account the operator allows "
        f"(allowed: {allowed_text(names)})"
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
