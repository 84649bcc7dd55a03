"""Chart series and progress of a job (the dashboard, ``/series``, ``/summary``): reads only.

Core rows, not ORM ones, where there may be many: 100k rows stay cheap.
"""

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.records import EPOCH_STEP
from service.store.tables import MetricRecord


def series_rows(
    session: Session, job_id: int, name: str, steps: bool
) -> Sequence[tuple[int, int, int, int, float | None, str | None]]:
    """``(attempt, rank, epoch, step, value, nonfinite)`` of one metric of a job: the per-epoch
    records, or with ``steps`` the per-step ones. Core rows, not ORM ones: 100k rows stay cheap."""
    m = MetricRecord
    step_filter = m.step != EPOCH_STEP if steps else m.step == EPOCH_STEP
    q = (
        select(m.attempt, m.rank, m.epoch, m.step, m.value, m.nonfinite)
        .where(m.job_id == job_id, m.name == name, step_filter)
        .order_by(m.attempt, m.rank, m.epoch, m.step)
    )
    return session.connection().execute(q).tuples().all()


def metric_names(session: Session, job_id: int) -> list[str]:
    """The distinct metric names a job has reported, sorted."""
    q = select(MetricRecord.name).where(MetricRecord.job_id == job_id).distinct()
    return sorted(session.scalars(q).all())


def last_record(session: Session, job_id: int) -> tuple[int, int] | None:
    """``(seq, epoch)`` of the job's newest record, or None: one indexed lookup (job_id, seq)."""
    q = (
        select(MetricRecord.seq, MetricRecord.epoch)
        .where(MetricRecord.job_id == job_id)
        .order_by(MetricRecord.seq.desc())
        .limit(1)
    )
    row = session.execute(q).first()
    return (row[0], row[1]) if row else None
