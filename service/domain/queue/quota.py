"""Teams in a scheduling pass: the order of fair share, and the rules that hold a team's jobs
(its budget, its ``max_slots``). Pure: :class:`TeamBook` is what the scheduler
(``service.domain.queue.scheduler.plan``) asks; ``service.domain.queue.standing`` builds it.

* **Order.** Lowest fair-share factor first (recent usage / share,
  ``service.domain.queue.fairshare``), then higher priority, then submission order. Factors are
  as of the start of the pass.
* **Budget.** A team past its ``slot_hours`` for the period starts nothing; what runs is left
  alone.
* **Quota.** A team's running jobs hold at most ``max_slots``; only a ``preemptible`` job may
  start past it, on slots that are idle (*borrowed*: ``service.domain.queue.reclaim`` takes them
  back for a team within its quota).

A *slot* is one resource a job holds (a GPU or a CPU slot, one per rank): a team's count is
every slot of its jobs in ``starting``, ``running`` or ``pausing``.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.domain.queue.budget import Period

# Members submit at most this priority unless their team says otherwise (admins: any).
DEFAULT_MAX_PRIORITY = 50


@dataclass(frozen=True)
class TeamRules:
    """A team's settings as the scheduler reads them (``teams.quota``, ``teams.share``)."""

    name: str
    max_slots: int | None = None
    slot_hours: float | None = None
    period: Period = Period.month
    share: float = 1.0

    @classmethod
    def of(cls, name: str, quota: Mapping[str, Any] | None, share: float | None) -> "TeamRules":
        """From the stored columns; anything unreadable in ``quota`` is no limit (the API
        validates what it stores)."""
        quota = quota if isinstance(quota, Mapping) else {}
        max_slots = quota.get("max_slots")
        slot_hours = quota.get("slot_hours")
        try:
            period = Period(quota.get("period") or Period.month.value)
        except ValueError:
            period = Period.month
        return cls(
            name=name,
            max_slots=max_slots if isinstance(max_slots, int) and max_slots >= 0 else None,
            slot_hours=float(slot_hours) if isinstance(slot_hours, int | float)
            and slot_hours >= 0 else None,
            period=period,
            share=float(share) if share and share > 0 else 1.0,
        )


def whose(team: str | None, job_id: int) -> str:
    """``team nlp's job 41``, or ``job 41 (no team)``."""
    return f"team {team}'s job {job_id}" if team is not None else f"job {job_id} (no team)"


@dataclass
class TeamBook:
    """One pass's view of the teams. ``factor``: each team's fair-share factor (a team not
    named: 0); ``max_slots``: the teams with a cap; ``held``: slots each team holds now (the
    pass adds what it starts, :meth:`took`); ``spent``: teams past their budget → why."""

    factor: dict[str | None, float] = field(default_factory=dict)
    max_slots: dict[str, int] = field(default_factory=dict)
    held: dict[str | None, int] = field(default_factory=dict)
    spent: dict[str, str] = field(default_factory=dict)
    # (team, held, count) → the quota's reason: a pass asks it of thousands of jobs
    _reasons: dict[tuple[str, int, int], str] = field(default_factory=dict)

    def order_key(self, team: str | None, priority: int, job_id: int) -> tuple[float, int, int]:
        return (self.factor.get(team, 0.0), -priority, job_id)

    def hold(self, team: str | None, count: int, preemptible: bool) -> str | None:
        """Why a team rule keeps this job from starting now (budget, quota); None when none
        does (a preemptible job past the quota may borrow: :meth:`borrowing`)."""
        if team is None:
            return None
        spent = self.spent.get(team)
        if spent is not None:
            return spent
        cap = self.max_slots.get(team)
        if cap is None or preemptible:
            return None
        held = self.held.get(team, 0)
        if held + count <= cap:
            return None
        key = (team, held, count)
        reason = self._reasons.get(key)
        if reason is None:
            unit = "slot" if cap == 1 else "slots"
            reason = f"team {team} holds {held} of its {cap} {unit}"
            if held < cap:
                reason = f"{reason}; this job needs {count}"
            self._reasons[key] = reason
        return reason

    def borrowing(self, team: str | None, count: int) -> bool:
        """Would this job run past its team's ``max_slots`` (on borrowed slots)?"""
        cap = self.max_slots.get(team) if team is not None else None
        return cap is not None and self.held.get(team, 0) + count > cap

    def within_quota(self, team: str | None, count: int) -> bool:
        return not self.borrowing(team, count) and (team is None or team not in self.spent)

    def took(self, team: str | None, count: int) -> None:
        self.held[team] = self.held.get(team, 0) + count
