"""The tracking outbox in SQL (``tracking_exports``): rows written in the transaction that creates
a job or a sweep, read and advanced by the acting supervisor's exporter
(``service.domain.tracking.exporter``), and the reads of records it exports.
"""

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row, and_, func, or_, select, update
from sqlalchemy.orm import Session

from service.store.clock import utcnow
from service.store.records import EPOCH_STEP
from service.store.tables import Job, MetricRecord, Sweep, TrackingExport
from torchyard_contract.bounds import bounded_text


def add_export(
    session: Session, *, job_id: int | None = None, sweep_id: int | None = None,
    mlflow: bool, tensorboard: bool, experiment: str | None, log_outputs: bool = False,
) -> None:
    """One outbox row for a new job or sweep, due at once."""
    now = utcnow()
    session.add(TrackingExport(
        job_id=job_id, sweep_id=sweep_id, mlflow=mlflow, tensorboard=tensorboard,
        experiment=experiment, log_outputs=log_outputs, export_key=uuid.uuid4().hex,
        next_try_at=now, created_at=now,
    ))
    session.flush()


@dataclass(frozen=True)
class Pending:
    """A row with something left to export, and what its job or sweep is now."""

    export: TrackingExport
    state: str | None  # the job's (or sweep's) state; None when it is gone
    ran: bool  # the job has run (``running_at`` set); a sweep: True
    last_seq: int  # the job's newest record; 0 for a sweep


# MLflow statuses of a run that a queued job leaves as they are.
_RESTING_STATUSES = ("SCHEDULED", "RUNNING")


def unfinished(session: Session, limit: int) -> list[Pending]:
    """Rows not done, sweeps first (their runs are their trials' parents), then oldest first,
    at most ``limit``, each with its job's state and newest record (an index lookup each).

    Rows of queued jobs with nothing to send are left out: a queue of thousands of jobs costs
    the exporter's scan nothing until they run (a queued job's run is made, SCHEDULED, once)."""
    e = TrackingExport
    newest = func.coalesce(
        select(func.max(MetricRecord.seq)).where(MetricRecord.job_id == e.job_id)
        .scalar_subquery(), 0)
    resting = and_(  # never NULL (a sweep's row has no job): NOT NULL would drop the row
        Job.state.is_not(None), Job.state == "queued", e.sent_seq == e.acked_seq,
        newest <= e.acked_seq,
        or_(e.mlflow.is_(False), e.mlflow_done,
            and_(e.run_id.is_not(None), e.status.in_(_RESTING_STATUSES))),
    )
    q = (
        select(e, Job.state, Job.running_at, Sweep.state, newest)
        .outerjoin(Job, Job.id == e.job_id).outerjoin(Sweep, Sweep.id == e.sweep_id)
        .where(e.done.is_(False), ~resting)
        .order_by(e.sweep_id.is_(None), e.id).limit(limit)
    )
    return [
        Pending(row, job_state if row.job_id is not None else sweep_state,
                running_at is not None or row.sweep_id is not None, int(last or 0))
        for row, job_state, running_at, sweep_state, last in session.execute(q).tuples()
    ]


def update_export(session: Session, export_id: int, **values: Any) -> None:
    """Set columns of one row; an ``error`` is one line, bounded (it may quote a server's
    answer). The row is ``done`` once each export it has is done."""
    if isinstance(values.get("error"), str):
        values["error"] = bounded_text(" ".join(values["error"].split()))
    e = TrackingExport
    session.execute(update(e).where(e.id == export_id).values(**values))
    if values.get("mlflow_done") or values.get("tensorboard_done"):
        session.execute(
            update(e).where(e.id == export_id, or_(e.mlflow_done, e.mlflow.is_(False)),
                            or_(e.tensorboard_done, e.tensorboard.is_(False))).values(done=True))


def export_of_job(session: Session, job_id: int) -> TrackingExport | None:
    return session.scalar(select(TrackingExport).where(TrackingExport.job_id == job_id))


def export_of_sweep(session: Session, sweep_id: int) -> TrackingExport | None:
    return session.scalar(select(TrackingExport).where(TrackingExport.sweep_id == sweep_id))


def job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def sweep(session: Session, sweep_id: int) -> Sweep | None:
    return session.get(Sweep, sweep_id)


def last_seq(session: Session, job_id: int) -> int:
    """The job's newest record's ``seq``, 0 when none: one indexed lookup (job_id, seq)."""
    q = select(func.max(MetricRecord.seq)).where(MetricRecord.job_id == job_id)
    return int(session.scalar(q) or 0)


def records_between(
    session: Session, job_id: int, after: int, through: int | None, limit: int
) -> Sequence[Row[Any]]:
    """The job's records with ``after < seq <= through`` in ``seq`` order, at most ``limit``;
    plain rows (``seq``, ``attempt``, ``rank``, ``epoch``, ``step``, ``name``, ``value``,
    ``nonfinite``, ``time``)."""
    m = MetricRecord.__table__.c
    q = select(m.seq, m.attempt, m.rank, m.epoch, m.step, m.name, m.value, m.nonfinite, m.time)
    q = q.where(m.job_id == job_id, m.seq > after)
    if through is not None:
        q = q.where(m.seq <= through)
    return session.connection().execute(q.order_by(m.seq).limit(limit)).all()


def epoch_records_through(session: Session, job_id: int, through: int) -> Sequence[Row[Any]]:
    """The job's per-epoch records with ``seq <= through`` in ``seq`` order (the columns of
    ``records_between``): what the cross-rank means folded over so far."""
    m = MetricRecord.__table__.c
    q = select(m.seq, m.attempt, m.rank, m.epoch, m.step, m.name, m.value, m.nonfinite, m.time)
    q = q.where(m.job_id == job_id, m.step == EPOCH_STEP, m.seq <= through)
    return session.connection().execute(q.order_by(m.seq)).all()


def records_after_count(session: Session, job_id: int, after: int) -> int:
    """How many of the job's records have ``seq > after``: an index range count."""
    q = select(func.count()).select_from(MetricRecord).where(
        MetricRecord.job_id == job_id, MetricRecord.seq > after)
    return int(session.scalar(q) or 0)


def trial_exports(session: Session, sweep_id: int) -> Sequence[TrackingExport]:
    """The outbox rows of a sweep's trials."""
    trials = select(Job.id).where(Job.sweep_id == sweep_id)
    return session.scalars(
        select(TrackingExport).where(TrackingExport.job_id.in_(trials))).all()
