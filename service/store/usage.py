"""SQL of the slot usage account (``slot_usage``): runs opened and closed, the rows the fair-share
ledger folds in (``service.domain.queue.fairshare``), and the report of ``GET /usage``.

A *run* is one stretch of a job holding slots: from the transaction that gives them (local:
``repository.allocate``; Slurm: the pass that sees the batch job start) to the one that frees
them (``repository.release``, whoever calls it). Closing is a compare-and-set on
``ended_at IS NULL``: a run is closed once, however many paths free the job's slots (the reaper,
the finisher, a restarted server's recovery), so nothing is counted twice. Times are seconds
since the epoch (floats, so the report's arithmetic is the same SQL on SQLite and PostgreSQL).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import Float, case, cast, false, func, insert, literal, or_, select, update
from sqlalchemy.orm import Session

from service.store.tables import Job, SlotUsage

GroupBy = Literal["team", "user", "job"]


@dataclass(frozen=True)
class UsageRow:
    """A run as the ledger sees it; ``ended_at`` None while it holds its slots."""

    id: int
    team: str | None
    slots: int
    started_at: float
    ended_at: float | None


@dataclass(frozen=True)
class UsageTotal:
    """One row of ``GET /usage``: slot-seconds inside the window, distinct jobs, runs."""

    team: str | None
    user: str | None
    job_id: int | None
    slot_seconds: float
    jobs: int
    attempts: int


def open_run(session: Session, job_id: int, slots: int, at: float) -> None:
    """A run of ``job_id`` holding ``slots`` from ``at``, with the job's team and owner; none
    when one is open already (the same start seen twice)."""
    if session.scalar(select(SlotUsage.id).where(
            SlotUsage.job_id == job_id, SlotUsage.ended_at.is_(None)).limit(1)) is not None:
        return
    session.execute(insert(SlotUsage).from_select(
        ["job_id", "team", "owner", "slots", "started_at"],
        select(Job.id, Job.team, Job.owner, literal(slots), literal(at, Float))
        .where(Job.id == job_id)))


def close_runs(session: Session, job_id: int, at: float) -> int:
    """Close the job's open run at ``at`` (never before it started); rows closed (0 when none
    was open: closed already by another path)."""
    result = session.execute(
        update(SlotUsage)
        .where(SlotUsage.job_id == job_id, SlotUsage.ended_at.is_(None))
        .values(ended_at=case((SlotUsage.started_at > at, SlotUsage.started_at), else_=at)))
    return result.rowcount or 0


def runs_for_ledger(session: Session, closed_since: float) -> list[UsageRow]:
    """Open runs and runs closed at or after ``closed_since``: what the ledger has not folded
    yet, and what it keeps for the budgets' windows."""
    q = select(SlotUsage.id, SlotUsage.team, SlotUsage.slots, SlotUsage.started_at,
               SlotUsage.ended_at).where(
        or_(SlotUsage.ended_at.is_(None), SlotUsage.ended_at >= closed_since))
    return [UsageRow(*row) for row in session.execute(q).tuples().all()]


def runs_of_job(session: Session, job_id: int) -> Sequence[SlotUsage]:
    return session.scalars(
        select(SlotUsage).where(SlotUsage.job_id == job_id).order_by(SlotUsage.id)).all()


def report(
    session: Session, group_by: GroupBy, since: float, until: float, team: str | None = None,
    everyone: bool = True,
) -> list[UsageTotal]:
    """Slot-seconds used inside [``since``, ``until``] (an open run counts up to ``until``),
    grouped, largest first. ``everyone`` False: only ``team``'s runs (none when it is None)."""
    end = case((or_(SlotUsage.ended_at.is_(None), SlotUsage.ended_at > until), until),
               else_=SlotUsage.ended_at)
    start = case((SlotUsage.started_at < since, since), else_=SlotUsage.started_at)
    seconds = func.sum(SlotUsage.slots * (cast(end, Float) - cast(start, Float)))
    keys = {"team": [SlotUsage.team], "user": [SlotUsage.team, SlotUsage.owner],
            "job": [SlotUsage.team, SlotUsage.owner, SlotUsage.job_id]}[group_by]
    q = (select(*keys, seconds, func.count(func.distinct(SlotUsage.job_id)), func.count())
         .where(SlotUsage.started_at < until,
                or_(SlotUsage.ended_at.is_(None), SlotUsage.ended_at > since))
         .group_by(*keys))
    if not everyone:
        q = q.where(SlotUsage.team == team) if team is not None else q.where(false())
    totals = []
    for row in session.execute(q).tuples().all():
        parts = list(row[:len(keys)]) + [None] * (3 - len(keys))
        team_, user, job_id = parts
        totals.append(UsageTotal(team_, user, job_id, float(row[-3] or 0.0), int(row[-2]),
                                 int(row[-1])))
    totals.sort(key=lambda t: (-t.slot_seconds, t.team or "", t.user or "", t.job_id or 0))
    return totals
