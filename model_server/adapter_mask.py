"""The LoRA adapters a worker holds, as one number of its shared view (pure).

The inference process knows which adapters are loaded and which running requests use; ``/stats`` and
``/metrics`` are answered by other processes from the shared view (``worker_view``), which holds floats.
A set of adapters is therefore a bit mask over the declared ones (``--adapter``'s order, at most
``modelpool_contract.flags.MAX_ADAPTERS``: exact in a float's 52 bits).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def adapter_mask(declared: Sequence[str], names: Iterable[str]) -> int:
    """The bit mask of ``names`` over the declared adapters (bit ``i``: ``declared[i]``)."""
    wanted = set(names)
    return sum(1 << i for i, name in enumerate(declared) if name in wanted)


def mask_names(declared: Sequence[str], mask: float | None) -> list[str]:
    """The declared adapters whose bits ``mask`` sets (a NaN or None mask: none)."""
    if mask is None or math.isnan(mask):
        return []
    bits = int(mask)
    return [name for i, name in enumerate(declared) if bits >> i & 1]


__all__ = ["adapter_mask", "mask_names"]
