"""The shared hosts' control keys (``control_keys``): derived from the operator's seed, one per ModelHost
object, and the operator never reads a Secret (its RBAC grants only ``create`` and ``patch`` on them)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import modelpool_operator
from modelpool_operator.control_keys import derive_control_key, load_seed
from modelpool_operator.effects.kube import KubeApi

SEED = b"a-seed-of-at-least-sixteen-bytes"


def test_the_key_is_deterministic_and_differs_per_host_uid_and_seed() -> None:
    key = derive_control_key(SEED, "ns", "gpus", "uid-1")
    assert key == derive_control_key(SEED, "ns", "gpus", "uid-1")
    assert re.fullmatch(r"[0-9a-f]{64}", key)
    others = {
        derive_control_key(SEED, "ns", "cpus", "uid-1"),  # another host
        derive_control_key(SEED, "other", "gpus", "uid-1"),  # the same name in another namespace
        derive_control_key(SEED, "ns", "gpus", "uid-2"),  # the host deleted and made again
        derive_control_key(b"another-seed-of-sixteen-bytes", "ns", "gpus", "uid-1"),
    }
    assert key not in others and len(others) == 4


def test_the_seed_is_read_from_its_file_or_made_at_random(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seed_file = tmp_path / "seed"
    seed_file.write_text("x" * 48 + "\n")
    assert load_seed(seed_file) == b"x" * 48
    with caplog.at_level(logging.WARNING):
        first, second = load_seed(None), load_seed(None)
    assert first != second and len(first) == 32
    assert "will not survive a restart" in caplog.text
    seed_file.write_text("short")
    with pytest.raises(ValueError, match="at least 16"):
        load_seed(seed_file)


def test_the_operator_never_reads_a_secret() -> None:
    """No method of the API seam reads a Secret, and no module of the operator calls the client's Secret
    reads (the chart's RBAC has no ``get``/``list``/``watch`` on Secrets)."""
    assert not [m for m in dir(KubeApi) if "secret" in m.lower() and m != "ensure_control_key_secret"]
    package = Path(modelpool_operator.__file__).parent
    reads = re.compile(r"(read|list|watch)_\w*secret", re.IGNORECASE)
    found = [str(p) for p in package.rglob("*.py") if reads.search(p.read_text())]
    assert found == []
