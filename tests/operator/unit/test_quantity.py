"""Kubernetes quantities to bytes and back."""

from __future__ import annotations

import contextlib
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from modelpool_contract.quantity import (
    QuantityError,
    format_quantity,
    humanize_bytes,
    is_quantity,
    parse_quantity,
    quantity_value,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2Gi", 2 * 2**30),
        ("500M", 500 * 10**6),
        ("1.5Gi", 3 * 2**29),
        ("128974848", 128974848),
        ("129e6", 129 * 10**6),
        ("1E3", 1000),
        ("123Mi", 123 * 2**20),
        ("1k", 1000),
        ("0", 0),
        (".5Ki", 512),
        ("1500m", 2),  # 1.5 bytes: rounded up, never under-charged
        (" 4Gi ", 4 * 2**30),
        (7, 7),
        (2.5, 3),
    ],
)
def test_parse(text: str | int | float, expected: int) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "Gi",
        "2GB",
        "-1Gi",
        "2 Gi",
        "1.2.3",
        "abc",
        "0x10",
        "1e999999999",
        "99999999999Ei",
        -5,
        float("nan"),
        True,
    ],
)
def test_parse_rejects_with_the_value_in_the_message(bad: object) -> None:
    with pytest.raises(QuantityError, match="invalid quantity"):
        parse_quantity(bad)  # type: ignore[arg-type]
    assert not is_quantity(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Decimal("0.5")),  # a CPU share: exact, not rounded to whole units
        ("1500m", Decimal("1.5")),
        ("250u", Decimal("0.00025")),
        ("2", Decimal(2)),
        ("1Mi", Decimal(2**20)),
        ("1.5k", Decimal(1500)),
        ("5e-1", Decimal("0.5")),
        ("1E", Decimal(10**18)),  # the decimal suffix E, not an exponent
    ],
)
def test_quantity_value_is_exact(text: str, expected: Decimal) -> None:
    assert quantity_value(text) == expected


@pytest.mark.parametrize(
    ("bad", "message"), [("lots", "expected a number"), ("-1", "expected"), ("1e41", "too large")]
)
def test_quantity_value_rejects_with_the_value_named_once(bad: str, message: str) -> None:
    with pytest.raises(QuantityError) as raised:
        quantity_value(bad)
    assert str(raised.value).startswith(f"invalid quantity {bad!r}: ") and message in str(raised.value)
    assert str(raised.value).count("invalid quantity") == 1


def test_format_and_humanize() -> None:
    assert format_quantity(4 * 2**30) == "4Gi"
    assert format_quantity(1536 * 2**20) == "1536Mi"
    assert format_quantity(1000) == "1000"
    assert format_quantity(0) == "0"
    assert humanize_bytes(3 * 2**29) == "1.5Gi"
    assert humanize_bytes(2**30) == "1Gi"
    assert humanize_bytes(12) == "12"


@given(st.integers(0, 2**62))
def test_format_round_trips(num: int) -> None:
    assert parse_quantity(format_quantity(num)) == num


@given(
    st.integers(0, 10**6),
    st.sampled_from(["", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"]),
)
def test_suffixes_multiply(num: int, suffix: str) -> None:
    factors = {
        "": 1,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    assert parse_quantity(f"{num}{suffix}") == num * factors[suffix]


@given(st.text(max_size=12))
def test_never_crashes_on_text(text: str) -> None:
    with contextlib.suppress(QuantityError):
        assert parse_quantity(text) >= 0
