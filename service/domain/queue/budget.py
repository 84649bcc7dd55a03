"""A team's slot-hour budget: the period it counts over and what a team past it is told. Pure.

``month`` is the calendar month in UTC (it resets at 00:00 UTC on the 1st); ``rolling_30d`` the
30 days before now (it frees as old usage leaves the window, so it has no reset time).
"""

from datetime import UTC, datetime
from enum import Enum

from service.domain.queue.fairshare import DAY_S, HOUR_S


class Period(str, Enum):
    month = "month"
    rolling_30d = "rolling_30d"


def window(period: Period, now: float) -> tuple[float, float | None]:
    """(start of the period holding ``now``, when it resets: None for a rolling window)."""
    if period is Period.rolling_30d:
        return now - 30 * DAY_S, None
    at = datetime.fromtimestamp(now, UTC)
    start = datetime(at.year, at.month, 1, tzinfo=UTC)
    reset = datetime(at.year + at.month // 12, at.month % 12 + 1, 1, tzinfo=UTC)
    return start.timestamp(), reset.timestamp()


def utc_minutes(at: float) -> str:
    """``2027-01-01T00:00Z``."""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%MZ")


def hours(value: float) -> str:
    """Slot-hours as people read them: ``500.2``; a small budget's ``0.00123``."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def spent_reason(team: str, used_s: float, slot_hours: float, period: Period,
                 resets_at: float | None) -> str:
    """Why a team past its budget starts nothing, naming the budget and when it frees."""
    used = hours(used_s / HOUR_S)
    if period is Period.month:
        return (f"team {team} used {used} of {slot_hours:g} slot-hours this month; "
                f"resets {utc_minutes(resets_at or 0.0)}")
    return (f"team {team} used {used} of {slot_hours:g} slot-hours in the last 30 days; "
            "frees as that usage ages out")
