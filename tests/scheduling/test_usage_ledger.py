"""Recent usage, pure (``service.domain.queue.fairshare``, ``budget``): the decay with a clock
the test moves (no sleeps), the incremental ledger against a full recomputation, runs read
twice counted once, and the budgets' windows."""

import random
from datetime import UTC, datetime

import pytest

from service.domain.queue import budget
from service.domain.queue.budget import Period
from service.domain.queue.fairshare import (
    FOLD_MEMORY_S,
    HOUR_S,
    UsageLedger,
    overlap,
    run_worth,
)
from service.store.usage import UsageRow

H = 168 * HOUR_S
T0 = datetime(2026, 12, 10, tzinfo=UTC).timestamp()


def test_a_slot_hour_used_one_half_life_ago_counts_half() -> None:
    hour = run_worth(1, T0, T0 + HOUR_S, T0 + HOUR_S, H)
    later = run_worth(1, T0, T0 + HOUR_S, T0 + HOUR_S + H, H)
    assert later == pytest.approx(hour / 2, rel=1e-12)
    assert hour == pytest.approx(HOUR_S, rel=3e-3), "barely decayed within its own hour"
    assert run_worth(4, T0, T0 + 10, T0 + 10, H) == pytest.approx(4 * run_worth(1, T0, T0 + 10, T0 + 10, H))


def test_the_ledger_decays_with_the_clock_it_is_given() -> None:
    ledger = UsageLedger(H)
    ledger.apply([UsageRow(1, "a", 2, T0, T0 + HOUR_S)], T0 + HOUR_S)
    now = ledger.decayed_s("a", T0 + HOUR_S)
    ledger.apply([], T0 + HOUR_S + H)  # one half-life later: nothing new
    assert ledger.decayed_s("a", T0 + HOUR_S + H) == pytest.approx(now / 2, rel=1e-9)
    ledger.apply([], T0 + HOUR_S + 3 * H)
    assert ledger.decayed_s("a", T0 + HOUR_S + 3 * H) == pytest.approx(now / 8, rel=1e-9)


def _full(runs: list[UsageRow], team: str, now: float) -> float:
    return sum(run_worth(r.slots, r.started_at, min(r.ended_at or now, now), now, H)
               for r in runs if r.team == team and r.started_at < now)


def test_incremental_reads_equal_a_full_recomputation_and_count_each_run_once() -> None:
    rng = random.Random(7)
    runs: list[UsageRow] = []
    start = T0
    for i in range(300):
        start += rng.uniform(0, 4 * HOUR_S)
        runs.append(UsageRow(i + 1, rng.choice(["a", "b", None]), rng.randint(1, 4), start,
                             start + rng.uniform(1, 20 * HOUR_S)))
    ledger = UsageLedger(H)
    now = T0
    while now < start + 30 * HOUR_S:
        now += rng.uniform(1, 3 * HOUR_S)
        since = ledger.next_closed_since(now)
        # What the store would answer: open runs (as of now) and runs closed since ``since``.
        seen = [r if r.ended_at is not None and r.ended_at <= now
                else UsageRow(r.id, r.team, r.slots, r.started_at, None)
                for r in runs if r.started_at <= now]
        ledger.apply([r for r in seen if r.ended_at is None or r.ended_at >= since], now)
        for team in ("a", "b", None):
            assert ledger.decayed_s(team, now) == pytest.approx(_full(runs, team, now), rel=1e-9)
    assert ledger.next_closed_since(now) == now - FOLD_MEMORY_S


def test_running_slots_and_a_budget_window() -> None:
    month_start, resets = budget.window(Period.month, T0)
    ledger = UsageLedger(H)
    rows = [UsageRow(1, "a", 2, month_start - HOUR_S, month_start + HOUR_S),  # straddles
            UsageRow(2, "a", 1, T0 - 2 * HOUR_S, T0 - HOUR_S),
            UsageRow(3, "a", 3, T0 - HOUR_S, None)]
    ledger.apply(rows, T0)
    assert ledger.running_slots("a") == 3 and ledger.running_slots("b") == 0
    assert ledger.window_s("a", month_start, T0) == pytest.approx((2 + 1 + 3) * HOUR_S)
    ledger.apply([UsageRow(3, "a", 3, T0 - HOUR_S, T0 + HOUR_S)], T0 + HOUR_S)  # it ends
    assert ledger.running_slots("a") == 0
    assert ledger.window_s("a", month_start, T0 + HOUR_S) == pytest.approx(9 * HOUR_S)
    assert overlap(10, 20, 15) == 5 and overlap(10, 20, 30) == 0
    assert resets == datetime(2027, 1, 1, tzinfo=UTC).timestamp()


def test_budget_periods_and_what_a_spent_team_is_told() -> None:
    dec = datetime(2026, 12, 31, 23, 59, tzinfo=UTC).timestamp()
    assert budget.window(Period.month, dec) == (
        datetime(2026, 12, 1, tzinfo=UTC).timestamp(), datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    rolling_start, resets = budget.window(Period.rolling_30d, dec)
    assert (dec - rolling_start, resets) == (30 * 86400, None)
    assert budget.spent_reason("vision", 500.2 * HOUR_S, 500, Period.month, resets or
                               datetime(2027, 1, 1, tzinfo=UTC).timestamp()) == \
        "team vision used 500.2 of 500 slot-hours this month; resets 2027-01-01T00:00Z"
    assert "in the last 30 days" in budget.spent_reason("v", 1, 0.001, Period.rolling_30d, None)
