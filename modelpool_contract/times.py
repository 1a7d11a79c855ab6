"""Times as Kubernetes writes them: RFC 3339 in UTC, to the second (or the millisecond where needed)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 string, an epoch number, or a datetime, as an aware UTC datetime (None if unparseable)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return _from_epoch(float(value))
    if isinstance(value, str) and value:
        text = value.strip()
        if text.endswith("Z"):
            text = text[:-1] + "+00:00"
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            try:
                return _from_epoch(float(text))
            except ValueError:
                return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _from_epoch(seconds: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def rfc3339(value: datetime | None) -> str | None:
    """A datetime as ``2026-01-02T03:04:05Z`` (seconds precision, UTC), the way Kubernetes writes times."""
    if value is None:
        return None
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339_ms(value: datetime | None) -> str | None:
    """A datetime as ``2026-01-02T03:04:05.678Z``: milliseconds, for times compared with a gateway's."""
    if value is None:
        return None
    utc = value.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"
