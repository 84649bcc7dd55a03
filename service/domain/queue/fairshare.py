"""Recent usage, kept incrementally: each team's decayed slot-seconds and its usage inside a
budget's window. Pure: the store's runs come in (``apply``), numbers go out; ``now`` is always
given (tests move it; nothing here reads a clock).

Usage decays with half-life ``H``: a slot-second used ``Δ`` seconds ago counts ``2^(-Δ/H)``. A
run of ``n`` slots from ``s`` to ``e`` is therefore worth, at ``t ≥ e``,

    n · H/ln 2 · (2^(-(t-e)/H) − 2^(-(t-s)/H))          (slot-seconds)

and a run still holding its slots ``n · H/ln 2 · (1 − 2^(-(t-s)/H))``. A team's fair-share
factor is the sum over its runs, in slot-hours, divided by its ``share``.

Cost: a closed run is folded into its team's sum once (its id remembered while an overlapping
read may return it again, ``FOLD_MEMORY_S``); the sums decay together, by one multiplication
per team per read. Open runs — as many as jobs holding slots — are summed anew. So a read costs
the number of teams plus running jobs, never the history. Closed runs of the last
``WINDOW_HORIZON_S`` are kept per team for the budgets' windows, whose closed part is cached per
window start (recomputed when the start moved more than ``WINDOW_SLACK_S``: a rolling window's
start moves every pass, and a minute's slack is far below a slot-hour budget's grain).
"""

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from service.store.usage import UsageRow

LN2 = math.log(2)
HOUR_S = 3600.0
DAY_S = 86400.0
# Closed runs are kept this long for budgets: a month's window starts at most 31 days back.
WINDOW_HORIZON_S = 32 * DAY_S
# A run closed and committed out of order is seen by the next read as long as its end is no
# older than this when it commits (transactions here last milliseconds; clocks of two servers
# sharing one database may differ by a few seconds).
FOLD_MEMORY_S = 120.0
WINDOW_SLACK_S = 60.0
# Runs older than this many half-lives are left out on the first read (2^-20: one part in a
# million of what they were worth).
DECAY_HORIZON_HALF_LIVES = 20


def run_worth(slots: int, started: float, ended: float, now: float, half_life_s: float) -> float:
    """Decayed slot-seconds of a run from ``started`` to ``ended`` (≤ ``now``), seen at ``now``."""
    if ended <= started:
        return 0.0
    scale = half_life_s / LN2
    return slots * scale * (2.0 ** (-(now - ended) / half_life_s)
                            - 2.0 ** (-(now - started) / half_life_s))


def overlap(started: float, ended: float, window_start: float) -> float:
    """Seconds of [started, ended] at or after ``window_start``."""
    return max(0.0, ended - max(started, window_start))


@dataclass
class _Window:
    start: float
    closed_s: float  # slot-seconds of the closed runs inside [start, …)


@dataclass
class UsageLedger:
    """Per team (``None``: jobs of no team): decayed usage and the closed runs of the last
    ``WINDOW_HORIZON_S``; fed by :meth:`apply` with the rows of
    ``service.store.usage.runs_for_ledger(closed_since=ledger.next_closed_since(now))``."""

    half_life_s: float
    _decayed: dict[str | None, float] = field(default_factory=lambda: defaultdict(float))
    _as_of: float | None = None  # when ``_decayed`` was last decayed to; None: never read
    _open: dict[int, UsageRow] = field(default_factory=dict)
    _folded: dict[int, float] = field(default_factory=dict)  # run id → its end
    _recent: dict[str | None, list[tuple[float, float, int]]] = field(
        default_factory=lambda: defaultdict(list))
    _windows: dict[str | None, _Window] = field(default_factory=dict)
    _pruned_at: float = -math.inf

    def next_closed_since(self, now: float) -> float:
        """The ``closed_since`` of the next read: far back on the first one, then a margin
        before the last read."""
        if self._as_of is None:
            return now - max(DECAY_HORIZON_HALF_LIVES * self.half_life_s, WINDOW_HORIZON_S)
        return min(self._as_of, now) - FOLD_MEMORY_S

    def apply(self, rows: Iterable[UsageRow], now: float) -> None:
        """Decay the sums to ``now`` and fold in the runs closed since (each once). A clock
        that went back (another server's) decays nothing: the sums stay as of the later time."""
        if self._as_of is None or now > self._as_of:
            if self._as_of is not None:
                factor = 2.0 ** (-(now - self._as_of) / self.half_life_s)
                for team in self._decayed:
                    self._decayed[team] *= factor
            self._as_of = now
        at = self._as_of
        seen_open: dict[int, UsageRow] = {}
        for row in rows:
            if row.ended_at is None:
                seen_open[row.id] = row
            elif row.id not in self._folded:
                self._fold(row, row.ended_at, at)
        self._open = seen_open  # a run open before and absent now was closed (and folded)
        if now - self._pruned_at > FOLD_MEMORY_S:
            self._prune(now)

    def _fold(self, row: UsageRow, ended: float, now: float) -> None:
        self._folded[row.id] = ended
        self._decayed[row.team] += run_worth(row.slots, row.started_at, min(ended, now), now,
                                             self.half_life_s)
        if ended >= now - WINDOW_HORIZON_S:
            self._recent[row.team].append((row.started_at, ended, row.slots))
            window = self._windows.get(row.team)
            if window is not None:
                window.closed_s += row.slots * overlap(row.started_at, ended, window.start)

    def _prune(self, now: float) -> None:
        self._pruned_at = now
        horizon = now - 2 * FOLD_MEMORY_S
        self._folded = {i: e for i, e in self._folded.items() if e >= horizon}
        oldest = now - WINDOW_HORIZON_S
        for team, runs in self._recent.items():
            if runs and min(e for _, e, _ in runs) < oldest:
                self._recent[team] = [r for r in runs if r[1] >= oldest]

    # --- reads (after ``apply`` at the same ``now``) -------------------------------------------
    def teams(self) -> set[str | None]:
        return set(self._decayed) | {r.team for r in self._open.values()}

    def decayed_s(self, team: str | None, now: float) -> float:
        """The team's decayed slot-seconds at ``now``: its closed runs' sum and its open runs."""
        total = self._decayed.get(team, 0.0)
        for run in self._open.values():
            if run.team == team and now > run.started_at:
                total += run_worth(run.slots, run.started_at, now, now, self.half_life_s)
        return total

    def running_slots(self, team: str | None) -> int:
        """Slots the team's open runs hold."""
        return sum(r.slots for r in self._open.values() if r.team == team)

    def window_s(self, team: str | None, window_start: float, now: float) -> float:
        """Slot-seconds the team used from ``window_start`` to ``now`` (a budget's period)."""
        window = self._windows.get(team)
        if window is None or abs(window.start - window_start) > WINDOW_SLACK_S:
            closed = sum(n * overlap(s, e, window_start) for s, e, n in self._recent.get(team, ()))
            window = self._windows[team] = _Window(window_start, closed)
        running = sum(r.slots * overlap(r.started_at, now, window_start)
                      for r in self._open.values() if r.team == team)
        return window.closed_s + running
