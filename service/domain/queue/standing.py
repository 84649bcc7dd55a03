"""Where each team stands: its recent usage, fair-share factor and rank, its budget's period
and what it used in it. Read from the store (teams, the slot usage account) into a
:class:`service.domain.queue.fairshare.UsageLedger` kept per process and brought up to date at
each read, so a read costs the teams plus the runs that changed, not the history.

The supervisor's scheduling pass asks :meth:`Standings.book` (a
:class:`service.domain.queue.quota.TeamBook`, or None while there are no teams); ``GET /teams``
asks :meth:`Standings.read`. Both compute from the same ledger code at the time they are
given, so they agree up to the moment of reading.
"""

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from service.domain.queue import budget
from service.domain.queue.fairshare import HOUR_S, UsageLedger
from service.domain.queue.quota import TeamBook, TeamRules
from service.store import identity as identitystore
from service.store import usage as usagestore


@dataclass(frozen=True)
class Standing:
    """One team, as ``GET /teams`` shows it. Usage in slot-hours."""

    rules: TeamRules
    running_slots: int
    recent_slot_hours: float  # decayed by the half-life
    factor: float  # recent_slot_hours / share: lowest starts first
    rank: int  # 1 = first in fair-share order among the teams
    period_start: float
    resets_at: float | None  # None: a rolling window
    period_slot_hours: float
    spent: str | None  # past its budget: why its jobs wait

    @property
    def borrowed_slots(self) -> int:
        cap = self.rules.max_slots
        return max(0, self.running_slots - cap) if cap is not None else 0


@dataclass
class Standings:
    """One per process (the supervisor's pass, the routes): the ledger and its lock."""

    half_life_s: float
    ledger: UsageLedger = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.ledger = UsageLedger(self.half_life_s)

    def _sync(self, session: Session, now: float) -> None:
        rows = usagestore.runs_for_ledger(session, self.ledger.next_closed_since(now))
        self.ledger.apply(rows, now)

    def book(self, session: Session, now: float, held: Mapping[str | None, int]) -> TeamBook | None:
        """The pass's :class:`TeamBook`; ``held``: slots each team's jobs hold now. None when
        there are no teams (the queue is then priority, then FIFO)."""
        rows = identitystore.list_teams(session)
        if not rows:
            return None
        rules = [TeamRules.of(t.name, t.quota, t.share) for t in rows]
        book = TeamBook(held=dict(held))
        with self._lock:
            self._sync(session, now)
            ledger = self.ledger
            for team in ledger.teams():
                book.factor[team] = ledger.decayed_s(team, now) / HOUR_S
            for rule in rules:
                book.factor[rule.name] = book.factor.get(rule.name, 0.0) / rule.share
                if rule.max_slots is not None:
                    book.max_slots[rule.name] = rule.max_slots
                if rule.slot_hours is not None:
                    spent = self._spent(rule, now)
                    if spent is not None:
                        book.spent[rule.name] = spent
        return book

    def _spent(self, rule: TeamRules, now: float) -> str | None:
        start, resets = budget.window(rule.period, now)
        used_s = self.ledger.window_s(rule.name, start, now)
        if rule.slot_hours is None or used_s < rule.slot_hours * HOUR_S:
            return None
        return budget.spent_reason(rule.name, used_s, rule.slot_hours, rule.period, resets)

    def read(self, session: Session, now: float) -> dict[str, Standing]:
        """Every team's standing at ``now``, by name."""
        rows = identitystore.list_teams(session)
        with self._lock:
            self._sync(session, now)
            ledger = self.ledger
            found = []
            for team in rows:
                rule = TeamRules.of(team.name, team.quota, team.share)
                recent = ledger.decayed_s(team.name, now) / HOUR_S
                start, resets = budget.window(rule.period, now)
                period = ledger.window_s(team.name, start, now) / HOUR_S
                found.append((rule, ledger.running_slots(team.name), recent, recent / rule.share,
                              start, resets, period,
                              self._spent(rule, now) if rule.slot_hours is not None else None))
        found.sort(key=lambda f: (f[3], f[0].name))
        return {f[0].name: Standing(f[0], f[1], f[2], f[3], rank, f[4], f[5], f[6], f[7])
                for rank, f in enumerate(found, start=1)}
