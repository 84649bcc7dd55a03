"""The store's clock: naive UTC, as every timestamp column holds it."""

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)
