"""The shared hosts' control keys: each ModelHost's key is derived from the operator's seed, so that a
restarted operator knows every key without reading a Secret (the chart grants it no ``get`` on Secrets).

``derive_control_key`` is the pure derivation; ``load_seed`` reads the seed file the chart mounts (its
Secret ``<release>-control-seed``), or makes a random seed when none is configured (dev runs: the keys then
change with each start, and host pods made by an earlier process refuse the new one's control calls).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from pathlib import Path

logger = logging.getLogger(__name__)

# A seed shorter than this is refused: HMAC-SHA256's key should carry at least 128 bits.
MIN_SEED_BYTES = 16


def derive_control_key(seed: bytes, namespace: str, name: str, uid: str | None) -> str:
    """HMAC-SHA256(seed, "<namespace>/<name>/<uid>"), hex: one key per ModelHost object (a host deleted
    and made again under its name has a new uid, hence a new key)."""
    message = f"{namespace}/{name}/{uid or ''}".encode()
    return hmac.new(seed, message, hashlib.sha256).hexdigest()


def load_seed(path: Path | None) -> bytes:
    """The seed from ``path`` (its bytes, surrounding whitespace stripped), or a random one when no file is
    configured. A configured file that cannot be read, or holds too short a seed, is an error."""
    if path is None:
        logger.warning(
            "no control seed file configured (MODELPOOL_OPERATOR_CONTROL_SEED_FILE): a random seed is used, "
            "so the shared hosts' control keys will not survive a restart of the operator"
        )
        return secrets.token_bytes(32)
    seed = path.read_bytes().strip()
    if len(seed) < MIN_SEED_BYTES:
        raise ValueError(f"the control seed file {path} holds {len(seed)} bytes; at least {MIN_SEED_BYTES}")
    return seed
