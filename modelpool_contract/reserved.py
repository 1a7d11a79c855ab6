"""What a pool's author may never put on its worker pods: the environment the server (and the Python and
Hugging Face libraries under it) reads, and the label and annotation domains of the project and of
Kubernetes.

The operator's policy (``modelpool_operator.policy``) refuses a ModelPool that names them, and the chart's
ValidatingAdmissionPolicy renders the same lists into its CEL (``templates/admissionpolicy.yaml`` reads them
from ``values.yaml``'s ``reserved`` block; ``tests/operator/unit/test_policy.py`` keeps both equal), so the
one definition is here.

* Environment: every ``MODELPOOL_*`` variable is one of the server's flags (``model_server.config``: its
  settings read ``MODELPOOL_<FLAG>``, case-insensitively), so ``MODELPOOL_TRUST_REMOTE_CODE`` or
  ``MODELPOOL_HANDLER`` would bypass ``spec.model.trustRemoteCode`` and the task the operator passes;
  ``LD_*`` (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``) and the Python start-up variables load code
  from anywhere the worker can write (its model cache), which is what trustRemoteCode off forbids; the
  cache variables (``HF_HOME``, ``HF_MODULES_CACHE``, ...) would move the model cache, or the remote code
  copied from it, out of the volume the operator gave it (``modelpool_contract.mounts``). Names compare
  case-insensitively (pydantic-settings reads the server's flags so).
* Label and annotation keys: a key whose prefix (before ``/``) is one of ``RESERVED_KEY_DOMAINS`` or a
  subdomain of one: ``modelpool.dev`` (the ledger's, the Service's and the gateway's own labels),
  ``kubernetes.io`` and ``k8s.io`` (AppArmor, seccomp, the kubelet's, the scheduler's and the autoscaler's
  annotations). The administrator can allow other domains, never these.

The defaults of the operator's placement allowlists (``DEFAULT_TOLERATION_KEYS``,
``DEFAULT_NODE_SELECTOR_KEYS``) are here too, beside what is never allowed.
"""

from __future__ import annotations

from typing import Final

#: Prefixes of environment variable names a pool may not set (compared in capitals).
RESERVED_ENV_PREFIXES: Final = ("MODELPOOL_", "LD_")
#: Environment variable names a pool may not set (compared in capitals).
RESERVED_ENV_NAMES: Final = (
    # The model cache and what is copied into it (remote code: HF_MODULES_CACHE).
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_MODULES_CACHE",
    "HF_ASSETS_CACHE",
    "HF_XET_CACHE",
    "TRANSFORMERS_CACHE",
    "SENTENCE_TRANSFORMERS_HOME",
    "TORCH_HOME",
    # Code loaded at start-up from a directory of one's choice.
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONPLATLIBDIR",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
)
#: The toleration keys allowed by default: the GPU nodes' taint (the NVIDIA device plugin's convention).
DEFAULT_TOLERATION_KEYS = ("nvidia.com/gpu",)
#: The node label keys allowed by default: hardware and place, which every tenant may choose; never a
#: node's role (node-role.kubernetes.io/control-plane) or name (kubernetes.io/hostname, which would pick
#: another tenant's node to sit beside), nor the labels that set a team's nodes apart (the admin's to grant).
DEFAULT_NODE_SELECTOR_KEYS = (
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.count",
)
#: Label and annotation key domains a pool may not use, nor any subdomain of them.
RESERVED_KEY_DOMAINS: Final = ("modelpool.dev", "kubernetes.io", "k8s.io")


def _upper_ascii(text: str) -> str:
    # As CEL's upperAscii() (the chart's policy): only a-z change.
    return "".join(c.upper() if "a" <= c <= "z" else c for c in text)


def env_name_reserved(name: str) -> bool:
    """True for a variable the server or its libraries read to decide what code runs or where the cache
    is (``MODELPOOL_*``, ``LD_*``, ``RESERVED_ENV_NAMES``), in any case."""
    upper = _upper_ascii(name)
    return upper in RESERVED_ENV_NAMES or upper.startswith(RESERVED_ENV_PREFIXES)


def key_domain(key: str) -> str | None:
    """The prefix of a label or annotation key (before its first ``/``) in lower case; None for a key
    without one."""
    prefix, slash, _ = key.partition("/")
    return "".join(c.lower() if "A" <= c <= "Z" else c for c in prefix) if slash else None


def domain_within(domain: str, parents: tuple[str, ...] | list[str]) -> bool:
    """True when ``domain`` is one of ``parents`` or a subdomain of one (``a.k8s.io`` within ``k8s.io``;
    ``xk8s.io`` is not)."""
    return any(domain == p or domain.endswith("." + p) for p in parents)


def key_reserved(key: str) -> bool:
    """True for a key of a reserved domain (``RESERVED_KEY_DOMAINS``, subdomains included)."""
    domain = key_domain(key)
    return domain is not None and domain_within(domain, RESERVED_KEY_DOMAINS)
