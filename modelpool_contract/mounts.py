"""Where a worker pod's volumes are mounted, as both halves must agree on it.

* A ``pvc://claim/sub/path`` source: the operator mounts the claim (read-only) at
  ``pvc_mount_path(claim)`` = ``/models/<claim>`` and tells the server ``--pvc-root /models``; the server
  reads the model from ``<pvc-root>/<claim>/<sub/path>``.  ``parse_pvc_source`` is the one parser of
  the form, used by the pod builder and the server's source resolution.
* The model cache (``hf://`` downloads): mounted at ``CACHE_MOUNT_PATH``, with ``HF_HOME`` at
  ``HF_HOME_PATH`` inside it.  Whether it is a per-pod emptyDir or a volume that workers share is the
  pool's choice (``spec.model.cache``); the paths are the same either way.
* The writable scratch of a read-only root filesystem: worker containers run with
  ``readOnlyRootFilesystem``, so everything the server and its libraries write goes to an emptyDir:
  ``TMP_PATH`` (``TMPDIR``: tempfiles, the Prometheus multiprocess files, torch's compile caches) and
  ``HOME_PATH`` (``HOME``, ``XDG_CACHE_HOME``, ``MPLCONFIGDIR``: the caches torch, triton and matplotlib
  keep under the home directory).  ``SCRATCH_ENV`` is the environment that points them there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

#: Claims of ``pvc://`` sources are mounted below this directory, one directory per claim.
PVC_MOUNT_ROOT: Final = "/models"
PVC_SCHEME: Final = "pvc://"
#: The model cache volume's mount path in worker pods.
CACHE_MOUNT_PATH: Final = "/cache"
#: ``HF_HOME`` of worker pods (huggingface_hub keeps its download cache in ``$HF_HOME/hub``).
HF_HOME_PATH: Final = f"{CACHE_MOUNT_PATH}/huggingface"

#: The ``tmp`` emptyDir of worker pods, and their ``TMPDIR``.
TMP_PATH: Final = "/tmp"
#: The ``home`` emptyDir of worker pods: their ``HOME`` (the Dockerfile's user's home directory).
HOME_PATH: Final = "/home/modelpool"
#: The environment that sends what libraries write to the writable volumes, in the order the pod sets it
#: (a pool's own ``podTemplate.env`` entry of the same name wins).  ``HF_HOME`` is in the cache volume.
SCRATCH_ENV: Final = (
    ("HF_HOME", HF_HOME_PATH),
    ("TMPDIR", TMP_PATH),
    ("HOME", HOME_PATH),
    ("XDG_CACHE_HOME", f"{HOME_PATH}/.cache"),
    ("MPLCONFIGDIR", f"{HOME_PATH}/.config/matplotlib"),
)

# A claim name is a DNS-1123 subdomain (Kubernetes object name rules), at most 253 characters.
_CLAIM_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class PvcSourceError(ValueError):
    """A ``pvc://`` source that does not name a claim."""


@dataclass(frozen=True)
class PvcSource:
    """``pvc://<claim>/<path>``: the claim and the path inside it ("" for the claim's root)."""

    claim: str
    path: str

    @property
    def mount_path(self) -> str:
        """Where the operator mounts the claim in the worker pod."""
        return pvc_mount_path(self.claim)

    def model_path(self, root: str = PVC_MOUNT_ROOT) -> str:
        """The model directory when claims are mounted under ``root``."""
        base = f"{root.rstrip('/')}/{self.claim}"
        return f"{base}/{self.path}" if self.path else base


def parse_pvc_source(source: str) -> PvcSource | None:
    """Pure: ``pvc://claim[/sub/path]`` -> ``PvcSource``; None for any other scheme.

    Raises ``PvcSourceError`` when the claim is missing or not a valid object name, or the path climbs
    out of the claim (``..``)."""
    if not source.startswith(PVC_SCHEME):
        return None
    claim, _, sub = source[len(PVC_SCHEME) :].partition("/")
    if not claim or len(claim) > 253 or not _CLAIM_RE.match(claim):
        raise PvcSourceError(f"pvc source must be pvc://claim[/sub/path] (a claim name), got {source!r}")
    parts = [part for part in sub.split("/") if part]
    if ".." in parts:
        raise PvcSourceError(f"pvc source must not leave its claim with '..', got {source!r}")
    return PvcSource(claim=claim, path="/".join(parts))


def pvc_mount_path(claim: str) -> str:
    """Where a ``pvc://`` source's claim is mounted in a worker pod: ``/models/<claim>``."""
    return f"{PVC_MOUNT_ROOT}/{claim}"
