"""Kubernetes resource quantities (``2Gi``, ``500M``, ``1.5G``, ``128974848``, ``1e9``) to and from bytes,
and a quantity's exact value (``500m`` CPU is 0.5).

Pure and dependency-free: the operator charges memory against the budget in integer bytes, while the
wire (spec, status, printer columns) speaks quantities.  The grammar is the one the API server accepts
for resource quantities; fractional byte counts are rounded up (a budget never under-charges).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

# The suffix → multiplier table of k8s.io/apimachinery/pkg/api/resource (binary SI, decimal SI).
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}

# A regular expression the CRD schema uses too (for the string form of int-or-string fields): a
# non-negative number followed by an optional binary/decimal suffix or a decimal exponent.
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
# Kubernetes quantities are int64 underneath; anything larger is a typo, not a memory size.
_MAX_BYTES = 2**63 - 1
_MAX_EXPONENT = 40


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity (the message quotes it and shows valid forms)."""


def parse_quantity(value: str | int | float) -> int:
    """A quantity as whole bytes (rounded up).  Raises ``QuantityError`` for malformed or negative input."""
    if isinstance(value, bool):
        raise QuantityError(f"invalid quantity {value!r}: expected a number or a string like '2Gi'")
    if isinstance(value, int):
        if value < 0 or value > _MAX_BYTES:
            raise QuantityError(f"invalid quantity {value!r}: must be between 0 and 2^63-1")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or value > _MAX_BYTES:
            raise QuantityError(f"invalid quantity {value!r}: must be a finite, non-negative number")
        return math.ceil(value)
    amount = quantity_value(value)
    if amount > _MAX_BYTES:
        raise QuantityError(f"invalid quantity {value!r}: too large (the limit is 2^63-1 bytes)")
    # Decimal -> int rounding up: charging a fraction of a byte as a whole byte keeps the budget safe.
    return int(amount.to_integral_value(rounding="ROUND_CEILING"))


def quantity_value(text: str) -> Decimal:
    """A quantity's exact value (``500m`` → ``0.5``, ``2Gi`` → ``2147483648``), for the callers that
    divide quantities (a CPU request over a divisor) before rounding.  Raises ``QuantityError`` for
    malformed or negative input."""
    match = _QUANTITY_RE.match(text.strip())
    if match is None:
        raise QuantityError(
            f"invalid quantity {text!r}: expected a number with an optional suffix "
            "such as '2Gi', '500M' or '1e9'"
        )
    number_text, suffix = match.group(1), match.group(3) or ""
    # An exponent such as e9 is bounded first, so "1e999999999" cannot eat the operator's memory.
    if suffix not in _BINARY and suffix not in _DECIMAL and int(suffix[1:]) > _MAX_EXPONENT:
        raise QuantityError(f"invalid quantity {text!r}: too large")
    try:
        number = Decimal(number_text)
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix in _DECIMAL:
            return number * _DECIMAL[suffix]
        return number * (Decimal(10) ** int(suffix[1:]))  # the exponent form
    except (InvalidOperation, ValueError, OverflowError) as exc:
        raise QuantityError(f"invalid quantity {text!r}: {exc}") from None


def is_quantity(value: object) -> bool:
    """True when ``parse_quantity`` would accept the value."""
    if not isinstance(value, str | int | float):
        return False
    try:
        parse_quantity(value)
    except QuantityError:
        return False
    return True


def format_quantity(num_bytes: int) -> str:
    """Bytes as the shortest exact binary quantity (``4294967296`` → ``4Gi``; ``1000`` → ``1000``)."""
    if num_bytes < 0:
        raise QuantityError(f"invalid byte count {num_bytes}: must not be negative")
    if num_bytes == 0:
        return "0"
    for suffix, factor in reversed(_BINARY.items()):
        if num_bytes % factor == 0:
            return f"{num_bytes // factor}{suffix}"
    return str(num_bytes)


def humanize_bytes(num_bytes: int) -> str:
    """Bytes rounded for people (``1610612736`` → ``1.5Gi``); for messages, never for the wire."""
    value = float(num_bytes)
    for suffix in ("", "Ki", "Mi", "Gi", "Ti", "Pi"):
        if abs(value) < 1024 or suffix == "Pi":
            return f"{value:.0f}{suffix}" if suffix == "" or value == int(value) else f"{value:.1f}{suffix}"
        value /= 1024
    return f"{num_bytes}"  # pragma: no cover - the loop always returns
